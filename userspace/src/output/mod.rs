//! Everything a person or another tool reads, rendered from one [`Profile`]
//! (docs/ARCHITECTURE.md, "Outputs"): flamegraph SVG, collapsed stacks, pprof, speedscope, and report tables.
//!
//! Exporters implement [`ProfileSink`], like ripgrep's printers implement its `Sink`: the
//! profile is built once and pushed into whichever sink the user asked for.

pub mod collapsed;
pub(crate) mod file;
pub mod functions;
pub(crate) mod otlp;
pub mod pprof;
pub(crate) mod report;
pub mod speedscope;
pub mod svg;
pub mod table;

use std::io::Write;

use crate::profile::{Frame, Profile};

/// Why an output could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Writing failed (closed pipe, full disk, ...).
    #[error("cannot write output: {0}")]
    Io(#[from] std::io::Error),
    /// The selected value does not exist in this profile.
    #[error("the profile has no `{name}` values (it has: {available})")]
    NoSuchValue {
        /// The value asked for.
        name: String,
        /// The values present, comma-separated.
        available: String,
    },
    /// `--sort` named no column (or several).
    #[error("cannot sort by `{name}`: columns are {available}")]
    NoSuchColumn {
        /// The name given.
        name: String,
        /// The columns of this report, comma-separated.
        available: String,
    },
    /// Nothing to draw: no sample matched, or every weight is zero.
    #[error("no samples to show (check the --pid/--comm filters and the recording)")]
    Empty,
    /// JSON encoding failed.
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// An output format fed with a whole profile.
pub trait ProfileSink {
    /// Writes `profile` to `out`.
    fn write_profile(&mut self, profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError>;
}

/// Index of the value named `name`, or a clear error listing those present.
pub fn value_index(profile: &Profile, name: &str) -> Result<usize, OutputError> {
    profile
        .value_index(name)
        .ok_or_else(|| OutputError::NoSuchValue {
            name: name.to_string(),
            available: profile
                .value_types
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// How a frame is named in flamegraph-style outputs: inferno's `_[k]` suffix marks kernel
/// frames, `_[j]` JIT-compiled ones (perf's `--jit` convention) and `_[i]` inlined ones
/// (it colours them apart); `;` would split the frame.
pub(crate) fn flame_name(frame: &Frame) -> String {
    let mut name = frame.function.replace([';', '\n'], ":");
    if frame.is_kernel() {
        name.push_str("_[k]");
    } else if matches!(frame.kind, crate::symbolize::FrameKind::Jit(_)) {
        name.push_str("_[j]");
    } else if frame.inlined {
        name.push_str("_[i]");
    }
    name
}

/// Samples merged by (process name, stack), with the summed value; zero values skipped.
///
/// Keys borrow the profile's frame slices, so folding 100k samples hashes integers, not
/// the (often long, demangled) frame names.
pub(crate) fn unique_stacks(profile: &Profile, value: usize) -> Vec<(&str, &[u32], f64)> {
    let mut index: foldhash::HashMap<(&str, &[u32]), usize> = Default::default();
    let mut out: Vec<(&str, &[u32], f64)> = Vec::new();
    for s in &profile.samples {
        let v = s.values.get(value).copied().unwrap_or(0.0);
        if v == 0.0 {
            continue;
        }
        let key = (&*s.labels.comm, s.frames.as_slice());
        match index.get(&key) {
            Some(&i) => out[i].2 += v,
            None => {
                index.insert(key, out.len());
                out.push((key.0, key.1, v));
            }
        }
    }
    out
}

/// Human-readable energy in J with a power in W over `duration_ns`.
pub(crate) fn joules_and_watts(microjoules: f64, duration_ns: u64) -> String {
    let joules = microjoules / 1e6;
    if duration_ns == 0 {
        return format!("{joules:.3} J");
    }
    let watts = joules / (duration_ns as f64 / 1e9);
    format!("{joules:.3} J, {watts:.2} W average")
}

#[cfg(test)]
pub(crate) mod testdata;
