//! Splitting one interval's energy of one domain across threads, idle and unknown.
//!
//! TProf apportions each package delta across cores by per-core activity; with
//! exact per-thread on-CPU time from the switch timeline this becomes (docs/ARCHITECTURE.md, "Attribution")
//! `E_θ = E_dyn · Σ_c w_θ t_{c,θ} / Σ_c Σ_φ w_φ t_{c,φ}` over the domain's CPUs only, after
//! the static share `min(ΔE, P_static·Δt)` is set aside (policy `separate`) or spread by busy
//! time (policy `proportional`). Time nobody can name (UNKNOWN_TID) is split like a thread
//! and reported as its own row, so the parts always add up to the measured delta.

use crate::timeline::{IDLE_TID, Run, Timeline, UNKNOWN_TID};

use super::IdlePolicy;

/// A thread, `(tgid, tid)`.
pub type ThreadKey = (u32, u32);

/// On-CPU time of one thread in one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ThreadTime {
    /// Exact on-CPU ns.
    pub ns: f64,
    /// Σ weight × ns (the activity of the split).
    pub weighted: f64,
}

/// Per-thread times of one interval: each thread once, in key order (a flat sorted array,
/// looked up by binary search: no map per interval).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadTimes(Vec<(ThreadKey, ThreadTime)>);

/// Iterator over [`ThreadTimes`] as `(key, time)` pairs, in key order.
pub type ThreadTimesIter<'a> = std::iter::Map<
    std::slice::Iter<'a, (ThreadKey, ThreadTime)>,
    fn(&'a (ThreadKey, ThreadTime)) -> (&'a ThreadKey, &'a ThreadTime),
>;

impl ThreadTimes {
    /// From pairs already sorted by key, each key once.
    pub(super) fn from_sorted(pairs: Vec<(ThreadKey, ThreadTime)>) -> Self {
        debug_assert!(pairs.windows(2).all(|w| w[0].0 < w[1].0));
        Self(pairs)
    }

    /// `(key, time)` pairs in key order.
    pub fn iter(&self) -> ThreadTimesIter<'_> {
        self.0.iter().map(|(k, t)| (k, t))
    }

    /// `(key, time)` pairs in key order, times mutable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&ThreadKey, &mut ThreadTime)> {
        self.0.iter_mut().map(|(k, t)| (&*k, t))
    }

    /// Times in key order.
    pub fn values(&self) -> impl Iterator<Item = &ThreadTime> {
        self.0.iter().map(|(_, t)| t)
    }

    /// The time of one thread.
    pub fn get(&self, key: &ThreadKey) -> Option<&ThreadTime> {
        self.0
            .binary_search_by_key(key, |(k, _)| *k)
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Threads held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no thread ran.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The pairs, emptied out of `self` (their allocation to be refilled).
    pub(super) fn take_pairs(&mut self) -> Vec<(ThreadKey, ThreadTime)> {
        std::mem::take(&mut self.0)
    }
}

impl std::ops::Index<&ThreadKey> for ThreadTimes {
    type Output = ThreadTime;

    fn index(&self, key: &ThreadKey) -> &ThreadTime {
        match self.get(key) {
            Some(t) => t,
            None => panic!("thread {key:?} is not in this occupancy"),
        }
    }
}

impl FromIterator<(ThreadKey, ThreadTime)> for ThreadTimes {
    /// Pairs in any order; a key given twice keeps its last time (as a map insert would).
    fn from_iter<I: IntoIterator<Item = (ThreadKey, ThreadTime)>>(iter: I) -> Self {
        let mut pairs: Vec<(ThreadKey, ThreadTime)> = iter.into_iter().collect();
        pairs.sort_by_key(|p| p.0);
        let mut out: Vec<(ThreadKey, ThreadTime)> = Vec::with_capacity(pairs.len());
        for p in pairs {
            match out.last_mut() {
                Some(last) if last.0 == p.0 => *last = p,
                _ => out.push(p),
            }
        }
        Self(out)
    }
}

impl<'a> IntoIterator for &'a ThreadTimes {
    type Item = (&'a ThreadKey, &'a ThreadTime);
    type IntoIter = ThreadTimesIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

/// Who occupied a domain's CPUs during one interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Occupancy {
    /// Busy threads.
    pub threads: ThreadTimes,
    /// Idle CPU-ns.
    pub idle_ns: f64,
    /// CPU-ns whose task is unknown (including time outside the timeline's window).
    pub unknown: ThreadTime,
}

