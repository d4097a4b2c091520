//! `energy-bpf diff`: did a change save energy? Two sides (each one or more recordings,
//! or the runs of `record --repeat`) compared row by row — function, process, command,
//! thread or container — with a 95% interval of each difference and whether it is
//! significant.
//!
//! - [`mod@side`]: recordings into runs, each through the same pipeline and rollup as
//!   `report` (no rollup of its own);
//! - `stats`: the Welch interval over runs, sampling variance within a run;
//! - `render`: table, JSON and CSV; [`flame`]: the differential flamegraph (SVG) and
//!   the two-column collapsed stacks inferno's `difffolded` writes;
//! - `gate`: the CI check (`--fail-above`).
//!
//! Pure: recordings in, a [`Diff`] out; the command does the reading and writing.

pub mod flame;
pub(crate) mod gate;
pub(crate) mod render;
pub mod side;
pub(crate) mod stats;

use serde::Serialize;

pub use side::{By, Input, Side, StacksOf, side, sides};

/// What every value is divided by before the sides are compared.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Per {
    /// Energy per run: the work is fixed (a benchmark, a batch job).
    Run,
    /// Energy per second (average power): services whose runs differ in length.
    Second,
    /// Energy per unit of work the user counted (requests served): each run of the base
    /// did `base` units and each run of the new side `new`.
    Unit {
        /// Units per base run.
        base: f64,
        /// Units per new run.
        new: f64,
    },
}

impl Per {
    /// The unit of a normalised value, e.g. `J/run`.
    pub fn unit(&self) -> &'static str {
        match self {
            Per::Run => "J/run",
            Per::Second => "W",
            Per::Unit { .. } => "J/unit",
        }
    }

    /// What was normalised, in words.
    pub(crate) fn describe(&self) -> String {
        match self {
            Per::Run => "per run (each run is taken to do the same work)".into(),
            Per::Second => "per second of each run (average power)".into(),
            Per::Unit { base, new } => {
                format!("per unit of work: {base} units per base run, {new} per new run")
            }
        }
    }

    /// What a run's values are divided by.
    pub(crate) fn divisor(&self, run: &side::Run, is_new: bool) -> f64 {
        match *self {
            Per::Run => 1.0,
            Per::Second => run.duration_s,
            Per::Unit { base, new } => {
                if is_new {
                    new
                } else {
                    base
                }
            }
        }
    }
}

/// One row of the diff (values normalised by [`Per`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Function, process, command, thread or container.
    pub name: String,
    /// Mean over the base runs.
    pub base_j: f64,
    /// Mean over the new runs.
    pub new_j: f64,
    /// new − base.
    pub delta_j: f64,
    /// 100 · delta / base (`null` when the base has none).
    pub delta_pct: Option<f64>,
    /// 95% interval of `delta_j`.
    pub ci95: [f64; 2],
    /// The interval excludes zero.
    pub significant: bool,
    /// Share of the base's total energy, 0..=1.
    pub base_share: f64,
    /// Share of the new side's total energy, 0..=1.
    pub share: f64,
}

fn pct(p: Option<f64>) -> String {
    p.map_or_else(|| "new".to_string(), |p| format!("{p:+.1}%"))
}

/// One line about a row: its change, interval and whether it is significant.
pub(crate) fn describe(r: &Row, unit: &str) -> String {
    let rel = |j: f64| {
        if r.base_j > 0.0 {
            format!("{:+.1}%", 100.0 * j / r.base_j)
        } else {
            format!("{j:+.4} {unit}")
        }
    };
    format!(
        "{:.4} -> {:.4} {unit}: {:+.4} {unit} ({}), 95% CI [{}, {}], {}",
        r.base_j,
        r.new_j,
        r.delta_j,
        pct(r.delta_pct),
        rel(r.ci95[0]),
        rel(r.ci95[1]),
        if r.significant {
            "significant"
        } else {
            "not significant"
        }
    )
}

