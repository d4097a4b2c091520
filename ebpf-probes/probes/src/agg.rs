//! The aggregating mode (the agent's default): `sched_switch` adds each run to its
//! thread's row in a per-CPU table of the current time slot instead of sending an event,
//! so userspace pays per slot and active thread, not per switch. `record` keeps the exact
//! event stream.
//!
//! Slots are fixed, `[k × AGG_SLOT_NS, (k + 1) × AGG_SLOT_NS)` on CLOCK_MONOTONIC, and a
//! run is cut exactly at their edges, so nothing needs to be told when a slot ends. A run
//! is charged when it ends (the switch) or at a sampler tick, which charges the running
//! task up to the start of the tick's slot: the sampler ticks on idle CPUs too, so every
//! CPU's cursor leaves a slot within one sampling period of its end.
//!
//! Each CPU keeps the rows of one slot, its current one, in a table (a linear search over
//! the few threads a CPU runs in 10 ms: no hashing, no lock). When the CPU leaves the slot,
//! the table goes to the `AGG_SLOTS` ring as one record, before the cursor's `start_ns`
//! moves past the slot: so a slot userspace sees every CPU past has all its records in the
//! ring. A table that fills up mid-slot is sent at once and starts again.
//!
//! The table and the cursor are per-CPU and used by one program at a time (`sched_switch`
//! runs with interrupts off, the sampler from the timer interrupt), so nothing needs a lock.

use aya_ebpf::{
    helpers::bpf_get_smp_processor_id,
    macros::map,
    maps::{PerCpuArray, RingBuf},
};
use energy_bpf_abi::{AggCursor, AggRow, AggTable, SWITCH_BATCH, agg_row_flags, counter};

use crate::{batch, global};

/// Whether the probes aggregate (set before load, frozen in `.rodata`: with 0 the verifier
/// prunes all of this and `sched_switch` sends events).
#[unsafe(no_mangle)]
static AGG_ON: u32 = 0;

/// Slot length, ns: a constant, so each division by it compiles to a multiplication.
const SLOT_NS: u64 = energy_bpf_abi::AGG_SLOT_NS;

/// Slots one charge cuts a run into at most; a longer run's rest goes to its last slot.
/// Ticks charge running tasks every sampling period, so a run spans a few slots at most.
const MAX_SLOTS_PER_CHARGE: u32 = 16;

/// Each CPU's running task.
#[map]
static AGG_CURSOR: PerCpuArray<AggCursor> = PerCpuArray::with_max_entries(1, 0);

/// Each CPU's rows of its current slot.
#[map]
static AGG_TABLES: PerCpuArray<AggTable> = PerCpuArray::with_max_entries(1, 0);

/// Complete slot tables, for userspace. As large as the stream's ring: where a CPU runs
/// more threads in a slot than a table holds, tables go out as often as switch batches
/// would, with rows as large as switch events. Userspace shrinks it to a page when the
/// probes stream.
#[map]
static AGG_SLOTS: RingBuf = RingBuf::with_byte_size(8 << 20, 0);

/// Whether the probes aggregate.
#[inline(always)]
pub fn on() -> bool {
    global(&AGG_ON) != 0
}

/// Sends `table` to the ring and empties it.
///
/// # Safety
/// `table` is this CPU's slot of `AGG_TABLES` (see the module docs).
#[inline(always)]
unsafe fn send(table: *mut AggTable) {
    // SAFETY: the caller's.
    unsafe { batch::flush(table, &AGG_SLOTS, counter::AGG_DROPPED) };
}

/// Sends `table` if it holds a slot before `slot`: this CPU is leaving it.
///
/// # Safety
/// As [`send`].
#[inline(always)]
unsafe fn send_before(table: *mut AggTable, slot: u64) {
    // SAFETY: the caller's.
    unsafe {
        if (*table).len != 0 && (*table).rows[0].slot < slot {
            send(table);
        }
    }
}

/// A row of `slot` for `tid`, to add to: its own if `search` finds it in the table, else a
/// new one, the table sent first if it holds another slot or is full. `None` only where
/// the verifier needs a bound.
///
/// # Safety
/// As [`send`].
#[inline(always)]
unsafe fn row_of(
    table: *mut AggTable,
    cpu: u32,
    (tid, tgid): (u32, u32),
    slot: u64,
    search: bool,
) -> Option<*mut AggRow> {
    // SAFETY: the caller's.
    unsafe {
        send_before(table, slot);
        let mut len = (*table).len as usize;
        if search {
            for i in 0..SWITCH_BATCH {
                if i >= len {
                    break;
                }
                if (*table).rows[i].tid == tid {
                    return Some(&raw mut (*table).rows[i]);
                }
            }
        }
        if len >= SWITCH_BATCH {
            send(table);
            len = 0;
        }
        let row = (*table).rows.get_mut(len)?;
        *row = AggRow {
            slot,
            tid,
            tgid,
            ..AggRow::default()
        };
        (*table).len = len as u32 + 1;
        (*table).cpu = cpu;
        Some(row)
    }
}

