//! Flag groups several commands share, and how they map onto the plain option structs the
//! library takes. clap stays here: the core never sees a command line.

use clap::{ValueEnum, builder::PossibleValue};

use crate::{
    analysis::ModelOverride,
    attribute::{IdlePolicy, Options, PowerModel},
    capture::{ActivityEvent, UnwindMode},
};

/// The counter `sched_switch` reads per run, for `record` and `top`.
#[derive(Clone, Copy, Debug, Default, clap::Args)]
pub(crate) struct ActivityArgs {
    /// Counter that weighs each run's share of dynamic energy: hardware cycles or
    /// instructions where the PMU has them; `task-clock` or `cpu-clock` (software, the same
    /// as time) to exercise the path where it has not; `none` to split by time. `auto`:
    /// cycles if available, else none.
    #[arg(long = "activity-event", value_enum, default_value_t = ActivityEvent::Auto)]
    pub(crate) event: ActivityEvent,
}

/// How user stacks are walked, for `record`, `top` and the agent.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct UnwindArgs {
    /// User-stack unwinding: `dwarf` walks unwind tables compiled from each binary's
    /// `.eh_frame` (whole stacks without frame pointers; a frame-pointer step where a PC has
    /// no table); `fp` has the kernel follow frame pointers; `auto` is `dwarf` where the
    /// kernel accepts the table walker, else `fp` with a warning.
    #[arg(long = "unwind", value_enum, default_value_t = UnwindMode::Auto)]
    pub(crate) mode: UnwindMode,
    /// Log the probes' diagnostics on stderr: why a Python walk stopped short (which read
    /// faulted at which address, the depth limit, a failed tail call). Off: the probes are
    /// loaded without them, at no cost.
    #[arg(long = "debug-probes")]
    pub(crate) debug_probes: bool,
}

impl ValueEnum for UnwindMode {
    fn value_variants<'a>() -> &'a [Self] {
        &[UnwindMode::Auto, UnwindMode::Dwarf, UnwindMode::Fp]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            UnwindMode::Auto => {
                "Unwind tables where the kernel takes the walker, else frame pointers"
            }
            UnwindMode::Dwarf => {
                "Unwind tables from .eh_frame (an error if the walker cannot load)"
            }
            UnwindMode::Fp => "Frame pointers only",
        };
        Some(PossibleValue::new(self.name()).help(help))
    }
}

impl ValueEnum for ActivityEvent {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            ActivityEvent::Auto,
            ActivityEvent::Cycles,
            ActivityEvent::Instructions,
            ActivityEvent::TaskClock,
            ActivityEvent::CpuClock,
            ActivityEvent::None,
        ]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let help = match self {
            ActivityEvent::Auto => "Cycles if the PMU has them, else none",
            ActivityEvent::Cycles => "Hardware CPU cycles",
            ActivityEvent::Instructions => "Hardware retired instructions",
            ActivityEvent::TaskClock => "Software task-clock (ns)",
            ActivityEvent::CpuClock => "Software cpu-clock (ns)",
            ActivityEvent::None => "No counter: split by time",
        };
        Some(PossibleValue::new(self.name()).help(help))
    }
}

/// Command-line flags of attribution, for `report`, `flamegraph` and `top`.
#[derive(Clone, Debug, Default, clap::Args)]
pub(crate) struct AttributeArgs {
    /// Where idle/static energy goes: its own row (`separate`, like Kepler's idle) or spread
    /// over the busy threads by busy time (`proportional`, like PowerJoular).
    #[arg(long, value_enum, default_value_t = IdlePolicy::Separate)]
    pub(crate) idle: IdlePolicy,
    /// How dynamic energy is weighted between threads: by busy time, by per-class watts
    /// fitted by regression, or regression where it predicts held-out intervals better.
    #[arg(long, value_enum, default_value_t = PowerModel::Auto)]
    pub(crate) power_model: PowerModel,
    /// Static (all-idle) power of each package, W, e.g. measured on a quiet machine;
    /// default: an online estimate (or the model's idle power).
    #[arg(long, value_name = "W")]
    pub(crate) static_power_w: Option<f64>,
}

