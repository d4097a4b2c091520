//! The aggregating mode, userspace side (the probe side is `ebpf-probes/probes/src/agg.rs`):
//! the probes sum each thread's on-CPU time and activity per CPU and fixed time slot
//! (10 ms by default) and send each CPU's table of a slot to a ring when the CPU leaves it;
//! each poll reads the slots every CPU has left and turns their rows into switch events
//! the pipeline reads like the exact stream.
//!
//! What is exact and what is not: each thread's busy time and activity per CPU and slot
//! are exact, cut at the slot edges. Where inside a slot its runs fell is not kept: the
//! time is laid out in the slot thread after thread ([`synthesize`]), so an energy reading
//! inside a slot splits the slot's time as that layout does. Energy readings come every
//! 10 ms or more and the busy-time split only looks at who ran between two readings, so
//! the split differs from the exact stream's by what happens within a slot at either end
//! of each reading interval (docs/ARCHITECTURE.md, "Aggregating mode").

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray},
};
use energy_bpf_abi::{AggCursor, AggRow, agg_row_flags};

use crate::pb::v1 as pb;

/// One thread's row of one slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    /// The CPU.
    pub cpu: u32,
    /// The thread.
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// The slot.
    pub slot: u64,
    /// On-CPU ns in the slot.
    pub busy_ns: u64,
    /// Its activity count, when every run had one.
    pub activity: Option<u64>,
}

/// The rows of the slots `[first, end)` (each `slot_ns` long), read at one poll.
#[derive(Clone, Debug, Default)]
pub struct Slots {
    /// First slot.
    pub first: u64,
    /// One past the last slot.
    pub end: u64,
    /// Slot length, ns.
    pub slot_ns: u64,
    /// Rows, any order.
    pub rows: Vec<Row>,
}

/// The maps of the aggregating mode, and how far they were read.
pub struct Aggregator {
    cursors: PerCpuArray<MapData, AggCursor>,
    tables: super::ring::Ring,
    /// The online CPUs (the cursors of the others never move).
    cpus: Vec<u32>,
    slot_ns: u64,
    /// The first slot not read yet.
    next: u64,
    /// Rows taken from the ring whose slot some CPU had not left at the last read (the
    /// tables of a slot that filled up early).
    pending: Vec<Row>,
}

impl Aggregator {
    /// Takes the maps from a loaded object (`AGG_ON` set, slots `slot_ns` long); the first
    /// slot read is the first that starts after now.
    pub fn start(ebpf: &mut Ebpf, cpus: &[u32], slot_ns: u64) -> Result<Self, &'static str> {
        let cursors = ebpf
            .take_map("AGG_CURSOR")
            .and_then(|m| PerCpuArray::try_from(m).ok())
            .ok_or("AGG_CURSOR")?;
        let tables = super::ring::Ring::take(ebpf, "AGG_SLOTS").ok_or("AGG_SLOTS")?;
        let slot_ns = slot_ns.max(1);
        Ok(Self {
            cursors,
            tables,
            cpus: cpus.to_vec(),
            slot_ns,
            next: crate::clock::monotonic_ns() / slot_ns + 1,
            pending: Vec::new(),
        })
    }

    /// Where the slots read so far end: switch events cover the time up to here.
    pub fn covered_ns(&self) -> u64 {
        self.next * self.slot_ns
    }

    /// The fraction of the slot ring read since the last call (see `super::ring`).
    pub fn take_ring_fill(&mut self) -> f64 {
        self.tables.take_fill()
    }

    /// The first slot some online CPU has not left: its cursor's run started in it.
    fn first_open_slot(&self) -> u64 {
        let Ok(per_cpu) = self.cursors.get(&0, 0) else {
            return 0;
        };
        self.cpus
            .iter()
            .filter_map(|&cpu| per_cpu.get(cpu as usize))
            .map(|c| {
                if c.known == 0 {
                    0
                } else {
                    c.start_ns / self.slot_ns
                }
            })
            .min()
            .unwrap_or(0)
    }

    /// The rows of every slot all CPUs have left since the last call, or `None` when no new
    /// slot is complete.
    ///
    /// The cursors are read before the ring: a CPU sends a slot's table before its cursor
    /// moves past the slot, so every table of a slot before `end` is in the ring by then.
    pub fn read(&mut self) -> Option<Slots> {
        let end = self.first_open_slot();
        while let Some(record) = self.tables.next() {
            decode_table(&record, &mut self.pending);
        }
        if end <= self.next {
            return None;
        }
        let slots = Slots {
            first: self.next,
            end,
            slot_ns: self.slot_ns,
            rows: take_slots(&mut self.pending, self.next, end),
        };
        self.next = end;
        Some(slots)
    }
}

