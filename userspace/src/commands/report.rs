//! `energy-bpf report FILE`: per process (thread, cgroup, command or function), on-CPU
//! time, share of each CPU, samples, lost events, and energy per domain with average
//! power, share and a 95% confidence interval; the idle/static row and the totals; the
//! source and `estimated`.
//!
//! The recording goes through the [`crate::pipeline`]: one window covering all of it, or with
//! `--window SECS` consecutive windows (a time series: `windows[]` in JSON, a row per
//! window and process in CSV). The document is built by `crate::output::report`; this
//! module parses the flags, warns about damaged recordings and prints.

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;

use crate::{
    analysis,
    commands::args::{AttributeArgs, ModelArgs, RangeArgs},
    output::{
        report::{self, ReportOptions},
        table::{By, Format},
    },
};

/// Arguments of `energy-bpf report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Recording written by `energy-bpf record`, or a directory of the agent's rotating
    /// recordings.
    pub(crate) file: PathBuf,
    /// Which part of it.
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// One row per process, thread, cgroup, command name, container (or pod), or function
    /// (self and total energy).
    #[arg(long, value_enum, default_value_t = By::Process)]
    pub(crate) by: By,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
    /// A time series: cut the recording into windows of this many seconds (JSON:
    /// `windows[]`; CSV: a row per window and process; table: one table per window).
    #[arg(long, value_name = "SECS", value_parser = parse_window)]
    pub(crate) window: Option<f64>,
    /// Sort by this column (a unique prefix is enough, e.g. `samples`, `cpu_s`,
    /// `total_package`); default: the first energy column, else CPU time.
    #[arg(long, value_name = "COLUMN")]
    pub(crate) sort: Option<String>,
    /// Show at most this many rows (default: 25 in a table, which then says how many it
    /// left out; all in JSON and CSV; JSON always lists every process).
    #[arg(long, value_name = "N", value_parser = super::args::count_usize)]
    pub(crate) limit: Option<usize>,
    /// Only these processes (repeat, or separate with commas); the idle row and the totals
    /// stay the machine's.
    #[arg(short = 'p', long = "pid", value_name = "PID", value_delimiter = ',')]
    pub(crate) pids: Vec<u32>,
    /// How energy is split.
    #[command(flatten)]
    pub(crate) attribute: AttributeArgs,
    /// Recompute estimated energy with other model parameters.
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Static power measured by `energy-bpf calibrate`.
    #[command(flatten)]
    pub(crate) calibration: super::args::CalibrationFlags,
    /// With `--by function`: place each function against the machine's balance points
    /// (the calibration's `roofline`, from `calibrate --roofline`), using the run counts of
    /// `record --activity-events instructions,cycles,llc-misses`.
    #[arg(long)]
    pub(crate) roofline: bool,
    /// Grams of CO2e beside the joules.
    #[command(flatten)]
    pub(crate) carbon: crate::carbon::cli::CarbonArgs,
}

fn parse_window(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    if !(0.01..=86_400.0).contains(&secs) {
        return Err(format!(
            "window must be between 0.01 and 86400 seconds, got {secs}"
        ));
    }
    Ok(secs)
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rec = args.range.read(&args.file).context("cannot report")?;
    if rec.truncated && !rec.damage.end_damaged {
        eprintln!(
            "energy-bpf: warning: {} was cut short (recorder killed or disk full); reporting the {:.1} s it holds",
            args.file.display(),
            rec.duration_ns() as f64 / 1e9
        );
    }
    if let Some(note) = rec.damage.note() {
        eprintln!(
            "energy-bpf: warning: {} is damaged: {note}; reporting the rest",
            args.file.display()
        );
    }
    let mut options = args.attribute.options();
    options.calibrated =
        crate::calibration::for_recording(&args.calibration.config(), &rec.header)?;
    let cfg = analysis::config(&rec, options, &args.model.model());
    if args.roofline {
        anyhow::ensure!(
            args.by == By::Function && args.window.is_none(),
            "`--roofline` places functions: use it with `--by function` and no `--window`"
        );
        let a = analysis::analyze(&rec, &cfg);
        let report = crate::roofline::report::Report::new(
            &rec,
            &a,
            args.calibration.calibration.as_deref(),
        )?;
        for warning in &report.warnings {
            eprintln!("energy-bpf: warning: {warning}");
        }
        let limit = args
            .limit
            .or((args.format == Format::Table).then_some(report::DEFAULT_TABLE_ROWS));
        let text = report.render(args.format, limit)?;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(&text)
            .and_then(|()| stdout.flush())
            .context("cannot write to standard output")?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut stdout = std::io::stdout().lock();
    let opts = ReportOptions {
        by: args.by,
        format: args.format,
        window: args.window,
        sort: args.sort.clone(),
        limit: args.limit,
        pids: args.pids.clone(),
    };
    let mut carbon = args.carbon.carbon()?;
    let text = report::render_carbon(&rec, &cfg, &opts, carbon.as_mut())?;
    stdout
        .write_all(&text)
        .context("cannot write to standard output")?;
    stdout.flush().context("cannot write to standard output")?;
    Ok(ExitCode::SUCCESS)
}