impl AttributeArgs {
    /// The options these flags select.
    pub(crate) fn options(&self) -> Options {
        Options {
            idle: self.idle,
            power_model: self.power_model,
            static_w: self.static_power_w,
            ..Options::default()
        }
    }
}

/// Flags that recompute an estimated recording with other model parameters.
#[derive(Clone, Debug, Default, clap::Args)]
pub(crate) struct ModelArgs {
    /// Recompute modelled (estimated) energy with this idle power per package, W.
    #[arg(long = "model-idle-w", value_name = "W")]
    pub(crate) idle_w: Option<f64>,
    /// Recompute modelled (estimated) energy with this full-load power per package, W.
    #[arg(long = "model-max-w", value_name = "W")]
    pub(crate) max_w: Option<f64>,
}

impl ModelArgs {
    /// The override these flags ask for.
    pub(crate) fn model(&self) -> ModelOverride {
        ModelOverride {
            idle_w: self.idle_w,
            max_w: self.max_w,
        }
    }
}

/// Which part of a recording (or of a directory of the agent's rotating recordings).
#[derive(Clone, Debug, Default, clap::Args)]
pub(crate) struct RangeArgs {
    /// Start here: RFC 3339 (`2026-11-26T04:00:00Z`) or a time ago (`-15m`).
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub(crate) from: Option<String>,
    /// End here: RFC 3339, a time ago (`-5m`), or `now`.
    #[arg(long, value_name = "TIME", allow_hyphen_values = true)]
    pub(crate) to: Option<String>,
}

impl RangeArgs {
    /// Reads `path` (a recording file or a directory of them) cut to the range.
    pub(crate) fn read(
        &self,
        path: &std::path::Path,
    ) -> Result<crate::record::Recording, crate::record::ReadError> {
        let range = crate::record::TimeRange::parse(
            self.from.as_deref(),
            self.to.as_deref(),
            crate::clock::realtime_ns(),
        )?;
        crate::record::read_path(path, &range)
    }
}

impl ValueEnum for IdlePolicy {
    fn value_variants<'a>() -> &'a [Self] {
        &[IdlePolicy::Separate, IdlePolicy::Proportional]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            IdlePolicy::Separate => PossibleValue::new("separate").help("Its own row"),
            IdlePolicy::Proportional => {
                PossibleValue::new("proportional").help("Spread over busy threads by busy time")
            }
        })
    }
}

impl ValueEnum for PowerModel {
    fn value_variants<'a>() -> &'a [Self] {
        &[PowerModel::Time, PowerModel::Regression, PowerModel::Auto]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(match self {
            PowerModel::Time => PossibleValue::new("time").help("Equal power per busy CPU-ns"),
            PowerModel::Regression => {
                PossibleValue::new("regression").help("Per-class watts fitted by regression")
            }
            PowerModel::Auto => PossibleValue::new("auto")
                .help("Regression where it predicts held-out intervals better, else time"),
        })
    }
}

/// Arguments of `energy-bpf calibrate` (and of `calibrate --roofline`).
#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    /// Seconds to measure (with `--load`, each load step lasts this long too).
    #[arg(short = 'd', long = "duration", value_name = "SECS", default_value_t = 10.0,
          allow_negative_numbers = true, value_parser = positive_secs)]
    pub(crate) duration: f64,
    /// Calibration file to update.
    #[arg(long, value_name = "FILE", default_value = crate::calibration::DEFAULT_PATH)]
    pub(crate) calibration: std::path::PathBuf,
    /// Refuse when more than this share of CPU time is busy, %.
    #[arg(long = "max-busy", value_name = "PCT", default_value_t = 10.0)]
    pub(crate) max_busy: f64,
    /// Then spin 1..N CPUs in turn to measure watts per busy CPU.
    #[arg(long)]
    pub(crate) load: bool,
    /// Measure the energy roofline instead: time and energy per flop and per byte, constant
    /// power, balance points, whether racing to halt saves energy (stored under `roofline`).
    #[arg(long)]
    pub(crate) roofline: bool,
    /// With --roofline: also draw the normalised roofline and arch line to this SVG file.
    #[arg(long, value_name = "FILE.svg", requires = "roofline")]
    pub(crate) plot: Option<std::path::PathBuf>,
    /// With --roofline: repeat the sweep with every CPU pinned to each of these frequencies
    /// (kHz, or with an MHz/GHz suffix) and fit the V²-scaling model; needs cpufreq.
    #[arg(
        long,
        value_name = "F1,F2,...",
        value_delimiter = ',',
        requires = "roofline"
    )]
    pub(crate) frequencies: Vec<String>,
    /// With --roofline: how long each kernel runs, ms (at least 50 counter updates).
    #[arg(long = "kernel-ms", value_name = "MS", default_value_t = 500)]
    pub(crate) kernel_ms: u64,
    /// With --roofline: the kernels' buffer, MiB (default: twice the last-level cache,
    /// 64 to 1024 MiB).
    #[arg(long = "buffer-mib", value_name = "MIB")]
    pub(crate) buffer_mib: Option<usize>,
    /// With --roofline: keep the kernels' cumulative flops and bytes in this file (two
    /// little-endian u64, mapped shared, updated as they run), for emulated counters.
    #[arg(long = "progress-file", value_name = "FILE", hide = true)]
    pub(crate) progress_file: Option<std::path::PathBuf>,
    /// Energy sources (counters, fake trees for testing, model parameters).
    #[command(flatten)]
    pub(crate) energy: EnergyFlags,
}

