//! Static (all-idle) power of one energy source, and how sure we are of it (docs/ARCHITECTURE.md, "Attribution": static power).
//!
//! Per-process joules hinge on this number: on a busy machine every watt of static power
//! mistaken for dynamic power (or the reverse) moves straight into the process rows. The
//! energy signal alone cannot tell a process that runs 100% of the time from static power;
//! only variation in utilisation identifies the intercept. So, in order of trust:
//! given (`--static-power-w`, config), calibrated (`energy-bpf calibrate`), the model's idle
//! power, measured idle intervals, a robust extrapolation of power to zero busy CPUs when
//! utilisation varies enough — and otherwise *unidentified*, said in every output, never
//! guessed. Whatever the origin, the value is bounded by `[0, lowest interval power]`: static
//! power cannot exceed what the machine drew in its quietest interval.

use crate::pb::v1::{EnergyDomain, EnergySource};

use super::Options;
use super::history::LoadRows;
use super::interval::Interval;
use super::split::Occupancy;

use super::zero_load::Unidentified;
use super::zero_load::{
    FIT_UPDATES, ZeroLoadFit, aligned_rows, fine_spread, fit_zero_load, merge_spans,
};

/// Idle intervals (≤ 5% busy) from which their mean power is the static power.
const IDLE_INTERVALS: usize = 20;
/// Counter updates a row spans at least for the static bound (see [`estimate`]).
const BOUND_UPDATES: u64 = 20;
/// Standard deviation of busy CPUs in [`FINE_WINDOW_NS`] windows above which flat fit rows
/// mean the load varies too fast for the counter, not that it never varies.
const FINE_SPREAD_CPUS: f64 = 0.1;
/// Window of the timeline in which load variation is looked for when the rows are flat.
const FINE_WINDOW_NS: u64 = 1_000_000;

/// A static power measured by `energy-bpf calibrate` on this machine for one source.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Calibrated {
    /// Static power, W.
    pub watts: f64,
    /// When it was measured (RFC 3339, UTC).
    pub date: String,
    /// The calibration file it came from (empty when it came from a recording's header).
    pub file: String,
}

/// A static power the agent learned from the quietest intervals it kept over hours
/// (`agent::learn`): the zero-load fit over them, identified by the same checks as any
/// other extrapolation, bounded by the lowest kept interval power.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Learned {
    /// Static power, W.
    pub watts: f64,
    /// Intervals kept and fitted.
    pub intervals: usize,
    /// Time from the oldest to the newest kept interval, s.
    pub span_s: f64,
    /// The fit over them.
    pub fit: ZeroLoadFit,
}

/// The stable name of a source across runs and reboots, which calibration files are keyed
/// by (`EnergySource.id` is only an index in one recording): `kind:name`.
pub fn source_key(source: &EnergySource) -> String {
    format!("{}:{}", source.kind, source.name)
}

/// Where a source's static power came from.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum StaticOrigin {
    /// Given by configuration (`--static-power-w`).
    Given,
    /// Measured on a quiet machine by `energy-bpf calibrate`.
    Calibrated {
        /// When.
        date: String,
        /// From which file (empty: the recording's header).
        file: String,
    },
    /// Learned by the agent from the quietest intervals of hours of running.
    Learned {
        /// Intervals it rests on.
        intervals: usize,
        /// Time they span, s.
        span_s: f64,
        /// The fit over them.
        fit: ZeroLoadFit,
    },
    /// Inside a virtual machine: the static power the host assigns this VM (its share of
    /// the host's static power under the host's policy), from the hypervisor share.
    Host,
    /// The energy model's idle power (estimated sources).
    Model,
    /// Mean power (energy over time) of the intervals in which the domain's CPUs were
    /// (nearly) idle (≤ 5% busy; at least 20 such intervals, each after another; a live
    /// view's over its last two minutes).
    OnlineIdle,
    /// Robust extrapolation of interval power to zero busy CPUs (a live view's over its last
    /// two minutes).
    Extrapolated {
        /// The fit and its identifiability.
        fit: ZeroLoadFit,
    },
    /// GPU sources: this low percentile of interval power.
    Online {
        /// Percentile, 0..100.
        percentile: f64,
    },
    /// Not identifiable from this recording: static energy stays inside the process rows
    /// (split by busy time), so the per-process split of static vs dynamic is unknown.
    Unidentified {
        /// Why.
        reason: Unidentified,
        /// The fit, when one was tried.
        fit: Option<ZeroLoadFit>,
    },
}

