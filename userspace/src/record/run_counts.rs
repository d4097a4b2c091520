//! Run counts on disk (`RunCounts` in `proto/energy_bpf.proto`): what the run counters
//! (`record --activity-events`) counted over each run, packed by column. Recordings made
//! without run counters have none, and read as before.

use crate::pb::v1::RunCounts;

/// Counters per run at most (the probes' `RUN_COUNTERS`).
pub const MAX_COUNTERS: usize = energy_bpf_abi::RUN_COUNTERS;

/// What the run counters counted over one interval of a run: `tid` on `cpu` from the
/// previous read there to `ts_ns`, a switch or a sampler tick (`RunCounts` in the proto).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountedRun {
    /// End of the interval, CLOCK_MONOTONIC ns.
    pub ts_ns: u64,
    /// CPU it ran on.
    pub cpu: u32,
    /// Thread (0: the idle task).
    pub tid: u32,
    /// Count of `Header.run_counters[k]`, `None` when that counter did not count it.
    pub counts: [Option<u64>; MAX_COUNTERS],
}

/// Packs `runs` into columns.
pub fn to_columns(runs: &[CountedRun], dropped: u64) -> RunCounts {
    let mut c = RunCounts {
        dropped,
        ..RunCounts::default()
    };
    let mut last = 0u64;
    for r in runs {
        c.cpu.push(r.cpu);
        c.ts_delta_ns.push(r.ts_ns.wrapping_sub(last) as i64);
        last = r.ts_ns;
        c.tid.push(r.tid);
        let mut valid = 0;
        for (k, count) in r.counts.iter().enumerate() {
            if let Some(n) = count {
                valid |= 1 << k;
                c.count.push(*n);
            }
        }
        c.valid.push(valid);
    }
    c
}

/// Why run-count columns could not be unpacked.
#[derive(Debug, thiserror::Error)]
#[error("run count columns are inconsistent: {0}")]
pub struct RunCountsError(&'static str);

/// Unpacks columns into runs, in their recorded order.
pub fn from_columns(c: &RunCounts) -> Result<Vec<CountedRun>, RunCountsError> {
    let n = c.ts_delta_ns.len();
    if c.cpu.len() != n || c.tid.len() != n || c.valid.len() != n {
        return Err(RunCountsError("per-run columns differ in length"));
    }
    let mut counts = c.count.iter();
    let mut runs = Vec::with_capacity(n);
    let mut last = 0u64;
    for i in 0..n {
        let valid = c.valid[i];
        if valid >> MAX_COUNTERS != 0 {
            return Err(RunCountsError("a run names a counter past the last"));
        }
        last = last.wrapping_add(c.ts_delta_ns[i] as u64);
        let mut run = CountedRun {
            ts_ns: last,
            cpu: c.cpu[i],
            tid: c.tid[i],
            counts: [None; MAX_COUNTERS],
        };
        for (k, slot) in run.counts.iter_mut().enumerate() {
            if valid & (1 << k) != 0 {
                *slot = Some(
                    *counts
                        .next()
                        .ok_or(RunCountsError("count column ends early"))?,
                );
            }
        }
        runs.push(run);
    }
    if counts.next().is_some() {
        return Err(RunCountsError("count column has entries left over"));
    }
    Ok(runs)
}

#[cfg(test)]
#[path = "run_counts_tests.rs"]
mod tests;