/// The energy flags; commands flatten this into their own `Args`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct EnergyFlags {
    /// Energy source to use (auto: best available per domain; model: estimated only).
    #[arg(long, value_enum, default_value_t = crate::energy::SourceKind::Auto)]
    pub(crate) energy_source: crate::energy::SourceKind,
    /// Root of sysfs, where powercap, hwmon and the power PMU are found (tests pass a fake
    /// tree; hidden from --help).
    #[arg(long, value_name = "DIR", default_value = "/sys", hide = true)]
    pub(crate) sysfs_root: std::path::PathBuf,
    /// Root of the MSR device files (`N/msr` under it; tests pass a fake tree, hidden from
    /// --help).
    #[arg(long, value_name = "DIR", default_value = "/dev/cpu", hide = true)]
    pub(crate) dev_cpu_root: std::path::PathBuf,
    /// Read interval in ms (default: at least 5x the measured update period and 10 ms).
    #[arg(long, value_name = "N")]
    pub(crate) energy_interval_ms: Option<u64>,
    /// Estimated model: power of one package with all its CPUs idle, watts.
    #[arg(long, value_name = "W")]
    pub(crate) model_idle_w: Option<f64>,
    /// Estimated model: power of one package with all its CPUs busy, watts.
    #[arg(long, value_name = "W")]
    pub(crate) model_max_w: Option<f64>,
    /// Estimated model parameters from a file of `key = value` lines (`idle_w`, `max_w`,
    /// per package; `#` comments).
    #[arg(long, value_name = "PATH")]
    pub(crate) model_config: Option<std::path::PathBuf>,
    /// Estimated model: load curve (fitted: u^γ from SPECpower load points; linear).
    #[arg(long, value_enum, default_value_t = ModelCurveFlag::Fitted)]
    pub(crate) model_curve: ModelCurveFlag,
    /// Root of procfs, where the model reads cpuinfo and meminfo (tests pass a fake tree;
    /// hidden from --help).
    #[arg(long, value_name = "DIR", default_value = "/proc", hide = true)]
    pub(crate) proc_root: std::path::PathBuf,
    /// In a virtual machine: the directory the host shares this VM's measured energy in
    /// (read-only; used automatically when present).
    #[arg(long, value_name = "DIR", default_value = crate::energy::hypervisor::DEFAULT_DIR)]
    pub(crate) hypervisor_dir: std::path::PathBuf,
}

/// `--model-curve`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum ModelCurveFlag {
    /// P_idle + (P_max − P_idle)·u^γ, γ fitted from SPECpower load points.
    #[default]
    Fitted,
    /// P_idle + (P_max − P_idle)·u.
    Linear,
}

impl Default for EnergyFlags {
    fn default() -> Self {
        let d = crate::energy::EnergyArgs::default();
        Self {
            energy_source: d.energy_source,
            sysfs_root: d.sysfs_root,
            dev_cpu_root: d.dev_cpu_root,
            energy_interval_ms: d.energy_interval_ms,
            model_idle_w: d.model_idle_w,
            model_max_w: d.model_max_w,
            model_config: d.model_config,
            model_curve: ModelCurveFlag::Fitted,
            proc_root: d.proc_root,
            hypervisor_dir: d.hypervisor_dir,
        }
    }
}

