//! The result of attribution: energy per source, per thread and per stack sample, with the
//! idle and unknown rows that make every total add up to the measured energy.

use std::collections::BTreeMap;

use crate::pb::v1::EnergyDomain;

use super::interval::IntervalStats;
use super::regression::{ClassFit, NotIdentifiable};
use super::split::ThreadKey;
use super::static_power::StaticOrigin;

/// Every domain, in proto order.
pub const DOMAINS: [EnergyDomain; 7] = [
    EnergyDomain::DomainUnspecified,
    EnergyDomain::Package,
    EnergyDomain::Cores,
    EnergyDomain::Uncore,
    EnergyDomain::Dram,
    EnergyDomain::Psys,
    EnergyDomain::Gpu,
];

/// Lower-case name of a domain as outputs show it ("package", "dram", ...).
pub fn domain_name(d: EnergyDomain) -> &'static str {
    match d {
        EnergyDomain::DomainUnspecified => "other",
        EnergyDomain::Package => "package",
        EnergyDomain::Cores => "cores",
        EnergyDomain::Uncore => "uncore",
        EnergyDomain::Dram => "dram",
        EnergyDomain::Psys => "psys",
        EnergyDomain::Gpu => "gpu",
    }
}

/// Energy per domain, µJ. Domains overlap (PACKAGE contains CORES), so never sum all of
/// them: use [`Attribution::headline`] for "the" total.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PerDomain(pub [f64; 7]);

impl PerDomain {
    /// Energy of one domain, µJ.
    pub fn get(&self, d: EnergyDomain) -> f64 {
        self.0[d as usize]
    }

    /// Adds to one domain.
    pub fn add(&mut self, d: EnergyDomain, uj: f64) {
        self.0[d as usize] += uj;
    }

    /// Adds another per-domain value.
    pub fn add_all(&mut self, other: &PerDomain) {
        for (a, b) in self.0.iter_mut().zip(other.0) {
            *a += b;
        }
    }

    /// Sum over a set of domains, µJ.
    pub fn sum_of(&self, domains: &[EnergyDomain]) -> f64 {
        domains.iter().map(|&d| self.get(d)).sum()
    }

    /// Non-zero domains with their energy in joules, keyed by [`domain_name`] (the shape of
    /// `"energy_j": {"package": …}` in JSON outputs).
    pub fn joules_by_name(&self) -> BTreeMap<&'static str, f64> {
        DOMAINS
            .iter()
            .filter(|&&d| self.get(d) != 0.0)
            .map(|&d| (domain_name(d), self.get(d) * 1e-6))
            .collect()
    }
}

/// The split a source actually used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerModelUsed {
    /// Equal power per busy CPU-ns (× activity weights).
    #[default]
    Time,
    /// Per-class watts from the regression as split weights.
    Regression,
}

impl PowerModelUsed {
    /// Its name in JSON, on the agent's wire and in metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Time => "time",
            Self::Regression => "regression",
        }
    }
}

/// A regression class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClassLabel {
    /// One process (tgid).
    Process(u32),
    /// Everything else, including unknown time.
    Other,
}

/// One class of the whole-recording fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassReport {
    /// Which class.
    pub label: ClassLabel,
    /// Its watts, standard error, occupancy and identifiability.
    pub fit: ClassFit,
}

impl ClassReport {
    /// Whether the class kept the equal-power prior, and why.
    pub fn fallback(&self) -> Option<NotIdentifiable> {
        self.fit.not_identifiable
    }
}

/// The regression of one source.
#[derive(Clone, Debug, PartialEq)]
pub struct RegressionReport {
    /// Fit over the whole recording (the sliding-window fits weight the split).
    pub classes: Vec<ClassReport>,
    /// Equal-power prior, W per busy CPU.
    pub prior_w: f64,
    /// Condition number of the standardised system.
    pub condition: f64,
    /// Rows (merged intervals) in the fit.
    pub rows: usize,
    /// Their length (at least), ns: the shorter of the counter's 5 updates and
    /// `regression_row_ns` where the fit over it pins the classes down better.
    pub row_ns: u64,
    /// Held-out squared error of the time model and of the regression, J².
    pub heldout_sse_time: f64,
    /// See `heldout_sse_time`.
    pub heldout_sse_regression: f64,
    /// How far the split moved from equal power toward the regression's watts, 0..1 (1:
    /// `--power-model regression`; 0: the time model).
    pub regression_weight: f64,
    /// The watts per class that weight the split (the whole-recording fit's, shrunk and
    /// weighted; with sliding windows, theirs averaged over the class's busy time), W.
    pub split_w: Vec<f64>,
    /// Sliding windows fitted.
    pub windows: usize,
    /// How long before each reading its rows' busy time was taken to end, ns: the counter
    /// lag that predicted held-out rows best.
    pub lag_ns: u64,
}