/// Charges `[from, to)` of `tid` on this CPU, cut at slot edges (`from` lies in
/// `from_slot`); `activity`, the count over the whole span, is split in proportion to time.
/// Returns the slot `to` lies in.
///
/// Only the first slot's row is searched for: the slots after it are new to the table.
/// Nothing here divides by the slot length (see [`slot_of`]).
///
/// # Safety
/// As [`send`].
#[inline(always)]
unsafe fn charge(
    table: *mut AggTable,
    cpu: u32,
    task: (u32, u32),
    (from, from_slot): (u64, u64),
    to: u64,
    activity: Option<u64>,
) -> u64 {
    if task.0 == 0 || to <= from {
        return slot_of(to, from_slot);
    }
    let span = to - from;
    let mut at = from;
    let mut slot = from_slot;
    let mut counted = 0u64;
    for i in 0..MAX_SLOTS_PER_CHARGE {
        let edge = (slot + 1) * SLOT_NS;
        let end = if edge < to && i + 1 < MAX_SLOTS_PER_CHARGE {
            edge
        } else {
            to
        };
        let share = activity.map(|a| {
            if end == to {
                a - counted.min(a)
            } else {
                let part = end - from;
                // a × part / span without overflow for counts and spans below 2^32.
                let upto = a / span * part + a % span * part / span;
                let share = upto - counted.min(upto);
                counted = upto;
                share
            }
        });
        // SAFETY: the caller's.
        if let Some(row) = unsafe { row_of(table, cpu, task, slot, i == 0) } {
            // SAFETY: a row of this CPU's table.
            unsafe {
                (*row).busy_ns += end - at;
                match share {
                    Some(a) => (*row).activity += a,
                    None => (*row).flags |= agg_row_flags::NO_ACTIVITY,
                }
            }
        }
        at = end;
        if at >= to {
            break;
        }
        slot += 1;
    }
    slot_of(to, slot)
}

/// The slot holding `ts_ns`, given `near`, the slot of an earlier time: without a division
/// when `ts_ns` is still in it (most switches) or in the next.
#[inline(always)]
fn slot_of(ts_ns: u64, near: u64) -> u64 {
    let edge = (near + 1) * SLOT_NS;
    if ts_ns < edge && ts_ns >= near * SLOT_NS {
        near
    } else if ts_ns >= edge && ts_ns < edge + SLOT_NS {
        near + 1
    } else {
        ts_ns / SLOT_NS
    }
}

/// At `sched_switch` at `ts_ns`: the run of `prev` (tid, tgid) that ends now is charged
/// (`activity`, its count), and `next` runs from now (`None` when the task_struct offsets
/// are unknown: the CPU's task is then unknown until its next tick).
#[inline(always)]
pub fn on_switch(ts_ns: u64, prev: (u32, u32), next: Option<(u32, u32)>, activity: Option<u64>) {
    let (Some(cursor), Some(table)) = (AGG_CURSOR.get_ptr_mut(0), AGG_TABLES.get_ptr_mut(0)) else {
        return;
    };
    // SAFETY: helper with no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    // SAFETY: this CPU's slots (see the module docs).
    unsafe {
        let from = ((*cursor).start_ns, (*cursor).slot);
        let slot = if (*cursor).known != 0 {
            charge(table, cpu, prev, from, ts_ns, activity)
        } else {
            slot_of(ts_ns, from.1)
        };
        send_before(table, slot);
        match next {
            Some((tid, tgid)) => {
                (*cursor).tid = tid;
                (*cursor).tgid = tgid;
                (*cursor).known = 1;
            }
            None => (*cursor).known = 0,
        }
        (*cursor).slot = slot;
        (*cursor).start_ns = ts_ns;
    }
}

/// At a sampler tick (idle CPUs included) at `ts_ns`, `current` (tid, tgid) running: the
/// time since the cursor's start up to the start of this slot is charged to `current`
/// (with `count()`, its activity so far, asked only then), which runs on.
///
/// `current`, not the cursor's task: the two differ where the kernel switched tasks
/// without a `sched_switch` event this program saw, and the exact stream gives such time
/// to the task the next switch shows leaving, which is the one running now.
#[inline(always)]
pub fn on_tick(ts_ns: u64, current: (u32, u32), count: impl FnOnce() -> Option<u64>) {
    let (Some(cursor), Some(table)) = (AGG_CURSOR.get_ptr_mut(0), AGG_TABLES.get_ptr_mut(0)) else {
        return;
    };
    // SAFETY: helper with no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    // SAFETY: this CPU's slots (see the module docs).
    unsafe {
        let slot = slot_of(ts_ns, (*cursor).slot);
        let slot_start = slot * SLOT_NS;
        if (*cursor).known == 0 {
            send_before(table, slot);
            (*cursor).slot = slot;
            (*cursor).start_ns = ts_ns;
        } else if slot_start > (*cursor).start_ns {
            let from = ((*cursor).start_ns, (*cursor).slot);
            charge(table, cpu, current, from, slot_start, count());
            send_before(table, slot);
            (*cursor).slot = slot;
            (*cursor).start_ns = slot_start;
        }
        (*cursor).tid = current.0;
        (*cursor).tgid = current.1;
        (*cursor).known = 1;
    }
}
