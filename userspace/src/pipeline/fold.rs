//! The folded switch path (live `top`, the agent, `top --replay`): switch events are folded
//! as they are pushed into per-CPU, per-interval accumulators (thread → on-CPU ns,
//! activity count, cgroup), cut exactly at the energy readings' timestamps (a run spanning
//! a reading is split there), instead of being held for a window and rebuilt into runs.
//!
//! Each interval of each CPU (a *cell*, between two consecutive cuts) keeps one run per
//! thread, laid end to end inside the cell in thread order: every figure the attribution
//! takes over whole cells (per-thread on-CPU ns, activity, idle and unknown time, the
//! modelled readings' busy time) is the same integer sum the exact path gives, while a
//! window holds one run per thread and cell instead of one per switch and nothing of the
//! switch events themselves.
//!
//! Cuts: the counters' reading timestamps, and, with modelled sources, a grid every
//! [`crate::energy::model::DEFAULT_INTERVAL_NS`] from the pipeline's start (a model-only
//! window ends on the grid, where the modelled readings of that window fall too), and every
//! window end. A cell is folded once a run passes its end and that end is known (no counter
//! reading can still fall inside it); until then its runs stay raw, a few milliseconds of
//! them per CPU.
//!
//! Where the folded figures can differ from the exact path, and why it does not matter for
//! what the windows show:
//! - CPUs with an SMT sibling keep their raw runs (no fold): the sibling overlap needs
//!   the real times.
//! - Queries inside one cell (none for the split; the static-power search of a flat load
//!   looks at 1 ms windows) see the cell's runs in thread order, not in time order.
//! - A window forced to end off the cuts (a counter with no reading since the window
//!   started) splits the cells it crosses by their layout.
//! - With both counters and modelled sources, windows end on counter readings, off the
//!   grid the modelled readings of the window are taken on.
//! - Each interval's energy is split over its span shifted back by the counter's lag. A
//!   counter read more often than it updates (a VM's, updated once a second and read every
//!   10 ms) is half a read old, which falls inside a cell: that cell is split by its
//!   layout (up to 5 ms of a one-second row).
//! - Switches of one CPU must arrive in time order (as the capture session hands them); an
//!   older one than the last is dropped.
//!
//! `record` and `report` never fold: the recording keeps every event and `report` builds
//! the exact timeline.

mod sched_runs;

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::{
    energy,
    pb::v1::{Cpu, EnergyReading, SwitchEvent},
    timeline::{Run, RunStore, Threads, Timeline, UNKNOWN_TID, clip},
};

/// A run not yet folded: its part of `[start_ns, end_ns)` and the switch that ended it.
#[derive(Clone, Copy, Debug)]
struct Raw {
    start_ns: u64,
    end_ns: u64,
    tid: u32,
    tgid: u32,
    cgroup_id: u64,
    /// (count, began, ended): the count of the whole run `[began, ended)`, clipped to each
    /// part by length as the exact path clips it at window edges.
    activity: Option<(u64, u64, u64)>,
}

impl Raw {
    fn part(&self, a: u64, b: u64) -> Option<Run> {
        let (from, to) = (self.start_ns.max(a), self.end_ns.min(b));
        (from < to).then(|| Run {
            start_ns: from,
            end_ns: to,
            tid: self.tid,
            tgid: self.tgid,
            cgroup_id: self.cgroup_id,
            activity: self
                .activity
                .map(|(count, began, ended)| clip(count, began, ended, from, to)),
        })
    }
}

/// One CPU's fold state.
#[derive(Clone, Debug, Default)]
struct CpuFold {
    /// Where the next switch's run starts (the latest switch, or the window start).
    cursor: u64,
    /// The latest switch's time (the start of the run the next switch ends, for counts).
    previous: Option<u64>,
    /// The task the latest switch switched to, when the probe read it.
    last_next: Option<(u32, u32)>,
    /// Start of the first cell not yet folded.
    raw_start: u64,
    /// Runs in time order; those from `raw_head` on reach past `raw_start`.
    raw: Vec<Raw>,
    /// The first raw run not yet wholly folded (the ones before are dropped in one go).
    raw_head: usize,
    /// Folded cells of the open window (and beyond, when this CPU is ahead), laid out,
    /// compact (see `timeline::store`): they move into the window's timeline at its close.
    done: RunStore,
    /// Keep raw runs (an SMT sibling: the overlap needs real times).
    exact: bool,
    /// Runs the last window took: the next one's room is reserved at its first fold (once
    /// the last window's runs are freed), so `done` grows without copies.
    room: usize,
}

