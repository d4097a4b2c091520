//! Attribution: timeline + stack samples + energy readings + topology → joules per source,
//! thread, process, cgroup, command and stack sample (docs/ARCHITECTURE.md, "Attribution").
//!
//! PURE: no aya, sysfs, clocks or files; a function of its inputs, tested with tables and
//! property tests and checked against the simulator (`sim`, behind `test-support`) for accuracy.
//!
//! Pipeline per energy source: cut time into reading intervals (`interval`); per interval,
//! set the static share aside and split the rest across the threads that ran on the
//! source's CPUs by activity-weighted busy time (`split`, TProf), optionally weighted by
//! per-class watts fitted by regression (`regression`, StarPU least squares); push each thread's
//! energy onto its stack samples (`samples`, ALEA); aggregate with confidence
//! intervals (`attribution`, `ci`). Conservation is the hard invariant: for every interval
//! and domain, attributed + idle + unknown = measured.

pub(crate) mod activity;
mod apportion;
pub(crate) mod attribution;
pub(crate) mod calibrate;
pub(crate) mod ci;
pub(crate) mod history;
pub(crate) mod interval;
pub(crate) mod linalg;
pub(crate) mod load;
pub(crate) mod regression;
pub(crate) mod samples;
pub(crate) mod smt;
pub(crate) mod split;
pub(crate) mod static_power;
pub(crate) mod tally;
pub(crate) mod uncertainty;
pub(crate) mod zero_load;

#[cfg(test)]
mod activity_tests;
#[cfg(test)]
mod idle_tests;
#[cfg(test)]
mod power_model_tests;
#[cfg(test)]
mod static_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};

use crate::pb::v1::{Cpu, EnergyDomain, EnergyReading, EnergySource, Sample, ThreadInfo};
use crate::timeline::Timeline;

pub use activity::{ActivityUsed, ActivityWeights};
pub use attribution::{
    Attribution, ClassLabel, IntervalRow, PerDomain, PowerModelUsed, RegressionReport,
    SourceAttribution, ThreadEnergy, domain_name,
};
pub use ci::{Estimate, estimate_samples};
pub use history::{LIVE_HORIZON, SharedHistory};
pub(crate) use split::ThreadKey;
pub use static_power::{Calibrated, Learned, StaticOrigin, source_key};
pub use zero_load::Unidentified;

/// What attribution reads. All slices may be in any order.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// Who ran on each CPU when.
    pub timeline: &'a Timeline,
    /// Stack samples; the output's per-sample energy is aligned with this slice.
    pub samples: &'a [Sample],
    /// Energy sources in use.
    pub sources: &'a [EnergySource],
    /// Their readings (cumulative, unwrapped µJ).
    pub readings: &'a [EnergyReading],
    /// CPU topology (empty: every timeline CPU belongs to every domain).
    pub cpus: &'a [Cpu],
    /// Thread names and cgroups (may be empty).
    pub threads: &'a [ThreadInfo],
    /// Activity weights from the runs' counts (cycles where the PMU has them, see
    /// `activity`); `None` splits by busy time.
    pub activity: Option<&'a ActivityWeights>,
}

/// Where idle/static energy goes (`--idle`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdlePolicy {
    /// Its own row, like Kepler's idle power.
    #[default]
    Separate,
    /// Spread over the busy threads by busy time, like PowerJoular.
    Proportional,
}

/// How dynamic energy is weighted between threads (`--power-model`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerModel {
    /// Equal power per busy CPU-ns.
    Time,
    /// Per-class watts from the regression, wherever a source can be fitted.
    Regression,
    /// Regression where it predicts held-out intervals better than time, else time.
    #[default]
    Auto,
}

/// Everything that tunes attribution.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Idle/static policy.
    pub idle: IdlePolicy,
    /// Static power per source id, W (calibration or config); wins over everything.
    pub static_w_by_source: BTreeMap<u32, f64>,
    /// Static power for every PACKAGE and PSYS source not in `static_w_by_source`, W.
    pub static_w: Option<f64>,
    /// Static power measured by `energy-bpf calibrate`, per [`static_power::source_key`]
    /// (used after `static_w_by_source` and `static_w`).
    pub calibrated: BTreeMap<String, Calibrated>,
    /// Static power the agent learned, per [`static_power::source_key`] (used after
    /// `calibrated`: a calibration file wins).
    pub learned: BTreeMap<String, Learned>,
    /// Percentile of GPU interval power used as the GPU's online static estimate, 0..100.
    pub static_percentile: f64,
    /// Power model.
    pub power_model: PowerModel,
    /// Regression classes: this many busiest processes per source, plus "other".
    pub regression_classes: usize,
    /// Regression rows are intervals merged to at least this long, ns (StarPU least squares: 50 ms), or
    /// to five counter updates where that is shorter (see `zero_load::FIT_UPDATES`).
    pub regression_row_ns: u64,
    /// Sliding window of the regression, ns, and the stride at which it is refitted.
    pub regression_window_ns: u64,
    /// See `regression_window_ns`.
    pub regression_stride_ns: u64,
    /// Solver tuning.
    pub fit: regression::FitOptions,
    /// Stack windows span at least this long, ns (0: one interval).
    pub stack_window_ns: u64,
    /// Power a second busy SMT sibling adds, as a share of one thread's (`smt`).
    pub smt_sibling_extra: f64,
    /// Rows of past windows (a live view's): with `auto`, each window's regression is fitted
    /// on them, its own included, instead of on its own seconds (`attribute::history`).
    pub history: Option<SharedHistory>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            idle: IdlePolicy::Separate,
            static_w_by_source: BTreeMap::new(),
            static_w: None,
            calibrated: BTreeMap::new(),
            learned: BTreeMap::new(),
            static_percentile: 5.0,
            power_model: PowerModel::Auto,
            regression_classes: 8,
            regression_row_ns: 50_000_000,
            regression_window_ns: 30_000_000_000,
            regression_stride_ns: 5_000_000_000,
            fit: regression::FitOptions::default(),
            stack_window_ns: 1_000_000_000,
            smt_sibling_extra: 0.2,
            history: None,
        }
    }
}

