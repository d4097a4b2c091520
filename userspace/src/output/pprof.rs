//! pprof output (`perftools.profiles`, DESIGN.md §5): multi-valued samples (`samples/count`,
//! `cpu/nanoseconds`, `energy_<domain>/microjoules`), labels pid, tid, comm, cpu, cgroup,
//! mappings/locations/functions with file names and lines, gzip-compressed as pprof writes.

use std::collections::HashMap;
use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::{OutputError, ProfileSink};
use crate::pb::pprof;
use crate::profile::Profile;

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

    // One mapping per module, one function per (name, file), one location per frame.
    let mut mapping_ids: HashMap<&str, u64> = HashMap::new();
    let mut function_ids: HashMap<(&str, Option<&str>), u64> = HashMap::new();
    for (i, f) in profile.frames.iter().enumerate() {
        let next_mapping = mapping_ids.len() as u64 + 1;
        let mapping_id = *mapping_ids.entry(f.module.as_str()).or_insert_with(|| {
            out.mapping.push(pprof::Mapping {
                id: next_mapping,
                filename: strings.id(&f.module),
                has_functions: true,
                has_filenames: true,
                has_line_numbers: true,
                has_inline_frames: true,
                ..Default::default()
            });
            next_mapping
        });
        let next_function = function_ids.len() as u64 + 1;
        let function_id = *function_ids
            .entry((f.function.as_str(), f.file.as_deref()))
            .or_insert_with(|| {
                let name = strings.id(&f.function);
                out.function.push(pprof::Function {
                    id: next_function,
                    name,
                    system_name: name,
                    filename: strings.id(f.file.as_deref().unwrap_or("")),
                    start_line: 0,
                });
                next_function
            });
        out.location.push(pprof::Location {
            id: i as u64 + 1,
            mapping_id,
            address: 0,
            line: vec![pprof::Line {
                function_id,
                line: i64::from(f.line.unwrap_or(0)),
                column: 0,
            }],
            is_folded: f.inlined,
        });
    }

    let keys = ["pid", "tid", "comm", "cpu", "cgroup"].map(|k| strings.id(k));
    // Samples with the same stack and labels merge (values summed), as pprof itself does:
    // far fewer, smaller messages to encode and compress.
    type Key<'p> = (&'p [u32], u32, u32, &'p str, Option<u32>, u64);
    let mut merged: foldhash::HashMap<Key<'_>, usize> = Default::default();
    let mut sums: Vec<(Key<'_>, Vec<f64>)> = Vec::new();
    for s in &profile.samples {
        let l = &s.labels;
        let key = (s.frames.as_slice(), l.pid, l.tid, &*l.comm, l.cpu, l.cgroup);
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
    for ((frames, pid, tid, comm, cpu, cgroup), values) in sums {
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
            location_id: frames.iter().map(|&f| u64::from(f) + 1).collect(),
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
        // Leaf first: the inlined `square` inside `hot_heavy`.
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
}
