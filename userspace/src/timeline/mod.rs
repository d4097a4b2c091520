//! Who ran on each CPU in every nanosecond range, rebuilt from `sched_switch` events.
//!
//! Pure: a function of the switch events and the capture window. A switch event at `t` on
//! CPU `c` closes the run of the task leaving (`prev`), which ran from the previous switch on
//! `c` (or the window start) to `t`, and opens the run of `next` when the probe could read it.
//! Busy and idle time come from here, never from sample counts: idle CPUs in a VM may take
//! no timer samples at all (docs/ARCHITECTURE.md, "Our machines").

mod store;
mod sums;

use std::{collections::BTreeMap, sync::Arc};

pub(crate) use store::{RunStore, Threads, Who};

use crate::{
    pb::v1::SwitchEvent,
    record::{CpuOrders, Recording, SwitchLog},
};

/// Thread id of a CPU's idle task (swapper).
pub(crate) const IDLE_TID: u32 = 0;

/// Thread id used for a stretch of time whose task is not known (no switch seen on the CPU
/// yet and the probe could not read `next`).
pub(crate) const UNKNOWN_TID: u32 = u32::MAX;

/// One uninterrupted stretch of one thread on one CPU, `[start_ns, end_ns)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// End (exclusive), CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// Thread; `IDLE_TID` for idle, `UNKNOWN_TID` when unknown.
    pub tid: u32,
    /// Process of `tid`.
    pub tgid: u32,
    /// cgroup v2 id of the thread (0 when unknown).
    pub cgroup_id: u64,
    /// Activity count (e.g. cycles) over `[start_ns, end_ns)`, when the probe counted the
    /// run: a run cut by the window keeps the share of its count its length says.
    pub activity: Option<u64>,
}

impl Run {
    /// Length in ns.
    pub fn len_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// Whether a real thread (not idle, not unknown) ran.
    pub fn is_busy(&self) -> bool {
        self.tid != IDLE_TID && self.tid != UNKNOWN_TID
    }

    /// Overlap of this run with `[a, b)`, in ns.
    pub fn overlap_ns(&self, a: u64, b: u64) -> u64 {
        self.end_ns.min(b).saturating_sub(self.start_ns.max(a))
    }
}

/// The runs of one CPU, sorted, non-overlapping, covering the window without gaps. Held
/// compact (see `store`): runs are read as values. Its thread table is its timeline's.
#[derive(Clone, Debug)]
pub struct CpuTimeline {
    /// CPU number.
    pub cpu: u32,
    store: RunStore,
    /// The window's threads, which `store` indexes.
    who: Arc<[Who]>,
}

impl CpuTimeline {
    /// Every run, in time order.
    pub fn runs(&self) -> impl Iterator<Item = Run> + '_ {
        self.runs_from(0)
    }

    /// The runs from the `i`-th of the store on (see [`Self::store`]).
    pub(crate) fn runs_from(&self, i: usize) -> impl Iterator<Item = Run> + '_ {
        (i..self.store.len()).map(|i| self.store.run(&self.who, i))
    }

    /// Runs that overlap `[a, b)`, found by binary search.
    pub fn runs_in(&self, a: u64, b: u64) -> impl Iterator<Item = Run> + '_ {
        self.runs_from(self.store.first_ending_after(a))
            .take_while(move |r| r.start_ns < b)
    }

    /// Busy ns (real threads only) within `[a, b)`.
    pub fn busy_ns(&self, a: u64, b: u64) -> u64 {
        self.runs_in(a, b)
            .filter(|r| r.is_busy())
            .map(|r| r.overlap_ns(a, b))
            .sum()
    }

    /// The runs as held: starts, thread indices into [`Self::who`].
    pub(crate) fn store(&self) -> &RunStore {
        &self.store
    }

    /// The threads the store's indices name (the timeline's table).
    pub(crate) fn who(&self) -> &[Who] {
        &self.who
    }
}

impl PartialEq for CpuTimeline {
    fn eq(&self, other: &Self) -> bool {
        self.cpu == other.cpu && self.runs().eq(other.runs())
    }
}

impl Eq for CpuTimeline {}