impl EnergyFlags {
    /// The library's energy options.
    pub(crate) fn config(&self) -> crate::energy::EnergyArgs {
        crate::energy::EnergyArgs {
            energy_source: self.energy_source,
            sysfs_root: self.sysfs_root.clone(),
            dev_cpu_root: self.dev_cpu_root.clone(),
            energy_interval_ms: self.energy_interval_ms,
            model_idle_w: self.model_idle_w,
            model_max_w: self.model_max_w,
            model_config: self.model_config.clone(),
            model_curve: match self.model_curve {
                ModelCurveFlag::Fitted => crate::energy::ModelCurve::Fitted,
                ModelCurveFlag::Linear => crate::energy::ModelCurve::Linear,
            },
            proc_root: self.proc_root.clone(),
            hypervisor_dir: self.hypervisor_dir.clone(),
        }
    }
}

/// `--calibration FILE` for the commands that attribute energy.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct CalibrationFlags {
    /// Calibration file from `energy-bpf calibrate` (default: /var/lib/energy-bpf/calibration.json
    /// when it exists).
    #[arg(long, value_name = "FILE")]
    pub(crate) calibration: Option<std::path::PathBuf>,
}

impl CalibrationFlags {
    /// The library's calibration choice.
    pub(crate) fn config(&self) -> crate::calibration::CalibrationArgs {
        crate::calibration::CalibrationArgs {
            calibration: self.calibration.clone(),
        }
    }
}

impl ValueEnum for crate::energy::SourceKind {
    fn value_variants<'a>() -> &'a [Self] {
        use crate::energy::SourceKind::*;
        &[Auto, Perf, Powercap, Msr, Hwmon, Nvml, Hypervisor, Model]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        use crate::energy::SourceKind::*;
        let help = match self {
            Auto => {
                "The best per domain: perf PMU > powercap > MSR > hwmon, plus NVML for GPUs; the estimated model when no CPU counter exists"
            }
            Perf => "perf `power/energy-*` PMU events",
            Powercap => "powercap sysfs (`intel-rapl:*` zones; AMD exposes the same tree)",
            Msr => "Raw RAPL MSRs through `/dev/cpu/N/msr`",
            Hwmon => "hwmon `energyN_input` (amd_energy, zenergy, ...)",
            Nvml => "NVIDIA GPUs through NVML",
            Hypervisor => {
                "In a virtual machine: the energy the host measured for it, from the directory it shares (--hypervisor-dir)"
            }
            Model => "The estimated model only",
        };
        Some(PossibleValue::new(self.as_str()).help(help))
    }
}

impl ValueEnum for crate::output::table::By {
    fn value_variants<'a>() -> &'a [Self] {
        use crate::output::table::By::*;
        &[Process, Thread, Cgroup, Command, Container, Function, Vm]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        use crate::output::table::By::*;
        let (name, help) = match self {
            Process => ("process", "One row per process"),
            Thread => ("thread", "One row per thread"),
            Cgroup => (
                "cgroup",
                "One row per cgroup (container, service): its processes summed",
            ),
            Command => ("command", "One row per command name: its processes summed"),
            Container => (
                "container",
                "One row per container (or Kubernetes pod; `[host]` for the rest), from the cgroup",
            ),
            Function => ("function", "One row per function (self and total energy)"),
            Vm => (
                "vm",
                "One row per virtual machine and thread class (vCPU, emulator), `[host]` for the rest",
            ),
        };
        Some(PossibleValue::new(name).help(help))
    }
}

impl ValueEnum for crate::output::table::Format {
    fn value_variants<'a>() -> &'a [Self] {
        use crate::output::table::Format::*;
        &[Table, Json, Csv]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        use crate::output::table::Format::*;
        let (name, help) = match self {
            Table => ("table", "Aligned columns for a terminal"),
            Json => ("json", JSON_FIELDS),
            Csv => ("csv", "Comma-separated values with a header line"),
        };
        // `text` is what `top --format` called the same thing.
        let value = PossibleValue::new(name).help(help);
        Some(if name == "table" {
            value.alias("text")
        } else {
            value
        })
    }
}

