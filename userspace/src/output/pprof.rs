//! pprof output (`perftools.profiles`, DESIGN.md §5): multi-valued samples (`samples/count`,
//! `cpu/nanoseconds`, `energy_<domain>/microjoules`), labels pid, tid, comm, cpu, cgroup,
//! gzip-compressed as pprof writes.
//!
//! Code is laid out as a native profiler's (pprof's perf converter): one location per
//! (mapping, sampled address) holding the address's inline chain as lines (innermost
//! inlined function first, the containing function last); mappings as recorded per process
//! (start, limit, file offset, path, build-id) plus `[kernel.kallsyms]`, each saying what
//! symbolization found in it, so pprof re-symbolizes only mappings we could not.

use std::collections::HashMap;
use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::{OutputError, ProfileSink};
use crate::pb::pprof;
use crate::profile::{Frame, Location, LocationId, Profile};

/// Writes a gzip-compressed pprof profile with every value of the profile.
pub struct Pprof {
    /// Value shown by default in pprof tools (e.g. `energy_package`); first energy when `None`.
    pub default_value: Option<String>,
}

/// Builds pprof's string table as we go (index 0 is always "").
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        Self {
            table: vec![String::new()],
            index: HashMap::from([(String::new(), 0)]),
        }
    }

    fn id(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

/// The uncompressed pprof message of `profile`.
pub fn to_pprof(profile: &Profile, default_value: Option<&str>) -> pprof::Profile {
    let mut strings = Strings::new();
    let mut out = pprof::Profile {
        sample_type: profile
            .value_types
            .iter()
            .map(|v| pprof::ValueType {
                r#type: strings.id(&v.name),
                unit: strings.id(&v.unit),
            })
            .collect(),
        ..Default::default()
    };

    // One function per (name, file).
    let mut function_ids: HashMap<(&str, Option<&str>), u64> = HashMap::new();
    let frame_function: Vec<u64> = profile
        .frames
        .iter()
        .map(|f| {
            let next = function_ids.len() as u64 + 1;
            *function_ids
                .entry((f.function.as_str(), f.file.as_deref()))
                .or_insert_with(|| {
                    let name = strings.id(&f.function);
                    out.function.push(pprof::Function {
                        id: next,
                        name,
                        system_name: name,
                        filename: strings.id(f.file.as_deref().unwrap_or("")),
                        start_line: 0,
                    });
                    next
                })
        })
        .collect();

    // One mapping per profile mapping, the main binary first (pprof titles a profile with
    // mapping 1), flags saying what symbolization found in it.
    let order = mapping_order(profile);
    let mut mapping_id = vec![0u64; profile.mappings.len()];
    for (i, &m) in order.iter().enumerate() {
        mapping_id[m] = i as u64 + 1;
    }
    let mut found = vec![Found::default(); profile.mappings.len()];
    for l in &profile.locations {
        if let Some(m) = l.mapping {
            found[m as usize].add(l, &profile.frames);
        }
    }
    for &m in &order {
        let pm = &profile.mappings[m];
        let f = found[m];
        out.mapping.push(pprof::Mapping {
            id: mapping_id[m],
            memory_start: pm.start,
            memory_limit: pm.end,
            file_offset: pm.file_offset,
            filename: strings.id(&pm.path),
            build_id: strings.id(&hex(&pm.build_id)),
            has_functions: f.functions,
            has_filenames: f.filenames,
            has_line_numbers: f.lines,
            has_inline_frames: f.lines || f.inlined,
        });
    }

    // One location per profile location (one per mapping and address): a line per frame,
    // innermost inlined function first, the containing function last.
    out.location = profile
        .locations
        .iter()
        .enumerate()
        .map(|(i, l)| pprof::Location {
            id: i as u64 + 1,
            mapping_id: l.mapping.map_or(0, |m| mapping_id[m as usize]),
            address: l.address,
            line: l
                .frames
                .iter()
                .map(|&f| pprof::Line {
                    function_id: frame_function[f as usize],
                    line: i64::from(profile.frames[f as usize].line.unwrap_or(0)),
                    column: 0,
                })
                .collect(),
            is_folded: false,
        })
        .collect();

    let keys = ["pid", "tid", "comm", "cpu", "cgroup"].map(|k| strings.id(k));
    // Samples with the same stack and labels merge (values summed), as pprof itself does:
    // far fewer, smaller messages to encode and compress.
    type Key<'p> = (&'p [LocationId], u32, u32, &'p str, Option<u32>, u64);
    let mut merged: foldhash::HashMap<Key<'_>, usize> = Default::default();
    let mut sums: Vec<(Key<'_>, Vec<f64>)> = Vec::new();
    for s in &profile.samples {
        let l = &s.labels;
        let key = (
            s.locations.as_slice(),
            l.pid,
            l.tid,
            &*l.comm,
            l.cpu,
            l.cgroup,
        );
        match merged.get(&key) {
            Some(&i) => {
                for (t, v) in sums[i].1.iter_mut().zip(&s.values) {
                    *t += v;
                }
            }
            None => {
                merged.insert(key, sums.len());
                sums.push((key, s.values.clone()));
            }
        }
    }
    for ((locations, pid, tid, comm, cpu, cgroup), values) in sums {
        let mut label = vec![
            pprof::Label {
                key: keys[0],
                num: i64::from(pid),
                ..Default::default()
            },
            pprof::Label {
                key: keys[1],
                num: i64::from(tid),
                ..Default::default()
            },
            pprof::Label {
                key: keys[2],
                str: strings.id(comm),
                ..Default::default()
            },
        ];
        if let Some(cpu) = cpu {
            label.push(pprof::Label {
                key: keys[3],
                num: i64::from(cpu),
                ..Default::default()
            });
        }
        if cgroup != 0 {
            // cgroup ids are inode numbers: a string keeps all 64 bits.
            let cgroup = strings.id(&cgroup.to_string());
            label.push(pprof::Label {
                key: keys[4],
                str: cgroup,
                ..Default::default()
            });
        }
        out.sample.push(pprof::Sample {
            location_id: locations.iter().map(|&l| u64::from(l) + 1).collect(),
            value: values.iter().map(|v| v.round() as i64).collect(),
            label,
        });
    }

    out.time_nanos = i64::try_from(profile.meta.start_unix_ns).unwrap_or(0);
    out.duration_nanos = i64::try_from(profile.meta.duration_ns).unwrap_or(i64::MAX);
    if let Some(cpu) = profile.value_index(crate::profile::CPU) {
        out.period_type = out.sample_type.get(cpu).cloned();
        out.period = (1e9 / f64::from(profile.meta.sample_hz.max(1))).round() as i64;
    }
    let default = default_value
        .and_then(|name| profile.value_index(name))
        .or_else(|| {
            profile
                .value_types
                .iter()
                .position(|v| v.unit == "microjoules")
        });
    if let Some(d) = default {
        out.default_sample_type = out.sample_type[d].r#type;
    }
    if profile.meta.estimated {
        out.comment
            .push(strings.id("energy is estimated (modelled, not measured)"));
    }
    out.comment
        .push(strings.id(&format!("source: {}", profile.meta.source)));
    if profile.meta.lost_events > 0 {
        out.comment.push(strings.id(&format!(
            "{} events lost during capture",
            profile.meta.lost_events
        )));
    }
    out.string_table = strings.table;
    out
}

/// What symbolization found in one mapping's locations.
#[derive(Clone, Copy, Default)]
struct Found {
    /// A symbol for some address (the others have none to find).
    functions: bool,
    /// A source file for some frame.
    filenames: bool,
    /// A source line for some frame: DWARF was read, inline chains with it.
    lines: bool,
    /// An inlined frame somewhere.
    inlined: bool,
}

impl Found {
    fn add(&mut self, l: &Location, frames: &[Frame]) {
        for f in l.frames.iter().map(|&f| &frames[f as usize]) {
            self.functions |= !f.is_unresolved();
            self.filenames |= f.file.is_some();
            self.lines |= f.line.is_some();
        }
        self.inlined |= l.frames.len() > 1;
    }
}

/// Profile mapping indices in output order: pprof's own guess at the main binary first
/// (the first mapping of a file that is neither a shared library nor `[...]`), then the
/// rest in profile order.
fn mapping_order(profile: &Profile) -> Vec<usize> {
    let mut order: Vec<usize> = (0..profile.mappings.len()).collect();
    let is_main = |path: &str| {
        let name = path.rsplit('/').next().unwrap_or(path);
        !path.is_empty() && !path.starts_with('[') && !name.contains(".so")
    };
    if let Some(main) = order
        .iter()
        .position(|&m| is_main(&profile.mappings[m].path))
    {
        let m = order.remove(main);
        order.insert(0, m);
    }
    order
}

/// Lower-case hex of a build-id, as pprof and perf print them.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl ProfileSink for Pprof {
    fn write_profile(&mut self, profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
        let bytes = to_pprof(profile, self.default_value.as_deref()).encode_to_vec();
        let mut gz = GzEncoder::new(out, Compression::default());
        gz.write_all(&bytes)?;
        gz.finish()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testdata;
    use std::io::Read;

    #[test]
    fn round_trips_through_gzip_and_matches_golden() {
        let p = testdata::profile();
        let mut out = Vec::new();
        Pprof {
            default_value: None,
        }
        .write_profile(&p, &mut out)
        .expect("write");
        assert_eq!(&out[..2], &[0x1f, 0x8b], "gzip magic");
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(&out[..])
            .read_to_end(&mut raw)
            .expect("gunzip");
        let back = pprof::Profile::decode(&raw[..]).expect("decode");
        let st = |i: i64| back.string_table[i as usize].as_str();
        let types: Vec<(&str, &str)> = back
            .sample_type
            .iter()
            .map(|v| (st(v.r#type), st(v.unit)))
            .collect();
        assert_eq!(
            types,
            vec![
                ("samples", "count"),
                ("cpu", "nanoseconds"),
                ("energy_package", "microjoules"),
                ("energy_dram", "microjoules")
            ]
        );
        assert_eq!(st(back.default_sample_type), "energy_package");
        assert_eq!(back.sample.len(), 5);
        assert_eq!(back.sample[0].value, vec![1, 10_000_000, 300_000, 30_000]);
        // Leaf first: the inlined `square` inside `hot_heavy`, one location.
        let leaf = &back.location[back.sample[0].location_id[0] as usize - 1];
        let func = &back.function[leaf.line[0].function_id as usize - 1];
        assert_eq!(
            (st(func.name), st(func.filename), leaf.line[0].line),
            ("square", "/src/burn.c", 8)
        );
        let labels: Vec<(&str, String)> = back.sample[2]
            .label
            .iter()
            .map(|l| {
                (
                    st(l.key),
                    if l.str != 0 {
                        st(l.str).to_string()
                    } else {
                        l.num.to_string()
                    },
                )
            })
            .collect();
        assert_eq!(
            labels,
            vec![
                ("pid", "100".into()),
                ("tid", "101".into()),
                ("comm", "burn".into()),
                ("cpu", "1".into()),
                ("cgroup", "7".into())
            ]
        );
        assert_eq!(back.duration_nanos, 2_000_000_000);
        assert_eq!(back.period, 10_000_000);
        testdata::assert_golden("profile.pb", &raw);
    }

    fn decode(p: &Profile) -> pprof::Profile {
        let bytes = to_pprof(p, None).encode_to_vec();
        pprof::Profile::decode(&bytes[..]).expect("decode")
    }

    /// Function names of a location's lines, innermost first.
    fn names<'p>(back: &'p pprof::Profile, l: &pprof::Location) -> Vec<&'p str> {
        l.line
            .iter()
            .map(|line| {
                let f = &back.function[line.function_id as usize - 1];
                back.string_table[f.name as usize].as_str()
            })
            .collect()
    }

    #[test]
    fn one_location_per_address_with_its_inline_chain_and_mapping() {
        let back = decode(&testdata::profile());
        let st = |i: i64| back.string_table[i as usize].as_str();
        // Locations: ids 1..=n, one per (mapping, address), real addresses but for the
        // synthetic frame, which has no mapping.
        let mut seen = std::collections::HashSet::new();
        for (i, l) in back.location.iter().enumerate() {
            assert_eq!(l.id, i as u64 + 1);
            assert!(seen.insert((l.mapping_id, l.address)), "{l:?} repeated");
            assert!(!l.is_folded);
            let synthetic = names(&back, l) == [crate::profile::NO_STACK_SAMPLE];
            assert_eq!(l.address == 0, synthetic, "{l:?}");
            assert_eq!(l.mapping_id == 0, synthetic, "{l:?}");
        }
        // The inlined chain is one location: `square` (innermost) then `hot_heavy`.
        let leaf = &back.location[back.sample[0].location_id[0] as usize - 1];
        assert_eq!(leaf.address, 0x5555_5555_5150);
        assert_eq!(names(&back, leaf), vec!["square", "hot_heavy"]);
        assert_eq!(
            leaf.line.iter().map(|l| l.line).collect::<Vec<_>>(),
            vec![8, 12]
        );
        // hot_heavy sampled at another address: its own location, same function.
        let other = &back.location[back.sample[1].location_id[0] as usize - 1];
        assert_ne!(other.id, leaf.id);
        assert_eq!(names(&back, other), vec!["hot_heavy"]);
        assert_eq!(other.line[0].function_id, leaf.line[1].function_id);
        assert_eq!(
            back.sample[0].location_id.len(),
            2,
            "square+hot_heavy, main"
        );

        // Mappings: the main binary first, with its build-id; every field as recorded.
        let m: Vec<(&str, u64, u64, u64, &str)> = back
            .mapping
            .iter()
            .map(|m| {
                (
                    st(m.filename),
                    m.memory_start,
                    m.memory_limit,
                    m.file_offset,
                    st(m.build_id),
                )
            })
            .collect();
        assert_eq!(
            m,
            vec![
                (
                    "/opt/burn",
                    0x5555_5555_5000,
                    0x5555_5555_6000,
                    0x1000,
                    "deadbeef"
                ),
                (
                    "[kernel.kallsyms]",
                    0xffff_ffff_8100_0000,
                    0xffff_ffff_8100_2000,
                    0xffff_ffff_8100_0000,
                    ""
                ),
                (
                    "/usr/lib/libc.so.6",
                    0x7f00_0000_0000,
                    0x7f00_0010_0000,
                    0,
                    ""
                ),
            ]
        );
        assert!(
            back.mapping
                .iter()
                .enumerate()
                .all(|(i, m)| m.id == i as u64 + 1)
        );
        assert_eq!(leaf.mapping_id, 1);
        // What symbolization found: all of it in burn, names only in the kernel, nothing in
        // libc (its one frame is `libc.so.6+0x1234`).
        let flags: Vec<[bool; 4]> = back
            .mapping
            .iter()
            .map(|m| {
                [
                    m.has_functions,
                    m.has_filenames,
                    m.has_line_numbers,
                    m.has_inline_frames,
                ]
            })
            .collect();
        assert_eq!(
            flags,
            vec![
                [true, true, true, true],
                [true, false, false, false],
                [false, false, false, false]
            ]
        );
    }

    /// An -O1 program whose `outer` inlines `leaf`: a sample inside the inlined code, built
    /// into a profile from a recording and exported, is one location with both functions.
    #[test]
    fn real_inlined_code_is_one_location_with_its_chain() {
        use crate::pb::v1::{Header, Mapping, Sample};
        use crate::profile::{Filter, SampleValues};
        use crate::record::Recording;
        use crate::symbolize::{Symbolizer, read_build_id};
        use std::process::Command;

        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("inl.c");
        std::fs::write(
            &src,
            "static volatile int sink;\n\
             static inline __attribute__((always_inline)) void leaf(int i) { sink += i * i; }\n\
             __attribute__((noinline)) void outer(int n) { for (int i = 0; i < n; i++) leaf(i); }\n\
             int main(int argc, char **argv) { (void)argv; outer(argc * 1000); return 0; }\n",
        )
        .expect("write source");
        let bin = dir.path().join("inl");
        let ok = Command::new("gcc")
            .args(["-O1", "-g", "-o"])
            .arg(&bin)
            .arg(&src)
            .status()
            .expect("run gcc (install gcc to run this test)");
        assert!(ok.success(), "gcc failed");

        // File offset of `outer` and its size, through the executable LOAD segment.
        let nm = Command::new("nm").arg("-S").arg(&bin).output().expect("nm");
        let nm = String::from_utf8_lossy(&nm.stdout);
        let (vaddr, size) = nm
            .lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 4 && f[3] == "outer").then(|| {
                    let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
                    (hex(f[0]), hex(f[1]))
                })
            })
            .expect("outer in nm -S");
        let re = Command::new("readelf")
            .arg("-lW")
            .arg(&bin)
            .output()
            .expect("readelf");
        let re = String::from_utf8_lossy(&re.stdout);
        let offset = re
            .lines()
            .filter(|l| l.trim_start().starts_with("LOAD"))
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
                let (off, va, memsz) = (hex(f[1])?, hex(f[2])?, hex(f[5])?);
                (va..va + memsz)
                    .contains(&vaddr)
                    .then_some(vaddr - va + off)
            })
            .expect("outer in a LOAD segment");

        // One mapping of the whole file at BASE; find an address of `outer` in `leaf`.
        const BASE: u64 = 0x5600_0000_0000;
        let path = bin.to_str().expect("utf-8 path").to_string();
        let build_id = read_build_id(&bin);
        assert!(!build_id.is_empty(), "gcc links with a build-id");
        let mapping = Mapping {
            tgid: 1,
            start: BASE,
            end: BASE + 0x10_0000,
            file_offset: 0,
            path: path.clone(),
            build_id: build_id.clone(),
            ts_ns: 0,
        };
        let mut sym = Symbolizer::with_kallsyms(None);
        let addr = (BASE + offset..BASE + offset + size)
            .find(|&a| sym.user(a, std::slice::from_ref(&mapping)).len() > 1)
            .expect("an address of outer inside inlined leaf");

        let mut rec = Recording {
            header: Header {
                sample_hz: 100,
                ..Header::default()
            },
            end_ns: 1_000_000_000,
            ..Recording::default()
        };
        rec.mappings.insert(1, vec![mapping]);
        rec.samples.push(Sample {
            tid: 1,
            tgid: 1,
            user_stack: vec![addr],
            ..Sample::default()
        });
        let p = crate::profile::build(
            &rec,
            &SampleValues::cpu_time(&rec),
            &mut sym,
            &Filter::default(),
        );
        let back = decode(&p);
        let st = |i: i64| back.string_table[i as usize].as_str();
        assert_eq!(back.sample.len(), 1);
        assert_eq!(
            back.sample[0].location_id.len(),
            1,
            "one address, one location"
        );
        let l = &back.location[back.sample[0].location_id[0] as usize - 1];
        assert_eq!(l.address, addr);
        assert_eq!(names(&back, l), vec!["leaf", "outer"]);
        assert!(l.line.iter().all(|line| line.line > 0), "{l:?}");
        let m = &back.mapping[l.mapping_id as usize - 1];
        assert_eq!(st(m.filename), path);
        assert_eq!(st(m.build_id), hex(&build_id));
        assert_eq!(
            (m.memory_start, m.memory_limit, m.file_offset),
            (BASE, BASE + 0x10_0000, 0)
        );
        assert!(m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames);
    }
}