impl Occupancy {
    /// Tallies `[a, b)` on `cpus`; `weight(cpu, run)` is the activity weight per ns of a
    /// busy or unknown run (1.0 = busy time). For many intervals of one timeline,
    /// [`super::tally::Tally`] does the same without sorting per interval.
    pub fn tally(
        timeline: &Timeline,
        cpus: &[u32],
        a: u64,
        b: u64,
        weight: &dyn Fn(u32, &Run) -> f64,
    ) -> Self {
        let mut occ = Occupancy::default();
        // Threads' parts in the order met, then stably sorted and summed per thread: the
        // same sums in the same order as adding to a map part by part.
        let mut parts: Vec<(ThreadKey, ThreadTime)> = Vec::new();
        walk(timeline, cpus, a, b, weight, &mut occ, |occ, run, part| {
            if run.tid == UNKNOWN_TID {
                occ.unknown.ns += part.ns;
                occ.unknown.weighted += part.weighted;
            } else {
                parts.push(((run.tgid, run.tid), part));
            }
        });
        parts.sort_by_key(|p| p.0);
        let mut summed: Vec<(ThreadKey, ThreadTime)> = Vec::with_capacity(parts.len());
        for (key, part) in parts {
            match summed.last_mut() {
                Some((last, t)) if *last == key => {
                    t.ns += part.ns;
                    t.weighted += part.weighted;
                }
                _ => summed.push((key, part)),
            }
        }
        occ.threads = ThreadTimes::from_sorted(summed);
        occ
    }

    /// The occupancy of `[a, b)` on `cpus` with no thread listed: every busy thread's time
    /// summed into `unknown` (what the static-power estimate and load rows read: busy and
    /// weighted CPU-ns), at no per-thread cost.
    pub fn totals<W: Fn(u32, &Run) -> f64 + ?Sized>(
        timeline: &Timeline,
        cpus: &[u32],
        a: u64,
        b: u64,
        weight: &W,
    ) -> Self {
        let mut occ = Occupancy::default();
        walk(timeline, cpus, a, b, weight, &mut occ, |occ, _, part| {
            occ.unknown.ns += part.ns;
            occ.unknown.weighted += part.weighted;
        });
        occ
    }

    /// Busy CPU-ns (threads + unknown).
    pub fn busy_ns(&self) -> f64 {
        self.threads.values().map(|t| t.ns).sum::<f64>() + self.unknown.ns
    }
}

/// Walks the runs of `[a, b)` on `cpus` (each CPU's from the first that ends after `a`,
/// found by binary search): idle time and the gaps the timeline does not cover go into
/// `occ`, and each other run's part (ns and weighted ns) to `busy`.
fn walk<W: Fn(u32, &Run) -> f64 + ?Sized>(
    timeline: &Timeline,
    cpus: &[u32],
    a: u64,
    b: u64,
    weight: &W,
    occ: &mut Occupancy,
    mut busy: impl FnMut(&mut Occupancy, &Run, ThreadTime),
) {
    for &cpu in cpus {
        let mut covered = 0u64;
        if let Some(ct) = timeline.cpu(cpu) {
            for run in ct
                .runs_from(ct.store().first_ending_after(a))
                .take_while(|r| r.start_ns < b)
            {
                let ns = run.overlap_ns(a, b);
                covered += ns;
                let ns = ns as f64;
                if run.tid == IDLE_TID {
                    occ.idle_ns += ns;
                } else {
                    let weighted = ns * weight(cpu, &run);
                    busy(occ, &run, ThreadTime { ns, weighted });
                }
            }
        }
        add_gap(occ, cpu, a, b, covered, weight);
    }
}

/// Time of `[a, b)` on `cpu` the timeline does not cover (`covered` of it is): unknown, not
/// idle.
pub(super) fn add_gap<W: Fn(u32, &Run) -> f64 + ?Sized>(
    occ: &mut Occupancy,
    cpu: u32,
    a: u64,
    b: u64,
    covered: u64,
    weight: &W,
) {
    let gap = (b - a).saturating_sub(covered) as f64;
    if gap > 0.0 {
        let unknown_run = Run {
            start_ns: a,
            end_ns: b,
            tid: UNKNOWN_TID,
            tgid: 0,
            cgroup_id: 0,
            activity: None,
        };
        occ.unknown.ns += gap;
        occ.unknown.weighted += gap * weight(cpu, &unknown_run);
    }
}

/// One interval's energy, split.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Split {
    /// Energy per thread, µJ.
    pub threads: Vec<(ThreadKey, f64)>,
    /// Idle/static energy, µJ.
    pub idle_uj: f64,
    /// Energy of unknown time, µJ.
    pub unknown_uj: f64,
}

