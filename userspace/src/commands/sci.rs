//! `energy-bpf sci RECORDING…`: the Software Carbon Intensity (Green Software Foundation,
//! ISO/IEC 21031:2024) of what was recorded, SCI = (E·I + M) / R, per command or container
//! and in total, as JSON with the method in one line.
//!
//! E is the measured energy (the same joules `report` prints), I the grid intensity the
//! carbon flags give, M the embodied emissions of the hardware share (embodied g/h ×
//! reserved hours × the share of the machine's CPU time), R the functional unit: runs
//! (`record --repeat`), requests (`--unit-count`) or seconds. See docs/carbon.md.

use std::{collections::BTreeMap, io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use serde_json::json;

use crate::{
    analysis,
    carbon::{self, J_PER_KWH},
    commands::args::{AttributeArgs, ModelArgs, RangeArgs},
    pipeline,
};

/// The functional unit R.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Per {
    /// One run of the recorded command (`record --repeat N` marks N).
    Run,
    /// One request (or job, or any unit): give their number with `--unit-count`.
    Request,
    /// One second of the recording.
    Second,
}

/// Rows by what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SciBy {
    /// One row per command name (runs of a command are one row).
    Command,
    /// One row per container (or pod; `[host]` for the rest).
    Container,
}

/// Arguments of `energy-bpf sci`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Recordings (their energy, time and units add up).
    #[arg(required = true, value_name = "RECORDING")]
    pub(crate) files: Vec<PathBuf>,
    /// The functional unit R.
    #[arg(long, value_enum, default_value_t = Per::Run)]
    pub(crate) per: Per,
    /// How many units (requests, jobs) the recordings served; with `--per run`, overrides
    /// the number of runs marked.
    #[arg(long, value_name = "N", value_parser = super::args::count_usize)]
    pub(crate) unit_count: Option<usize>,
    /// Embodied emissions of the machine, gCO2e per hour of reserved time.
    #[arg(long, value_name = "G", conflicts_with = "embodied")]
    pub(crate) embodied_g_per_hour: Option<f64>,
    /// `auto`: from the built-in per-server table (the base rack server, or
    /// `--instance-type`); `none`: leave M out (and say so).
    #[arg(long, value_name = "auto|none", default_value = "auto")]
    pub(crate) embodied: String,
    /// Cloud instance type for `--embodied auto` (`aws:m5.large`, `gcp:n2-standard-8`).
    #[arg(long, value_name = "PROVIDER:TYPE")]
    pub(crate) instance_type: Option<String>,
    /// Rows per command name or per container.
    #[arg(long, value_enum, default_value_t = SciBy::Command)]
    pub(crate) by: SciBy,
    /// Which part of each recording.
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// How energy is split.
    #[command(flatten)]
    pub(crate) attribute: AttributeArgs,
    /// Recompute estimated energy with other model parameters.
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// The grid intensity I.
    #[command(flatten)]
    pub(crate) carbon: carbon::cli::CarbonArgs,
}