/// Raw runs of one CPU after which a batch of its switches is folded before it ends.
const RAW_FOLD_EVERY: usize = 1024;

/// Folds switch events into per-CPU, per-interval runs (see the module doc).
#[derive(Clone, Debug)]
pub struct Folder {
    /// Start of the open window.
    start_ns: u64,
    /// Grid anchor and step (modelled sources), if any.
    grid: Option<(u64, u64)>,
    /// Counter sources as (id, lag): cells are cut at their readings, and `lag` (half the
    /// update period) before each, where the static-power fit takes a row's busy time.
    counters: Vec<(u32, u64)>,
    /// Newest reading per counter.
    newest: BTreeMap<u32, u64>,
    /// Counter readings and window ends after the oldest unfolded cell.
    cuts: BTreeSet<u64>,
    cpus: BTreeMap<u32, CpuFold>,
    /// CPUs of the configuration (each gets a timeline, with or without events).
    known: Vec<u32>,
    smt: HashSet<u32>,
    /// The threads of the folded runs of the open window (and beyond).
    threads: Threads,
    scratch: Vec<Run>,
    /// Sort keys of one cell's parts (see [`lay_out`]).
    keys: Keys,
}

impl Folder {
    /// A folder whose first window starts at `start_ns`, for `cpus`; `counters` are the
    /// measured sources as (id, update period), `modelled` whether any source is modelled
    /// (the grid).
    pub fn new(start_ns: u64, cpus: &[Cpu], counters: &[(u32, u64)], modelled: bool) -> Self {
        let mut by_core: BTreeMap<(u32, u32), Vec<u32>> = BTreeMap::new();
        for c in cpus {
            by_core.entry((c.package, c.core)).or_default().push(c.id);
        }
        let smt = by_core
            .into_values()
            .filter(|v| v.len() > 1)
            .flatten()
            .collect();
        Self {
            start_ns,
            grid: modelled.then_some((start_ns, energy::model::DEFAULT_INTERVAL_NS)),
            counters: counters
                .iter()
                .map(|&(id, period)| (id, period / 2))
                .collect(),
            newest: BTreeMap::new(),
            cuts: BTreeSet::new(),
            cpus: BTreeMap::new(),
            known: cpus.iter().map(|c| c.id).collect(),
            smt,
            threads: Threads::default(),
            scratch: Vec::new(),
            keys: Keys::default(),
        }
    }

    /// Where a window asked to end by `limit_ns` can end without a counter: the last grid
    /// point at or before it (the limit itself without a grid), or `None` when that is not
    /// after the window start.
    pub fn model_end(&self, limit_ns: u64) -> Option<u64> {
        let end = match self.grid {
            Some((anchor, step)) if limit_ns >= anchor => {
                anchor + (limit_ns - anchor) / step * step
            }
            _ => limit_ns,
        };
        (end > self.start_ns).then_some(end)
    }

