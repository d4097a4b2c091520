//! One energy source from readings to per-thread and per-sample energy: intervals, static
//! power, the power-model choice (time or regression), the split of every interval and the
//! push-down onto stack samples.

use std::collections::{BTreeMap, HashMap};

use crate::pb::v1::{EnergyDomain, EnergySource};
use crate::timeline::{IDLE_TID, Run, UNKNOWN_TID};

use super::attribution::{
    ClassLabel, ClassReport, IntervalRow, PowerModelUsed, RegressionReport, SourceAttribution,
};
use super::interval::{self, Interval};
use super::regression::{self, Row};
use super::samples::SampleSplitter;
use super::split::{self, Occupancy, Split, ThreadKey};
use super::tally::{Tally, ThreadIndex};
use super::{ActivityWeights, Input, Options, PowerModel};
use super::{history, smt, static_power, uncertainty};

/// What one source contributes.
pub(super) struct SourceOutcome {
    pub report: SourceAttribution,
    pub sample_uj: Vec<(usize, f64)>,
    pub residual: BTreeMap<ThreadKey, f64>,
    /// Relative standard error of each process's energy on this source.
    pub relative_error: uncertainty::RelativeError,
}

pub(super) fn run_source(
    input: &Input<'_>,
    index: &ThreadIndex<'_>,
    opts: &Options,
    source: &EnergySource,
) -> SourceOutcome {
    let domain = source.domain();
    // The period the readings show where start-up could only bound it from below.
    let interval::Timed {
        readings,
        period_ns,
        read_ns,
        head_ns,
    } = interval::timed(source, input.readings);
    let timed;
    let source = if period_ns == source.update_period_ns {
        source
    } else {
        timed = EnergySource {
            update_period_ns: period_ns,
            ..source.clone()
        };
        &timed
    };
    let (intervals, mut interval_stats) = interval::cut(&readings, source.update_period_ns);
    interval_stats.dropped_ns += head_ns;
    let is_gpu = domain == EnergyDomain::Gpu;
    let cpus = if is_gpu {
        Vec::new()
    } else {
        domain_cpus(input, source)
    };
    let mut occupancy = DomainTally {
        tally: Tally::new(index),
        cpus: &cpus,
        cores: smt::cores(input.cpus, &cpus),
        extra: opts.smt_sibling_extra,
        activity: input.activity,
    };
    // Each interval's busy totals (no thread listed): what the static-power estimate reads.
    // The per-thread occupancy of an interval is tallied when it is split, and dropped.
    let totals: Vec<Occupancy> = if is_gpu {
        Vec::new()
    } else {
        intervals
            .iter()
            .map(|iv| occupancy.totals(iv.start_ns, iv.end_ns))
            .collect()
    };
    // Busy CPU-ns of the domain over any span, for the zero-load fit's own rows.
    let busy_ns = |a: u64, b: u64| occupancy.tally.busy_ns(&cpus, a, b);
    let st = static_power::estimate(opts, source, &intervals, &totals, cpus.len(), &busy_ns);
    let static_w = st.watts;
    let mut report = SourceAttribution {
        source_id: source.id,
        domain,
        package: source.package,
        name: source.name.clone(),
        estimated: source.estimated,
        measured_uj: 0.0,
        attributed_uj: 0.0,
        idle_uj: 0.0,
        unknown_uj: 0.0,
        static_w,
        static_origin: st.origin,
        static_bound_w: st.bound_w,
        static_clamped_from_w: st.clamped_from_w,
        power_model: PowerModelUsed::Time,
        power_model_note: None,
        power_model_uncertain: None,
        regression: None,
        interval_stats,
        intervals: Vec::with_capacity(intervals.len()),
    };
    if is_gpu {
        // No stacks to split onto: each thread's energy is its residual.
        let mut residual = BTreeMap::new();
        for iv in &intervals {
            let st = split::static_uj(iv.energy_uj, iv.len_ns(), static_w);
            let s = split::split_gpu(iv.energy_uj, st, &iv.gpu_util_ns, opts.idle);
            for &(k, e) in &s.threads {
                *residual.entry(k).or_insert(0.0) += e;
            }
            book(&mut report, iv, &s);
        }
        return SourceOutcome {
            report,
            sample_uj: Vec::new(),
            residual,
            relative_error: uncertainty::RelativeError::default(),
        };
    }
    let mut splitter = SampleSplitter::new(opts.stack_window_ns).with_threads(index.keys());
    let by_activity = input.activity.is_some();
    // Each interval's energy is split over the span it was drawn in: the readings' own
    // span shifted back by the counter's lag, in the split and in the regression's rows.
    // Split over the readings' span, a writer running late under load gave the energy of
    // the process that had just run to the one running now (equal watts on a 3 ms counter
    // up to 5 ms late: worst +5.2%, shifted +4.8%; 15 / 5 / 8 W worst 17.3%, shifted
    // 14.9%). Modelled readings are computed from the timeline, with no lag.
    let lag = if source.estimated {
        0
    } else {
        counter_lag_ns(source.update_period_ns, read_ns)
    };
    let plan = plan_model(
        source,
        opts,
        lag,
        &intervals,
        &mut occupancy,
        static_w,
        by_activity,
        &mut report,
    );
    let samples = domain_samples(input, &cpus);
    let mut next_sample = 0;
    let mut occ = Occupancy::default();
    for (i, iv) in intervals.iter().enumerate() {
        let (a, b) = (
            iv.start_ns.saturating_sub(lag),
            iv.end_ns.saturating_sub(lag),
        );
        occupancy.fill(&mut occ, a, b);
        let occ = &occ;
        let st = split::static_uj(iv.energy_uj, iv.len_ns(), static_w);
        let class_w = |k: Option<ThreadKey>| match &plan {
            Some(p) => p.weight(i, k),
            None => 1.0,
        };
        let weighted: f64 = occ
            .threads
            .iter()
            .map(|(k, t)| t.weighted * class_w(Some(*k)))
            .sum::<f64>()
            + occ.unknown.weighted * class_w(None);
        // Every busy class fitted to 0 W: fall back to busy time rather than call it idle.
        let s = if weighted > 0.0 {
            split::split_cpu(iv.energy_uj, st, occ, opts.idle, &class_w)
        } else {
            split::split_cpu(iv.energy_uj, st, occ, opts.idle, &split::equal_power)
        };
        while next_sample < samples.len() && samples[next_sample].0 < a {
            next_sample += 1;
        }
        let first = next_sample;
        while next_sample < samples.len() && samples[next_sample].0 < b {
            next_sample += 1;
        }
        let in_iv: Vec<(usize, ThreadKey)> = samples[first..next_sample]
            .iter()
            .map(|&(_, idx, key)| (idx, key))
            .collect();
        let ids = occupancy.tally.filled();
        splitter.add_indexed(a, b, &s, occ, &in_iv, ids);
        book(&mut report, iv, &s);
    }
    let (sample_uj, residual) = splitter.finish();
    let mut class_tgid: Vec<(usize, u32)> = plan
        .as_ref()
        .map(|p| p.class_of.iter().map(|(&t, &k)| (k, t)).collect())
        .unwrap_or_default();
    class_tgid.sort_unstable();
    let class_tgid: Vec<u32> = class_tgid.into_iter().map(|(_, t)| t).collect();
    let relative_error = uncertainty::with_model_error(
        uncertainty::relative_error(&report, &class_tgid, opts.idle),
        if source.estimated {
            source.model_error_pct
        } else {
            0.0
        },
    );
    let (relative_error, disagreement) =
        uncertainty::cover_models(&report, &class_tgid, relative_error);
    report.power_model_uncertain = disagreement;
    SourceOutcome {
        report,
        sample_uj,
        residual,
        relative_error,
    }
}

