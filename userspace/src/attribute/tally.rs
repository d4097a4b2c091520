//! Tallying many intervals of one timeline fast: its threads interned once per window
//! ([`ThreadIndex`]: dense indices in key order), each interval's per-thread sums added into
//! a flat array by index that is reused from interval to interval ([`Tally`]). No map is
//! built per interval and none is held across intervals; the sums, and their order of
//! addition, are those of [`Occupancy::tally`].

use std::cell::Cell;

use crate::timeline::{CpuTimeline, IDLE_TID, Run, RunStore, Timeline, UNKNOWN_TID};

use super::split::{Occupancy, ThreadKey, ThreadTime, ThreadTimes, add_gap};

/// The threads of one timeline, interned once: their keys in order, and for every entry of
/// the timeline's thread table the index of its key ([`NO_THREAD`] for unknown, [`IDLE`]
/// for idle). Built once per window, it lets [`Tally`] sum each interval into a flat array.
#[derive(Clone, Debug)]
pub struct ThreadIndex<'a> {
    timeline: &'a Timeline,
    keys: Vec<ThreadKey>,
    /// Per entry of the timeline's thread table.
    codes: Vec<u32>,
}

/// The index of unknown runs in a [`ThreadIndex`].
pub const NO_THREAD: u32 = u32::MAX;

/// The index of idle runs in a [`ThreadIndex`].
const IDLE: u32 = u32::MAX - 1;

impl<'a> ThreadIndex<'a> {
    /// Interns every busy run's thread of `timeline`.
    pub fn new(timeline: &'a Timeline) -> Self {
        let who = timeline.who();
        // Which entries some run names: only their threads are keys.
        let mut used = vec![false; who.len()];
        for ct in &timeline.cpus {
            let store = ct.store();
            for i in 0..store.len() {
                used[store.id(i) as usize] = true;
            }
        }
        let mut keys: Vec<ThreadKey> = who
            .iter()
            .zip(&used)
            .filter(|(w, used)| **used && w.is_busy())
            .map(|(w, _)| (w.tgid, w.tid))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let codes = who
            .iter()
            .map(|w| match w.tid {
                IDLE_TID => IDLE,
                UNKNOWN_TID => NO_THREAD,
                _ => keys
                    .binary_search(&(w.tgid, w.tid))
                    .map_or(NO_THREAD, |i| i as u32),
            })
            .collect();
        Self {
            timeline,
            keys,
            codes,
        }
    }

    /// The threads' keys, sorted: a thread's index is its position here.
    pub fn keys(&self) -> &[ThreadKey] {
        &self.keys
    }

    /// Position of `cpu` among the timeline's CPUs.
    fn position(&self, cpu: u32) -> Option<usize> {
        let cpus = &self.timeline.cpus;
        match cpus.binary_search_by_key(&cpu, |c| c.cpu) {
            Ok(i) => Some(i),
            Err(_) => cpus.iter().position(|c| c.cpu == cpu),
        }
    }
}

/// Tallies many intervals of one indexed timeline: each interval's per-thread sums are
/// added into a flat array by thread index (reused from interval to interval), then listed
/// in key order. The sums, and their order of addition, are those of
/// [`Occupancy::tally`].
#[derive(Clone, Debug)]
pub struct Tally<'i, 'a> {
    index: &'i ThreadIndex<'a>,
    acc: Vec<ThreadTime>,
    /// Whether each thread has a part in the current interval.
    seen: Vec<bool>,
    touched: Vec<u32>,
    /// The indices of the last filled interval's threads, in its order.
    filled: Vec<u32>,
    /// Per CPU of the timeline, where the last query's runs began or ended: intervals are
    /// queried in time order, so the next query's first run is found a few runs on (see
    /// [`seek`]), not by a binary search over the window.
    hints: Vec<Cell<usize>>,
}

impl<'i, 'a> Tally<'i, 'a> {
    /// A tally over `index`'s timeline.
    pub fn new(index: &'i ThreadIndex<'a>) -> Self {
        Self {
            index,
            acc: vec![ThreadTime::default(); index.keys.len()],
            seen: vec![false; index.keys.len()],
            touched: Vec::new(),
            filled: Vec::new(),
            hints: vec![Cell::new(0); index.timeline.cpus.len()],
        }
    }