    /// Registers energy readings: counters' timestamps become cuts, and cells that no
    /// reading can still cut are folded.
    pub fn push_readings<'a>(&mut self, readings: impl IntoIterator<Item = &'a EnergyReading>) {
        let mut any = false;
        for r in readings {
            let Some(&(_, lag)) = self.counters.iter().find(|c| c.0 == r.source_id) else {
                continue;
            };
            if r.ts_ns > self.start_ns {
                self.cuts.insert(r.ts_ns);
                if let Some(cut) = r
                    .ts_ns
                    .checked_sub(lag)
                    .filter(|&c| lag > 0 && c > self.start_ns)
                {
                    self.cuts.insert(cut);
                }
                let n = self.newest.entry(r.source_id).or_default();
                *n = (*n).max(r.ts_ns);
                any = true;
            }
        }
        if any {
            self.fold_all();
        }
    }

    /// Up to where every cut is known: the oldest of the counters' newest readings, less
    /// their lag (readings come in time order).
    fn horizon(&self) -> u64 {
        if self.counters.is_empty() {
            return u64::MAX;
        }
        self.counters
            .iter()
            .map(|(id, lag)| self.newest.get(id).map_or(0, |&n| n.saturating_sub(*lag)))
            .min()
            .unwrap_or(0)
    }

    /// Adds switch events (each CPU's in time order) and folds the cells they complete.
    pub fn push_switches(&mut self, events: impl IntoIterator<Item = SwitchEvent>) {
        let start = self.start_ns;
        let horizon = self.horizon();
        let mut touched: Vec<u32> = Vec::new();
        // Events come a CPU's batch at a time: its state is taken out of the map once per
        // batch, not looked up per event.
        let mut current: Option<(u32, CpuFold)> = None;
        for s in events {
            if current.as_ref().is_none_or(|(id, _)| *id != s.cpu) {
                if let Some((id, cpu)) = current.take() {
                    self.cpus.insert(id, cpu);
                }
                let cpu = self.cpus.remove(&s.cpu).unwrap_or_else(|| CpuFold {
                    cursor: start,
                    raw_start: start,
                    exact: self.smt.contains(&s.cpu),
                    ..Default::default()
                });
                touched.push(s.cpu);
                current = Some((s.cpu, cpu));
            }
            let Some((_, cpu)) = current.as_mut() else {
                continue;
            };
            if cpu.previous.is_some_and(|p| s.ts_ns < p) {
                continue; // out of order: its place is folded already
            }
            if s.ts_ns > cpu.cursor {
                // One thread's back-to-back runs are one run, as in the exact timeline (its
                // count spread over both).
                if let Some(last) = cpu.raw[cpu.raw_head..].last_mut()
                    && last.end_ns == cpu.cursor
                    && last.tid == s.tid
                {
                    last.end_ns = s.ts_ns;
                    last.activity = match (last.activity, s.activity, cpu.previous) {
                        (Some((count, began, _)), Some(more), Some(_)) => {
                            Some((count + more, began, s.ts_ns))
                        }
                        _ => None,
                    };
                    cpu.cursor = s.ts_ns;
                    cpu.previous = Some(s.ts_ns);
                    cpu.last_next = s.next_known.then_some((s.next_tid, s.next_tgid));
                    continue;
                }
                cpu.raw.push(Raw {
                    start_ns: cpu.cursor,
                    end_ns: s.ts_ns,
                    tid: s.tid,
                    tgid: s.tgid,
                    cgroup_id: s.cgroup_id,
                    activity: match (s.activity, cpu.previous) {
                        (Some(count), Some(began)) => Some((count, began, s.ts_ns)),
                        _ => None,
                    },
                });
                cpu.cursor = s.ts_ns;
                // A long batch of one CPU is folded as it comes, so the raw runs held stay
                // a few cells' worth, not the batch's.
                if cpu.raw.len().is_multiple_of(RAW_FOLD_EVERY) {
                    self.fold_cells(cpu, horizon);
                }
            }
            cpu.previous = Some(s.ts_ns);
            cpu.last_next = s.next_known.then_some((s.next_tid, s.next_tgid));
        }
        if let Some((id, cpu)) = current {
            self.cpus.insert(id, cpu);
        }
        touched.sort_unstable();
        touched.dedup();
        for id in touched {
            self.fold_cpu(id, horizon);
        }
    }

    fn fold_all(&mut self) {
        let horizon = self.horizon();
        let ids: Vec<u32> = self.cpus.keys().copied().collect();
        for id in ids {
            self.fold_cpu(id, horizon);
        }
    }

    /// The first cut after `t`.
    fn next_cut(&self, t: u64) -> u64 {
        let grid = match self.grid {
            Some((anchor, step)) if t >= anchor => anchor + ((t - anchor) / step + 1) * step,
            Some((anchor, _)) => anchor,
            None => u64::MAX,
        };
        let counter = self
            .cuts
            .range(t.saturating_add(1)..)
            .next()
            .copied()
            .unwrap_or(u64::MAX);
        grid.min(counter)
    }

    /// Folds the cells of `id` that end by both its cursor and `horizon`.
    fn fold_cpu(&mut self, id: u32, horizon: u64) {
        let Some(mut cpu) = self.cpus.remove(&id) else {
            return;
        };
        self.fold_cells(&mut cpu, horizon);
        self.cpus.insert(id, cpu);
    }

    /// Folds the cells of `cpu` that end by both its cursor and `horizon`.
    fn fold_cells(&mut self, cpu: &mut CpuFold, horizon: u64) {
        let limit = cpu.cursor.min(horizon);
        loop {
            let end = self.next_cut(cpu.raw_start);
            if end > limit {
                break;
            }
            self.fold_cell(cpu, end);
        }
        cpu.raw.drain(..cpu.raw_head);
        cpu.raw_head = 0;
    }

    /// Folds `cpu`'s raw runs in `[raw_start, end)` into one cell.
    fn fold_cell(&mut self, cpu: &mut CpuFold, end: u64) {
        let a = cpu.raw_start;
        let cell = &mut self.scratch;
        cell.clear();
        for r in &cpu.raw[cpu.raw_head..] {
            if r.start_ns >= end {
                break;
            }
            cell.extend(r.part(a, end));
            if r.end_ns <= end {
                cpu.raw_head += 1;
            }
        }
        cpu.raw_start = end;
        if cpu.room > 0 {
            cpu.done.reserve(cpu.room + cpu.room / 8);
            cpu.room = 0;
        }
        // Not merged across cells: a window ending on a cut takes whole runs.
        if cpu.exact {
            for r in cell.iter() {
                cpu.done.push(&mut self.threads, r);
            }
        } else {
            lay_out(cell, &mut self.keys, &mut self.threads, &mut cpu.done, a);
        }
    }

    /// Closes the window at `end_ns`: every CPU's runs in `[start, end_ns)` as a timeline
    /// (the task still running at `end_ns` fills its CPU up to it, unknown when no switch
    /// named it); the next window starts at `end_ns`.
    pub fn close(&mut self, end_ns: u64) -> Timeline {
        let start = self.start_ns;
        let end = end_ns.max(start + 1);
        self.cuts.insert(end);
        for id in &self.known {
            self.cpus.entry(*id).or_insert_with(|| CpuFold {
                cursor: start,
                raw_start: start,
                exact: self.smt.contains(id),
                ..Default::default()
            });
        }
        let ids: Vec<u32> = self.cpus.keys().copied().collect();
        let mut stores = Vec::with_capacity(ids.len());
        // The runs past the end are indexed anew: the threads of this window go with it.
        let mut next = Threads::default();
        for id in ids {
            let Some(mut cpu) = self.cpus.remove(&id) else {
                continue;
            };
            // The task still running fills its CPU up to the end, then every cell before
            // the end is folded.
            if cpu.cursor < end {
                let (tid, tgid) = cpu.last_next.unwrap_or((UNKNOWN_TID, 0));
                cpu.raw.push(Raw {
                    start_ns: cpu.cursor,
                    end_ns: end,
                    tid,
                    tgid,
                    cgroup_id: 0,
                    activity: None,
                });
                cpu.cursor = end;
            }
            while cpu.raw_start < end {
                let cut = self.next_cut(cpu.raw_start).min(end);
                self.fold_cell(&mut cpu, cut);
            }
            cpu.raw.drain(..cpu.raw_head);
            cpu.raw_head = 0;
            // This window's runs; a CPU ahead of the end keeps the rest for the next one.
            let runs = sched_runs::close(&mut cpu.done, &mut self.threads, &mut next, end);
            cpu.room = runs.len();
            stores.push((id, runs));
            self.cpus.insert(id, cpu);
        }
        let threads = std::mem::replace(&mut self.threads, next);
        self.start_ns = end;
        self.cuts = self.cuts.split_off(&end);
        Timeline::from_stores(start, end, stores, &threads)
    }

    /// Raw runs held (not yet folded) and folded runs waiting for their window.
    pub fn pending(&self) -> usize {
        self.cpus.values().map(|c| c.raw.len() + c.done.len()).sum()
    }
}