fn book(report: &mut SourceAttribution, iv: &Interval, s: &Split) {
    let attributed: f64 = s.threads.iter().map(|(_, e)| e).sum();
    report.measured_uj += iv.energy_uj;
    report.attributed_uj += attributed;
    report.idle_uj += s.idle_uj;
    report.unknown_uj += s.unknown_uj;
    report.intervals.push(IntervalRow {
        start_ns: iv.start_ns,
        end_ns: iv.end_ns,
        measured_uj: iv.energy_uj,
        attributed_uj: attributed,
        idle_uj: s.idle_uj,
        unknown_uj: s.unknown_uj,
    });
}

/// CPUs whose threads may receive a source's energy: the package's CPUs for per-package
/// domains (a package's energy never goes to another package, docs/ARCHITECTURE.md, "Attribution"), every CPU for
/// whole-machine domains or when the topology is unknown.
pub(super) fn domain_cpus(input: &Input<'_>, source: &EnergySource) -> Vec<u32> {
    if input.cpus.is_empty() {
        return input.timeline.cpus.iter().map(|c| c.cpu).collect();
    }
    let whole = matches!(
        source.domain(),
        EnergyDomain::Psys | EnergyDomain::DomainUnspecified
    );
    let mut cpus: Vec<u32> = input
        .cpus
        .iter()
        .filter(|c| whole || c.package == source.package)
        .map(|c| c.id)
        .collect();
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// Samples of real threads on the domain's CPUs, as (ts, index, thread), by time.
fn domain_samples(input: &Input<'_>, cpus: &[u32]) -> Vec<(u64, usize, ThreadKey)> {
    let mut out: Vec<(u64, usize, ThreadKey)> = input
        .samples
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            s.tid != IDLE_TID && s.tid != UNKNOWN_TID && cpus.binary_search(&s.cpu).is_ok()
        })
        .map(|(i, s)| (s.ts_ns, i, (s.tgid, s.tid)))
        .collect();
    out.sort_unstable();
    out
}

