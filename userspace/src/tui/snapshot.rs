//! The seam between collection and display: one [`Snapshot`] per refresh.
//!
//! The feed (a live capture, a replayed recording, or the agent's socket) builds these from
//! the pipeline's windows and sends them over a `std::sync::mpsc` channel; the TUI and the
//! batch printer only read them. Rows are the pipeline's [`ProcessRow`]s, the same rows
//! `report` renders; every value is already computed for the interval (power) or since
//! start (energy), so the display never does attribution math and never waits on
//! collection.

use crate::{
    attribute::domain_name,
    pipeline::{Window, source_label},
};

/// Everything the screen shows for one refresh interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC time at the start of the interval.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC time at the end of the interval (the clock of `bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Length of the interval the power figures cover, in seconds.
    pub interval_s: f64,
    /// Machine-wide figures for the header.
    pub header: Header,
    /// The window's machine-wide figures as `report --format json` prints them.
    pub totals: crate::pipeline::Totals,
    /// One row per process seen in the interval: the pipeline's rows, as `report` reads
    /// them.
    pub rows: Vec<ProcessRow>,
}

impl Snapshot {
    /// The display's view of one closed window of the pipeline (a live capture's, a
    /// replayed recording's, or the agent's), with the capture's sample rate.
    pub fn from_window(w: &Window, sample_hz: u32) -> Self {
        let secs = (w.totals.duration_ns as f64 / 1e9).max(1e-9);
        let attr = &w.analysis.attribution;
        let domains = attr
            .sources
            .iter()
            .map(|s| DomainPower {
                name: format!("{}-{}", domain_name(s.domain), s.package),
                watts: s.measured_uj * 1e-6 / secs,
            })
            .collect();
        let l = &w.losses;
        Self {
            start_ns: w.start_ns(),
            ts_ns: w.end_ns(),
            interval_s: secs,
            header: Header {
                domains,
                idle_w: w.totals.idle_j / secs,
                total_w: w.totals.total_j / secs,
                source: source_label(&w.analysis.sources),
                estimated: w.totals.estimated,
                sample_hz,
                lost_events: crate::record::lost_events(l),
                cpus: w.analysis.timeline.cpus.len() as u32,
                model_row: crate::energy::model::row_label(&w.analysis.sources),
            },
            totals: w.totals.clone(),
            rows: w.processes.clone(),
        }
    }
}

/// Machine-wide figures shown above the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Header {
    /// Power per energy domain over the interval, e.g. `package-0`, `dram-0`, `gpu-0`.
    pub domains: Vec<DomainPower>,
    /// Idle/static power over the interval (the `separate` idle row of docs/ARCHITECTURE.md, "Attribution"), W.
    pub idle_w: f64,
    /// Total machine power over the interval, W (sum of the measured domains).
    pub total_w: f64,
    /// The energy source in use, e.g. `powercap`, `perf-rapl`, `nvml`, `model`.
    pub source: String,
    /// True when the power comes from a model, not a counter: every power and energy figure
    /// is then labelled `estimated`.
    pub estimated: bool,
    /// Stack-sampling frequency in Hz.
    pub sample_hz: u32,
    /// Events lost since start (ring buffer full, drops counted in-kernel).
    pub lost_events: u64,
    /// Number of online CPUs.
    pub cpus: u32,
    /// The power-table row of the estimated model, when its parameters came from it.
    pub model_row: Option<String>,
}

/// Power of one energy domain over the interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DomainPower {
    /// Domain name as `<kind>-<index>`: `package-0`, `dram-0`, `core-0`, `psys-0`, `gpu-0`.
    pub name: String,
    /// Average power over the interval, W.
    pub watts: f64,
}

impl DomainPower {
    /// True for GPU domains (`gpu-*`), which the header shows on their own.
    pub fn is_gpu(&self) -> bool {
        self.name.starts_with("gpu")
    }
}

pub use crate::pipeline::{ProcessRow, ThreadRow};