/// Merges one cell's parts per thread (same thread, both counted or both not) and lays
/// them end to end from `a`, in thread order, onto `out`: the cell's per-thread sums are
/// kept. The parts are ordered through `keys` (thread, counted, position: one 8- or 16-byte
/// key per part, not the 48-byte runs); the parts come in time order, so a thread's parts
/// stay in time order and its last non-zero cgroup wins. A cell of a few threads (a server
/// ping-ponging between its threads, say) is ordered without sorting its parts: its threads
/// are sorted, then each one's parts taken in time order (the same order).
fn lay_out(cell: &[Run], keys: &mut Keys, threads: &mut Threads, out: &mut RunStore, a: u64) {
    if let Some((groups, n)) = few_groups(cell) {
        let order = groups[..n].iter().flat_map(|&g| {
            cell.iter()
                .enumerate()
                .filter(move |(_, r)| group_of(r) == g)
                .map(move |(i, _)| (g, i))
        });
        return place(cell, order, threads, out, a);
    }
    lay_out_sorted(cell, keys, threads, out, a);
}

/// [`lay_out`] by sorting the parts' keys.
fn lay_out_sorted(
    cell: &[Run],
    keys: &mut Keys,
    threads: &mut Threads,
    out: &mut RunStore,
    a: u64,
) {
    let narrow = &mut keys.narrow;
    narrow.clear();
    let fits = cell.len() <= POS_MASK as usize
        && cell
            .iter()
            .enumerate()
            .all(|(i, r)| narrow_key(r, i).map(|k| narrow.push(k)).is_some());
    if fits {
        narrow.sort_unstable();
        let order = narrow
            .iter()
            .map(|&k| (u128::from(k >> POS_BITS), (k & POS_MASK) as usize));
        return place(cell, order, threads, out, a);
    }
    let wide = &mut keys.wide;
    wide.clear();
    wide.extend(
        cell.iter()
            .enumerate()
            .map(|(i, r)| group_of(r) | i as u128),
    );
    wide.sort_unstable();
    place(
        cell,
        wide.iter().map(|&k| (k >> 32, (k as u32) as usize)),
        threads,
        out,
        a,
    );
}