impl Options {
    /// These options for a live view (`top`, its replay, the agent): `auto` fits each
    /// window's split on the rows of the last [`LIVE_HORIZON`] of windows, where a window
    /// alone holds seconds (`attribute::history`).
    #[must_use]
    pub fn live(mut self) -> Self {
        if self.power_model == PowerModel::Auto {
            self.history = Some(SharedHistory::new(LIVE_HORIZON));
        }
        self
    }
}

/// Attributes every source's energy (docs/ARCHITECTURE.md, "Attribution").
pub fn attribute(input: &Input<'_>, opts: &Options) -> Attribution {
    let n_samples = input.samples.len();
    let mut sample_energy = vec![PerDomain::default(); n_samples];
    let sample_thread: Vec<ThreadKey> = input.samples.iter().map(|s| (s.tgid, s.tid)).collect();
    let mut threads: BTreeMap<ThreadKey, ThreadEnergy> = BTreeMap::new();
    let (mut idle, mut unknown, mut measured) = (
        PerDomain::default(),
        PerDomain::default(),
        PerDomain::default(),
    );
    let mut sources = Vec::with_capacity(input.sources.len());
    let mut sorted_sources: Vec<&EnergySource> = input.sources.iter().collect();
    sorted_sources.sort_by_key(|s| s.id);
    // Threads interned once for every source's tallies.
    let index = tally::ThreadIndex::new(input.timeline);
    for source in sorted_sources {
        let out = apportion::run_source(input, &index, opts, source);
        let d = out.report.domain;
        idle.add(d, out.report.idle_uj);
        unknown.add(d, out.report.unknown_uj);
        measured.add(d, out.report.measured_uj);
        for (idx, uj) in out.sample_uj {
            sample_energy[idx].add(d, uj);
            let t = threads.entry(sample_thread[idx]).or_default();
            t.energy.add(d, uj);
            t.model_sd
                .add(d, uj * out.relative_error.of(sample_thread[idx].0));
        }
        for (key, uj) in out.residual {
            let t = threads.entry(key).or_default();
            t.energy.add(d, uj);
            t.no_stack.add(d, uj);
            t.model_sd.add(d, uj * out.relative_error.of(key.0));
        }
        sources.push(out.report);
    }
    fill_thread_facts(input, &mut threads);
    // A counter that measured nothing (a hypervisor exposing a PSYS event that never moves)
    // must not hide the domains that did measure something from the headline.
    let measuring: Vec<EnergyDomain> = sources
        .iter()
        .filter(|s| s.measured_uj > 0.0)
        .map(|s| s.domain)
        .collect();
    let present: Vec<EnergyDomain> = if measuring.is_empty() {
        sources.iter().map(|s| s.domain).collect()
    } else {
        measuring
    };
    let headline = attribution::headline_domains(&present);
    // Most energy first, then by tid, ties in key order (a stable sort): the order sorted as
    // (headline energy, tid, position), each thread's energy summed once and no thread
    // moved until its place is known.
    let threads: Vec<ThreadEnergy> = threads.into_values().collect();
    let mut order: Vec<(f64, u32, usize)> = threads
        .iter()
        .enumerate()
        .map(|(i, t)| (t.energy.sum_of(&headline), t.tid, i))
        .collect();
    order.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let mut slots: Vec<Option<ThreadEnergy>> = threads.into_iter().map(Some).collect();
    let threads: Vec<ThreadEnergy> = order
        .iter()
        .filter_map(|&(_, _, i)| slots[i].take())
        .collect();
    Attribution {
        estimated: sources.iter().any(|s| s.estimated),
        sources,
        threads,
        idle,
        unknown,
        measured,
        sample_energy,
        sample_thread,
        headline,
    }
}

/// Ids, on-CPU time, sample counts, names and cgroups of every thread seen anywhere.
fn fill_thread_facts(input: &Input<'_>, threads: &mut BTreeMap<ThreadKey, ThreadEnergy>) {
    let tl = input.timeline;
    // Summed per thread flat first (a window has many runs per thread), then added to the
    // ordered map once per thread: the same integer sums, and the same last non-zero
    // cgroup id, as adding run by run.
    for (key, ns, cgroup_id) in tl.busy_by_thread(&|_| false, &mut Vec::new(), None) {
        let t = threads.entry(key).or_default();
        t.cpu_ns += ns;
        if cgroup_id != 0 {
            t.cgroup_id = cgroup_id;
        }
    }
    for s in input.samples {
        if s.tid != crate::timeline::IDLE_TID && s.tid != crate::timeline::UNKNOWN_TID {
            threads.entry((s.tgid, s.tid)).or_default().samples += 1;
        }
    }
    let mut info: Vec<&ThreadInfo> = input.threads.iter().collect();
    info.sort_by_key(|i| i.ts_ns); // the latest name wins
    let by_tid: HashMap<u32, &ThreadInfo> = info.into_iter().map(|i| (i.tid, i)).collect();
    for (&(tgid, tid), t) in threads.iter_mut() {
        t.tgid = tgid;
        t.tid = tid;
        if let Some(i) = by_tid.get(&tid).filter(|i| i.tgid == tgid) {
            t.comm.clone_from(&i.comm);
            if t.cgroup_id == 0 {
                t.cgroup_id = i.cgroup_id;
            }
        }
    }
}