/// Every CPU's runs over one capture window.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    /// Window start (capture start), ns.
    pub start_ns: u64,
    /// Window end (capture end), ns.
    pub end_ns: u64,
    /// One entry per CPU, by CPU number.
    pub cpus: Vec<CpuTimeline>,
    /// The window's threads, which every CPU's runs index (each CPU holds it too).
    who: Arc<[Who]>,
}

impl PartialEq for Timeline {
    /// The same runs (however the thread tables were built).
    fn eq(&self, other: &Self) -> bool {
        (self.start_ns, self.end_ns) == (other.start_ns, other.end_ns) && self.cpus == other.cpus
    }
}

impl Eq for Timeline {}

impl Timeline {
    /// The timeline of `stores`, CPU by CPU, whose runs index `threads`.
    pub(crate) fn from_stores(
        start_ns: u64,
        end_ns: u64,
        stores: Vec<(u32, RunStore)>,
        threads: &Threads,
    ) -> Self {
        let who = threads.table();
        let cpus = stores
            .into_iter()
            .map(|(cpu, store)| CpuTimeline {
                cpu,
                store,
                who: who.clone(),
            })
            .collect();
        Self {
            start_ns,
            end_ns,
            cpus,
            who,
        }
    }

    /// The threads every CPU's runs index.
    pub(crate) fn who(&self) -> &[Who] {
        &self.who
    }

    /// Rebuilds the timeline of `cpus` over `[start_ns, end_ns)` from switch events in any
    /// order. The first run on each CPU (the task already running at capture start) is the
    /// `prev` of its first switch; the last is the `next` of its last switch, or unknown.
    pub fn build(start_ns: u64, end_ns: u64, cpus: &[u32], switches: &[SwitchEvent]) -> Self {
        Self::build_from(start_ns, end_ns, cpus, Switches::Events(switches))
    }

    /// The timeline of every CPU of a recording over its capture window.
    pub fn of(rec: &Recording) -> Self {
        Self::build_from(
            rec.start_ns(),
            rec.end_ns,
            &rec.cpu_ids(),
            Switches::Log(&rec.switches),
        )
    }

    /// [`Self::build`] from events held either way. Each CPU's runs are built as its
    /// events come, one batch decoded at a time; only a CPU whose events are out of time
    /// order has them gathered and sorted first (stably, so ties keep their order).
    pub(crate) fn build_from(
        start_ns: u64,
        end_ns: u64,
        cpus: &[u32],
        switches: Switches<'_>,
    ) -> Self {
        // How many events each CPU has, and whether they come in time order: a log counted
        // them as they were added; a slice is cheap to count here.
        let counted;
        let orders = match switches {
            Switches::Events(events) => {
                let mut o = CpuOrders::default();
                o.add(events);
                counted = o;
                &counted
            }
            Switches::Log(log) => log.cpu_orders(),
        };
        // (events, in time order) per CPU, the window's CPUs included when they had none.
        let mut seen: BTreeMap<u32, (usize, bool)> = cpus.iter().map(|&c| (c, (0, true))).collect();
        seen.extend(orders.iter().map(|(cpu, o)| (cpu, (o.events, o.ordered))));
        let mut threads = Threads::default();
        let mut builders: BTreeMap<u32, CpuRuns> = seen
            .iter()
            .map(|(&cpu, &(count, _))| (cpu, CpuRuns::new(start_ns, end_ns, count)))
            .collect();
        let mut unordered: BTreeMap<u32, Vec<SwitchEvent>> = seen
            .iter()
            .filter(|(_, (_, ordered))| !ordered)
            .map(|(&cpu, &(count, _))| (cpu, Vec::with_capacity(count)))
            .collect();
        switches.for_each_batch(|batch| {
            for s in batch {
                if let Some(gathered) = unordered.get_mut(&s.cpu) {
                    gathered.push(*s);
                } else if let Some(b) = builders.get_mut(&s.cpu) {
                    b.push(&mut threads, s);
                }
            }
        });
        for (cpu, mut events) in unordered {
            events.sort_by_key(|e| e.ts_ns);
            if let Some(b) = builders.get_mut(&cpu) {
                events.iter().for_each(|e| b.push(&mut threads, e));
            }
        }
        let stores: Vec<(u32, RunStore)> = builders
            .into_iter()
            .map(|(cpu, b)| (cpu, b.finish(&mut threads)))
            .collect();
        Self::from_stores(start_ns, end_ns, stores, &threads)
    }