/// The most threads a cell may have for [`lay_out`] to order it without sorting its parts.
const FEW: usize = 4;

/// A part's group in [`lay_out`] (thread, counted), ordered as the sort keys order them.
fn group_of(r: &Run) -> u128 {
    (u128::from(r.tgid) << 96)
        | (u128::from(r.tid) << 64)
        | (u128::from(r.activity.is_some()) << 32)
}

/// The groups of `cell`'s parts, sorted (the first `n`), when there are at most [`FEW`].
fn few_groups(cell: &[Run]) -> Option<([u128; FEW], usize)> {
    let mut groups = [0u128; FEW];
    let mut n = 0;
    for r in cell {
        let g = group_of(r);
        if !groups[..n].contains(&g) {
            if n == FEW {
                return None;
            }
            groups[n] = g;
            n += 1;
        }
    }
    groups[..n].sort_unstable();
    Some((groups, n))
}

/// The sort keys of [`lay_out`]: 8 bytes a part where the ids fit, else 16.
#[derive(Clone, Debug, Default)]
struct Keys {
    narrow: Vec<u64>,
    wide: Vec<u128>,
}

/// Bits of a tid or tgid in a narrow key (`pid_max` is at most 2^22), and of the position.
const ID_BITS: u32 = 23;
const POS_BITS: u32 = 64 - 2 * ID_BITS - 1;
const POS_MASK: u64 = (1 << POS_BITS) - 1;

/// (tgid, tid, counted, position) in 64 bits, in the order of the 128-bit key (unknown,
/// `u32::MAX`, stays last), when the ids fit.
fn narrow_key(r: &Run, i: usize) -> Option<u64> {
    let id = |v: u32| match v {
        u32::MAX => Some((1 << ID_BITS) - 1),
        v if u64::from(v) < (1 << ID_BITS) - 1 => Some(u64::from(v)),
        _ => None,
    };
    Some(
        (id(r.tgid)? << (ID_BITS + 1 + POS_BITS))
            | (id(r.tid)? << (1 + POS_BITS))
            | (u64::from(r.activity.is_some()) << POS_BITS)
            | i as u64,
    )
}

/// Lays `cell`'s parts out in `order` (group: thread and counted; position in `cell`).
fn place(
    cell: &[Run],
    order: impl Iterator<Item = (u128, usize)>,
    threads: &mut Threads,
    out: &mut RunStore,
    a: u64,
) {
    let mut group = u128::MAX;
    let mut pos = a;
    // The thread's run being merged, pushed once the next thread's begins.
    let mut open: Option<Run> = None;
    for (g, i) in order {
        let r = &cell[i];
        let len = r.len_ns();
        if g == group
            && let Some(last) = open.as_mut()
        {
            last.end_ns += len;
            last.activity = last.activity.zip(r.activity).map(|(x, y)| x + y);
            if r.cgroup_id != 0 {
                last.cgroup_id = r.cgroup_id;
            }
        } else {
            group = g;
            if let Some(last) = open.replace(Run {
                start_ns: pos,
                end_ns: pos + len,
                ..*r
            }) {
                out.push(threads, &last);
            }
        }
        pos += len;
    }
    if let Some(last) = open {
        out.push(threads, &last);
    }
}