/// The busiest processes on a source's CPUs over `intervals`, most busy first.
fn rank_classes(
    intervals: &[Interval],
    occupancy: &mut DomainTally<'_, '_, '_>,
    n: usize,
) -> Vec<u32> {
    let mut busy: HashMap<u32, f64> = HashMap::new();
    let mut occ = Occupancy::default();
    for iv in intervals {
        occupancy.fill(&mut occ, iv.start_ns, iv.end_ns);
        for (&(tgid, _), t) in &occ.threads {
            *busy.entry(tgid).or_insert(0.0) += t.ns;
        }
    }
    busiest(busy, n)
}

/// One domain's occupancy over any span: the tally of its CPUs, activity-weighted, SMT
/// siblings shared.
struct DomainTally<'t, 'i, 'a> {
    tally: Tally<'i, 'a>,
    cpus: &'t [u32],
    cores: Vec<Vec<u32>>,
    extra: f64,
    activity: Option<&'t ActivityWeights>,
}

impl DomainTally<'_, '_, '_> {
    /// Who ran over `[a, b)`, into `occ`.
    fn fill(&mut self, occ: &mut Occupancy, a: u64, b: u64) {
        let activity = self.activity;
        let weight = |cpu: u32, run: &Run| activity.map_or(1.0, |w| w.weight(cpu, run));
        self.tally.fill(occ, self.cpus, a, b, &weight);
        if !self.cores.is_empty() {
            let timeline = self.tally.timeline();
            smt::apply(occ, timeline, &self.cores, a, b, self.extra);
        }
    }

    /// Busy totals over `[a, b)`, no thread listed ([`Tally::totals`]).
    fn totals(&self, a: u64, b: u64) -> Occupancy {
        let activity = self.activity;
        let weight = |cpu: u32, run: &Run| activity.map_or(1.0, |w| w.weight(cpu, run));
        self.tally.totals(self.cpus, a, b, &weight)
    }
}

/// The regression's classes and the per-window watts that weight the split.
struct Plan {
    class_of: HashMap<u32, usize>,
    other: usize,
    first_ns: u64,
    stride_ns: u64,
    windows: Vec<Vec<f64>>,
    interval_start: Vec<u64>,
}

impl Plan {
    fn weight(&self, interval: usize, key: Option<ThreadKey>) -> f64 {
        let class = key
            .and_then(|(tgid, _)| self.class_of.get(&tgid).copied())
            .unwrap_or(self.other);
        let start = self.interval_start[interval];
        let w = ((start.saturating_sub(self.first_ns)) / self.stride_ns.max(1)) as usize;
        let watts = &self.windows[w.min(self.windows.len() - 1)];
        watts[class]
    }
}