impl StaticOrigin {
    /// Short name, as JSON's `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Given => "given",
            Self::Calibrated { .. } => "calibrated",
            Self::Learned { .. } => "learned",
            Self::Host => "host",
            Self::Model => "model",
            Self::OnlineIdle => "online_idle",
            Self::Extrapolated { .. } => "extrapolated",
            Self::Online { .. } => "online",
            Self::Unidentified { .. } => "unidentified",
        }
    }

    /// True when static power is known (everything but `Unidentified`).
    pub fn identified(&self) -> bool {
        !matches!(self, Self::Unidentified { .. })
    }

    /// The line every output shows when static power is unidentified: what is wrong and
    /// what to do about it.
    pub fn warning(&self) -> Option<String> {
        match self {
            Self::Unidentified { reason, .. } => Some(format!(
                "static power unidentified ({}): process rows include their share of static \
                 power; {}",
                reason.describe(),
                reason.remedy()
            )),
            _ => None,
        }
    }
}

/// A source's static power, its origin and the bound it was held to.
#[derive(Clone, Debug, PartialEq)]
pub struct StaticPower {
    /// Static power used by the split, W.
    pub watts: f64,
    /// Where it came from.
    pub origin: StaticOrigin,
    /// Lowest interval power (over intervals merged to the regression row length), W.
    pub bound_w: f64,
    /// Set when the value asked for (given, calibrated, ...) was above `bound_w` and was
    /// lowered to it, W.
    pub clamped_from_w: Option<f64>,
}

/// Static power of one source (docs/ARCHITECTURE.md, "Attribution": static power). `occs` is empty for
/// GPU sources.
pub fn estimate(
    opts: &Options,
    source: &EnergySource,
    intervals: &[Interval],
    occs: &[Occupancy],
    n_cpus: usize,
    busy_ns: &dyn Fn(u64, u64) -> f64,
) -> StaticPower {
    let (watts, origin) = choose(opts, source, intervals, occs, n_cpus, busy_ns);
    let watts = watts.max(0.0);
    // The bound is a minimum, so noise pulls it down: a row's power is off by up to one
    // counter update over its length (NVML updates every ~100 ms, so a 0.5 s interval reads
    // ±20% and an idle H100 at 75 W showed a 65 W interval). Rows of at least
    // BOUND_UPDATES updates keep that under 5%, and each row is allowed the one update it
    // may have missed: a row read as 19 of its 20 updates bounds static power at the power
    // of 20, not of 19 (a bound 5% low clamped every idle estimate on a 3 ms counter).
    let bound_row_ns = opts
        .regression_row_ns
        .max(BOUND_UPDATES.saturating_mul(source.update_period_ns));
    let period = source.update_period_ns as f64;
    // With no interval there is nothing observed to bound by (and no energy to split).
    let Some(bound_w) = merge_spans(intervals, occs, bound_row_ns)
        .iter()
        .map(|span| {
            let len = span.end_ns.saturating_sub(span.start_ns).max(1) as f64;
            span.power_row().power_w.max(0.0) * (1.0 + period / len)
        })
        .min_by(f64::total_cmp)
    else {
        return StaticPower {
            watts,
            origin,
            bound_w: watts,
            clamped_from_w: None,
        };
    };
    StaticPower {
        watts: watts.min(bound_w),
        origin,
        bound_w,
        clamped_from_w: (watts > bound_w).then_some(watts),
    }
}