/// One interval's books (for audits and conservation tests).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IntervalRow {
    /// Interval start, ns.
    pub start_ns: u64,
    /// Interval end, ns.
    pub end_ns: u64,
    /// Measured delta, µJ.
    pub measured_uj: f64,
    /// Given to threads, µJ.
    pub attributed_uj: f64,
    /// Idle/static row, µJ.
    pub idle_uj: f64,
    /// Unknown row, µJ.
    pub unknown_uj: f64,
}

/// Attribution of one energy source.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceAttribution {
    /// `EnergySource.id`.
    pub source_id: u32,
    /// Its domain.
    pub domain: EnergyDomain,
    /// Package id or GPU index.
    pub package: u32,
    /// Human-readable name.
    pub name: String,
    /// Modelled energy: label it "estimated".
    pub estimated: bool,
    /// Measured energy over kept intervals, µJ.
    pub measured_uj: f64,
    /// Given to threads, µJ.
    pub attributed_uj: f64,
    /// Idle/static row, µJ.
    pub idle_uj: f64,
    /// Unknown row, µJ.
    pub unknown_uj: f64,
    /// Static power used, W.
    pub static_w: f64,
    /// Where it came from.
    pub static_origin: StaticOrigin,
    /// Lowest interval power, W: static power is never above it.
    pub static_bound_w: f64,
    /// The static power asked for (given, calibrated, model), W, when it was above
    /// `static_bound_w` and lowered to it.
    pub static_clamped_from_w: Option<f64>,
    /// Split actually used.
    pub power_model: PowerModelUsed,
    /// Why the model differs from the one asked for, when it does.
    pub power_model_note: Option<String>,
    /// Set when the time split and the regression's split of this source disagree beyond
    /// their intervals: how far apart they are.
    pub power_model_uncertain: Option<ModelDisagreement>,
    /// The regression, when one was fitted.
    pub regression: Option<RegressionReport>,
    /// Dropped and merged intervals.
    pub interval_stats: IntervalStats,
    /// Every kept interval.
    pub intervals: Vec<IntervalRow>,
}

/// How far the time split and the regression's split of a source are apart, for a source
/// where the two models (the regression with its interval) leave a process's energy open
/// by more than 25%.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelDisagreement {
    /// The class whose energy differs most between the two models.
    pub class: ClassLabel,
    /// Its energy under the time split and under the regression, J.
    pub time_j: f64,
    /// See `time_j`.
    pub regression_j: f64,
    /// Half-width of the regression's 95% interval of that energy, J.
    pub regression_ci_j: f64,
    /// Their difference relative to the smaller of the two, %.
    pub apart_pct: f64,
    /// The split's relative weight on the regression, 0..1 (see the blend in apportion).
    pub regression_weight: f64,
}

/// Energy of one thread.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadEnergy {
    /// Process id.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// Thread name (empty when unknown).
    pub comm: String,
    /// cgroup v2 id (0 when unknown).
    pub cgroup_id: u64,
    /// Exact on-CPU time over the timeline, ns.
    pub cpu_ns: u64,
    /// Energy per domain, µJ (stack samples + `no_stack`).
    pub energy: PerDomain,
    /// Stack samples of the thread.
    pub samples: u64,
    /// Energy no stack sample could carry (no sample in its window, or GPU energy), µJ:
    /// flamegraphs show it as a `[no stack sample]` frame under the thread.
    pub no_stack: PerDomain,
    /// Standard error of `energy` from the model (fitted per-class watts, estimated static
    /// power), µJ (`super::uncertainty`); threads of one process err together.
    pub model_sd: PerDomain,
}

