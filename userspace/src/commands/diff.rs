//! `energy-bpf diff BASE NEW`: clap wiring over [`crate::diff`]. Reads each side's
//! recordings, refuses sides that do not measure the same thing unless told, renders, and
//! runs the CI gate (`--fail-above`).

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::{Context as _, bail};

use crate::{
    analysis,
    commands::args::{AttributeArgs, ModelArgs, RangeArgs},
    diff::{self, By, Input, Per, gate},
};

/// Exit status when the gate fails (errors exit 1).
pub(crate) const GATE_FAILED: u8 = 3;

/// Rows a table shows when `--limit` is not given.
const DEFAULT_TABLE_ROWS: usize = 25;

/// What a row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ByArg {
    /// Functions (self energy).
    Function,
    /// Processes, matched by command line.
    Process,
    /// Command names.
    Command,
    /// Threads (`process/thread`).
    Thread,
    /// Containers or pods.
    Container,
}

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Aligned columns for a terminal (`text` is accepted too).
    #[value(alias = "text")]
    Table,
    /// One JSON document: `base`, `new`, `total`, `rows[]`.
    Json,
    /// One row per line, the total first.
    Csv,
    /// Differential flamegraph (`--by function`).
    Svg,
    /// `stack BASE NEW` lines, as inferno's difffolded writes (`--by function`).
    Collapsed,
}

/// Arguments of `energy-bpf diff`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// BASE then NEW: each a recording or a directory of the agent's rotating recordings
    /// (or give the sides with `--base`/`--new`).
    #[arg(value_name = "BASE NEW", num_args = 0..=2)]
    pub(crate) files: Vec<PathBuf>,
    /// The base side as several recordings (comma-separated), each one or more runs.
    #[arg(long, value_delimiter = ',', value_name = "A.ebpr,B.ebpr")]
    pub(crate) base: Vec<PathBuf>,
    /// The new side as several recordings (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "C.ebpr,D.ebpr")]
    pub(crate) new: Vec<PathBuf>,
    /// Which part of each recording (or directory).
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// What a row is.
    #[arg(long, value_enum, default_value_t = ByArg::Function)]
    pub(crate) by: ByArg,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
    /// Write here instead of standard output (created with mode 0600).
    #[arg(short = 'o', long = "output")]
    pub(crate) output: Option<PathBuf>,
    /// Normalise: `run` (fixed work per run), `second` (services: average power), or
    /// `unit=N` / `unit=BASE_N,NEW_N` (units of work per run, e.g. requests served).
    #[arg(long, default_value = "run", value_parser = parse_per)]
    pub(crate) per: Per,
    /// CI gate: exit with status 3 when the scope rose significantly by more than PCT.
    #[arg(long, value_name = "PCT")]
    pub(crate) fail_above: Option<f64>,
    /// What the gate looks at: `total`, or a row's name.
    #[arg(long, default_value = "total", requires = "fail_above")]
    pub(crate) scope: String,
    /// Also write the gate's verdict as JSON here (mode 0600).
    #[arg(long, value_name = "FILE", requires = "fail_above")]
    pub(crate) summary: Option<PathBuf>,
    /// Compare even when the sides come from different machines, or one is estimated and
    /// the other measured (the output still says so).
    #[arg(long)]
    pub(crate) allow_mismatch: bool,
    /// Table rows to show (default 25; JSON and CSV show all).
    #[arg(long, value_name = "N", value_parser = super::args::count_usize)]
    pub(crate) limit: Option<usize>,
    /// SVG width in pixels.
    #[arg(long)]
    pub(crate) width: Option<usize>,
    /// How energy is split.
    #[command(flatten)]
    pub(crate) attribute: AttributeArgs,
    /// Recompute estimated energy with other model parameters.
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    /// Static power measured by `energy-bpf calibrate`.
    #[command(flatten)]
    pub(crate) calibration: super::args::CalibrationFlags,
    /// The change in grams of CO2e too, with its interval, at one intensity for both sides.
    #[command(flatten)]
    pub(crate) carbon: crate::carbon::cli::CarbonArgs,
}

fn parse_per(text: &str) -> Result<Per, String> {
    match text {
        "run" => return Ok(Per::Run),
        "second" => return Ok(Per::Second),
        _ => {}
    }
    let Some(units) = text
        .strip_prefix("unit=")
        .or_else(|| text.strip_prefix("unit:"))
    else {
        return Err(format!(
            "`{text}`: use run, second, or unit=N (unit=BASE_N,NEW_N when the sides differ)"
        ));
    };
    let n: Vec<f64> = units
        .split(',')
        .map(|u| u.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| format!("`{units}` is not a number of units (unit=N or unit=N,M)"))?;
    let ok = |v: f64| v.is_finite() && v > 0.0;
    match n.as_slice() {
        [u] if ok(*u) => Ok(Per::Unit { base: *u, new: *u }),
        [b, n] if ok(*b) && ok(*n) => Ok(Per::Unit { base: *b, new: *n }),
        _ => Err(format!(
            "`{units}`: units must be one or two positive numbers"
        )),
    }
}