/// A side as the header shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SideSummary {
    /// Where it came from.
    #[serde(flatten)]
    pub facts: side::Facts,
    /// Runs compared.
    pub runs: usize,
    /// Mean run length, s.
    pub duration_s: f64,
    /// All runs together, s.
    pub total_duration_s: f64,
    /// Mean measured energy (normalised).
    pub total_j: f64,
    /// Mean idle/static energy (normalised).
    pub idle_j: f64,
}

/// A whole diff.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Diff {
    /// The base side.
    pub base: SideSummary,
    /// The new side.
    pub new: SideSummary,
    /// What a row is (`function`, `process`, ...).
    pub by: String,
    /// The unit of every value (`J/run`, `W`, `J/unit`).
    pub unit: String,
    /// What was normalised, in words.
    pub normalised: String,
    /// The machine totals compared like a row.
    pub total: Row,
    /// Rows, largest |delta| first.
    pub rows: Vec<Row>,
    /// True when either side's energy is modelled.
    pub estimated: bool,
    /// Ways the sides do not match (estimated against measured, other machines, other
    /// sampling rates): the comparison may not mean what it seems.
    pub mismatch: Vec<String>,
    /// How significance was tested, with its limits for this diff.
    pub method: String,
}

/// Compares `base` with `new`, per `per`, rows named by `by`.
pub fn compare(base: &Side, new: &Side, by: By, per: Per) -> Diff {
    // What each run's values are divided by; the totals normalised here, the rows where
    // they are read (`row`).
    let divisors = |s: &Side, is_new: bool| -> Vec<f64> {
        s.runs
            .iter()
            .map(|r| {
                let d = per.divisor(r, is_new);
                if d > 0.0 && d.is_finite() { d } else { 1.0 }
            })
            .collect()
    };
    let (bd, nd) = (divisors(base, false), divisors(new, true));
    let norm = |s: &Side, divisors: &[f64]| -> Vec<side::Run> {
        s.runs
            .iter()
            .zip(divisors)
            .map(|(r, &d)| side::Run {
                duration_s: r.duration_s,
                total_j: r.total_j / d,
                idle_j: r.idle_j / d,
                ..side::Run::default()
            })
            .collect()
    };
    let (b, n) = (norm(base, &bd), norm(new, &nd));
    let total_of = |runs: &[side::Run]| {
        stats::mean(
            &runs.iter().map(|r| r.total_j).collect::<Vec<_>>(),
            &vec![0.0; runs.len()],
        )
    };
    let (bt, nt) = (total_of(&b), total_of(&n));
    let mut names: Vec<&String> = base
        .runs
        .iter()
        .chain(&new.runs)
        .flat_map(|r| r.rows.keys())
        .collect();
    names.sort_unstable();
    names.dedup();
    let (b_rows, n_rows) = ((&base.runs[..], &bd[..]), (&new.runs[..], &nd[..]));
    let mut rows: Vec<Row> = names
        .into_iter()
        .map(|name| row(name, b_rows, n_rows, bt.mean, nt.mean))
        // A function whose samples all carried no energy (e.g. before the first reading).
        .filter(|r| r.base_j != 0.0 || r.new_j != 0.0)
        .collect();
    rows.sort_by(|x, y| {
        y.delta_j
            .abs()
            .total_cmp(&x.delta_j.abs())
            .then_with(|| x.name.cmp(&y.name))
    });
    let total = row_from("[total]", &bt, &nt, bt.mean, nt.mean);
    let summary = |s: &Side, runs: &[side::Run]| {
        let k = runs.len().max(1) as f64;
        SideSummary {
            facts: s.facts.clone(),
            runs: runs.len(),
            duration_s: runs.iter().map(|r| r.duration_s).sum::<f64>() / k,
            total_duration_s: runs.iter().map(|r| r.duration_s).sum(),
            total_j: runs.iter().map(|r| r.total_j).sum::<f64>() / k,
            idle_j: runs.iter().map(|r| r.idle_j).sum::<f64>() / k,
        }
    };
    let (bs, ns) = (summary(base, &b), summary(new, &n));
    Diff {
        mismatch: mismatch(&bs.facts, &ns.facts),
        method: method(b.len(), n.len(), by),
        estimated: bs.facts.estimated || ns.facts.estimated,
        base: bs,
        new: ns,
        by: by_name(by).into(),
        unit: per.unit().into(),
        normalised: per.describe(),
        total,
        rows,
    }
}

