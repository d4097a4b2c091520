//! `energy-bpf flamegraph FILE`: an energy-weighted flamegraph (SVG, collapsed, pprof or
//! speedscope) from a recording. Reading, weighting, symbolizing and exporting are library
//! work; this module parses arguments and wires them.
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};

use crate::analysis;
use crate::commands::args::{AttributeArgs, ModelArgs, RangeArgs};
use crate::output::{ProfileSink, collapsed, otlp, pprof, speedscope, svg};
use crate::profile::{self, Filter};

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Interactive flamegraph SVG (inferno).
    Svg,
    /// Collapsed stacks, `comm;frame;... COUNT` (flamegraph.pl, inferno, speedscope).
    Collapsed,
    /// gzip-compressed pprof protobuf (`go tool pprof`, Pyroscope, Parca).
    Pprof,
    /// speedscope JSON.
    Speedscope,
    /// One binary OTLP `ExportProfilesServiceRequest` (opentelemetry-proto v1.10.0): a CPU
    /// profile and an energy profile per domain, for an OpenTelemetry Collector later.
    Otlp,
}

/// What the widths measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Domain {
    /// CPU package energy (RAPL package, or the model).
    Package,
    /// DRAM energy.
    Dram,
    /// GPU energy.
    Gpu,
    /// On-CPU time instead of energy.
    CpuTime,
}

impl Domain {
    /// Name of the profile value this domain selects.
    pub(crate) fn value_name(self) -> &'static str {
        match self {
            Domain::Package => "energy_package",
            Domain::Dram => "energy_dram",
            Domain::Gpu => "energy_gpu",
            Domain::CpuTime => profile::CPU,
        }
    }
}

/// Arguments of `energy-bpf flamegraph`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Recording made by `energy-bpf record`, or a directory of the agent's rotating
    /// recordings.
    pub(crate) file: PathBuf,
    /// Which part of it.
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// Static power measured by `energy-bpf calibrate`.
    #[command(flatten)]
    pub(crate) calibration: super::args::CalibrationFlags,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Svg)]
    pub(crate) format: Format,
    /// What the widths measure (default: package energy when recorded, else CPU time).
    #[arg(long, value_enum)]
    pub(crate) domain: Option<Domain>,
    /// Only these process ids (repeat, or separate with commas).
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
    pub(crate) pids: Vec<u32>,
    /// Only threads or processes with this name (repeatable).
    #[arg(long = "comm")]
    pub(crate) comms: Vec<String>,
    /// Write here instead of standard output (created with mode 0600). SVG, pprof and OTLP
    /// are never written to a terminal: give a file.
    #[arg(short = 'o', long = "output")]
    pub(crate) output: Option<PathBuf>,
    /// SVG width in pixels.
    #[arg(long)]
    pub(crate) width: Option<usize>,
    /// How energy is split between threads (and so between stacks).
    #[command(flatten)]
    pub(crate) attribute: AttributeArgs,
    /// Recompute estimated energy with other model parameters.
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// `co2e`: widths in grams of CO2e (the energy at the carbon flags' intensity).
    #[arg(long, value_enum, default_value_t = Unit::Energy)]
    pub(crate) unit: Unit,
    /// The intensity for `--unit co2e`.
    #[command(flatten)]
    pub(crate) carbon: crate::carbon::cli::CarbonArgs,
}

/// What the widths measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Unit {
    /// Joules (or CPU time where no energy was recorded).
    Energy,
    /// Grams of CO2e.
    Co2e,
}

/// Adds `co2e_<domain>` (nanograms) to every sample: its energy at the intensity over the
/// recording (one intensity per recording, computed once, not per sample's own time);
/// returns the value's name.
fn co2e_values(
    args: &Args,
    rec: &crate::record::Recording,
    profile: &mut profile::Profile,
    energy: &str,
) -> anyhow::Result<String> {
    let mut carbon = args.carbon.carbon()?.ok_or_else(|| {
        anyhow::anyhow!(
            "--unit co2e needs a grid intensity: give --carbon-intensity, --carbon-zone, --carbon-series or --carbon-api"
        )
    })?;
    energy.strip_prefix("energy_").ok_or_else(|| {
        anyhow::anyhow!(
            "--unit co2e weighs energy, and {} has none",
            args.file.display()
        )
    })?;
    let unix = |t: u64| rec.header.start_unix_ns + t.saturating_sub(rec.start_ns());
    let i = carbon.over(unix(rec.start_ns()), unix(rec.end_ns));
    // µJ × g/J × 1e3 = ng.
    let name = profile
        .add_co2e(energy, i.g_per_joule() * 1e3)
        .ok_or_else(|| anyhow::anyhow!("no {energy} values"))?;
    profile.meta.source = format!("{}; carbon: {}", profile.meta.source, i.describe());
    Ok(name)
}

