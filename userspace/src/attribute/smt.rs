//! SMT: two hardware threads on one core do not draw twice the core's power (TProf's
//! per-core step). Energy goes to physical cores first, then among the siblings: while k
//! siblings of a core are busy, each busy thread-ns weighs `(1 + extra·(k−1)) / k`, where
//! `extra` is the power a second sibling adds as a share of one thread's (0: the core's
//! power is shared; 1: no SMT effect).

use std::collections::BTreeMap;

use crate::timeline::{Timeline, UNKNOWN_TID};

use super::split::{Occupancy, ThreadKey};

/// Groups a domain's CPUs by physical core (`(package, core)`); only cores with siblings.
pub fn cores(cpus: &[crate::pb::v1::Cpu], domain_cpus: &[u32]) -> Vec<Vec<u32>> {
    let mut by_core: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
    for c in cpus.iter().filter(|c| domain_cpus.contains(&c.id)) {
        by_core.entry((c.package, c.core)).or_default().push(c.id);
    }
    by_core.into_values().filter(|v| v.len() > 1).collect()
}

/// Rescales each thread's activity in `occ` (tallied over `[a, b)`) by its SMT weight.
pub fn apply(
    occ: &mut Occupancy,
    timeline: &Timeline,
    cores: &[Vec<u32>],
    a: u64,
    b: u64,
    extra: f64,
) {
    let mut smt_ns: BTreeMap<ThreadKey, f64> = BTreeMap::new();
    let mut plain_ns: BTreeMap<ThreadKey, f64> = BTreeMap::new();
    for core in cores {
        // Busy runs of the core's CPUs, clipped to the interval.
        let runs: Vec<(u64, u64, ThreadKey)> = core
            .iter()
            .filter_map(|&cpu| timeline.cpu(cpu))
            .flat_map(|ct| ct.runs_in(a, b))
            .filter(|r| r.is_busy() && r.tid != UNKNOWN_TID)
            .map(|r| (r.start_ns.max(a), r.end_ns.min(b), (r.tgid, r.tid)))
            .filter(|(s, e, _)| e > s)
            .collect();
        let mut bounds: Vec<u64> = runs.iter().flat_map(|&(s, e, _)| [s, e]).collect();
        bounds.sort_unstable();
        bounds.dedup();
        for w in bounds.windows(2) {
            let (s, e) = (w[0], w[1]);
            let on: Vec<ThreadKey> = runs
                .iter()
                .filter(|r| r.0 <= s && r.1 >= e)
                .map(|r| r.2)
                .collect();
            let k = on.len() as f64;
            let scale = if k > 1.0 {
                (1.0 + extra * (k - 1.0)) / k
            } else {
                1.0
            };
            for key in on {
                *smt_ns.entry(key).or_insert(0.0) += (e - s) as f64 * scale;
                *plain_ns.entry(key).or_insert(0.0) += (e - s) as f64;
            }
        }
    }
    for (key, t) in occ.threads.iter_mut() {
        if let (Some(smt), Some(&plain)) = (smt_ns.get(key), plain_ns.get(key))
            && plain > 0.0
        {
            t.weighted *= smt / plain;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::split::equal_power;
    use crate::attribute::{IdlePolicy, split::split_cpu};

    use crate::testing::sw;

    #[test]
    fn co_running_siblings_share_their_core() {
        // Core 0 = CPUs 0 and 1: thread 1 alone on CPU 0 for 0..500, then threads 1 and 2
        // together on both siblings for 500..1000.
        let ev = [sw(500, 1, 0, 2), sw(1000, 0, 1, 0), sw(1000, 1, 2, 0)];
        let tl = Timeline::build(0, 1000, &[0, 1], &ev);
        let mut occ = Occupancy::tally(&tl, &[0, 1], 0, 1000, &|_, _| 1.0);
        apply(&mut occ, &tl, &[vec![0, 1]], 0, 1000, 0.0);
        // Core-seconds: thread 1 = 500 + 250, thread 2 = 250.
        let s = split_cpu(1000.0, 0.0, &occ, IdlePolicy::Separate, &equal_power);
        let e = |tid| {
            s.threads
                .iter()
                .find(|((_, t), _)| *t == tid)
                .map_or(0.0, |x| x.1)
        };
        assert!(
            (e(1) - 750.0).abs() < 1e-9 && (e(2) - 250.0).abs() < 1e-9,
            "{s:?}"
        );
    }
}
