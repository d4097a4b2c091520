//! speedscope JSON (<https://www.speedscope.app/file-format-schema.json>): one "sampled"
//! profile, identical stacks merged, weighted by one value; the process name is the root.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use serde::Serialize;

use super::{OutputError, ProfileSink, svg, unique_stacks, value_index};
use crate::profile::Profile;

/// Writes a speedscope file weighted by one value.
pub struct Speedscope {
    /// Name of the value to weight by.
    pub value: String,
}

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared<'a>,
    profiles: Vec<Sampled>,
    name: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: u32,
    exporter: String,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<FrameJson<'a>>,
}

#[derive(Serialize)]
struct FrameJson<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct Sampled {
    r#type: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: f64,
    #[serde(rename = "endValue")]
    end_value: f64,
    samples: Vec<Vec<usize>>,
    weights: Vec<f64>,
}

impl ProfileSink for Speedscope {
    fn write_profile(&mut self, profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
        let value = value_index(profile, &self.value)?;
        let mut frames: Vec<FrameJson<'_>> = profile
            .frames
            .iter()
            .map(|f| FrameJson {
                name: &f.function,
                file: f.file.as_deref(),
                line: f.line,
            })
            .collect();
        // Process names become root frames after the code frames.
        let mut comm_frames: HashMap<&str, usize> = HashMap::new();
        let mut stacks: BTreeMap<Vec<usize>, f64> = BTreeMap::new();
        for (comm, ids, v) in unique_stacks(profile, value) {
            let root = *comm_frames.entry(comm).or_insert_with(|| {
                frames.push(FrameJson {
                    name: comm,
                    file: None,
                    line: None,
                });
                frames.len() - 1
            });
            let mut stack = Vec::with_capacity(ids.len() + 1);
            stack.push(root);
            stack.extend(ids.iter().rev().map(|&f| f as usize));
            *stacks.entry(stack).or_insert(0.0) += v;
        }
        if stacks.is_empty() {
            return Err(OutputError::Empty);
        }
        let total: f64 = stacks.values().sum();
        let unit = match profile.value_types[value].unit.as_str() {
            "nanoseconds" => "nanoseconds",
            // speedscope has no energy unit: "none" shows the raw µJ numbers.
            _ => "none",
        };
        let (title, _) = svg::title(profile, value);
        let (samples, weights) = stacks.into_iter().unzip();
        let file = File {
            schema: "https://www.speedscope.app/file-format-schema.json",
            shared: Shared { frames },
            profiles: vec![Sampled {
                r#type: "sampled",
                name: title.clone(),
                unit,
                start_value: 0.0,
                end_value: total,
                samples,
                weights,
            }],
            name: title,
            active_profile_index: 0,
            exporter: "energy-bpf".to_string(),
        };
        serde_json::to_writer(&mut *out, &file)?;
        writeln!(out)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testdata;

    #[test]
    fn matches_golden_file() {
        let mut out = Vec::new();
        Speedscope {
            value: "energy_package".into(),
        }
        .write_profile(&testdata::profile(), &mut out)
        .expect("write");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
        let p = &v["profiles"][0];
        assert_eq!(p["type"], "sampled");
        assert_eq!(p["samples"].as_array().map(Vec::len), Some(5));
        let weights: f64 = p["weights"]
            .as_array()
            .expect("weights")
            .iter()
            .filter_map(|w| w.as_f64())
            .sum();
        assert!((weights - 950_000.2).abs() < 1e-6);
        testdata::assert_golden("speedscope.json", &out);
    }
}
