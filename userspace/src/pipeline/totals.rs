//! Machine-wide figures of a window ([`Totals`]): energy measured, idle and unknown, the
//! sources in use, static power and the split used, as every output prints them beside the
//! process rows.

use serde::Serialize;

use super::{Analysis, DomainJoules};
use crate::{
    attribute::{ActivityUsed, PowerModelUsed, StaticOrigin},
    pb::v1::EnergySource,
};

/// Machine-wide figures of one window, as `report --format json` and every
/// `top --batch --format json` frame print them next to `processes[]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Window length, ns.
    pub duration_ns: u64,
    /// Time on CPUs whose task was unknown, ns (should be ~0).
    pub unknown_ns: u64,
    /// Idle/static energy (headline domains), J.
    pub idle_j: f64,
    /// Energy no thread could be given (headline domains), J.
    pub unknown_j: f64,
    /// Measured energy (headline domains), J.
    pub total_j: f64,
    /// Measured energy per domain, J.
    pub energy_j: DomainJoules,
    /// Idle/static energy per domain, J.
    pub idle_by_domain_j: DomainJoules,
    /// Kinds of sources, e.g. `powercap`, `model`.
    pub source: String,
    /// True when any energy is modelled: every figure is then estimated.
    pub estimated: bool,
    /// The split used.
    pub power_model: PowerModelUsed,
    /// True when the time and regression splits of a source disagree beyond their
    /// intervals (each source's `power_model_spread` says how far); absent when false.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub power_model_uncertain: bool,
    /// The sources' `power_model_spread` lines when `static_power` is not at hand (a
    /// window received from the agent); in JSON they are in `static[]`.
    #[serde(skip)]
    pub power_model_spread: Vec<String>,
    /// Static power per source and where it came from.
    #[serde(rename = "static")]
    pub static_power: Vec<StaticPower>,
    /// The activity event that weighted dynamic energy between threads, or none (time).
    pub activity: ActivityUsed,
}

/// A source's static power in [`Totals`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StaticPower {
    /// Source name.
    pub source: String,
    /// Static power, W.
    pub static_w: f64,
    /// Where it came from.
    pub origin: StaticOrigin,
    /// The most it may be: the lowest interval power.
    pub bound_w: f64,
    /// What an estimate was before it was clamped to `bound_w`, when it was.
    pub clamped_from_w: Option<f64>,
    /// What to do when static power could not be identified.
    pub warning: Option<String>,
    /// The split used for this source.
    pub power_model: PowerModelUsed,
    /// How far apart the time and regression splits of this source are, when beyond
    /// their intervals (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub power_model_spread: Option<String>,
    /// Why the split is what it is, when it fell back.
    pub note: Option<String>,
}

impl Totals {
    /// Each source's line saying how far apart the power models are, where one does: from
    /// `static_power`, or as received from the agent.
    pub fn spread_lines(&self) -> Vec<String> {
        self.static_power
            .iter()
            .filter_map(|p| p.power_model_spread.clone())
            .chain(self.power_model_spread.iter().cloned())
            .collect()
    }
}

impl Analysis {
    /// The machine-wide figures of this window.
    pub fn totals(&self) -> Totals {
        let attr = &self.attribution;
        let unknown_ns = self
            .timeline
            .cpus
            .iter()
            .flat_map(|c| c.runs())
            .filter(|r| r.tid == crate::timeline::UNKNOWN_TID)
            .map(|r| r.len_ns())
            .sum();
        Totals {
            duration_ns: self.timeline.end_ns.saturating_sub(self.timeline.start_ns),
            unknown_ns,
            idle_j: attr.headline_uj(&attr.idle) * 1e-6,
            unknown_j: attr.headline_uj(&attr.unknown) * 1e-6,
            total_j: attr.total_uj() * 1e-6,
            energy_j: attr.measured.joules_by_name(),
            idle_by_domain_j: attr.idle.joules_by_name(),
            source: source_label(&self.sources),
            estimated: attr.estimated,
            power_model: attr.power_model(),
            power_model_uncertain: attr
                .sources
                .iter()
                .any(|s| s.power_model_uncertain.is_some()),
            power_model_spread: Vec::new(),
            static_power: attr
                .sources
                .iter()
                .map(|s| StaticPower {
                    source: s.name.clone(),
                    static_w: s.static_w,
                    origin: s.static_origin.clone(),
                    bound_w: s.static_bound_w,
                    clamped_from_w: s.static_clamped_from_w,
                    warning: s.static_origin.warning(),
                    power_model: s.power_model,
                    power_model_spread: s.power_model_line(),
                    note: s.power_model_note.clone(),
                })
                .collect(),
            activity: self.activity.clone(),
        }
    }
}

/// The kinds of sources in use, e.g. `powercap`, `model`, `powercap+nvml` (`none` when there
/// are none). Whether they are estimated is said separately, next to the numbers.
pub(crate) fn source_label(sources: &[EnergySource]) -> String {
    let mut kinds: Vec<&str> = sources.iter().map(|s| s.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    if kinds.is_empty() {
        "none".into()
    } else {
        kinds.join("+")
    }
}
