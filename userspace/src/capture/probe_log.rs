//! Probe diagnostics (`--debug-probes`): the probes log through aya-log (why a Python walk
//! stopped short: which read faulted at which address, the depth limit, a failed tail
//! call), and this module hands each record to `tracing` as a warning on the
//! `energy_bpf::probes` target.
//!
//! Off by default, at no cost per sample: the probes' `PROBE_DEBUG` and aya-log's
//! `AYA_LOG_LEVEL` are load-time constants in `.rodata`, 0 unless asked for, so the
//! verifier prunes every diagnostic and log call.

use std::sync::atomic::{AtomicBool, Ordering};

static ON: AtomicBool = AtomicBool::new(false);

/// Asks the probes started from now on to log their diagnostics (the command's
/// `--debug-probes`).
pub fn enable(on: bool) {
    ON.store(on, Ordering::Relaxed);
}

/// Whether probe diagnostics were asked for.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// The `AYA_LOG_LEVEL` the probes are loaded with: every level up to debug when on, none
/// when off.
pub(super) fn level() -> u8 {
    if enabled() {
        aya_log::Level::Debug as u8
    } else {
        0
    }
}

/// Forwards aya-log's records to `tracing`.
pub(super) struct ToTracing;

impl log::Log for ToTracing {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        // Asked for by flag: shown at the default filter (`warn`), with the probe's level.
        tracing::warn!(
            target: "energy_bpf::probes",
            "probe {}: {}",
            record.level().as_str().to_ascii_lowercase(),
            record.args()
        );
    }

    fn flush(&self) {}
}

/// The probes' log reader, when diagnostics are on.
pub(super) type Logger = aya_log::EbpfLogger<ToTracing>;

/// Starts reading the probes' log records; `None` (with a warning) when the object has no
/// log map.
pub(super) fn start(ebpf: &mut aya::Ebpf) -> Option<Logger> {
    if !enabled() {
        return None;
    }
    match aya_log::EbpfLogger::init_with_logger(ebpf, ToTracing) {
        Ok(logger) => Some(logger),
        Err(err) => {
            tracing::warn!("probe diagnostics are off: {err}");
            None
        }
    }
}
