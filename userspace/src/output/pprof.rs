//! pprof output (`perftools.profiles`, docs/ARCHITECTURE.md, "Outputs"): multi-valued samples (`samples/count`,
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
pub(crate) fn to_pprof(profile: &Profile, default_value: Option<&str>) -> pprof::Profile {
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
    if !profile.meta.unwind.is_empty() {
        out.comment.push(strings.id(&profile.meta.unwind));
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
#[path = "pprof_tests.rs"]
mod tests;
