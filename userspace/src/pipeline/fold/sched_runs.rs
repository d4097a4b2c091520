//! Closing a window's folded runs: a CPU's runs are folded into a [`RunStore`] as its
//! cells close (12 bytes a run, see `timeline::store`), indexing the window's [`Threads`].
//! At the window's end they move into the window's timeline; the runs past the end (a CPU
//! ahead of it) stay, indexed anew in the next window's threads.

use crate::timeline::{Run, RunStore, Threads};

/// Takes the runs of `done` that end by `end`; the rest stay in `done`, indexed in `next`
/// (the next window's threads) from `end` on. A run across `end` (a window forced off the
/// cuts) is split by its length, its count by [`super::clip`], and its part before `end`
/// merged into the run before it when that is the same thread.
pub(crate) fn close(
    done: &mut RunStore,
    threads: &mut Threads,
    next: &mut Threads,
    end: u64,
) -> RunStore {
    let k = done.first_ending_after(end);
    if k == done.len() {
        return std::mem::take(done);
    }
    let later: Vec<Run> = (k..done.len())
        .map(|i| done.run(threads.table_ref(), i))
        .collect();
    done.truncate(k);
    let mut out = std::mem::take(done);
    let mut rest = RunStore::default();
    for mut run in later {
        if run.start_ns < end {
            // Off the cuts (see the module doc of `fold`): split by the layout.
            let mut before = run;
            before.end_ns = end;
            let whole = run.activity;
            before.activity =
                whole.map(|c| super::clip(c, run.start_ns, run.end_ns, run.start_ns, end));
            run.activity = whole.zip(before.activity).map(|(c, b)| c - b);
            run.start_ns = end;
            push_merged(&mut out, threads, before);
        }
        rest.push(next, &run);
    }
    *done = rest;
    out
}

/// Appends `run`, merged with the last one when it is the same thread and adjoins it.
fn push_merged(runs: &mut RunStore, threads: &mut Threads, run: Run) {
    if run.start_ns >= run.end_ns {
        return;
    }
    if let Some(mut last) = runs.last(threads)
        && last.end_ns == run.start_ns
        && last.tid == run.tid
        && last.tgid == run.tgid
        && last.activity.is_some() == run.activity.is_some()
    {
        last.end_ns = run.end_ns;
        last.activity = last.activity.zip(run.activity).map(|(a, b)| a + b);
        if run.cgroup_id != 0 {
            last.cgroup_id = run.cgroup_id;
        }
        runs.truncate(runs.len() - 1);
        runs.push(threads, &last);
        return;
    }
    runs.push(threads, &run);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(start_ns: u64, end_ns: u64, tid: u32, activity: Option<u64>) -> Run {
        Run {
            start_ns,
            end_ns,
            tid,
            tgid: tid,
            cgroup_id: u64::from(tid) * 7,
            activity,
        }
    }

    fn runs(store: &RunStore, threads: &Threads) -> Vec<Run> {
        (0..store.len())
            .map(|i| store.run(threads.table_ref(), i))
            .collect()
    }

    #[test]
    fn close_gives_back_the_runs_pushed_and_keeps_the_rest() {
        let long = 100 + (1u64 << 33);
        let pushed = [
            run(100, 150, 1, Some(5)),
            run(150, 160, 0, None),
            run(160, long, 2, Some(0)),
            run(long, long + 10, 1, None),
            run(long + 10, long + 30, 3, Some(40)),
        ];
        let mut threads = Threads::default();
        let mut done = RunStore::default();
        for r in &pushed {
            done.push(&mut threads, r);
        }
        let mut next = Threads::default();
        let got = close(&mut done, &mut threads, &mut next, long + 20);
        let got = runs(&got, &threads);
        assert_eq!(got[..4], pushed[..4]);
        // The last run is split at the end, its count by length.
        assert_eq!(got[4], run(long + 10, long + 20, 3, Some(20)));
        assert_eq!(got.len(), 5);
        let rest = close(&mut done, &mut next, &mut Threads::default(), u64::MAX);
        assert_eq!(
            runs(&rest, &next),
            vec![run(long + 20, long + 30, 3, Some(20))]
        );
        assert_eq!(done.len(), 0);
    }

    #[test]
    fn a_cell_of_few_threads_is_laid_out_as_the_sort_lays_it_out() {
        let mut x = 0x2545_f491_u64;
        for threads_in_cell in 1..=6u64 {
            let mut cell = Vec::new();
            let mut t = 1_000;
            for _ in 0..200 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let tid = (x % threads_in_cell) as u32 + u32::from(x.is_multiple_of(3)) * 7;
                let len = 1 + x % 50;
                let mut r = run(t, t + len, tid, (!x.is_multiple_of(5)).then_some(x % 100));
                r.cgroup_id = if x.is_multiple_of(7) { 0 } else { x % 4 };
                cell.push(r);
                t += len;
            }
            let lay = |sorted: bool| {
                let (mut threads, mut out) = (Threads::default(), RunStore::default());
                let mut keys = super::super::Keys::default();
                if sorted {
                    super::super::lay_out_sorted(&cell, &mut keys, &mut threads, &mut out, 1_000);
                } else {
                    super::super::lay_out(&cell, &mut keys, &mut threads, &mut out, 1_000);
                }
                runs(&out, &threads)
            };
            assert_eq!(lay(false), lay(true), "{threads_in_cell} threads");
        }
    }

    #[test]
    fn a_split_part_merges_into_the_same_threads_run_before_it() {
        let mut threads = Threads::default();
        let mut done = RunStore::default();
        done.push(&mut threads, &run(0, 10, 4, Some(10)));
        done.push(&mut threads, &run(10, 30, 4, Some(20)));
        let mut next = Threads::default();
        let got = close(&mut done, &mut threads, &mut next, 20);
        assert_eq!(runs(&got, &threads), vec![run(0, 20, 4, Some(20))]);
        assert_eq!(runs(&done, &next), vec![run(20, 30, 4, Some(10))]);
    }
}