/// Decides time or regression for a source (recording the decision in `report`) and, for
/// regression, fits the sliding windows.
#[allow(
    clippy::too_many_arguments,
    reason = "the source, its counter's lag and intervals, and where the plan goes"
)]
fn plan_model(
    source: &EnergySource,
    opts: &Options,
    lag: u64,
    intervals: &[Interval],
    occupancy: &mut DomainTally<'_, '_, '_>,
    static_w: f64,
    by_activity: bool,
    report: &mut SourceAttribution,
) -> Option<Plan> {
    if opts.power_model == PowerModel::Time || intervals.is_empty() {
        return None;
    }
    if source.estimated {
        report.power_model_note = Some(
            "estimated source: modelled dynamic energy is exactly proportional to busy time, \
             so per-class power cannot be fitted; time model used"
                .into(),
        );
        return None;
    }
    // Two row lengths, and the one whose fit pins the classes' watts down better (the
    // smaller occupancy-weighted standard error) is kept. Rows as short as the counter
    // resolves (5 updates, as the zero-load fit's) see a fair scheduler's rotation:
    // always-runnable processes sharing the CPUs hold shares within about one slice of
    // the mean in a row of any length, so shorter rows carry more of what tells them
    // apart. Load that changes over seconds is measured better by the long rows, where a
    // counter update at either end is a smaller part of the row.
    let long_ns = opts.regression_row_ns;
    let short_ns = long_ns.min(
        super::zero_load::FIT_UPDATES
            .saturating_mul(source.update_period_ns)
            .max(1),
    );
    let candidates = if short_ns < long_ns {
        vec![short_ns, long_ns]
    } else {
        vec![long_ns]
    };
    // Classes: the busiest processes on this source's CPUs, plus "other" (seed 003 digest).
    // A live view's window adds its intervals to the rows of past windows, and the fit
    // reads them all (`history`), merged while the history is held rather than copied.
    let past = (opts.power_model == PowerModel::Auto)
        .then_some(opts.history.as_ref())
        .flatten()
        .map(|h| {
            let rows = past_rows(intervals, occupancy, lag, by_activity);
            h.extend_and_read(source.id, by_activity, rows, |past| {
                let ranked = rank_past(past, opts.regression_classes);
                let class_of = classes_of(&ranked);
                let merged: Vec<Vec<Row>> = candidates
                    .iter()
                    .map(|&row_ns| merge_past(past, static_w, &class_of, ranked.len(), row_ns))
                    .collect();
                (ranked, merged)
            })
        });
    let (ranked, mut merged) = match past {
        Some((ranked, merged)) => (ranked, Some(merged)),
        None => (
            rank_classes(intervals, occupancy, opts.regression_classes),
            None,
        ),
    };
    let class_of = classes_of(&ranked);
    let other = ranked.len();
    let k = other + 1;
    let (rows, global, row_ns) = candidates
        .into_iter()
        .enumerate()
        .map(|(i, row_ns)| {
            let rows = match &mut merged {
                Some(merged) => std::mem::take(&mut merged[i]),
                None => build_rows(
                    intervals,
                    &mut *occupancy,
                    lag,
                    static_w,
                    &class_of,
                    other,
                    row_ns,
                    by_activity,
                ),
            };
            let fit = regression::fit(&rows, k, &opts.fit);
            (rows, fit, row_ns)
        })
        .min_by(|a, b| weighted_se(&a.1).total_cmp(&weighted_se(&b.1)))?;
    let held = regression::heldout(&rows, k, FOLDS, &opts.fit);
    let mut labels: Vec<ClassLabel> = ranked.iter().map(|&t| ClassLabel::Process(t)).collect();
    labels.push(ClassLabel::Other);
    // Parameters the rows must pin down: the classes fitted on their own.
    let fitted = global
        .classes
        .iter()
        .filter(|c| c.not_identifiable.is_none())
        .count();
    let enough_rows = rows.len() > 2 * fitted + 2;
    // How far the split moves from equal power toward the regression's watts, 0..1. Not a
    // switch: `auto` weights the regression by its held-out evidence (the stacking weight
    // of `regression::heldout`) and shrinks each class's watts toward the common value by
    // how well the rows identify it (`regression::shrunk_watts`), so a recording whose
    // evidence is borderline gets a split between the two, not one or the other.
    let weight = match opts.power_model {
        PowerModel::Regression if rows.len() > k + 1 => 1.0,
        PowerModel::Auto if enough_rows => held.weight,
        _ => 0.0,
    };
    let use_regression = weight > 0.0;
    let blend = |f: &regression::Fit| -> Vec<f64> {
        if opts.power_model == PowerModel::Regression {
            return f.classes.iter().map(|c| c.watts).collect();
        }
        regression::shrunk_watts(f)
            .into_iter()
            .map(|w| f.prior_w + weight * (w - f.prior_w))
            .collect()
    };
    report.power_model_note = match (opts.power_model, use_regression) {
        (PowerModel::Auto, false) if !enough_rows => Some(format!(
            "auto: {} regression rows are too few to fit {fitted} classes; time model used",
            rows.len()
        )),
        (PowerModel::Auto, false) => Some(
            "auto: regression did not predict held-out intervals better; time model used".into(),
        ),
        (PowerModel::Auto, true) if weight < 1.0 => Some(format!(
            "auto: held-out intervals weight the regression {:.0}% against time; watts \
             shrunk toward equal power by how well each is identified",
            weight * 100.0
        )),
        (PowerModel::Regression, false) => Some(format!(
            "{} regression rows are too few to fit {k} classes; time model used",
            rows.len()
        )),
        _ => None,
    };
    let first_ns = intervals[0].start_ns;
    let last_ns = intervals[intervals.len() - 1].end_ns;
    let mut windows = Vec::new();
    let whole = blend(&global);
    if use_regression {
        // Past rows are a window of their own, the horizon long.
        if merged.is_some() || last_ns - first_ns <= opts.regression_window_ns {
            windows.push(whole.clone());
        } else {
            let stride = opts.regression_stride_ns.max(1);
            let mut start = first_ns;
            while start < last_ns {
                let centre = start + stride / 2;
                let lo = centre.saturating_sub(opts.regression_window_ns / 2);
                let hi = centre + opts.regression_window_ns / 2;
                let in_window: Vec<Row> = rows
                    .iter()
                    .filter(|r| r.start_ns >= lo && r.end_ns <= hi)
                    .cloned()
                    .collect();
                let f = regression::fit(&in_window, k, &opts.fit);
                // A window's watts move from the whole recording's only as far as the
                // window's own rows show they differ: shrunk toward equal power instead,
                // a 30-row window of a once-a-second counter lost what 120 rows had
                // pinned down (a 5 W process 29% over, its interval, the whole fit's,
                // too narrow to say so).
                windows.push(if opts.power_model == PowerModel::Regression {
                    blend(&f)
                } else {
                    regression::shrunk_toward(&f, &whole)
                });
                start += stride;
            }
        }
    }
    // The watts the split used, per class: with sliding windows, each window's watts
    // weighted by the class's busy time in the intervals it weights, so the intervals and
    // the uncertainty flag judge the split that was made, not the whole recording's fit.
    let split_w = if windows.len() > 1 {
        let stride = opts.regression_stride_ns.max(1);
        let (mut num, mut den) = (vec![0.0; k], vec![0.0; k]);
        for r in &rows {
            let w = ((r.start_ns.saturating_sub(first_ns)) / stride) as usize;
            let watts = &windows[w.min(windows.len() - 1)];
            for c in 0..k {
                num[c] += r.t_s[c] * watts[c];
                den[c] += r.t_s[c];
            }
        }
        (0..k)
            .map(|c| {
                if den[c] > 0.0 {
                    num[c] / den[c]
                } else {
                    whole[c]
                }
            })
            .collect()
    } else {
        whole
    };
    report.regression = Some(RegressionReport {
        classes: labels
            .iter()
            .zip(&global.classes)
            .map(|(&label, &fit)| ClassReport { label, fit })
            .collect(),
        prior_w: global.prior_w,
        condition: global.condition,
        rows: global.rows,
        row_ns,
        heldout_sse_time: held.sse_time,
        heldout_sse_regression: held.sse_regression,
        regression_weight: weight,
        split_w,
        windows: windows.len(),
        lag_ns: lag,
    });
    if !use_regression {
        return None;
    }
    report.power_model = PowerModelUsed::Regression;
    Some(Plan {
        class_of,
        other,
        first_ns,
        stride_ns: if windows.len() > 1 {
            opts.regression_stride_ns
        } else {
            u64::MAX
        },
        windows,
        interval_start: intervals.iter().map(|iv| iv.start_ns).collect(),
    })
}