fn choose(
    opts: &Options,
    source: &EnergySource,
    intervals: &[Interval],
    occs: &[Occupancy],
    n_cpus: usize,
    busy_ns: &dyn Fn(u64, u64) -> f64,
) -> (f64, StaticOrigin) {
    if let Some(&w) = opts.static_w_by_source.get(&source.id) {
        return (w, StaticOrigin::Given);
    }
    let whole_machine = matches!(source.domain(), EnergyDomain::Package | EnergyDomain::Psys);
    if let (Some(w), true) = (opts.static_w, whole_machine) {
        return (w, StaticOrigin::Given);
    }
    // The host measured and split it: nothing the guest sees can do better.
    if source.kind == "hypervisor" {
        return (source.host_static_w, StaticOrigin::Host);
    }
    if let Some(c) = opts.calibrated.get(&source_key(source)) {
        return (
            c.watts,
            StaticOrigin::Calibrated {
                date: c.date.clone(),
                file: c.file.clone(),
            },
        );
    }
    if let Some(l) = opts.learned.get(&source_key(source)) {
        return (
            l.watts,
            StaticOrigin::Learned {
                intervals: l.intervals,
                span_s: l.span_s,
                fit: l.fit,
            },
        );
    }
    if source.estimated && source.model_idle_w > 0.0 {
        return (source.model_idle_w, StaticOrigin::Model);
    }
    // µJ per ns = 1e3 W.
    let power = |iv: &Interval| iv.energy_uj / iv.len_ns() as f64 * 1e3;
    if occs.is_empty() || n_cpus == 0 {
        let percentile = opts.static_percentile.clamp(0.0, 100.0);
        let mut watts: Vec<f64> = intervals.iter().map(power).collect();
        watts.sort_by(f64::total_cmp);
        let w = if watts.is_empty() {
            0.0
        } else {
            watts[((percentile / 100.0) * (watts.len() - 1) as f64).round() as usize]
        };
        return (w, StaticOrigin::Online { percentile });
    }
    let mut idle = idle_intervals(intervals, occs, n_cpus);
    // A live view's window reads the rows of the windows before it (`history`).
    let past = opts.history.as_ref().filter(|_| !intervals.is_empty());
    if idle.len() >= IDLE_INTERVALS && past.is_none() {
        return (mean_power(&idle), StaticOrigin::OnlineIdle);
    }
    // Rows as short as the counter resolves (see `FIT_UPDATES`); a counter of unknown
    // update period keeps the regression's rows.
    let period = source.update_period_ns;
    let row_ns = if period > 0 {
        FIT_UPDATES.saturating_mul(period)
    } else {
        opts.regression_row_ns
    };
    let (mut rows, lag_ns) = aligned_rows(intervals, row_ns, period, busy_ns);
    if let Some(h) = past {
        let load = LoadRows {
            start_ns: intervals.first().map_or(0, |iv| iv.start_ns),
            end_ns: intervals.last().map_or(0, |iv| iv.end_ns),
            rows,
            idle,
        };
        (rows, idle) = h.extend_load(source.id, load);
    }
    if idle.len() >= IDLE_INTERVALS {
        return (mean_power(&idle), StaticOrigin::OnlineIdle);
    }
    let with_lag = |fit: ZeroLoadFit| ZeroLoadFit { lag_ns, ..fit };
    match fit_zero_load(&rows).map_err(|(why, fit)| (why, fit.map(with_lag))) {
        Ok(fit) => (
            fit.intercept_w,
            StaticOrigin::Extrapolated { fit: with_lag(fit) },
        ),
        // Flat rows over a load that does vary (in 1 ms windows of the timeline):
        // say so, rather than blame busy CPUs.
        Err((Unidentified::NoSpread | Unidentified::FewLevels, fit))
            if fine_spread(intervals, FINE_WINDOW_NS, busy_ns) >= FINE_SPREAD_CPUS =>
        {
            (
                0.0,
                StaticOrigin::Unidentified {
                    reason: Unidentified::LoadTooFast,
                    fit,
                },
            )
        }
        // Unknown static power stays inside the process rows: the split charges it by busy
        // time, as the `proportional` policy would, and every output says so.
        Err((reason, fit)) => (0.0, StaticOrigin::Unidentified { reason, fit }),
    }
}

