//! Energy sources: every energy counter a Linux machine exposes, read on a dedicated thread,
//! unwrapped to cumulative microjoules and stamped with CLOCK_MONOTONIC (the clock of
//! `bpf_ktime_get_ns`), plus a labelled `estimated` model where no counter exists.
//!
//! What this module owns (docs/ARCHITECTURE.md, "Energy counters" and "Estimated energy"):
//! - [`EnergySource`]: one seam, one instance per hardware counter (a RAPL zone, an MSR, a
//!   hwmon input, a GPU). One counter per instance so that one that vanishes mid-run (GPU
//!   reset, hot-unplug, permission change) is dropped alone while the others go on.
//! - The backends: `perf` (power PMU), `powercap`, `msr`, `hwmon`, `nvml`; every
//!   root is configurable ([`EnergyArgs`]) so tests drive the same code on fake trees.
//! - `detect`: which kinds exist here, why not, and the best per domain
//!   (perf PMU > powercap > MSR > hwmon; NVML for GPUs), or the [`model`].
//! - `counter`: wrap handling, merging of unchanged reads, flags for implausible ones.
//! - `reader`: the reader thread ([`start`], [`EnergyReader`]).
//! - [`model`]: P = P_idle + (P_max − P_idle)·u^γ from the timeline's exact busy time;
//!   its default parameters from [`power_table`] (SPECpower-measured servers) for the
//!   machine [`machine`] reads.
//! - `fake` (behind `test-support`): fake sysfs/MSR trees and a counter emulator for tests.

pub(crate) mod args;
pub(crate) mod counter;
pub(crate) mod detect;
// Fake sysfs trees and emulators, for this crate's tests and the integration tests (the
// `test-support` feature, which the crate's own dev-dependency turns on).
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
mod host;
mod hwmon;
pub mod hypervisor;
pub mod machine;
pub mod model;
mod msr;
mod nvml;
mod perf;
pub mod power_table;
mod powercap;
pub(crate) mod reader;
pub(crate) mod survey;
pub(crate) mod topology;

#[cfg(test)]
mod tests;

use std::path::PathBuf;

pub use args::{EnergyArgs, ModelCurve, SourceKind};
pub use reader::{EnergyReader, readings_for, start};

use crate::pb::v1 as pb;

/// What one read of a counter returns, before unwrapping.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawSample {
    /// The counter's raw value in its own units (see [`EnergySource::unit_uj`]).
    pub count: u64,
    /// GPU only: processes using the device since the previous read.
    pub gpu_processes: Vec<pb::GpuProcessUsage>,
}

/// One hardware energy counter (one domain of one package or device).
///
/// Implementations only read; unwrapping, merging and flagging are shared
/// (`counter::Unwrapper`) so every backend behaves the same at a wrap.
pub trait EnergySource: Send {
    /// The source as it goes into the recording. `id`, `update_period_ns` and
    /// `read_cost_ns` are filled in by the reader.
    fn describe(&self) -> pb::EnergySource;
    /// Microjoules per count of [`RawSample::count`].
    fn unit_uj(&self) -> f64;
    /// The count at which the raw counter wraps to 0 (`None`: it never wraps in practice).
    fn wrap_counts(&self) -> Option<u64>;
    /// Reads the counter now.
    fn read(&mut self) -> Result<RawSample, EnergyError>;
    /// The update period the source knows without watching it (the host's interval, for a
    /// hypervisor share): used instead of the measured one, and such a counter is never
    /// judged silent for not changing while start-up watched it.
    fn known_update_period_ns(&self) -> Option<u64> {
        None
    }
    /// The read interval the source asks for when `--energy-interval-ms` is not given.
    fn default_read_interval_ns(&self) -> Option<u64> {
        None
    }
    /// After a read: a gap the source saw (the host restarted, a new VM instance): the
    /// reading is flagged, so the interval ending at it is dropped, and counting goes on
    /// from the value just read.
    fn take_gap(&mut self) -> Option<String> {
        None
    }
    /// After a read: something the user must be told that does not end the source (the
    /// host stopped updating its share).
    fn take_notice(&mut self) -> Option<String> {
        None
    }
}