    /// The timeline of one CPU.
    pub fn cpu(&self, cpu: u32) -> Option<&CpuTimeline> {
        // Built timelines hold their CPUs sorted: a binary search keeps lookups per interval
        // and CPU from growing with the number of CPUs; a hand-made unsorted one is searched.
        match self.cpus.binary_search_by_key(&cpu, |c| c.cpu) {
            Ok(i) => self.cpus.get(i),
            Err(_) => self.cpus.iter().find(|c| c.cpu == cpu),
        }
    }

    /// On-CPU ns per thread `(tgid, tid)` summed over all CPUs within `[a, b)`.
    pub fn thread_ns(&self, a: u64, b: u64) -> BTreeMap<(u32, u32), u64> {
        let mut out = BTreeMap::new();
        for cpu in &self.cpus {
            for run in cpu.runs_in(a, b).filter(|r| r.is_busy()) {
                *out.entry((run.tgid, run.tid)).or_insert(0) += run.overlap_ns(a, b);
            }
        }
        out
    }
}

/// The switch events a timeline is built from: a slice, or a recording's packed log.
#[derive(Clone, Copy, Debug)]
pub enum Switches<'a> {
    /// Decoded events.
    Events(&'a [SwitchEvent]),
    /// A recording's events, decoded a block at a time.
    Log(&'a SwitchLog),
}

impl Switches<'_> {
    /// Calls `f` with the events in order, in batches.
    fn for_each_batch(&self, mut f: impl FnMut(&[SwitchEvent])) {
        match self {
            Self::Events(events) => f(events),
            Self::Log(log) => log.for_each_block(f),
        }
    }
}

/// One CPU's runs, built from its switch events pushed in time order.
struct CpuRuns {
    start_ns: u64,
    end_ns: u64,
    runs: RunStore,
    /// The latest run, held while the next may merge into it.
    open: Option<Run>,
    /// Where the run the next switch ends began (the latest switch, or the window start).
    cursor: u64,
    /// The previous switch on this CPU, where the run a switch ends began.
    previous: Option<u64>,
    /// The task the last switch switched to, when the probe read it.
    last_next: Option<(u32, u32)>,
}

impl CpuRuns {
    /// A builder for a CPU with `events` switches (an upper bound on its runs, less one).
    fn new(start_ns: u64, end_ns: u64, events: usize) -> Self {
        let mut runs = RunStore::default();
        runs.reserve(events + 1);
        Self {
            start_ns,
            end_ns,
            runs,
            open: None,
            cursor: start_ns,
            previous: None,
            last_next: None,
        }
    }

    fn push(&mut self, threads: &mut Threads, event: &SwitchEvent) {
        let (from, to) = (self.cursor.max(self.start_ns), event.ts_ns.min(self.end_ns));
        let activity = match (event.activity, self.previous) {
            (Some(count), Some(began)) => Some(clip(count, began, event.ts_ns, from, to)),
            _ => None,
        };
        self.add(
            threads,
            Run {
                start_ns: from,
                end_ns: to,
                tid: event.tid,
                tgid: event.tgid,
                cgroup_id: event.cgroup_id,
                activity,
            },
        );
        self.cursor = self.cursor.max(event.ts_ns);
        self.previous = Some(event.ts_ns);
        self.last_next = event
            .next_known
            .then_some((event.next_tid, event.next_tgid));
    }

    fn add(&mut self, threads: &mut Threads, run: Run) {
        if run.start_ns >= run.end_ns {
            return;
        }
        // Merge with the previous run when it is the same thread (e.g. a gap filled by an
        // unknown-next run that the next event shows was the same task).
        if let Some(last) = self.open.as_mut()
            && last.end_ns == run.start_ns
            && last.tid == run.tid
        {
            last.end_ns = run.end_ns;
            last.activity = last
                .activity
                .zip(run.activity)
                .map(|(a, b)| a.saturating_add(b));
            return;
        }
        if let Some(last) = self.open.replace(run) {
            self.runs.push(threads, &last);
        }
    }