/// Takes the rows of slots `[first, end)` out of `pending`, drops those before `first` (the
/// probes' first moments, before the first read) and keeps the rest.
fn take_slots(pending: &mut Vec<Row>, first: u64, end: u64) -> Vec<Row> {
    let mut rows = Vec::new();
    pending.retain(|r| {
        if r.slot >= end {
            return true;
        }
        if r.slot >= first {
            rows.push(*r);
        }
        false
    });
    rows
}

/// Appends the rows of one ring record, a slot table (`len`, `cpu`, `len` rows), to `out`;
/// a malformed record is skipped, as malformed switch batches are.
pub fn decode_table(record: &[u8], out: &mut Vec<Row>) {
    let Some((cpu, rows)) = super::decode::batch::<AggRow>(record) else {
        return;
    };
    out.extend(rows.map(|r| Row {
        cpu,
        tid: r.tid,
        tgid: r.tgid,
        slot: r.slot,
        busy_ns: r.busy_ns,
        activity: (r.flags & agg_row_flags::NO_ACTIVITY == 0).then_some(r.activity),
    }));
}

/// Switch events for the rows of `slots` on `cpus`, each CPU's in time order: in each slot,
/// its threads one after the other from the slot's start (by thread id), then idle. With
/// `opening`, each CPU starts with an idle switch at the first slot's start, so the first
/// run has a known start (the first read of a capture); otherwise it starts where the
/// previous read's events ended.
pub fn synthesize(slots: &Slots, cpus: &[u32], opening: bool) -> Vec<pb::SwitchEvent> {
    let slot_ns = slots.slot_ns.max(1);
    let mut rows: Vec<&Row> = slots
        .rows
        .iter()
        .filter(|r| r.busy_ns > 0 && (slots.first..slots.end).contains(&r.slot))
        .collect();
    rows.sort_unstable_by_key(|r| (r.cpu, r.slot, r.tid));
    let mut out = Vec::new();
    for &cpu in cpus {
        let first = rows.partition_point(|r| r.cpu < cpu);
        let last = rows.partition_point(|r| r.cpu <= cpu);
        let on_cpu = &rows[first..last];
        // (end of run, tid, tgid, activity); tid 0 is idle.
        let mut runs: Vec<(u64, u32, u32, Option<u64>)> = Vec::new();
        let push = |runs: &mut Vec<(u64, u32, u32, Option<u64>)>, to: u64, tid, tgid, a| match runs
            .last_mut()
        {
            Some(last) if last.1 == tid => {
                last.0 = to;
                last.3 = last.3.zip(a).map(|(x, y): (u64, u64)| x + y);
            }
            _ => runs.push((to, tid, tgid, a)),
        };
        let mut k = 0;
        for slot in slots.first..slots.end {
            let (start, end) = (slot * slot_ns, (slot + 1) * slot_ns);
            let mut t = start;
            while let Some(r) = on_cpu.get(k).filter(|r| r.slot == slot) {
                // A slot holds at most its length (clamped, should a charge overshoot).
                let to = (t + r.busy_ns).min(end);
                if to > t {
                    push(&mut runs, to, r.tid, r.tgid, r.activity);
                    t = to;
                }
                k += 1;
            }
            if t < end {
                push(&mut runs, end, 0, 0, None);
            }
        }
        if opening {
            out.push(pb::SwitchEvent {
                ts_ns: slots.first * slot_ns,
                cpu,
                ..Default::default()
            });
        }
        for (i, &(to, tid, tgid, activity)) in runs.iter().enumerate() {
            let next = runs.get(i + 1);
            out.push(pb::SwitchEvent {
                ts_ns: to,
                cpu,
                tid,
                tgid,
                cgroup_id: 0,
                preempted: false,
                next_known: next.is_some(),
                next_tid: next.map_or(0, |n| n.1),
                next_tgid: next.map_or(0, |n| n.2),
                activity,
            });
        }
    }
    out
}

#[cfg(test)]
#[path = "aggregate_tests.rs"]
mod tests;