#[derive(Default)]
struct Acc {
    joules: f64,
    grams: f64,
    cpu_ns: f64,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut source = args.carbon.carbon()?.ok_or_else(|| {
        anyhow::anyhow!(
            "sci needs a grid intensity: give --carbon-intensity, --carbon-zone, --carbon-series or --carbon-api"
        )
    })?;
    let embodied = embodied(&args)?;
    let Tally {
        total,
        rows,
        secs,
        runs,
        machine_cpu_ns,
        estimated,
        intensities,
    } = tally(&args, &mut source)?;
    let (units, unit_name) = units(&args, runs, secs)?;
    anyhow::ensure!(units > 0.0, "no units to divide by (R = 0)");
    let reserved_h = secs / 3600.0;
    let machine_m = embodied.as_ref().map_or(0.0, |(g, _)| g * reserved_h);
    let entry = |a: &Acc, m_g: f64| {
        let e_kwh = a.joules / J_PER_KWH;
        let i = if e_kwh > 0.0 { a.grams / e_kwh } else { 0.0 };
        json!({
            "e_kwh": e_kwh,
            "e_j": a.joules,
            "i_g_per_kwh": i,
            "m_g": m_g,
            "r": units,
            "operational_g": a.grams,
            "e_j_per_unit": a.joules / units,
            "operational_g_per_unit": a.grams / units,
            "embodied_g_per_unit": m_g / units,
            "sci_g_per_unit": (a.grams + m_g) / units,
        })
    };
    let mut by_rows: Vec<(&String, &Acc)> = rows.iter().collect();
    by_rows.sort_by(|a, b| b.1.joules.total_cmp(&a.1.joules));
    let share = |cpu_ns: f64| {
        if machine_cpu_ns > 0.0 {
            cpu_ns / machine_cpu_ns
        } else {
            0.0
        }
    };
    let key = match args.by {
        SciBy::Command => "command",
        SciBy::Container => "container",
    };
    let out = json!({
        "method": format!(
            "SCI = (E·I + M) / R (ISO/IEC 21031:2024), location-based: E measured energy{est}, I grid intensity per recording, M = embodied g/h × reserved hours ({m}; rows: × their share of the machine's CPU time), R = {unit_name}s",
            est = if estimated { " (estimated)" } else { "" },
            m = embodied.as_ref().map_or("not counted: --embodied none".to_string(), |(g, s)| format!("{g:.3} g/h, {s}")),
        ),
        "functional_unit": unit_name,
        "units": units,
        "estimated": estimated,
        "intensity": intensities,
        "embodied": embodied.as_ref().map(|(g, s)| json!({"g_per_hour": g, "source": s, "reserved_h": reserved_h})),
        "total": entry(&total, machine_m),
        "rows": by_rows.iter().map(|(name, a)| {
            let mut v = entry(a, machine_m * share(a.cpu_ns));
            v[key] = json!(name);
            v
        }).collect::<Vec<_>>(),
    });
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{out:#}")
        .and_then(|()| stdout.flush())
        .context("cannot write to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// The embodied emissions per hour and where the figure comes from (`None`: not counted).
fn embodied(args: &Args) -> anyhow::Result<Option<(f64, String)>> {
    Ok(match (args.embodied_g_per_hour, args.embodied.as_str()) {
        (Some(g), _) => {
            anyhow::ensure!(
                g.is_finite() && g >= 0.0,
                "--embodied-g-per-hour must be a number of grams ≥ 0"
            );
            Some((g, "given (--embodied-g-per-hour)".to_string()))
        }
        (None, "auto") => {
            let e = carbon::embodied::lookup(args.instance_type.as_deref())
                .map_err(|e| anyhow::anyhow!("--embodied auto: {e}"))?;
            Some((e.g_per_hour(), e.source))
        }
        (None, "none") => None,
        (None, other) => anyhow::bail!("--embodied takes `auto` or `none`, not `{other}`"),
    })
}

/// What the recordings add up to.
struct Tally {
    total: Acc,
    rows: BTreeMap<String, Acc>,
    secs: f64,
    runs: usize,
    machine_cpu_ns: f64,
    estimated: bool,
    intensities: Vec<serde_json::Value>,
}

/// Energy, grams and CPU time of every recording, in total and per row, each recording at
/// the intensity over its own time.
fn tally(args: &Args, source: &mut carbon::Carbon) -> anyhow::Result<Tally> {
    let (mut total, mut rows) = (Acc::default(), BTreeMap::<String, Acc>::new());
    let (mut secs, mut runs, mut machine_cpu_ns, mut estimated) = (0.0, 0usize, 0.0, false);
    let mut intensities = Vec::new();
    for file in &args.files {
        let rec = args
            .range
            .read(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let cfg = analysis::config(&rec, args.attribute.options(), &args.model.model());
        let a = analysis::analyze(&rec, &cfg);
        let input = rec.window();
        let names = pipeline::recorded_cgroup_names(&rec);
        let procs = pipeline::rows(&input, &a, &rec.threads, &names);
        let totals = a.totals();
        let unix = |t: u64| rec.header.start_unix_ns + t.saturating_sub(rec.start_ns());
        let i = source.over(unix(input.start_ns), unix(input.end_ns));
        let g_per_j = i.g_per_joule();
        total.joules += totals.total_j;
        total.grams += totals.total_j * g_per_j;
        let dur = totals.duration_ns as f64;
        secs += dur / 1e9;
        machine_cpu_ns += dur * rec.header.cpus.len().max(1) as f64;
        runs += rec.runs.len();
        estimated |= totals.estimated;
        let group = match args.by {
            SciBy::Command => pipeline::GroupBy::Command,
            SciBy::Container => pipeline::GroupBy::Container,
        };
        for g in pipeline::group(&procs, group) {
            let r = rows.entry(g.comm.clone()).or_default();
            let j = g.share * totals.total_j;
            r.joules += j;
            r.grams += j * g_per_j;
            r.cpu_ns += g.cpu_ns as f64;
        }
        total.cpu_ns += procs.iter().map(|p| p.cpu_ns as f64).sum::<f64>();
        intensities.push(json!({
            "recording": file.display().to_string(),
            "g_per_kwh": i.g_per_kwh,
            "pue": i.pue,
            "source": i.source,
            "fallback": i.fallback,
        }));
    }
    Ok(Tally {
        total,
        rows,
        secs,
        runs,
        machine_cpu_ns,
        estimated,
        intensities,
    })
}

/// R: how many functional units the recordings hold, and the unit's name.
fn units(args: &Args, runs: usize, secs: f64) -> anyhow::Result<(f64, &'static str)> {
    Ok(match args.per {
        Per::Run => match args.unit_count.unwrap_or(runs) {
            0 => anyhow::bail!(
                "--per run: the recordings mark no runs (record them with `record --repeat N -- CMD`), or give --unit-count"
            ),
            n => (n as f64, "run"),
        },
        Per::Request => (
            args.unit_count.ok_or_else(|| {
                anyhow::anyhow!("--per request needs --unit-count N: how many requests were served")
            })? as f64,
            "request",
        ),
        Per::Second => (secs, "second"),
    })
}