/// Resource attributes of a recording: its host and kernel, and this machine's id when the
/// recording was made here.
fn otlp_origin(rec: &crate::record::Recording) -> otlp::Origin {
    let (_, here) = crate::capture::host::uname();
    let host_id = (here == rec.header.hostname)
        .then(|| std::fs::read_to_string("/etc/machine-id").ok())
        .flatten()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty());
    otlp::Origin {
        host_name: rec.header.hostname.clone(),
        host_id,
        kernel: rec.header.kernel_release.clone(),
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rec = args
        .range
        .read(&args.file)
        .with_context(|| format!("cannot read recording {}", args.file.display()))?;
    let mut options = args.attribute.options();
    options.calibrated =
        crate::calibration::for_recording(&args.calibration.config(), &rec.header)?;
    let cfg = analysis::config(&rec, options, &args.model.model());
    let analysis = analysis::analyze(&rec, &cfg);
    let filter = Filter {
        pids: args.pids.clone(),
        comms: args.comms.clone(),
    };
    let mut profile = analysis::profile(&rec, &analysis, &filter);

    let value = value_of(&args, &profile)?;
    let value = match args.unit {
        Unit::Energy => value.to_string(),
        Unit::Co2e => co2e_values(&args, &rec, &mut profile, value)?,
    };
    let value = value.as_str();
    let mut sink: Box<dyn ProfileSink> = match args.format {
        Format::Svg => Box::new(svg::Svg {
            value: value.to_string(),
            width: args.width,
        }),
        Format::Collapsed => Box::new(collapsed::Collapsed {
            value: value.to_string(),
        }),
        Format::Pprof => Box::new(pprof::Pprof {
            default_value: Some(value.to_string()),
        }),
        Format::Speedscope => Box::new(speedscope::Speedscope {
            value: value.to_string(),
        }),
        Format::Otlp => Box::new(otlp::Otlp {
            origin: otlp_origin(&rec),
            // Recordings keep cgroup ids, not paths: no container ids offline.
            container_of: &|_| Vec::new(),
        }),
    };
    if rec.truncated && !rec.damage.end_damaged {
        eprintln!(
            "energy-bpf: warning: {} was cut short (no trailer); showing what it holds",
            args.file.display()
        );
    }
    if let Some(note) = rec.damage.note() {
        eprintln!(
            "energy-bpf: warning: {} is damaged: {note}; showing the rest",
            args.file.display()
        );
    }
    write(&args, sink.as_mut(), &profile)?;
    Ok(ExitCode::SUCCESS)
}

