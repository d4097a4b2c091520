//! Run counters (`record --activity-events`): up to [`RUN_COUNTERS`] perf events per CPU,
//! opened by userspace, read at every `sched_switch` the way the activity counter is and
//! at every sampler tick, and sent as [`CountEvent`]s on a ring buffer of their own, so
//! switch events keep their size. How many counters there are is a load-time constant, so
//! without run counters the verifier prunes all of it and a switch pays nothing. Each event holds the counts of one interval of a thread on a CPU: from the
//! previous read there to a switch or a tick, at most one sampling period long, so a
//! stack sample is matched with the counts of the interval it opens.

use aya_ebpf::{
    bindings::{BPF_F_CURRENT_CPU, bpf_perf_event_value},
    helpers::generated::bpf_perf_event_read_value,
    macros::map,
    maps::{PerCpuArray, PerfEventArray, RingBuf},
};
use energy_bpf_abi::{CountBatch, CountEvent, RUN_COUNTERS, counter};

use crate::{batch, global};

/// Counter 0 of each CPU, stored at the CPU's index by userspace.
#[map]
static RUN_COUNTER_0: PerfEventArray<u32> = PerfEventArray::new(0);
/// Counter 1 of each CPU.
#[map]
static RUN_COUNTER_1: PerfEventArray<u32> = PerfEventArray::new(0);
/// Counter 2 of each CPU.
#[map]
static RUN_COUNTER_2: PerfEventArray<u32> = PerfEventArray::new(0);

/// How many counters userspace opened (0: off). Set before load and frozen in `.rodata`, so
/// with 0 the verifier prunes every read, as it does for `ACTIVITY_ON`.
#[unsafe(no_mangle)]
static RUN_COUNTERS_ON: u32 = 0;

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

/// Reads this CPU's counter of `map` (the run counters, and the activity counter).
#[inline(always)]
pub fn read(map: &PerfEventArray<u32>) -> Option<u64> {
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
    let on = global(&RUN_COUNTERS_ON);
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
    // with interrupts off and the sampler from the timer interrupt (see `batch`).
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
        batch::push(batch, event, &RUN_COUNTS, counter::COUNT_DROPPED);
    }
}