/// What `report --format json` prints, as its help says (a test compares each backquoted
/// name with real output).
const JSON_FIELDS: &str = "One JSON document: `processes[]` of `pid`, `comm`, `cpu_ns`, \
     `samples`, `energy_j`, `power_w`, `share`, `threads[]`, beside machine totals such as \
     `total_j` and `idle_j`; with `--by function`, `rows[]` of `function`, `module`, `cpu_s`, \
     `samples`, `power_w`, `share_pct`";

/// A number of seconds greater than zero (`-d`, windows and intervals).
pub(crate) fn positive_secs(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!("{text} s: give a positive number of seconds"));
    }
    Ok(secs)
}

/// A sampling frequency: 1 to 10,000 Hz per CPU.
pub(crate) fn hz(text: &str) -> Result<u32, String> {
    let hz: u32 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number of Hz"))?;
    if !(1..=10_000).contains(&hz) {
        return Err(format!(
            "{hz} Hz: sample at 1 to 10000 Hz (0 would take no stacks)"
        ));
    }
    Ok(hz)
}

/// A count of at least one (`top -n`, `--limit`).
pub(crate) fn count(text: &str) -> Result<u64, String> {
    let n: u64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a whole number"))?;
    if n == 0 {
        return Err("0 would show nothing: give a count of at least 1".into());
    }
    Ok(n)
}

/// [`count`] as a `usize`.
pub(crate) fn count_usize(text: &str) -> Result<usize, String> {
    count(text).and_then(|n| usize::try_from(n).map_err(|_| format!("{n} is too large")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        attribute: AttributeArgs,
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        activity: ActivityArgs,
    }

    #[test]
    fn flags_map_onto_plain_options() {
        let cli = Cli::parse_from([
            "x",
            "--idle",
            "proportional",
            "--power-model",
            "time",
            "--static-power-w",
            "6",
            "--model-max-w",
            "9",
        ]);
        let o = cli.attribute.options();
        assert_eq!(o.idle, IdlePolicy::Proportional);
        assert_eq!(o.power_model, PowerModel::Time);
        assert_eq!(o.static_w, Some(6.0));
        assert_eq!(cli.model.model().max_w, Some(9.0));
        assert!(Cli::try_parse_from(["x", "--idle", "nope"]).is_err());
        assert_eq!(cli.activity.event, ActivityEvent::Auto);
        let cli = Cli::parse_from(["x", "--activity-event", "task-clock"]);
        assert_eq!(cli.activity.event, ActivityEvent::TaskClock);
        assert!(Cli::try_parse_from(["x", "--activity-event", "joules"]).is_err());
    }

    #[derive(Parser)]
    struct EnergyCli {
        #[command(flatten)]
        energy: EnergyFlags,
    }

    #[test]
    fn energy_flags_parse_with_defaults_and_map_onto_the_library_options() {
        use crate::energy::SourceKind;
        use std::path::PathBuf;
        let cli = EnergyCli::parse_from(["x"]);
        assert_eq!(cli.energy.energy_source, SourceKind::Auto);
        assert_eq!(cli.energy.sysfs_root, PathBuf::from("/sys"));
        assert_eq!(cli.energy.dev_cpu_root, PathBuf::from("/dev/cpu"));
        let cli = EnergyCli::parse_from([
            "x",
            "--energy-source",
            "powercap",
            "--sysfs-root",
            "/tmp/f",
            "--energy-interval-ms",
            "20",
            "--model-idle-w",
            "3.5",
        ]);
        let energy = cli.energy.config();
        assert_eq!(energy.energy_source, SourceKind::Powercap);
        assert_eq!(energy.sysfs_root, PathBuf::from("/tmp/f"));
        assert_eq!(energy.energy_interval_ms, Some(20));
        assert_eq!(energy.model_idle_w, Some(3.5));
    }
}

/// How runs reach a live view (`agent`, `top`: `--switches`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SwitchesMode {
    /// Summed per thread, CPU and 10 ms slot in the kernel.
    Aggregate,
    /// Every switch sent, as `record` does.
    Stream,
}