    /// The runs, with the last one still going at the window's end: the `next` of the last
    /// switch, or unknown. Its count comes with the switch that ends it.
    fn finish(mut self, threads: &mut Threads) -> RunStore {
        let (tid, tgid) = self.last_next.unwrap_or((UNKNOWN_TID, 0));
        self.add(
            threads,
            Run {
                start_ns: self.cursor.max(self.start_ns),
                end_ns: self.end_ns,
                tid,
                tgid,
                cgroup_id: 0,
                activity: None,
            },
        );
        if let Some(last) = self.open.take() {
            self.runs.push(threads, &last);
        }
        self.runs
    }
}

/// The part of `count` (over the run `[began, ended)`) that falls in `[from, to)`, assuming
/// the rate was even over the run.
/// The pipeline's folded runs clip counts the same way.
pub(crate) fn clip(count: u64, began: u64, ended: u64, from: u64, to: u64) -> u64 {
    let (full, part) = (ended.saturating_sub(began), to.saturating_sub(from));
    if part >= full || full == 0 {
        return count;
    }
    (u128::from(count) * u128::from(part) / u128::from(full)) as u64
}

/// The index a thread interner last gave each tid slot (`tid % RECENT_SLOTS`): most runs
/// are of a thread met shortly before, found here without hashing. Another tid can share a
/// slot, so a hit is only a candidate the interner confirms against its own keys.
#[derive(Clone, Debug)]
pub(crate) struct RecentByTid(Vec<u32>);

/// Slots of [`RecentByTid`] (a power of two; 64 KiB).
const RECENT_SLOTS: usize = 1 << 14;

impl Default for RecentByTid {
    fn default() -> Self {
        Self(vec![0; RECENT_SLOTS])
    }
}

impl RecentByTid {
    /// The index last given in `tid`'s slot.
    pub(crate) fn get(&self, tid: u32) -> Option<u32> {
        self.0[tid as usize & (RECENT_SLOTS - 1)].checked_sub(1)
    }