impl Split {
    /// Sum of all parts, µJ (equals the measured delta to fp precision).
    #[cfg(test)]
    pub fn total(&self) -> f64 {
        self.threads.iter().map(|(_, e)| e).sum::<f64>() + self.idle_uj + self.unknown_uj
    }
}

/// Static energy of an interval, µJ: `min(ΔE, P_static·Δt)` (docs/ARCHITECTURE.md, "Attribution").
pub fn static_uj(energy_uj: f64, len_ns: u64, static_w: f64) -> f64 {
    // W × ns = 1e-9 J = 1e-3 µJ.
    (static_w.max(0.0) * len_ns as f64 * 1e-3).min(energy_uj)
}

/// Per-thread power weight on top of the activity weight (the regression's class watts);
/// `None` asks for the weight of unknown time.
pub type ClassWeight<'a> = &'a dyn Fn(Option<ThreadKey>) -> f64;

/// Equal power for every class: the split is by (activity-weighted) busy time.
pub fn equal_power(_: Option<ThreadKey>) -> f64 {
    1.0
}

/// Splits a CPU-domain interval (TProf-style activity weighting).
pub fn split_cpu(
    energy_uj: f64,
    static_part_uj: f64,
    occ: &Occupancy,
    policy: IdlePolicy,
    class_w: ClassWeight<'_>,
) -> Split {
    let unknown_w = occ.unknown.weighted * class_w(None);
    let weighted_total: f64 = occ
        .threads
        .iter()
        .map(|(k, t)| t.weighted * class_w(Some(*k)))
        .sum::<f64>()
        + unknown_w;
    let busy = occ.busy_ns();
    if weighted_total <= 0.0 || busy <= 0.0 {
        // Nothing ran: the whole delta is idle.
        return Split {
            threads: Vec::new(),
            idle_uj: energy_uj,
            unknown_uj: 0.0,
        };
    }
    let dynamic = energy_uj - static_part_uj;
    let (spread_static, idle_uj) = match policy {
        IdlePolicy::Separate => (0.0, static_part_uj),
        IdlePolicy::Proportional => (static_part_uj, 0.0),
    };
    let share =
        |weighted: f64, ns: f64| dynamic * weighted / weighted_total + spread_static * ns / busy;
    Split {
        threads: occ
            .threads
            .iter()
            .map(|(k, t)| (*k, share(t.weighted * class_w(Some(*k)), t.ns)))
            .collect(),
        idle_uj,
        unknown_uj: share(unknown_w, occ.unknown.ns),
    }
}