/// The whole attribution.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attribution {
    /// Per source.
    pub sources: Vec<SourceAttribution>,
    /// Per thread, most energy first.
    pub threads: Vec<ThreadEnergy>,
    /// Idle/static row per domain, µJ.
    pub idle: PerDomain,
    /// Unknown-time row per domain, µJ.
    pub unknown: PerDomain,
    /// Measured per domain, µJ.
    pub measured: PerDomain,
    /// Energy per input sample, aligned with `Input::samples`, µJ.
    pub sample_energy: Vec<PerDomain>,
    /// Thread of each input sample.
    pub sample_thread: Vec<ThreadKey>,
    /// The domains whose sum is "the" energy (no double counting).
    pub headline: Vec<EnergyDomain>,
    /// True when any source is modelled.
    pub estimated: bool,
}

impl Attribution {
    /// Measured headline energy, µJ.
    pub fn total_uj(&self) -> f64 {
        self.measured.sum_of(&self.headline)
    }

    /// Headline energy of a per-domain value, µJ.
    pub fn headline_uj(&self, e: &PerDomain) -> f64 {
        e.sum_of(&self.headline)
    }

    /// The time the headline energy was measured over, ns: the longest span a headline
    /// source's intervals cover. A slow counter's head (before its first update seen) and
    /// tail (after its last) are not in its energy, so they are not in this span either;
    /// average power is the energy over it, not over the recording. None without intervals.
    pub fn measured_span_ns(&self) -> Option<u64> {
        self.sources
            .iter()
            .filter(|s| self.headline.contains(&s.domain))
            .map(|s| s.intervals.iter().map(|iv| iv.end_ns - iv.start_ns).sum())
            .filter(|&ns: &u64| ns > 0)
            .max()
    }

    /// The span average power is taken over in a window of `window_ns`: the measured span
    /// ([`Self::measured_span_ns`]) within the window, else the window; at least 1 ns.
    pub fn power_span_ns(&self, window_ns: u64) -> u64 {
        let window_ns = window_ns.max(1);
        self.measured_span_ns()
            .unwrap_or(window_ns)
            .clamp(1, window_ns)
    }

    /// The split used by the sources: "regression" if any source used it, else "time".
    pub fn power_model(&self) -> PowerModelUsed {
        if self
            .sources
            .iter()
            .any(|s| s.power_model == PowerModelUsed::Regression)
        {
            PowerModelUsed::Regression
        } else {
            PowerModelUsed::Time
        }
    }
}

/// The domains that add up to the machine's energy without double counting: PSYS when
/// present (it contains the package and DRAM), else PACKAGE (or CORES + UNCORE) + DRAM;
/// GPUs always; unspecified domains when nothing else is present.
pub fn headline_domains(present: &[EnergyDomain]) -> Vec<EnergyDomain> {
    let has = |d| present.contains(&d);
    let mut out = Vec::new();
    if has(EnergyDomain::Psys) {
        out.push(EnergyDomain::Psys);
    } else {
        if has(EnergyDomain::Package) {
            out.push(EnergyDomain::Package);
        } else {
            out.extend(
                [EnergyDomain::Cores, EnergyDomain::Uncore]
                    .into_iter()
                    .filter(|&d| has(d)),
            );
        }
        if has(EnergyDomain::Dram) {
            out.push(EnergyDomain::Dram);
        }
    }
    if has(EnergyDomain::Gpu) {
        out.push(EnergyDomain::Gpu);
    }
    if out.is_empty() && has(EnergyDomain::DomainUnspecified) {
        out.push(EnergyDomain::DomainUnspecified);
    }
    out
}

