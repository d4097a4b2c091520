//! The seam between collection and display: one [`Snapshot`] per refresh.
//!
//! The live feed (capture + energy + attribution) builds these and sends them over a
//! `std::sync::mpsc` channel; the TUI and the batch printer only read them. Every value is
//! already computed for the interval (power) or since start (energy), so the display never
//! does attribution math and never waits on collection.

/// Everything the screen shows for one refresh interval.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC time at the end of the interval (the clock of `bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// Length of the interval the power figures cover, in seconds.
    pub interval_s: f64,
    /// Machine-wide figures for the header.
    pub header: Header,
    /// One row per process seen in the interval (or since start, with 0 W now).
    pub rows: Vec<ProcessRow>,
}

/// Machine-wide figures shown above the table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Header {
    /// Power per energy domain over the interval, e.g. `package-0`, `dram-0`, `gpu-0`.
    pub domains: Vec<DomainPower>,
    /// Idle/static power over the interval (the `separate` idle row of DESIGN.md §4), W.
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

/// One process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessRow {
    /// Process id (tgid).
    pub pid: u32,
    /// Short name (`comm`, at most 15 bytes).
    pub comm: String,
    /// Full command line, arguments joined by spaces; empty for kernel threads.
    pub cmdline: String,
    /// cgroup v2 path, e.g. `/system.slice/docker-<id>.scope`; empty when unknown.
    pub cgroup: String,
    /// Average power attributed over the interval, W.
    pub power_w: f64,
    /// Energy attributed since `top` started, J.
    pub energy_j: f64,
    /// CPU use over the interval in percent of one CPU (like top: up to 100 × CPUs).
    pub cpu_pct: f64,
    /// Share of the machine's power over the interval, 0..=1.
    pub share: f64,
    /// The process's threads (may be empty when the feed does not split by thread).
    pub threads: Vec<ThreadRow>,
}

/// One thread of a process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadRow {
    /// Thread id.
    pub tid: u32,
    /// Thread name (`comm`).
    pub comm: String,
    /// Average power attributed over the interval, W.
    pub power_w: f64,
    /// Energy attributed since `top` started, J.
    pub energy_j: f64,
    /// CPU use over the interval in percent of one CPU.
    pub cpu_pct: f64,
    /// Share of the machine's power over the interval, 0..=1.
    pub share: f64,
}