/// The value the frames' widths show: `--domain`, else package energy, else CPU time.
fn value_of(args: &Args, profile: &profile::Profile) -> anyhow::Result<&'static str> {
    let value = match args.domain {
        Some(d) => d.value_name(),
        None if profile.value_index("energy_package").is_some() => "energy_package",
        None => profile::CPU,
    };
    if profile.value_index(value).is_none() {
        bail!(
            "{} has no {value} values; pick another --domain (this recording has: {})",
            args.file.display(),
            profile
                .value_types
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(value)
}

/// Writes the profile to `-o FILE`, or to standard output where the format is text.
fn write(
    args: &Args,
    sink: &mut dyn ProfileSink,
    profile: &profile::Profile,
) -> anyhow::Result<()> {
    match &args.output {
        Some(path) => {
            let mut file = create_private(path)?;
            sink.write_profile(profile, &mut file)
                .with_context(|| format!("cannot write {}", path.display()))?;
            file.flush()
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        None => {
            let stdout = std::io::stdout();
            if stdout.is_terminal() {
                match args.format {
                    Format::Svg => bail!(
                        "an SVG flamegraph is not for a terminal; write it to a file with -o \
                         flame.svg and open that in a browser (or use --format collapsed)"
                    ),
                    Format::Pprof => {
                        bail!("pprof output is binary; write it to a file with -o FILE.pb.gz")
                    }
                    Format::Otlp => {
                        bail!("OTLP output is binary; write it to a file with -o FILE.pb")
                    }
                    Format::Collapsed | Format::Speedscope => {}
                }
            }
            let mut out = std::io::BufWriter::new(stdout.lock());
            sink.write_profile(profile, &mut out)
                .context("cannot write to standard output")?;
            out.flush().context("cannot write to standard output")?;
        }
    }
    Ok(())
}

/// Creates (or truncates) `path` readable by its owner only: profiles name processes and
/// command lines.
fn create_private(path: &Path) -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
    let file = crate::output::file::create_private(path).with_context(|| {
        format!(
            "cannot write {} (check the directory exists and is writable)",
            path.display()
        )
    })?;
    Ok(std::io::BufWriter::new(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn output_files_are_private_even_when_they_existed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("out.svg");
        std::fs::write(&path, "old contents that are longer").expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let mut f = create_private(&path).expect("create");
        f.write_all(b"new").expect("write");
        drop(f);
        let meta = std::fs::metadata(&path).expect("stat");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        let err = create_private(&dir.path().join("no/such/dir/x")).expect_err("no dir");
        assert!(
            format!("{err:#}").contains("check the directory exists"),
            "{err:#}"
        );
    }

    #[test]
    fn domains_name_profile_values() {
        assert_eq!(Domain::Package.value_name(), "energy_package");
        assert_eq!(Domain::Dram.value_name(), "energy_dram");
        assert_eq!(Domain::Gpu.value_name(), "energy_gpu");
        assert_eq!(Domain::CpuTime.value_name(), "cpu");
    }

    fn args(file: &Path, format: Format, output: &Path) -> Args {
        Args {
            file: file.to_path_buf(),
            format,
            domain: None,
            pids: vec![],
            comms: vec![],
            output: Some(output.to_path_buf()),
            width: Some(1200),
            range: RangeArgs::default(),
            calibration: Default::default(),
            attribute: AttributeArgs::default(),
            model: ModelArgs::default(),
            unit: Unit::Energy,
            carbon: Default::default(),
        }
    }

    #[test]
    fn widths_are_attributed_energy_with_total_power_and_losses_in_the_title() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rec = dir.path().join("rec.ebpr");
        crate::analysis::fixture::write(&rec, 3);
        let folded = dir.path().join("out.folded");
        run(args(&rec, Format::Collapsed, &folded)).expect("collapsed");
        let text = std::fs::read_to_string(&folded).expect("read");
        // µJ: heavy 1.2 J, light 0.6 J, quiet's 0.2 J has no stack sample (model, 2 W busy).
        let width = |prefix: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(prefix))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {prefix} in {text}"))
        };
        assert!(
            (width("heavy;[unknown]+0x100a ") - 1.2e6).abs() < 2.0,
            "{text}"
        );
        assert!(
            (width("light;[unknown]+0x1014 ") - 0.6e6).abs() < 2.0,
            "{text}"
        );
        assert!(
            (width("quiet;[no stack sample] ") - 0.2e6).abs() < 2.0,
            "{text}"
        );

        let svg_path = dir.path().join("out.svg");
        run(args(&rec, Format::Svg, &svg_path)).expect("svg");
        let svg = std::fs::read_to_string(&svg_path).expect("read");
        assert!(
            svg.contains("Energy (package): 2.000 J, 2.00 W average (estimated)"),
            "title states total J, average W and estimated"
        );
        assert!(svg.contains("3 events lost during capture"), "losses shown");
        assert!(svg.contains("idle/static 1.000 J not shown"), "idle named");

        let mut cpu = args(&rec, Format::Collapsed, &folded);
        cpu.domain = Some(Domain::CpuTime);
        run(cpu).expect("cpu time");
        let text = std::fs::read_to_string(&folded).expect("read");
        // Six 100 ms samples.
        assert!(text.contains("heavy;[unknown]+0x100a 600000000"), "{text}");

        let mut dram = args(&rec, Format::Svg, &svg_path);
        dram.domain = Some(Domain::Dram);
        let err = run(dram).expect_err("no dram in a model recording");
        assert!(format!("{err:#}").contains("energy_package"), "{err:#}");
    }

    #[test]
    fn missing_recording_is_a_one_line_error() {
        let args = Args {
            file: PathBuf::from("/nonexistent/rec.ebpf"),
            format: Format::Svg,
            domain: None,
            pids: vec![],
            comms: vec![],
            output: None,
            width: None,
            range: RangeArgs::default(),
            calibration: Default::default(),
            attribute: AttributeArgs::default(),
            model: ModelArgs::default(),
            unit: Unit::Energy,
            carbon: Default::default(),
        };
        let err = run(args).expect_err("missing file");
        assert!(
            format!("{err:#}").contains("/nonexistent/rec.ebpf"),
            "{err:#}"
        );
    }
}
