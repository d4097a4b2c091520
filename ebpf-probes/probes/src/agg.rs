//! The aggregating mode (the agent's default): `sched_switch` adds each run to a row per
//! (CPU, thread, time slot) instead of sending an event, so userspace pays per slot and
//! active thread, not per switch. `record` keeps the exact event stream.
//!
//! Slots are fixed, `[k × AGG_SLOT_NS, (k + 1) × AGG_SLOT_NS)` on CLOCK_MONOTONIC, and a
//! run is cut exactly at their edges, so nothing needs to be told when a slot ends. A run
//! is charged when it ends (the switch) or at a sampler tick, which charges the running
//! task up to the start of the tick's slot: the sampler ticks on idle CPUs too, so every
//! CPU's cursor leaves a slot within one sampling period of its end. Userspace reads a
//! slot's rows once every CPU's cursor is past it.
//!
//! Each row is written by its own CPU only, in place after its first insert, and a CPU's
//! cursor by one program at a time (`sched_switch` runs with interrupts off, the sampler
//! from the timer interrupt), so no row needs a lock. The cursor's `start_ns` is written
//! after the charges it ends, so a slot userspace sees as complete has all its rows.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_smp_processor_id,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use energy_bpf_abi::{AGG_ROWS, AggCursor, AggKey, RunTotal, counter, run_total_flags};

use crate::{bump, global};

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

/// The rows not read yet.
#[map]
static AGG_ROWS_MAP: HashMap<AggKey, RunTotal> = HashMap::with_max_entries(AGG_ROWS, 0);

/// Whether the probes aggregate.
#[inline(always)]
pub fn on() -> bool {
    global(&AGG_ON) != 0
}

/// Adds `ns` (and `activity`) of `tid` on `cpu` to its row of `slot`.
#[inline(always)]
fn add(cpu: u32, tid: u32, tgid: u32, slot: u64, ns: u64, activity: Option<u64>) {
    let key = AggKey { cpu, tid, slot };
    if let Some(row) = AGG_ROWS_MAP.get_ptr_mut(&key) {
        // SAFETY: this key is written by this CPU only, and by one program at a time.
        unsafe {
            (*row).busy_ns += ns;
            match activity {
                Some(a) => (*row).activity += a,
                None => (*row).flags |= run_total_flags::NO_ACTIVITY,
            }
        }
        return;
    }
    let row = RunTotal {
        busy_ns: ns,
        activity: activity.unwrap_or(0),
        tgid,
        flags: if activity.is_some() {
            0
        } else {
            run_total_flags::NO_ACTIVITY
        },
    };
    if AGG_ROWS_MAP
        .insert(&key, &row, u64::from(BPF_NOEXIST))
        .is_err()
    {
        bump(counter::AGG_DROPPED);
    }
}

/// Charges `[from, to)` of `tid` on `cpu`, cut at slot edges; `activity`, the count over
/// the whole span, is split in proportion to time.
#[inline(always)]
fn charge(cpu: u32, (tid, tgid): (u32, u32), from: u64, to: u64, activity: Option<u64>) {
    if tid == 0 || to <= from {
        return;
    }
    let span = to - from;
    let mut at = from;
    let mut counted = 0u64;
    for i in 0..MAX_SLOTS_PER_CHARGE {
        let slot = at / SLOT_NS;
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
        add(cpu, tid, tgid, slot, end - at, share);
        at = end;
        if at >= to {
            break;
        }
    }
}

/// At `sched_switch` at `ts_ns`: the run of `prev` (tid, tgid) that ends now is charged
/// (`activity`, its count), and `next` runs from now (`None` when the task_struct offsets
/// are unknown: the CPU's task is then unknown until its next tick).
#[inline(always)]
pub fn on_switch(ts_ns: u64, prev: (u32, u32), next: Option<(u32, u32)>, activity: Option<u64>) {
    let Some(cursor) = AGG_CURSOR.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: helper with no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    // SAFETY: this CPU's slot (see the module docs).
    unsafe {
        if (*cursor).known != 0 {
            charge(cpu, prev, (*cursor).start_ns, ts_ns, activity);
        }
        match next {
            Some((tid, tgid)) => {
                (*cursor).tid = tid;
                (*cursor).tgid = tgid;
                (*cursor).known = 1;
            }
            None => (*cursor).known = 0,
        }
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
    let Some(cursor) = AGG_CURSOR.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: helper with no preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let slot_start = ts_ns / SLOT_NS * SLOT_NS;
    // SAFETY: this CPU's slot (see the module docs).
    unsafe {
        if (*cursor).known == 0 {
            (*cursor).start_ns = ts_ns;
        } else if slot_start > (*cursor).start_ns {
            charge(cpu, current, (*cursor).start_ns, slot_start, count());
            (*cursor).start_ns = slot_start;
        }
        (*cursor).tid = current.0;
        (*cursor).tgid = current.1;
        (*cursor).known = 1;
    }
}