/// How old, on average, the energy a reading closes is: half the shorter of the counter's
/// update period and the read interval (0, unknown, leaves the update's). The read
/// interval is the recorder's ([`interval::read_interval_ns`]), not the readings' spacing:
/// reads that saw no change are not written, so a counter updated once a second and read
/// every 200 ms has readings a second apart, each at most 200 ms after its update (taking
/// the spacing put the energy 500 ms back, where 100 ms is the mean).
/// A reading holds the counter's last update, so each interval's energy was drawn over its
/// span shifted back by the update's age. Read less often than it updates, the counter is
/// on average half an update old; read more often (a counter updated once a second, read
/// every 10 ms), an interval ends at the first read that sees an update, on average half a
/// read after it. (A writer that runs late under load makes readings older than that.
/// Choosing the lag by held-out error was tried and withdrawn: between lags whose errors
/// differ by noise the choice flipped, and two replays of one machine got different
/// joules.)
fn counter_lag_ns(update_period_ns: u64, read_period_ns: u64) -> u64 {
    match read_period_ns {
        0 => update_period_ns / 2,
        r => update_period_ns.min(r) / 2,
    }
}

/// Contiguous folds of the held-out comparisons.
const FOLDS: usize = 5;

/// Occupancy-weighted standard error of a fit's watts, W: how well its rows pin the busy
/// classes down (infinite when a fitted class has no finite error).
fn weighted_se(fit: &regression::Fit) -> f64 {
    fit.classes
        .iter()
        .filter(|c| c.not_identifiable.is_none())
        .map(|c| c.occupancy * c.se_w)
        .sum::<f64>()
        .max(0.0)
}