    /// Notes `id` as the index of `tid`.
    pub(crate) fn set(&mut self, tid: u32, id: u32) {
        self.0[tid as usize & (RECENT_SLOTS - 1)] = id.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::sw_to as sw;

    fn spans(t: &Timeline, cpu: u32) -> Vec<(u64, u64, u32)> {
        t.cpu(cpu)
            .expect("cpu present")
            .runs()
            .map(|r| (r.start_ns, r.end_ns, r.tid))
            .collect()
    }

    #[test]
    fn first_and_last_partial_runs() {
        // Task 7 was running before capture began at 100; it leaves at 150 for 9, which
        // leaves at 300 for idle; capture ends at 400 with idle still running.
        let ev = [sw(150, 0, 7, Some(9)), sw(300, 0, 9, Some(0))];
        let t = Timeline::build(100, 400, &[0], &ev);
        assert_eq!(
            spans(&t, 0),
            vec![(100, 150, 7), (150, 300, 9), (300, 400, 0)]
        );
    }

    #[test]
    fn unknown_next_leaves_tail_unknown() {
        let ev = [sw(150, 0, 7, None)];
        let t = Timeline::build(100, 400, &[0], &ev);
        assert_eq!(spans(&t, 0), vec![(100, 150, 7), (150, 400, UNKNOWN_TID)]);
        assert_eq!(t.cpu(0).map(|c| c.busy_ns(0, 1000)), Some(50));
    }

    #[test]
    fn cpu_without_events_is_unknown_for_the_whole_window() {
        let t = Timeline::build(0, 1000, &[0, 1], &[sw(500, 0, 3, Some(0))]);
        assert_eq!(spans(&t, 1), vec![(0, 1000, UNKNOWN_TID)]);
        assert_eq!(spans(&t, 0), vec![(0, 500, 3), (500, 1000, 0)]);
    }

    #[test]
    fn events_out_of_order_and_across_cpus() {
        let ev = [
            sw(300, 1, 5, Some(0)),
            sw(200, 0, 4, Some(6)),
            sw(100, 1, 0, Some(5)),
            sw(250, 0, 6, Some(4)),
        ];
        let t = Timeline::build(0, 400, &[0, 1], &ev);
        assert_eq!(
            spans(&t, 0),
            vec![(0, 200, 4), (200, 250, 6), (250, 400, 4)]
        );
        assert_eq!(
            spans(&t, 1),
            vec![(0, 100, 0), (100, 300, 5), (300, 400, 0)]
        );
        // The same events packed as a recording holds them give the same timeline.
        let log: SwitchLog = ev.iter().copied().collect();
        assert_eq!(
            Timeline::build_from(0, 400, &[0, 1], Switches::Log(&log)),
            t
        );
        let per_thread = t.thread_ns(0, 400);
        assert_eq!(per_thread.get(&(4, 4)), Some(&350));
        assert_eq!(per_thread.get(&(5, 5)), Some(&200));
        assert_eq!(per_thread.get(&(6, 6)), Some(&50));
        assert_eq!(per_thread.get(&(0, 0)), None, "idle is not a thread");
    }

    #[test]
    fn events_outside_the_window_are_clipped() {
        let ev = [
            sw(50, 0, 2, Some(3)),
            sw(150, 0, 3, Some(2)),
            sw(450, 0, 2, Some(0)),
        ];
        let t = Timeline::build(100, 400, &[0], &ev);
        assert_eq!(spans(&t, 0), vec![(100, 150, 3), (150, 400, 2)]);
    }

    #[test]
    fn activity_counts_are_clipped_with_their_runs() {
        let counted = |ts_ns, tid, next, count| SwitchEvent {
            activity: Some(count),
            ..sw(ts_ns, 0, tid, Some(next))
        };
        // The first switch's run began before any event: its count cannot be placed.
        let ev = [
            counted(50, 2, 3, 100),
            counted(150, 3, 2, 1_000),
            counted(450, 2, 0, 3_000),
        ];
        let t = Timeline::build(100, 400, &[0], &ev);
        let runs: Vec<(u64, u64, Option<u64>)> = t.cpus[0]
            .runs()
            .map(|r| (r.start_ns, r.end_ns, r.activity))
            .collect();
        // (50, 150] keeps half its count inside the window; (150, 450] keeps 250/300.
        assert_eq!(runs, vec![(100, 150, Some(500)), (150, 400, Some(2_500))]);
        // The run still going at the end has no count yet; merged runs add theirs.
        let ev = [
            counted(100, 0, 8, 1),
            counted(200, 8, 8, 40),
            counted(300, 8, 5, 60),
        ];
        let t = Timeline::build(0, 400, &[0], &ev);
        let runs: Vec<(u64, u64, Option<u64>)> = t.cpus[0]
            .runs()
            .map(|r| (r.start_ns, r.end_ns, r.activity))
            .collect();
        assert_eq!(
            runs,
            vec![(0, 100, None), (100, 300, Some(100)), (300, 400, None)]
        );
    }

    #[test]
    fn consecutive_runs_of_one_thread_merge() {
        // A thread that yields and is immediately picked again shows as one run.
        let ev = [sw(100, 0, 8, Some(8)), sw(200, 0, 8, Some(0))];
        let t = Timeline::build(0, 300, &[0], &ev);
        assert_eq!(spans(&t, 0), vec![(0, 200, 8), (200, 300, 0)]);
    }

    #[test]
    fn runs_in_and_busy_ns_clip_to_the_query() {
        let ev = [sw(100, 0, 0, Some(5)), sw(300, 0, 5, Some(0))];
        let t = Timeline::build(0, 400, &[0], &ev);
        let cpu = t.cpu(0).expect("cpu 0");
        assert_eq!(cpu.busy_ns(150, 250), 100);
        assert_eq!(cpu.busy_ns(0, 400), 200);
        assert_eq!(cpu.runs_in(350, 400).count(), 1);
        // Runs cover the whole window with no gaps.
        let total: u64 = cpu.runs().map(|r| r.len_ns()).sum();
        assert_eq!(total, 400);
    }
}
