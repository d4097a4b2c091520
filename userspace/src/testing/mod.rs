//! Builders the tests share (compiled for unit tests, and behind the `test-support` feature
//! for the integration tests and benches; test-only): one place for the event shapes many
//! tests need, so a field added to an event is filled in once.

// The attribution's simulator (machines, classes, duty cycles, counters) and the scenarios
// the accuracy bench and the attribution's tests run on it.
pub mod scenarios;
pub mod sim;

use crate::pb::v1::SwitchEvent;

/// A switch on `cpu` at `ts_ns` from thread `tid` to `next` (each its own process).
pub fn sw(ts_ns: u64, cpu: u32, tid: u32, next: u32) -> SwitchEvent {
    sw_to(ts_ns, cpu, tid, Some(next))
}

/// [`sw`] where the probe may not have read the next task (`None`: unknown).
pub fn sw_to(ts_ns: u64, cpu: u32, tid: u32, next: Option<u32>) -> SwitchEvent {
    SwitchEvent {
        ts_ns,
        cpu,
        tid,
        tgid: tid,
        next_known: next.is_some(),
        next_tid: next.unwrap_or(0),
        next_tgid: next.unwrap_or(0),
        ..Default::default()
    }
}

/// [`sw`] carrying the activity count of the run it ends (`None`: not counted).
pub fn sw_counted(ts_ns: u64, cpu: u32, tid: u32, next: u32, activity: Option<u64>) -> SwitchEvent {
    SwitchEvent {
        activity,
        ..sw(ts_ns, cpu, tid, next)
    }
}