/// The name of a row kind, as `--by` takes it.
pub(crate) fn by_name(by: By) -> &'static str {
    match by {
        By::Function => "function",
        By::Process => "process",
        By::Command => "command",
        By::Thread => "thread",
        By::Container => "container",
    }
}

/// The row `name` of the runs of each side, each run's values divided by its divisor.
fn row(name: &str, b: (&[side::Run], &[f64]), n: (&[side::Run], &[f64]), bt: f64, nt: f64) -> Row {
    let side_mean = |(runs, divisors): (&[side::Run], &[f64])| {
        let (values, vars): (Vec<f64>, Vec<f64>) = runs
            .iter()
            .zip(divisors)
            .map(|(r, &d)| {
                let (j, v) = r.rows.get(name).copied().unwrap_or((0.0, 0.0));
                (j / d, v / (d * d))
            })
            .unzip();
        stats::mean(&values, &vars)
    };
    row_from(name, &side_mean(b), &side_mean(n), bt, nt)
}

fn row_from(name: &str, b: &stats::Mean, n: &stats::Mean, bt: f64, nt: f64) -> Row {
    let d = stats::welch(b, n);
    let share = |j: f64, t: f64| if t > 0.0 { j / t } else { 0.0 };
    Row {
        name: name.to_string(),
        base_j: b.mean,
        new_j: n.mean,
        delta_j: d.delta,
        delta_pct: (b.mean > 0.0).then(|| 100.0 * d.delta / b.mean),
        ci95: d.ci95,
        significant: d.significant,
        base_share: share(b.mean, bt),
        share: share(n.mean, nt),
    }
}

/// Ways the two sides do not measure the same thing.
fn mismatch(b: &side::Facts, n: &side::Facts) -> Vec<String> {
    let mut out = Vec::new();
    if b.estimated != n.estimated {
        let what = |e: bool| {
            if e {
                "estimated (modelled)"
            } else {
                "measured"
            }
        };
        out.push(format!(
            "base energy is {} ({}) but new energy is {} ({}): the difference mixes a model with a meter",
            what(b.estimated),
            b.source,
            what(n.estimated),
            n.source
        ));
    } else if b.source != n.source {
        out.push(format!(
            "energy sources differ: base {}, new {}",
            b.source, n.source
        ));
    }
    if b.hostnames != n.hostnames {
        out.push(format!(
            "recorded on different machines: base on {}, new on {}",
            b.hostnames.join(", "),
            n.hostnames.join(", ")
        ));
    }
    if b.sample_hz != n.sample_hz {
        let hz = |v: &[u32]| {
            v.iter()
                .map(|h| format!("{h} Hz"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        out.push(format!(
            "sampling rates differ: base {}, new {} (function shares stay comparable, their noise does not)",
            hz(&b.sample_hz),
            hz(&n.sample_hz)
        ));
    }
    out
}

fn method(nb: usize, nn: usize, by: By) -> String {
    let within = if by == By::Function {
        "within a run, the sampling variance of the per-sample weights (ALEA)"
    } else {
        "whole processes and threads carry no sampling variance within a run"
    };
    let mut text = format!(
        "Welch 95% interval of the difference of means over runs ({nb} base, {nn} new); {within}"
    );
    if nb < 2 || nn < 2 {
        text.push_str(
            "; a side with one run has no run-to-run variance, so only sampling noise is tested: \
             record with --repeat N or give several recordings per side",
        );
    }
    text
}

#[cfg(test)]
mod tests;
