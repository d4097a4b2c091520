//! The one typed profile model every output reads (docs/ARCHITECTURE.md, "Data flow").
//!
//! A [`Profile`] holds interned [`Frame`]s and [`ProfileSample`]s (leaf-first frame ids, one
//! value per [`ValueType`], labels). Each sample also lists its [`Location`]s: the sampled
//! addresses, each with its inline chain of frames and the [`ProfileMapping`] it lies in, for
//! outputs that keep addresses (pprof). [`build`] makes one from [`Stacks`] (a
//! [`Recording`](crate::record::Recording)'s, or the agent's windows') plus
//! per-sample weights ([`SampleValues`]): CPU time and energy per domain from the
//! attribution — the builder does not care which.

mod build;
mod interner;
mod stacks;

pub use build::{Filter, build, build_leaves, build_prefetched, needed, prefetch};
pub use stacks::Stacks;

use std::sync::Arc;

pub use crate::symbolize::{Frame, FrameKind, JitRuntime};

/// Index of a frame in [`Profile::frames`].
pub(crate) type FrameId = u32;

/// Index of a location in [`Profile::locations`].
pub(crate) type LocationId = u32;

/// File name of the kernel's [`ProfileMapping`], as perf and pprof name it.
pub const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// Name of the value every profile carries first: 1 per stack sample.
pub(crate) const SAMPLES: &str = "samples";
/// Name of the CPU-time value.
pub const CPU: &str = "cpu";
/// Function name of the synthetic frame carrying thread energy without a stack sample.
pub(crate) const NO_STACK_SAMPLE: &str = "[no stack sample]";
/// The frame of every caller in a profile built by [`build_leaves`].
pub(crate) const NOT_SYMBOLIZED: &str = "[caller, not symbolized]";

/// Where sampled addresses lie: one executable mapping of one process (as recorded), or
/// the kernel ([`KERNEL_MAPPING`], spanning the kernel addresses sampled).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileMapping {
    /// First virtual address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// File offset mapped at `start` (`start` itself for the kernel, as perf has it: a
    /// kernel address is its own offset).
    pub file_offset: u64,
    /// Path of the mapped file, or [`KERNEL_MAPPING`].
    pub path: String,
    /// GNU build-id recorded for the file (empty when unknown).
    pub build_id: Vec<u8>,
}

/// One sampled address and the frames it symbolizes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    /// Index in [`Profile::mappings`]; `None` when no recorded mapping holds the address,
    /// and for synthetic frames.
    pub mapping: Option<u32>,
    /// Virtual address as symbolized: a caller's return address minus one; 0 for synthetic
    /// frames.
    pub address: u64,
    /// Frames at the address: innermost inlined function first, the function that
    /// contains the code last (the frames' order within a sample's `frames`).
    pub frames: Vec<FrameId>,
}

/// What a value measures, pprof style: e.g. (`energy_package`, `microjoules`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueType {
    /// `samples`, `cpu`, `energy_package`, `energy_dram`, `energy_gpu`, ...
    pub name: String,
    /// `count`, `nanoseconds`, `microjoules`.
    pub unit: String,
}

impl ValueType {
    /// A value type from its name and unit.
    pub fn new(name: &str, unit: &str) -> Self {
        Self {
            name: name.to_string(),
            unit: unit.to_string(),
        }
    }

    /// The value type of energy in one domain (`package`, `dram`, `gpu`, ...), in µJ.
    pub fn energy(domain: &str) -> Self {
        Self::new(&format!("energy_{domain}"), "microjoules")
    }
}

/// Who a sample belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    /// Process id (tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub comm: Arc<str>,
    /// CPU the sample was taken on (`None` for residual entries).
    pub cpu: Option<u32>,
    /// cgroup id (0 when unknown).
    pub cgroup: u64,
}

/// One weighted stack.
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileSample {
    /// Frame ids, leaf first (kernel frames, then user frames).
    pub frames: Vec<FrameId>,
    /// The same stack by address, leaf first: the frames of these locations, in order, are
    /// `frames`.
    pub locations: Vec<LocationId>,
    /// One value per [`Profile::value_types`].
    pub values: Vec<f64>,
    /// Process, thread, CPU, cgroup.
    pub labels: Labels,
}

