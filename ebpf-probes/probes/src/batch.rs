//! Per-CPU batches of fixed-size events: switch events ([`SwitchBatch`]) and run counts
//! ([`CountBatch`]) are appended in a per-CPU map slot and sent to their ring buffer as
//! one record of up to [`SWITCH_BATCH`] events, the batch's header included, so the ring
//! buffer is written once per batch rather than per event.
//!
//! The aggregating mode's slot tables ([`AggTable`]) are sent the same way.
//!
//! All batch types share one layout (`len`, `cpu`, then the events; checked in the ABI
//! crate), and a slot is never used by two programs at once on one CPU: `sched_switch` runs
//! with interrupts off and the sampler from the timer interrupt.

use aya_ebpf::{helpers::bpf_get_smp_processor_id, maps::RingBuf};
use energy_bpf_abi::{
    AGG_SLOT_NS, AggRow, AggTable, CountBatch, CountEvent, SWITCH_BATCH, SWITCH_BATCH_HEADER,
    SWITCH_BATCH_MAX_AGE_NS, SwitchBatch, SwitchEvent,
};

use crate::{BPF_RB_NO_WAKEUP, bump_by};

/// A per-CPU batch type: its fields, and each event's timestamp (for the age rule).
pub trait Batch {
    /// The events it holds.
    type Event;
    /// `len`, `cpu` and the events.
    fn fields(&mut self) -> (&mut u32, &mut u32, &mut [Self::Event; SWITCH_BATCH]);
    /// When `event` happened.
    fn ts_ns(event: &Self::Event) -> u64;
}

impl Batch for SwitchBatch {
    type Event = SwitchEvent;
    #[inline(always)]
    fn fields(&mut self) -> (&mut u32, &mut u32, &mut [SwitchEvent; SWITCH_BATCH]) {
        (&mut self.len, &mut self.cpu, &mut self.events)
    }
    #[inline(always)]
    fn ts_ns(event: &SwitchEvent) -> u64 {
        event.ts_ns
    }
}

impl Batch for CountBatch {
    type Event = CountEvent;
    #[inline(always)]
    fn fields(&mut self) -> (&mut u32, &mut u32, &mut [CountEvent; SWITCH_BATCH]) {
        (&mut self.len, &mut self.cpu, &mut self.events)
    }
    #[inline(always)]
    fn ts_ns(event: &CountEvent) -> u64 {
        event.ts_ns
    }
}

/// The aggregating mode's slot table (`agg.rs` fills it in place and only [`flush`]es it).
impl Batch for AggTable {
    type Event = AggRow;
    #[inline(always)]
    fn fields(&mut self) -> (&mut u32, &mut u32, &mut [AggRow; SWITCH_BATCH]) {
        (&mut self.len, &mut self.cpu, &mut self.rows)
    }
    #[inline(always)]
    fn ts_ns(row: &AggRow) -> u64 {
        row.slot * AGG_SLOT_NS
    }
}

/// Appends `event` to this CPU's `batch`, and sends the batch to `ring` when it is full or
/// its first event is older than [`SWITCH_BATCH_MAX_AGE_NS`]; events the ring cannot take
/// are counted in loss counter `dropped`.
///
/// # Safety
/// `batch` is this CPU's slot of a per-CPU map of `B`, used by no other program meanwhile
/// (see the module docs).
#[inline(always)]
pub unsafe fn push<B: Batch>(batch: *mut B, event: B::Event, ring: &RingBuf, dropped: u32) {
    let ts_ns = B::ts_ns(&event);
    // SAFETY: the caller's.
    let (len_field, cpu, events) = unsafe { (*batch).fields() };
    let len = *len_field as usize;
    if len >= SWITCH_BATCH {
        // Unreachable (a full batch is sent at once); keeps the verifier's bounds.
        *len_field = 0;
        return;
    }
    if len == 0 {
        // SAFETY: helper with no preconditions.
        *cpu = unsafe { bpf_get_smp_processor_id() };
    }
    events[len] = event;
    *len_field = len as u32 + 1;
    if len + 1 == SWITCH_BATCH || ts_ns.wrapping_sub(B::ts_ns(&events[0])) > SWITCH_BATCH_MAX_AGE_NS
    {
        // SAFETY: the caller's.
        unsafe { flush(batch, ring, dropped) };
    }
}

/// Sends this CPU's pending events in `batch` to `ring` and empties the batch; events the
/// ring cannot take are counted in loss counter `dropped`.
///
/// # Safety
/// As [`push`].
#[inline(always)]
pub unsafe fn flush<B: Batch>(batch: *mut B, ring: &RingBuf, dropped: u32) {
    // SAFETY: the caller's.
    let len = unsafe { *(*batch).fields().0 };
    if len == 0 {
        return;
    }
    if len as usize > SWITCH_BATCH {
        // SAFETY: the caller's.
        unsafe { *(*batch).fields().0 = 0 };
        return;
    }
    // The header goes out with the events, `len` included, so reset it afterwards.
    // SAFETY: the batch is a whole map value of SWITCH_BATCH_HEADER bytes of header and
    // SWITCH_BATCH events; `len` is at most SWITCH_BATCH.
    let bytes = unsafe {
        core::slice::from_raw_parts(
            batch.cast::<u8>(),
            SWITCH_BATCH_HEADER + len as usize * core::mem::size_of::<B::Event>(),
        )
    };
    if ring.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP).is_err() {
        bump_by(dropped, u64::from(len));
    }
    // SAFETY: the caller's.
    unsafe { *(*batch).fields().0 = 0 };
}