    /// The timeline tallied.
    pub fn timeline(&self) -> &'a Timeline {
        self.index.timeline
    }

    /// [`Occupancy::tally`] of `[a, b)` on `cpus` into `occ` (its buffers reused).
    pub fn fill(
        &mut self,
        occ: &mut Occupancy,
        cpus: &[u32],
        a: u64,
        b: u64,
        weight: &impl Fn(u32, &Run) -> f64,
    ) {
        let mut pairs = occ.threads.take_pairs();
        pairs.clear();
        *occ = Occupancy::default();
        let index = self.index;
        for &cpu in cpus {
            let covered = parts(index, &self.hints, cpu, a, b, |ct, i, code, ns| {
                let ns = ns as f64;
                if code == IDLE {
                    occ.idle_ns += ns;
                    return;
                }
                let weighted = ns * weight(cpu, &ct.store().run(ct.who(), i));
                if code == NO_THREAD {
                    occ.unknown.ns += ns;
                    occ.unknown.weighted += weighted;
                } else {
                    let i = code as usize;
                    if !self.seen[i] {
                        self.seen[i] = true;
                        self.touched.push(code);
                    }
                    let t = &mut self.acc[i];
                    t.ns += ns;
                    t.weighted += weighted;
                }
            });
            add_gap(occ, cpu, a, b, covered, weight);
        }
        self.touched.sort_unstable();
        pairs.extend(self.touched.iter().map(|&id| {
            let i = id as usize;
            self.seen[i] = false;
            (index.keys[i], std::mem::take(&mut self.acc[i]))
        }));
        std::mem::swap(&mut self.touched, &mut self.filled);
        self.touched.clear();
        occ.threads = ThreadTimes::from_sorted(pairs);
    }

    /// The index of each thread of the last [`Self::fill`]'s occupancy, in its order.
    pub fn filled(&self) -> &[u32] {
        &self.filled
    }

    /// [`Occupancy::totals`] over this tally's timeline.
    pub fn totals(
        &self,
        cpus: &[u32],
        a: u64,
        b: u64,
        weight: &impl Fn(u32, &Run) -> f64,
    ) -> Occupancy {
        // As `Occupancy::totals` walks the runs (the same sums in the same order), but on
        // the store: a run is built only for the weight of a busy one.
        let mut occ = Occupancy::default();
        for &cpu in cpus {
            let covered = parts(self.index, &self.hints, cpu, a, b, |ct, i, code, ns| {
                let ns = ns as f64;
                if code == IDLE {
                    occ.idle_ns += ns;
                } else {
                    occ.unknown.ns += ns;
                    occ.unknown.weighted += ns * weight(cpu, &ct.store().run(ct.who(), i));
                }
            });
            add_gap(&mut occ, cpu, a, b, covered, weight);
        }
        occ
    }

    /// Busy CPU-ns (threads + unknown) of `[a, b)` on `cpus`, as [`Occupancy::busy_ns`]
    /// counts them (integer sums, so the same value), without listing threads.
    pub fn busy_ns(&self, cpus: &[u32], a: u64, b: u64) -> f64 {
        let mut idle = 0u64;
        for &cpu in cpus {
            parts(self.index, &self.hints, cpu, a, b, |_, _, code, ns| {
                if code == IDLE {
                    idle += ns;
                }
            });
        }
        (cpus.len() as u64 * b.saturating_sub(a)).saturating_sub(idle) as f64
    }
}

/// Walks the runs of `cpu` that overlap `[a, b)`, from the first that ends after `a` (found
/// from the CPU's hint, which is left at the last run met: it may reach into the next
/// interval): `part(its timeline, run index, run's code in `index`, ns of it in [a, b))`.
/// Returns the ns they cover (0 for a CPU the timeline does not have).
fn parts<'a>(
    index: &ThreadIndex<'a>,
    hints: &[Cell<usize>],
    cpu: u32,
    a: u64,
    b: u64,
    mut part: impl FnMut(&'a CpuTimeline, usize, u32, u64),
) -> u64 {
    let Some(pos) = index.position(cpu) else {
        return 0;
    };
    let ct: &'a CpuTimeline = &index.timeline.cpus[pos];
    let store = ct.store();
    let first = seek(store, &hints[pos], a);
    let mut last = first;
    let mut covered = 0;
    for i in first..store.len() {
        let start = store.start(i);
        if start >= b {
            break;
        }
        last += 1;
        let ns = store.end(i).min(b).saturating_sub(start.max(a));
        covered += ns;
        part(ct, i, index.codes[store.id(i) as usize], ns);
    }
    hints[pos].set(last.saturating_sub(1).max(first));
    covered
}

