//! Energy options shared by every command that reads energy (`record`, `top`, `report`,
//! `sources`): which source, where the roots are, how often, and the model. Plain data:
//! `commands::args` maps the command-line flags onto it.

use std::{fmt, path::PathBuf};

/// Where a guest finds the share of the energy its host measured for it, by default
/// (docs/virtual-machines.md, "In the guest").
pub const HYPERVISOR_DIR: &str = "/run/energy-bpf/host";

/// Which kind of energy source to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// The best per domain: perf PMU > powercap > MSR > hwmon, plus NVML for GPUs; the
    /// estimated model when no CPU counter exists.
    Auto,
    /// perf `power/energy-*` PMU events.
    Perf,
    /// powercap sysfs (`intel-rapl:*` zones; AMD exposes the same tree).
    Powercap,
    /// Raw RAPL MSRs through `/dev/cpu/N/msr`.
    Msr,
    /// hwmon `energyN_input` (amd_energy, zenergy, ...).
    Hwmon,
    /// NVIDIA GPUs through NVML.
    Nvml,
    /// The energy the host measured for this virtual machine, from the directory it shares
    /// into the guest (`--hypervisor-dir`).
    Hypervisor,
    /// The estimated model only.
    Model,
}

impl SourceKind {
    /// The name used in recordings (`EnergySource.kind`) and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Auto => "auto",
            SourceKind::Perf => "perf",
            SourceKind::Powercap => "powercap",
            SourceKind::Msr => "msr",
            SourceKind::Hwmon => "hwmon",
            SourceKind::Nvml => "nvml",
            SourceKind::Hypervisor => "hypervisor",
            SourceKind::Model => "model",
        }
    }

    /// Hardware kinds in order of preference for CPU domains (docs/ARCHITECTURE.md, "Energy counters").
    /// A hypervisor share is last: only a guest has one, and a guest has none of the others.
    pub const CPU_PREFERENCE: [SourceKind; 5] = [
        SourceKind::Perf,
        SourceKind::Powercap,
        SourceKind::Msr,
        SourceKind::Hwmon,
        SourceKind::Hypervisor,
    ];
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Energy options (`commands::args::EnergyFlags` fills them from the command line).
#[derive(Debug, Clone)]
pub struct EnergyArgs {
    /// Energy source to use (auto: best available per domain; model: estimated only).
    pub energy_source: SourceKind,
    /// Root of sysfs, where powercap, hwmon and the power PMU are found (tests pass a fake
    /// tree).
    pub sysfs_root: PathBuf,
    /// Root of the MSR device files (`N/msr` under it).
    pub dev_cpu_root: PathBuf,
    /// Read interval in ms (default: at least 5x the measured update period and 10 ms).
    pub energy_interval_ms: Option<u64>,
    /// Estimated model: power of one package with all its CPUs idle, watts.
    pub model_idle_w: Option<f64>,
    /// Estimated model: power of one package with all its CPUs busy, watts.
    pub model_max_w: Option<f64>,
    /// Estimated model parameters from a file of `key = value` lines (`idle_w`, `max_w`,
    /// per package; `#` comments).
    pub model_config: Option<PathBuf>,
    /// Estimated model: the load curve (fitted from SPECpower load points, or linear).
    pub model_curve: ModelCurve,
    /// Root of procfs, where the model reads `cpuinfo` and `meminfo` (tests pass a fake
    /// tree).
    pub proc_root: PathBuf,
    /// Inside a virtual machine: the directory the host shares this VM's energy in.
    pub hypervisor_dir: PathBuf,
}

/// The estimated model's load curve.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ModelCurve {
    /// P = P_idle + (P_max − P_idle)·u^γ, γ from the power table.
    #[default]
    Fitted,
    /// P = P_idle + (P_max − P_idle)·u.
    Linear,
}

impl Default for EnergyArgs {
    fn default() -> Self {
        Self {
            energy_source: SourceKind::Auto,
            sysfs_root: PathBuf::from("/sys"),
            dev_cpu_root: PathBuf::from("/dev/cpu"),
            energy_interval_ms: None,
            model_idle_w: None,
            model_max_w: None,
            model_config: None,
            model_curve: ModelCurve::Fitted,
            proc_root: PathBuf::from("/proc"),
            hypervisor_dir: PathBuf::from(HYPERVISOR_DIR),
        }
    }
}