/// Errors of the energy layer. Each names the thing and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum EnergyError {
    /// A counter file exists but this user may not read it.
    #[error(
        "permission denied reading {path}: {hint}",
        path = path.display()
    )]
    PermissionDenied {
        /// The file.
        path: PathBuf,
        /// How to get access.
        hint: String,
    },
    /// A counter file vanished (zone removed, device unplugged).
    #[error("{path} disappeared ({source})", path = path.display())]
    Vanished {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Any other I/O failure on a counter file.
    #[error("reading {path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file that should hold a number does not.
    #[error("{path}: expected {expected}, found {found:?}", path = path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it should hold.
        expected: &'static str,
        /// What it holds.
        found: String,
    },
    /// `perf_event_open` refused a power PMU event.
    #[error("perf_event_open(power/{event}, cpu {cpu}) failed: {source}{hint}")]
    PerfOpen {
        /// The event name, e.g. `energy-pkg`.
        event: String,
        /// The CPU it was opened on.
        cpu: u32,
        /// The OS error.
        source: std::io::Error,
        /// How to fix it, when known (starts with "; ").
        hint: String,
    },
    /// NVML could not be loaded or returned an error.
    #[error("NVML: {0}")]
    Nvml(String),
    /// The kind forced by `--energy-source` is not usable here.
    #[error("--energy-source {kind}: not usable on this machine: {reason}")]
    Unavailable {
        /// The kind asked for.
        kind: SourceKind,
        /// Why it cannot be used.
        reason: String,
    },
    /// Bad model parameters or model config file.
    #[error("energy model: {0}")]
    Model(String),
    /// The reader thread could not be started.
    #[error("starting the energy reader thread: {0}")]
    Thread(std::io::Error),
}

impl EnergyError {
    /// Classifies an I/O error on a counter file into the variant a user can act on.
    pub(crate) fn from_io(path: impl Into<PathBuf>, source: std::io::Error, hint: &str) -> Self {
        let path = path.into();
        match source.kind() {
            std::io::ErrorKind::PermissionDenied => EnergyError::PermissionDenied {
                path,
                hint: hint.to_owned(),
            },
            std::io::ErrorKind::NotFound => EnergyError::Vanished { path, source },
            _ => EnergyError::Io { path, source },
        }
    }
}

/// Reads a small sysfs text file, trimmed.
pub(crate) fn read_text(path: &std::path::Path, hint: &str) -> Result<String, EnergyError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| EnergyError::from_io(path, e, hint))
}

/// Reads a sysfs file holding one unsigned decimal integer.
pub(crate) fn read_u64(path: &std::path::Path, hint: &str) -> Result<u64, EnergyError> {
    let text = read_text(path, hint)?;
    text.parse().map_err(|_| EnergyError::Parse {
        path: path.to_owned(),
        expected: "an unsigned integer",
        found: text,
    })
}

/// Name of a domain as users see it.
pub(crate) fn domain_name(domain: pb::EnergyDomain) -> &'static str {
    match domain {
        pb::EnergyDomain::Package => "package",
        pb::EnergyDomain::Cores => "cores",
        pb::EnergyDomain::Uncore => "uncore",
        pb::EnergyDomain::Dram => "dram",
        pb::EnergyDomain::Psys => "psys",
        pb::EnergyDomain::Gpu => "gpu",
        pb::EnergyDomain::DomainUnspecified => "other",
    }
}

/// A source description with the fields every backend fills the same way.
pub(crate) fn source_desc(
    kind: SourceKind,
    domain: pb::EnergyDomain,
    package: u32,
    name: String,
) -> pb::EnergySource {
    pb::EnergySource {
        kind: kind.as_str().to_owned(),
        domain: domain as i32,
        package,
        name,
        ..Default::default()
    }
}
