//! Run counters (`record --activity-events`): up to [`RUN_COUNTERS`] perf events per CPU,
//! opened by userspace, read at every `sched_switch` the way the activity counter is and
//! at every sampler tick, and sent as [`CountEvent`]s on a ring buffer of their own, so
//! switch events keep their size and a capture without run counters pays one map lookup
//! per switch. Each event holds the counts of one interval of a thread on a CPU: from the
//! previous read there to a switch or a tick, at most one sampling period long, so a
//! stack sample is matched with the counts of the interval it opens.

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_CPU, bpf_perf_event_value},
    helpers::{bpf_get_smp_processor_id, generated::bpf_perf_event_read_value},
    macros::map,
    maps::{Array, PerCpuArray, PerfEventArray, RingBuf},
};
use energy_bpf_abi::{
    CountBatch, CountEvent, RUN_COUNTERS, SWITCH_BATCH, SWITCH_BATCH_HEADER,
    SWITCH_BATCH_MAX_AGE_NS, counter,
};

use crate::{BPF_RB_NO_WAKEUP, bump_by};

/// Counter 0 of each CPU, stored at the CPU's index by userspace.
#[map]
static RUN_COUNTER_0: PerfEventArray<u32> = PerfEventArray::new(0);
/// Counter 1 of each CPU.
#[map]
static RUN_COUNTER_1: PerfEventArray<u32> = PerfEventArray::new(0);
/// Counter 2 of each CPU.
#[map]
static RUN_COUNTER_2: PerfEventArray<u32> = PerfEventArray::new(0);

/// Entry 0: how many counters userspace installed (0: off). A map, not a load-time global,
/// so counters can be turned on after the probes are loaded.
#[map]
static RUN_COUNTERS_ON: Array<u32> = Array::with_max_entries(1, 0);

/// Each CPU's counter values at its previous switch.
#[map]
static RUN_COUNT_LAST: PerCpuArray<Cursor> = PerCpuArray::with_max_entries(1, 0);

/// Each CPU's count events not yet sent.
#[map]
static RUN_COUNT_BATCHES: PerCpuArray<CountBatch> = PerCpuArray::with_max_entries(1, 0);

/// 1 MiB: 26k intervals of 40 bytes, drained every 100 ms by `record`; allocated whether
/// or not run counters are on, so kept small.
#[map]
static RUN_COUNTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Counter values at a CPU's previous switch. Private to the probe.
#[repr(C)]
struct Cursor {
    values: [u64; RUN_COUNTERS],
    /// Bit k: `values[k]` was read at the previous switch on this CPU.
    known: u64,
}

/// Reads counter `k` of this CPU.
#[inline(always)]
fn read(map: &PerfEventArray<u32>) -> Option<u64> {
    let mut value = bpf_perf_event_value {
        counter: 0,
        enabled: 0,
        running: 0,
    };
    // SAFETY: the map is #[repr(transparent)] over its definition, as the helper expects;
    // `value` is a live bpf_perf_event_value of the size passed. The events are opened
    // pinned, so `counter` needs no enabled/running scaling.
    let rc = unsafe {
        bpf_perf_event_read_value(
            core::ptr::from_ref(map).cast_mut().cast(),
            u64::from(BPF_F_CURRENT_CPU),
            &mut value,
            core::mem::size_of::<bpf_perf_event_value>() as u32,
        )
    };
    (rc == 0).then_some(value.counter)
}

/// At a switch or a sampler tick: the counts of `tid`'s interval on this CPU ending at
/// `ts_ns`, batched.
#[inline(always)]
pub fn on_boundary(ts_ns: u64, tid: u32) {
    let on = match RUN_COUNTERS_ON.get(0) {
        Some(&n) => n,
        None => return,
    };
    if on == 0 {
        return;
    }
    let (Some(cursor), Some(batch)) = (
        RUN_COUNT_LAST.get_ptr_mut(0),
        RUN_COUNT_BATCHES.get_ptr_mut(0),
    ) else {
        return;
    };
    let values = [
        read(&RUN_COUNTER_0),
        if on > 1 { read(&RUN_COUNTER_1) } else { None },
        if on > 2 { read(&RUN_COUNTER_2) } else { None },
    ];
    let mut event = CountEvent {
        ts_ns,
        tid,
        valid: 0,
        counts: [0; RUN_COUNTERS],
    };
    // SAFETY: this CPU's slots; nothing else runs on this CPU meanwhile: sched_switch runs
    // with interrupts off and the sampler from the timer interrupt (see flush_switches).
    unsafe {
        let mut known = 0u64;
        for (k, value) in values.iter().enumerate() {
            if let Some(v) = *value {
                if (*cursor).known & (1 << k) != 0 {
                    event.counts[k] = v.wrapping_sub((*cursor).values[k]);
                    event.valid |= 1 << k;
                }
                (*cursor).values[k] = v;
                known |= 1 << k;
            }
        }
        (*cursor).known = known;
        if event.valid == 0 {
            return;
        }
        let len = (*batch).len as usize;
        if len >= SWITCH_BATCH {
            (*batch).len = 0;
            return;
        }
        if len == 0 {
            (*batch).cpu = bpf_get_smp_processor_id();
        }
        (*batch).events[len] = event;
        (*batch).len = len as u32 + 1;
        if len + 1 == SWITCH_BATCH
            || ts_ns.wrapping_sub((*batch).events[0].ts_ns) > SWITCH_BATCH_MAX_AGE_NS
        {
            flush(batch);
        }
    }
}

/// Sends this CPU's pending count events and empties the batch (as `flush_switches`).
#[inline(always)]
fn flush(batch: *mut CountBatch) {
    // SAFETY: `batch` is this CPU's slot of RUN_COUNT_BATCHES.
    unsafe {
        let len = (*batch).len;
        if len == 0 {
            return;
        }
        if len as usize > SWITCH_BATCH {
            (*batch).len = 0;
            return;
        }
        let bytes = core::slice::from_raw_parts(
            batch.cast::<u8>(),
            SWITCH_BATCH_HEADER + len as usize * core::mem::size_of::<CountEvent>(),
        );
        if RUN_COUNTS.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP).is_err() {
            bump_by(counter::COUNT_DROPPED, u64::from(len));
        }
        (*batch).len = 0;
    }
}