impl SourceAttribution {
    /// The lines saying which static power this source used and where it came from, plus
    /// the unidentified and collinear warnings: the header lines of reports, `top` and
    /// other text outputs. None for a GPU, whose idle power is its own row.
    pub fn static_notes(&self) -> Vec<String> {
        let s = self;
        let mut lines = Vec::new();
        if s.domain == EnergyDomain::Gpu {
            return lines;
        }
        let detail = match &s.static_origin {
            StaticOrigin::Calibrated { date, file } if file.is_empty() => {
                format!("calibrated {date}, from the recording")
            }
            StaticOrigin::Calibrated { date, file } => format!("calibrated {date}, {file}"),
            StaticOrigin::Learned {
                intervals,
                span_s,
                fit,
            } => format!(
                "learned from {intervals} quiet intervals over {}, 95% interval {:.2}–{:.2} W",
                span_text(*span_s),
                fit.ci_low_w.max(0.0),
                fit.ci_high_w
            ),
            StaticOrigin::Extrapolated { fit } => format!(
                "extrapolated to zero load, 95% interval {:.2}–{:.2} W",
                fit.ci_low_w.max(0.0),
                fit.ci_high_w
            ),
            StaticOrigin::Host => {
                "from the host: this VM's share of the host's static power".to_owned()
            }
            other => other.kind().replace('_', " "),
        };
        let clamped = s
            .static_clamped_from_w
            .map(|w| format!("; {w:.2} W asked, above the quietest interval"))
            .unwrap_or_default();
        lines.push(format!(
            "static power {}: {:.2} W ({detail}{clamped})",
            s.name, s.static_w
        ));
        lines.extend(s.static_origin.warning());
        lines.extend(collinear_warning(s));
        lines.extend(s.power_model_line());
        lines
    }

    /// The line saying the power model is uncertain and how far apart the models are, when
    /// they disagree beyond their intervals.
    pub fn power_model_line(&self) -> Option<String> {
        let d = self.power_model_uncertain.as_ref()?;
        let who = match d.class {
            ClassLabel::Process(pid) => format!("pid {pid}"),
            ClassLabel::Other => "other processes".into(),
        };
        Some(format!(
            "power model uncertain on {}: {who} gets {:.2} J split by time and {:.2} ± {:.2} J \
             by regression ({:.0}% apart); the split weights the regression {:.0}% and the \
             per-process intervals cover both",
            self.name,
            d.time_j,
            d.regression_j,
            d.regression_ci_j,
            d.apart_pct,
            d.regression_weight * 100.0
        ))
    }
}

/// The warning when the regression found classes whose watts it cannot tell apart: they
/// always ran together (classes never mix), so only their combined power is known.
fn collinear_warning(s: &SourceAttribution) -> Option<String> {
    let reg = s.regression.as_ref()?;
    let names: Vec<String> = reg
        .classes
        .iter()
        .filter(|c| c.fit.not_identifiable == Some(NotIdentifiable::Collinear))
        .map(|c| match c.label {
            ClassLabel::Process(pid) => format!("pid {pid}"),
            ClassLabel::Other => "other processes".into(),
        })
        .collect();
    (!names.is_empty()).then(|| {
        format!(
            "per-class watts not identifiable on {} for {}: they always ran together (the \
             classes never mix), so they share one fitted power per CPU-second; run them \
             apart for part of the recording to tell their watts apart",
            s.name,
            names.join(", ")
        )
    })
}

/// A time span in words: `40 s`, `12 min`, `3.5 h`, `2.0 d`.
fn span_text(secs: f64) -> String {
    if secs < 120.0 {
        format!("{secs:.0} s")
    } else if secs < 7200.0 {
        format!("{:.0} min", secs / 60.0)
    } else if secs < 172_800.0 {
        format!("{:.1} h", secs / 3600.0)
    } else {
        format!("{:.1} d", secs / 86_400.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headline_never_double_counts() {
        use EnergyDomain::*;
        assert_eq!(
            headline_domains(&[Package, Cores, Dram]),
            vec![Package, Dram]
        );
        assert_eq!(
            headline_domains(&[Psys, Package, Dram, Gpu]),
            vec![Psys, Gpu]
        );
        assert_eq!(headline_domains(&[Cores, Uncore]), vec![Cores, Uncore]);
        assert_eq!(headline_domains(&[]), Vec::<EnergyDomain>::new());
    }

    #[test]
    fn joules_by_name_skips_empty_domains() {
        let mut e = PerDomain::default();
        e.add(EnergyDomain::Package, 2.5e6);
        e.add(EnergyDomain::Dram, 5e5);
        let m = e.joules_by_name();
        assert_eq!(m.len(), 2);
        assert!((m["package"] - 2.5).abs() < 1e-12 && (m["dram"] - 0.5).abs() < 1e-12);
    }
}