/// Facts about the whole profile, for titles and headers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileMeta {
    /// Short title, e.g. the host name.
    pub title: String,
    /// Sum of each value over all samples (same order as the value types).
    pub totals: Vec<f64>,
    /// Capture length, ns.
    pub duration_ns: u64,
    /// True when any energy is modelled: every output says `estimated`.
    pub estimated: bool,
    /// Energy source description (e.g. "powercap", "model").
    pub source: String,
    /// Stack sampling rate, Hz.
    pub sample_hz: u32,
    /// Wall-clock start of the capture, ns since the epoch.
    pub start_unix_ns: u64,
    /// Events the kernel dropped during capture (switches, samples, process events):
    /// every output that can says so, since they make the picture incomplete.
    pub lost_events: u64,
    /// How user stacks were walked (`UnwindCounts::label`), empty without samples.
    pub unwind: String,
    /// The estimated model's power-table row, when its parameters came from the table.
    pub model_row: String,
    /// That row's error, % (0: none).
    pub model_error_pct: f64,
}

/// A symbolized, weighted profile.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Title, totals, duration, estimated flag.
    pub meta: ProfileMeta,
    /// What each sample value measures; `samples/count` first.
    pub value_types: Vec<ValueType>,
    /// Interned frames.
    pub frames: Vec<Frame>,
    /// Sampled addresses, one per (mapping, address).
    pub locations: Vec<Location>,
    /// Mappings the locations lie in.
    pub mappings: Vec<ProfileMapping>,
    /// Weighted stacks.
    pub samples: Vec<ProfileSample>,
}

impl Profile {
    /// Index of the value named `name` (e.g. `energy_package`).
    pub fn value_index(&self, name: &str) -> Option<usize> {
        self.value_types.iter().position(|v| v.name == name)
    }

    /// Adds `co2e_<zone>` (nanograms) beside the energy value `energy` (`energy_<zone>`,
    /// µJ): each sample's energy times `ng_per_uj` (1e3 × grams per joule). Returns the new
    /// value's name; `None` when `energy` is not an energy value of this profile.
    pub fn add_co2e(&mut self, energy: &str, ng_per_uj: f64) -> Option<String> {
        let zone = energy.strip_prefix("energy_")?;
        let k = self.value_index(energy)?;
        let name = format!("co2e_{zone}");
        self.value_types.push(ValueType {
            name: name.clone(),
            unit: "nanograms".into(),
        });
        for s in &mut self.samples {
            let v = s.values.get(k).copied().unwrap_or(0.0) * ng_per_uj;
            s.values.push(v);
        }
        self.recompute_totals();
        Some(name)
    }

    /// Recomputes [`ProfileMeta::totals`] from the samples.
    pub(crate) fn recompute_totals(&mut self) {
        let mut totals = vec![0.0; self.value_types.len()];
        for s in &self.samples {
            for (t, v) in totals.iter_mut().zip(&s.values) {
                *t += v;
            }
        }
        self.meta.totals = totals;
    }
}

/// Thread energy (or other values) with no stack sample to carry it.
#[derive(Clone, Debug, PartialEq)]
pub struct Residual {
    /// Process id.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// One value per [`SampleValues::value_types`].
    pub values: Vec<f64>,
}

/// Per-sample weights that a profile is built from (attribution's output, or CPU time).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleValues {
    /// What each value measures (not including `samples/count`, which the builder adds).
    pub value_types: Vec<ValueType>,
    /// `values[i * value_types.len() + k]` = value k of `rec.samples[i]`.
    pub values: Vec<f64>,
    /// Thread values without samples, shown as `[no stack sample]` under the thread.
    pub residuals: Vec<Residual>,
    /// True when any value is modelled energy.
    pub estimated: bool,
    /// Energy source description for titles.
    pub source: String,
    /// The estimated model's power-table row, when its parameters came from the table.
    pub model_row: String,
    /// That row's error, % (0: none).
    pub model_error_pct: f64,
}

impl SampleValues {
    /// CPU-time weights: each sample stands for one sampling period, 1e9 / sample_hz ns.
    pub fn cpu_time<'a>(input: impl Into<Stacks<'a>>) -> Self {
        let rec: Stacks<'a> = input.into();
        let period_ns = 1e9 / f64::from(rec.sample_hz.max(1));
        Self {
            value_types: vec![ValueType::new(CPU, "nanoseconds")],
            values: vec![period_ns; rec.samples.len()],
            residuals: Vec::new(),
            estimated: false,
            source: "cpu time".to_string(),
            model_row: String::new(),
            model_error_pct: 0.0,
        }
    }

    /// Values of sample `i` (empty when the weights do not cover it).
    pub fn row(&self, i: usize) -> &[f64] {
        let n = self.value_types.len();
        self.values.get(i * n..(i + 1) * n).unwrap_or(&[])
    }
}