/// A window's intervals as rows of a live history: each interval's energy with the busy
/// seconds per process over the span it was drawn in.
fn past_rows(
    intervals: &[Interval],
    occupancy: &mut DomainTally<'_, '_, '_>,
    lag: u64,
    by_activity: bool,
) -> Vec<history::PastRow> {
    let time = |t: &split::ThreadTime| if by_activity { t.weighted } else { t.ns };
    let mut occ = Occupancy::default();
    intervals
        .iter()
        .map(|iv| {
            occupancy.fill(
                &mut occ,
                iv.start_ns.saturating_sub(lag),
                iv.end_ns.saturating_sub(lag),
            );
            let mut busy: HashMap<u32, f64> = HashMap::new();
            for (&(tgid, _), t) in &occ.threads {
                *busy.entry(tgid).or_insert(0.0) += time(t) * 1e-9;
            }
            let mut busy_s: Vec<(u32, f64)> = busy.into_iter().collect();
            let mut rest_s = time(&occ.unknown) * 1e-9;
            if busy_s.len() > history::MAX_ROW_PROCESSES {
                busy_s.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                rest_s += busy_s
                    .drain(history::MAX_ROW_PROCESSES..)
                    .map(|(_, s)| s)
                    .sum::<f64>();
            }
            // In process order, so that sums over them do not depend on the map's.
            busy_s.sort_unstable_by_key(|&(tgid, _)| tgid);
            history::PastRow {
                start_ns: iv.start_ns,
                end_ns: iv.end_ns,
                energy_uj: iv.energy_uj,
                busy_s,
                rest_s,
            }
        })
        .collect()
}

/// Each ranked process's class: its rank.
fn classes_of(ranked: &[u32]) -> HashMap<u32, usize> {
    ranked.iter().enumerate().map(|(i, &t)| (t, i)).collect()
}

/// The `n` processes with the most busy time, most busy first (ties by pid).
fn busiest(busy: HashMap<u32, f64>, n: usize) -> Vec<u32> {
    let mut ranked: Vec<(u32, f64)> = busy.into_iter().collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    ranked.into_iter().take(n).map(|(t, _)| t).collect()
}

/// The busiest processes over past rows, most busy first.
fn rank_past(past: &[history::PastRow], n: usize) -> Vec<u32> {
    let mut busy: HashMap<u32, f64> = HashMap::new();
    for r in past {
        for &(tgid, s) in &r.busy_s {
            *busy.entry(tgid).or_insert(0.0) += s;
        }
    }
    busiest(busy, n)
}