/// The first index in `lo..hi` where `ends_by` is false (it is true, then false).
fn partition(mut lo: usize, mut hi: usize, ends_by: impl Fn(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ends_by(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// The first run of `runs` (in time order) that ends after `a`, as
/// [`RunStore::first_ending_after`] finds it, searched from `hint` (which it updates): back
/// by binary search when the hint is past it, else forward by doubling steps from the
/// hint, then a binary search within the last step. A query a few runs after the last
/// costs a few probes of runs just read.
fn seek(runs: &RunStore, hint: &Cell<usize>, a: u64) -> usize {
    let ends_by = move |i: usize| runs.end(i) <= a;
    let len = runs.len();
    let h = hint.get().min(len);
    let first = if h > 0 && !ends_by(h - 1) {
        partition(0, h, ends_by)
    } else {
        // Every run before `lo` ends by `a`.
        let mut lo = h;
        let mut step = 1;
        loop {
            let probe = lo + step;
            if probe > len {
                break partition(lo, len, ends_by);
            }
            if ends_by(probe - 1) {
                lo = probe;
                step *= 2;
            } else {
                break partition(lo, probe - 1, ends_by);
            }
        }
    };
    hint.set(first);
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sw_to;

    #[test]
    fn seek_finds_what_a_binary_search_finds_from_any_hint() {
        // Runs end to end with a gap (idle time is a run too, but a gap is allowed).
        let mut runs = RunStore::default();
        let mut threads = crate::timeline::Threads::default();
        let mut t = 0;
        for i in 0..200u64 {
            let len = 1 + (i * 7919) % 13;
            let run = Run {
                start_ns: t,
                end_ns: t + len,
                tid: 1,
                tgid: 1,
                cgroup_id: 0,
                activity: None,
            };
            runs.push(&mut threads, &run);
            t += len + u64::from(i == 50) * 40;
        }
        assert_eq!(runs.len(), 201, "the gap is held as one");
        for hint in [0, 1, 2, 3, 17, 64, 199, 200, 500] {
            for a in (0..t + 5).step_by(3) {
                let want = runs.first_ending_after(a);
                assert_eq!(want, partition(0, runs.len(), |i| runs.end(i) <= a));
                let cell = Cell::new(hint);
                assert_eq!(seek(&runs, &cell, a), want, "hint {hint}, a {a}");
                assert_eq!(cell.get(), want);
            }
        }
        assert_eq!(seek(&RunStore::default(), &Cell::new(3), 10), 0);
    }

    #[test]
    fn the_flat_tally_sums_as_the_sorting_one_does() {
        // Four threads of two processes, idle and unknown stretches, on three CPUs (CPU 2
        // has no events: all unknown); intervals inside, across and past the window.
        let mut ev = Vec::new();
        let mut x = 0x2545_f491_u64;
        for i in 0..300u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let tid = (x % 5) as u32; // 0 is idle
            let next = ((x >> 8) % 5) as u32;
            let mut e = sw_to(
                10 * i + x % 7,
                (i % 2) as u32,
                tid,
                (!x.is_multiple_of(11)).then_some(next),
            );
            if tid != 0 {
                e.tgid = 100 + tid % 2;
            }
            ev.push(e);
        }
        ev.sort_by_key(|s| s.ts_ns);
        let tl = Timeline::build(0, 3000, &[0, 1, 2], &ev);
        let index = ThreadIndex::new(&tl);
        let mut tally = Tally::new(&index);
        let w = |cpu: u32, r: &Run| 1.0 + f64::from(cpu) * 0.25 + f64::from(r.tid % 3) * 0.1;
        let mut occ = Occupancy::default();
        for (a, b) in [(0, 3000), (5, 17), (100, 1234), (2990, 4000), (3100, 3200)] {
            for cpus in [&[0, 1, 2][..], &[1], &[2, 0]] {
                let want = Occupancy::tally(&tl, cpus, a, b, &w);
                tally.fill(&mut occ, cpus, a, b, &w);
                assert_eq!(occ, want, "[{a}, {b}) on {cpus:?}");
                let totals = tally.totals(cpus, a, b, &w);
                assert_eq!(totals.busy_ns(), want.busy_ns());
                assert_eq!(totals.idle_ns, want.idle_ns);
                assert_eq!(tally.busy_ns(cpus, a, b), want.busy_ns());
                let weighted: f64 =
                    want.threads.values().map(|t| t.weighted).sum::<f64>() + want.unknown.weighted;
                assert!((totals.unknown.weighted - weighted).abs() <= 1e-9 * weighted);
            }
        }
    }
}
