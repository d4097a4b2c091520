//! Loading and attaching the eBPF probes, draining their ring buffers, decoding events.
//!
//! `Probes::start_sized` checks privileges and the kernel, loads the object built from
//! `ebpf-probes/probes`, attaches `sched_switch`, the lifecycle tracepoints and a cpu-clock
//! sampler on every online CPU. `Probes::drain` empties the ring buffers; the caller calls
//! it on a timer (the probes never wake us, see docs/ARCHITECTURE.md, "Capture"). `session` builds recording
//! chunks on top of it; `live` is the one place a capture is started, polled and finished.

pub(crate) mod activity;
pub(crate) mod aggregate;
pub(crate) mod backoff;
mod bpf_sys;
pub mod btf;
pub(crate) mod cgroupns;
pub(crate) mod command_runs;
mod decode;
pub mod host;
pub(crate) mod jit;
pub(crate) mod live;
pub(crate) mod probe_log;
mod probes;
pub(crate) mod python;
mod ring;
pub(crate) mod run_counts;
pub(crate) mod sampler;
pub(crate) mod session;
pub mod sink;
pub(crate) mod unwinder;
pub(crate) mod windowed;

pub(crate) use activity::ActivityEvent;
pub(crate) use decode::{Comm, DecodedSample, Event, comm_string};
pub use live::{Live, LiveError, LiveOptions};
pub(crate) use probes::{CaptureError, Probes, UnwindMode, sample_ring_bytes};
pub use windowed::{Capture, LiveConfig};

/// Probe object built by `userspace/build.rs` (aya-build) with the pinned nightly.
pub(crate) static PROBES_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/energy-bpf-probes"));