/// Regression rows from past rows, as [`build_rows`] makes them from intervals: merged to
/// at least `row_ns`, never across a gap between windows, static power at `static_w`.
fn merge_past(
    past: &[history::PastRow],
    static_w: f64,
    class_of: &HashMap<u32, usize>,
    other: usize,
    row_ns: u64,
) -> Vec<Row> {
    let mut rows = RowMerger::new(other + 1, row_ns, static_w);
    for p in past {
        if rows.cur.as_ref().is_some_and(|r| r.end_ns != p.start_ns) {
            rows.break_row();
        }
        let row = rows.add(p.start_ns, p.end_ns, p.energy_uj);
        for &(tgid, s) in &p.busy_s {
            row.t_s[class_of.get(&tgid).copied().unwrap_or(other)] += s;
        }
        row.t_s[other] += p.rest_s;
        rows.close_if_long();
    }
    rows.finish()
}

/// Consecutive intervals merged into regression rows of at least `row_ns`, each row's
/// target its energy less static power at `static_w`.
struct RowMerger {
    rows: Vec<Row>,
    cur: Option<Row>,
    k: usize,
    row_ns: u64,
    static_w: f64,
}

impl RowMerger {
    fn new(k: usize, row_ns: u64, static_w: f64) -> Self {
        Self {
            rows: Vec::new(),
            cur: None,
            k,
            row_ns,
            static_w,
        }
    }

    /// The row an interval of `energy_uj` over `[start_ns, end_ns)` joins, with its
    /// dynamic energy added; its columns are the caller's to add.
    fn add(&mut self, start_ns: u64, end_ns: u64, energy_uj: f64) -> &mut Row {
        let k = self.k;
        let row = self.cur.get_or_insert_with(|| Row {
            start_ns,
            end_ns,
            t_s: vec![0.0; k],
            y_j: 0.0,
        });
        row.end_ns = end_ns;
        let st = split::static_uj(energy_uj, end_ns - start_ns, self.static_w);
        row.y_j += (energy_uj - st) * 1e-6;
        row
    }

    /// Closes the current row once it is `row_ns` long.
    fn close_if_long(&mut self) {
        if self
            .cur
            .as_ref()
            .is_some_and(|r| r.end_ns - r.start_ns >= self.row_ns)
        {
            self.break_row();
        }
    }

    /// Closes the current row whatever its length.
    fn break_row(&mut self) {
        self.rows.extend(self.cur.take());
    }

    fn finish(mut self) -> Vec<Row> {
        self.break_row();
        self.rows
    }
}

/// Regression rows: consecutive intervals merged to at least `row_ns`; columns are the
/// classes and "other" (with unknown time). With activity weights the columns are
/// activity-weighted time, so the fitted watts multiply the weights instead of counting
/// the same difference twice.
#[allow(
    clippy::too_many_arguments,
    reason = "the intervals, how to count them, and the rows' shape"
)]
fn build_rows(
    intervals: &[Interval],
    occupancy: &mut DomainTally<'_, '_, '_>,
    lag: u64,
    static_w: f64,
    class_of: &HashMap<u32, usize>,
    other: usize,
    row_ns: u64,
    by_activity: bool,
) -> Vec<Row> {
    let time = |t: &split::ThreadTime| if by_activity { t.weighted } else { t.ns };
    let mut rows = RowMerger::new(other + 1, row_ns, static_w);
    let mut occ = Occupancy::default();
    for iv in intervals {
        occupancy.fill(
            &mut occ,
            iv.start_ns.saturating_sub(lag),
            iv.end_ns.saturating_sub(lag),
        );
        let row = rows.add(iv.start_ns, iv.end_ns, iv.energy_uj);
        for (&(tgid, _), t) in &occ.threads {
            row.t_s[class_of.get(&tgid).copied().unwrap_or(other)] += time(t) * 1e-9;
        }
        row.t_s[other] += time(&occ.unknown) * 1e-9;
        rows.close_if_long();
    }
    rows.finish()
}

#[cfg(test)]
mod lag_tests {
    use super::counter_lag_ns;

    #[test]
    fn a_reading_is_half_the_shorter_of_update_and_read_spacing_old() {
        // RAPL's 1 ms updates read every 10 ms: half an update.
        assert_eq!(counter_lag_ns(1_000_000, 10_000_000), 500_000);
        // A counter updated once a second, read every 10 ms: half a read.
        assert_eq!(counter_lag_ns(1_000_000_000, 10_000_000), 5_000_000);
        // Spacing unknown: half an update.
        assert_eq!(counter_lag_ns(3_000_000, 0), 1_500_000);
    }
}