fn sides(args: &Args) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut files = args.files.iter().cloned();
    let base = if args.base.is_empty() {
        files.next().into_iter().collect()
    } else {
        args.base.clone()
    };
    let new = if args.new.is_empty() {
        files.next().into_iter().collect()
    } else {
        args.new.clone()
    };
    if files.next().is_some() {
        bail!("too many recordings: give BASE NEW, or --base A,B and --new C,D");
    }
    if base.is_empty() || new.is_empty() {
        bail!("diff needs two sides: energy-bpf diff BASE NEW (or --base A,B --new C,D)");
    }
    Ok((base, new))
}

fn read_side(args: &Args, paths: &[PathBuf]) -> anyhow::Result<Vec<Input>> {
    let mut inputs = Vec::new();
    for path in paths {
        let rec = args
            .range
            .read(path)
            .with_context(|| format!("cannot read recording {}", path.display()))?;
        let mut options = args.attribute.options();
        options.calibrated =
            crate::calibration::for_recording(&args.calibration.config(), &rec.header)?;
        let cfg = analysis::config(&rec, options, &args.model.model());
        inputs.push(Input {
            label: path.display().to_string(),
            rec,
            cfg,
        });
    }
    Ok(inputs)
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (by, stacks) = shape(&args)?;
    let (base_paths, new_paths) = sides(&args)?;
    // The sides are independent: read them at once, then analyse them at once while the
    // names both need are resolved together (the diff of two 60 s recordings takes about as
    // long as one `report --by function`).
    let (base, new) = std::thread::scope(|s| {
        let base = s.spawn(|| read_side(&args, &base_paths).context("base side"));
        let new = read_side(&args, &new_paths).context("new side");
        let base = base
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("reading the base side failed")));
        (base, new)
    });
    let (base, new) = diff::sides(base?, new?, by, stacks);
    let d = diff::compare(&base, &new, by, args.per);
    let hard =
        base.facts.hostnames != new.facts.hostnames || base.facts.estimated != new.facts.estimated;
    if hard && !args.allow_mismatch {
        bail!(
            "the sides do not measure the same thing: {}; compare recordings of one machine with the same energy source, or pass --allow-mismatch",
            d.mismatch.join("; ")
        );
    }
    for m in &d.mismatch {
        eprintln!("energy-bpf: WARNING: sides do not match: {m}");
    }
    for w in base.facts.warnings.iter().chain(&new.facts.warnings) {
        eprintln!("energy-bpf: warning: {w}; comparing the rest");
    }
    let verdict = match args.fail_above {
        Some(pct) => Some(gate::check(&d, &gate::Scope::parse(&args.scope), pct)?),
        None => None,
    };
    if args.format == Format::Svg
        && args.output.is_none()
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
    {
        anyhow::bail!(
            "an SVG flamegraph is not for a terminal; write it to a file with -o diff.svg and \
             open that in a browser"
        );
    }
    let mut text = render(&args, &d, (&base, &new), verdict.as_ref())?;
    if let Some(mut c) = args.carbon.carbon()? {
        text = with_carbon(&args, &d, &c.now(), text)?;
    }
    write_out(args.output.as_deref(), &text)?;
    let Some(v) = verdict else {
        return Ok(ExitCode::SUCCESS);
    };
    eprintln!("{}", v.line);
    if let Some(path) = &args.summary {
        let json = serde_json::to_vec_pretty(&v)?;
        write_out(Some(path), &json)?;
    }
    Ok(if v.failed {
        ExitCode::from(GATE_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// The grouping and which side's stacks to draw, refusing flags that do not go together.
fn shape(args: &Args) -> anyhow::Result<(By, diff::StacksOf)> {
    let by = match args.by {
        ByArg::Function => By::Function,
        ByArg::Process => By::Process,
        ByArg::Command => By::Command,
        ByArg::Thread => By::Thread,
        ByArg::Container => By::Container,
    };
    let flame = matches!(args.format, Format::Svg | Format::Collapsed);
    // The flamegraph draws the new side's stacks; the collapsed stacks are both sides'.
    let stacks = match args.format {
        Format::Svg => diff::StacksOf::New,
        Format::Collapsed => diff::StacksOf::Both,
        _ => diff::StacksOf::Neither,
    };
    if flame && by != By::Function {
        bail!("--format svg and collapsed draw stacks: use them with --by function");
    }
    if let Some(p) = args.fail_above
        && !(p.is_finite() && p >= 0.0)
    {
        bail!("--fail-above takes a percentage >= 0, got {p}");
    }
    Ok((by, stacks))
}

/// The comparison in the asked format.
fn render(
    args: &Args,
    d: &diff::Diff,
    (base, new): (&diff::Side, &diff::Side),
    verdict: Option<&gate::Verdict>,
) -> anyhow::Result<Vec<u8>> {
    let mut text = Vec::new();
    match args.format {
        Format::Table => {
            diff::render::table(d, Some(args.limit.unwrap_or(DEFAULT_TABLE_ROWS)), &mut text)?
        }
        Format::Json => diff::render::json(d, verdict, &mut text)?,
        Format::Csv => diff::render::csv(d, &mut text)?,
        Format::Collapsed => diff::flame::collapsed(
            &diff::flame::mean_stacks(base, args.per, false),
            &diff::flame::mean_stacks(new, args.per, true),
            &mut text,
        )?,
        Format::Svg => diff::flame::svg(
            d,
            &diff::flame::mean_stacks(new, args.per, true),
            args.width,
            &mut text,
        )
        .context("cannot draw the differential flamegraph")?,
    }
    Ok(text)
}

/// The change in grams: every joule figure × the intensity (one for both sides, so the
/// change in grams is the change in energy, not in the grid). JSON gains `carbon` and each
/// row `delta_g` and `ci95_g`; a table a line under it; other formats stay as they are.
fn with_carbon(
    args: &Args,
    d: &diff::Diff,
    i: &crate::carbon::Intensity,
    text: Vec<u8>,
) -> anyhow::Result<Vec<u8>> {
    let g = i.g_per_joule();
    let unit = d.unit.replacen('J', "gCO2e", 1);
    match args.format {
        Format::Json => {
            let mut v: serde_json::Value = serde_json::from_slice(&text)?;
            let grams = |r: &diff::Row| {
                serde_json::json!({
                    "base_g": r.base_j * g,
                    "new_g": r.new_j * g,
                    "delta_g": r.delta_j * g,
                    "ci95_g": [r.ci95[0] * g, r.ci95[1] * g],
                })
            };
            let mut total = grams(&d.total);
            total["g_per_kwh"] = i.g_per_kwh.into();
            total["source"] = i.source.clone().into();
            total["pue"] = i.pue.into();
            total["unit"] = unit.into();
            v["carbon"] = total;
            if let Some(rows) = v.get_mut("rows").and_then(|r| r.as_array_mut()) {
                for (row, r) in rows.iter_mut().zip(&d.rows) {
                    row["delta_g"] = (r.delta_j * g).into();
                    row["ci95_g"] = serde_json::json!([r.ci95[0] * g, r.ci95[1] * g]);
                }
            }
            Ok(format!("{v:#}\n").into_bytes())
        }
        Format::Table => {
            let mut text = text;
            let t = &d.total;
            text.extend(
                format!(
                    "carbon: {:+.6} {unit} [{:+.6}, {:+.6}] (base {:.6}, new {:.6}) at {}\n",
                    t.delta_j * g,
                    t.ci95[0] * g,
                    t.ci95[1] * g,
                    t.base_j * g,
                    t.new_j * g,
                    i.describe()
                )
                .into_bytes(),
            );
            Ok(text)
        }
        _ => Ok(text),
    }
}

fn write_out(path: Option<&std::path::Path>, bytes: &[u8]) -> anyhow::Result<()> {
    match path {
        Some(path) => {
            let mut f = crate::output::file::create_private(path).with_context(|| {
                format!(
                    "cannot write {} (check the directory exists and is writable)",
                    path.display()
                )
            })?;
            f.write_all(bytes)
                .and_then(|()| f.flush())
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes)
                .and_then(|()| out.flush())
                .context("cannot write to standard output")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_parses_runs_seconds_and_units() {
        assert_eq!(parse_per("run"), Ok(Per::Run));
        assert_eq!(parse_per("second"), Ok(Per::Second));
        assert_eq!(
            parse_per("unit=1000"),
            Ok(Per::Unit {
                base: 1000.0,
                new: 1000.0
            })
        );
        assert_eq!(
            parse_per("unit=10,12"),
            Ok(Per::Unit {
                base: 10.0,
                new: 12.0
            })
        );
        assert!(parse_per("unit=0").is_err());
        assert!(parse_per("unit=x").is_err());
        assert!(parse_per("hour").is_err());
    }
}