/// Energy (µJ) and length (ns) of the intervals in which the domain's CPUs were (nearly)
/// idle, ≤ 5% busy, and that follow one that was. A counter that lags carries a busy
/// interval's last energy into the next one; so the first idle interval after load is left
/// out.
fn idle_intervals(intervals: &[Interval], occs: &[Occupancy], n_cpus: usize) -> Vec<(f64, f64)> {
    let is_idle =
        |iv: &Interval, o: &Occupancy| o.busy_ns() <= 0.05 * n_cpus as f64 * iv.len_ns() as f64;
    let mut prev_idle_end = None;
    let mut out = Vec::new();
    for (iv, o) in intervals.iter().zip(occs) {
        let idle = is_idle(iv, o);
        if idle && prev_idle_end == Some(iv.start_ns) {
            out.push((iv.energy_uj, iv.len_ns() as f64));
        }
        prev_idle_end = idle.then_some(iv.end_ns);
    }
    out
}

/// Mean power of intervals given as (µJ, ns), W: their energy over their time. Not the
/// median of their powers: a counter updating every 3 ms read every 10 ms gives intervals
/// of three or four updates, and the median is one of the two (7% off on such a counter).
fn mean_power(intervals: &[(f64, f64)]) -> f64 {
    let (uj, ns) = intervals
        .iter()
        .fold((0.0, 0.0), |(e, t), &(ie, it)| (e + ie, t + it));
    if ns > 0.0 { uj / ns * 1e3 } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle GPU at 75 W read every 500 ms through a counter that updates every 100 ms:
    /// each interval sees four or six updates, so reads 60 or 90 W. The bound comes from rows
    /// of 20 updates, within a few per cent of 75 W, not from the lowest noisy interval.
    #[test]
    fn a_slow_counter_bounds_static_power_over_many_updates() {
        const MS: u64 = 1_000_000;
        let intervals: Vec<Interval> = (0..40u64)
            .map(|i| Interval {
                start_ns: i * 500 * MS,
                end_ns: (i + 1) * 500 * MS,
                // 75 W × 0.5 s = 37.5 J, in updates of 7.5 J: 4 or 6 of them.
                energy_uj: if i % 2 == 0 { 30e6 } else { 45e6 },
                gpu_util_ns: Vec::new(),
                pieces: 1,
            })
            .collect();
        let gpu = EnergySource {
            id: 1,
            domain: EnergyDomain::Gpu as i32,
            update_period_ns: 100 * MS,
            ..Default::default()
        };
        let opts = Options {
            static_w: Some(75.0),
            ..Options::default()
        };
        let s = estimate(&opts, &gpu, &intervals, &[], 0, &|_, _| 0.0);
        // Not below the power drawn, and no more than the update a row may miss above it.
        assert!((75.0..=79.0).contains(&s.bound_w), "bound {} W", s.bound_w);
        assert_eq!(s.clamped_from_w, None);
        // A counter updating every millisecond keeps the regression rows' bound, allowed the
        // one update (1 ms of 500) a row may have missed.
        let rapl = EnergySource {
            update_period_ns: MS,
            ..gpu
        };
        let s = estimate(&opts, &rapl, &intervals, &[], 0, &|_, _| 0.0);
        let bound = 60.0 * (1.0 + 1.0 / 500.0);
        assert!((s.bound_w - bound).abs() < 1e-9, "bound {} W", s.bound_w);
    }
}