/// Splits a GPU interval: dynamic energy to the processes using the device by their SM
/// utilisation (equal shares when none is reported), the rest to the GPU's idle row.
pub fn split_gpu(
    energy_uj: f64,
    static_part_uj: f64,
    util_ns: &[(u32, f64)],
    policy: IdlePolicy,
) -> Split {
    if util_ns.is_empty() {
        return Split {
            threads: Vec::new(),
            idle_uj: energy_uj,
            unknown_uj: 0.0,
        };
    }
    let total: f64 = util_ns.iter().map(|(_, u)| u.max(0.0)).sum();
    let n = util_ns.len() as f64;
    let frac = |u: f64| {
        if total > 0.0 {
            u.max(0.0) / total
        } else {
            1.0 / n
        }
    };
    let (to_procs, idle_uj) = match policy {
        IdlePolicy::Separate => (energy_uj - static_part_uj, static_part_uj),
        IdlePolicy::Proportional => (energy_uj, 0.0),
    };
    Split {
        // A GPU process is charged on its main thread's row (tid = pid).
        threads: util_ns
            .iter()
            .map(|&(pid, u)| ((pid, pid), to_procs * frac(u)))
            .collect(),
        idle_uj,
        unknown_uj: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::sw;

    fn ones(_: u32, _: &Run) -> f64 {
        1.0
    }

    fn energy_of(s: &Split, tid: u32) -> f64 {
        s.threads
            .iter()
            .find(|((_, t), _)| *t == tid)
            .map_or(0.0, |(_, e)| *e)
    }

    /// CPU 0: thread 1 for 0..600, idle after; CPU 1: thread 2 for 0..200, thread 3 after.
    fn two_cpus() -> Timeline {
        let ev = [sw(600, 0, 1, 0), sw(200, 1, 2, 3), sw(1000, 1, 3, 0)];
        Timeline::build(0, 1000, &[0, 1], &ev)
    }

    #[test]
    fn busy_time_split_with_separate_idle() {
        let occ = Occupancy::tally(&two_cpus(), &[0, 1], 0, 1000, &ones);
        assert_eq!(occ.idle_ns, 400.0);
        // 1000 µJ measured, 200 µJ static: 800 dynamic over 1600 busy ns.
        let s = split_cpu(1000.0, 200.0, &occ, IdlePolicy::Separate, &equal_power);
        assert!((energy_of(&s, 1) - 300.0).abs() < 1e-9);
        assert!((energy_of(&s, 2) - 100.0).abs() < 1e-9);
        assert!((energy_of(&s, 3) - 400.0).abs() < 1e-9);
        assert_eq!(s.idle_uj, 200.0);
        assert!((s.total() - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn proportional_idle_spreads_static_by_busy_time() {
        let occ = Occupancy::tally(&two_cpus(), &[0, 1], 0, 1000, &ones);
        let s = split_cpu(1000.0, 200.0, &occ, IdlePolicy::Proportional, &equal_power);
        assert_eq!(s.idle_uj, 0.0);
        assert!((energy_of(&s, 1) - 375.0).abs() < 1e-9);
        assert!((energy_of(&s, 3) - 500.0).abs() < 1e-9);
        assert!((s.total() - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn activity_weights_change_the_split() {
        // Thread 3 draws twice the power per ns of the others.
        let w = |_: u32, r: &Run| if r.tid == 3 { 2.0 } else { 1.0 };
        let occ = Occupancy::tally(&two_cpus(), &[0, 1], 0, 1000, &w);
        let s = split_cpu(1000.0, 0.0, &occ, IdlePolicy::Separate, &equal_power);
        // weighted: 1→600, 2→200, 3→1600; total 2400.
        assert!((energy_of(&s, 3) - 1000.0 * 1600.0 / 2400.0).abs() < 1e-9);
    }

    #[test]
    fn package_isolation_only_counts_its_cpus() {
        // Domain of CPU 1 only: thread 1 (on CPU 0) gets nothing.
        let occ = Occupancy::tally(&two_cpus(), &[1], 0, 1000, &ones);
        let s = split_cpu(500.0, 0.0, &occ, IdlePolicy::Separate, &equal_power);
        assert_eq!(energy_of(&s, 1), 0.0);
        assert!((energy_of(&s, 2) + energy_of(&s, 3) - 500.0).abs() < 1e-9);
    }

    #[test]
    fn all_idle_interval_goes_to_idle_and_static_is_capped() {
        let occ = Occupancy::tally(&two_cpus(), &[0], 700, 900, &ones);
        let s = split_cpu(
            50.0,
            static_uj(50.0, 200, 1e6),
            &occ,
            IdlePolicy::Separate,
            &equal_power,
        );
        assert_eq!((s.idle_uj, s.threads.len()), (50.0, 0));
        assert_eq!(
            static_uj(50.0, 200, 1e6),
            50.0,
            "static never exceeds the delta"
        );
        assert!(
            (static_uj(1e9, 1_000_000, 2.0) - 2000.0).abs() < 1e-9,
            "2 W × 1 ms = 2000 µJ"
        );
    }

    #[test]
    fn time_outside_the_timeline_is_unknown() {
        let occ = Occupancy::tally(&two_cpus(), &[0], 500, 1500, &ones);
        assert_eq!(
            (occ.threads[&(1, 1)].ns, occ.idle_ns, occ.unknown.ns),
            (100.0, 400.0, 500.0)
        );
        let s = split_cpu(600.0, 0.0, &occ, IdlePolicy::Separate, &equal_power);
        assert!((s.unknown_uj - 500.0).abs() < 1e-9);
    }

    #[test]
    fn gpu_split_by_utilisation_else_equal() {
        let s = split_gpu(
            1000.0,
            100.0,
            &[(7, 300.0), (8, 600.0)],
            IdlePolicy::Separate,
        );
        assert!((energy_of(&s, 7) - 300.0).abs() < 1e-9);
        assert!((energy_of(&s, 8) - 600.0).abs() < 1e-9);
        assert_eq!(s.idle_uj, 100.0);
        let s = split_gpu(1000.0, 100.0, &[(7, 0.0), (8, 0.0)], IdlePolicy::Separate);
        assert!((energy_of(&s, 7) - 450.0).abs() < 1e-9);
        let s = split_gpu(1000.0, 100.0, &[], IdlePolicy::Separate);
        assert_eq!(s.idle_uj, 1000.0);
    }
}
