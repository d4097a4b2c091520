//! `energy-bpf model`: the estimated model's parameters, here or for a machine described
//! by flags: the power-table row matched (and how), the wall watts at active idle and at
//! full load, the load curve and the row's error. Given flags (`--model-idle-w`,
//! `--model-max-w`, `--model-config`), a calibration and a measured source win over the
//! table, and the output says so. The work is `crate::energy::{machine, model}`.
use std::process::ExitCode;

use anyhow::Context as _;

use crate::energy::{
    ModelCurve,
    machine::{self, Curve},
    model, survey,
};

// Text or JSON, as `sources` prints.
use super::sources::Format;

/// Arguments of `energy-bpf model`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Describe a machine instead of this one: its CPU model name (e.g. "Intel Xeon
    /// Platinum 8380", "AMD EPYC 7763").
    #[arg(long, value_name = "NAME")]
    cpu: Option<String>,
    /// With --cpu: hardware threads of all chips.
    #[arg(long, value_name = "N", requires = "cpu")]
    threads: Option<f64>,
    /// With --cpu: sockets (default 1).
    #[arg(long, value_name = "C", requires = "cpu", default_value_t = 1.0)]
    chips: f64,
    /// With --cpu: memory, GB (default: the row's typical GB per thread).
    #[arg(long = "memory-gb", value_name = "M", requires = "cpu")]
    memory_gb: Option<f64>,
    /// With --cpu: nodes the other figures are the sum of (default 1).
    #[arg(long, value_name = "K", requires = "cpu", default_value_t = 1.0)]
    nodes: f64,
    #[command(flatten)]
    energy: super::args::EnergyFlags,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// What the command prints.
#[derive(serde::Serialize)]
struct Output {
    /// Wall watts at active idle of the machine described, or of this VM's share here.
    idle_w: f64,
    /// Wall watts at full load of the same.
    full_w: f64,
    curve: Curve,
    /// The table row, as outputs label it.
    row: String,
    /// The row's error at full load, %.
    error_pct: f64,
    /// The row's error at active idle, %.
    idle_error_pct: f64,
    servers: u32,
    /// What the watts are of.
    scope: String,
    /// Where `idle_w`/`full_w` come from when flags or a config file set them.
    overridden_by: Option<String>,
    /// A measured source on this machine, which wins over any model.
    measured_source: Option<String>,
    /// The table's source, licence and cut-off.
    table: Vec<String>,
    note: &'static str,
}

fn positive(v: f64, what: &str) -> anyhow::Result<f64> {
    anyhow::ensure!(
        v.is_finite() && v > 0.0,
        "--{what} must be a positive number, not {v}"
    );
    Ok(v)
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let format = args.format;
    let out = build(args)?;
    match format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&out).context("encoding JSON")?
        ),
        Format::Text => print!("{}", text(&out)),
    }
    Ok(ExitCode::SUCCESS)
}

/// What the command prints, for `args`.
fn build(args: Args) -> anyhow::Result<Output> {
    let energy = args.energy.config();
    let table = machine::table()?;
    let here = args.cpu.is_none();
    let mut estimate = match &args.cpu {
        Some(cpu) => {
            let threads = positive(args.threads.context("--cpu needs --threads N")?, "threads")?;
            let memory_gb = match args.memory_gb {
                Some(m) => positive(m, "memory-gb")?,
                None => 0.0,
            };
            machine::estimate_described(
                table,
                cpu,
                threads,
                positive(args.chips, "chips")?,
                memory_gb,
                positive(args.nodes, "nodes")?,
            )
        }
        None => {
            let m = machine::read(&energy.proc_root, &energy.sysfs_root)?;
            machine::estimate(table, &m)
        }
    };
    let overridden = energy.model_idle_w.is_some()
        || energy.model_max_w.is_some()
        || energy.model_config.is_some();
    let mut overridden_by = None;
    if overridden {
        // The same choice `record` makes, over one package of every CPU: the flags and the
        // file win; what they leave unset stays the table's.
        let one = [crate::pb::v1::Cpu::default()];
        let s = model::sources(&energy, &one, 1)?;
        if let Some(s) = s.first() {
            if energy.model_idle_w.is_some() || energy.model_config.is_some() {
                estimate.idle_w = s.model_idle_w;
            }
            if energy.model_max_w.is_some() || energy.model_config.is_some() {
                estimate.full_w = s.model_max_w;
            }
            // Only what the flags and the file set; the rest of the origin is the table's.
            let given: Vec<&str> = s
                .model_origin
                .split("; ")
                .filter(|part| part.contains("wins over the table"))
                .collect();
            overridden_by = Some(given.join("; "));
        }
    }
    let curve = match energy.model_curve {
        ModelCurve::Linear => Curve::Linear,
        ModelCurve::Fitted => Curve::Fitted {
            gamma: table.curve_gamma,
        },
    };
    let measured_source = if here {
        survey::survey(&energy)
            .ok()
            .and_then(|s| s.in_use().iter().find(|u| !u.starts_with("model")).cloned())
    } else {
        None
    };
    Ok(Output {
        idle_w: estimate.idle_w,
        full_w: estimate.full_w,
        curve,
        row: estimate.row.clone(),
        error_pct: estimate.error_pct,
        idle_error_pct: estimate.idle_error_pct,
        servers: estimate.servers,
        scope: estimate.scope.clone(),
        overridden_by,
        measured_source,
        table: table.provenance.clone(),
        note: "a measured source (see `sources`), --model-idle-w/--model-max-w, --model-config and \
               a `calibrate` result (--calibration) win over the table",
    })
}

fn text(o: &Output) -> String {
    let mut s = format!(
        "estimated ({})\n  {}\n  active idle {:.1} W (±{:.0}%), full load {:.1} W (±{:.0}%)\n",
        o.row, o.scope, o.idle_w, o.idle_error_pct, o.full_w, o.error_pct
    );
    s.push_str(&match o.curve {
        Curve::Linear => "  curve: linear, P = P_idle + (P_full − P_idle)·u\n".to_string(),
        Curve::Fitted { gamma } => format!(
            "  curve: P = P_idle + (P_full − P_idle)·u^{gamma:.3} (fitted from SPECpower load points)\n"
        ),
    });
    if let Some(by) = &o.overridden_by {
        s.push_str(&format!("  overridden: {by}\n"));
    }
    if let Some(m) = &o.measured_source {
        s.push_str(&format!(
            "  this machine has a measured source ({m}): it is used, not the model\n"
        ));
    }
    s.push_str(&format!("  {}\n", o.note));
    for p in &o.table {
        s.push_str(&format!("  table {p}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn build_from(argv: &[&str]) -> Output {
        let cli = Cli::try_parse_from(std::iter::once("model").chain(argv.iter().copied()))
            .expect("flags parse");
        build(cli.args).expect("model")
    }

    #[test]
    fn a_described_machine_gets_its_row_and_whole_machine_watts() {
        let o = build_from(&[
            "--cpu",
            "Intel Xeon Platinum 8280",
            "--threads",
            "112",
            "--chips",
            "2",
            "--memory-gb",
            "192",
        ]);
        assert!(
            o.row
                .starts_with("Intel Xeon Platinum 8280 → Cascade Lake-SP, "),
            "{}",
            o.row
        );
        // SPECpower measured 410-414 W at full load and 48 W idle for this server in 2020.
        assert!((350.0..500.0).contains(&o.full_w), "{}", o.full_w);
        assert!(o.idle_w > 0.0 && o.idle_w < o.full_w / 3.0, "{}", o.idle_w);
        assert!(o.error_pct > 0.0 && o.overridden_by.is_none());
        let text = text(&o);
        assert!(
            text.starts_with("estimated (Intel Xeon Platinum 8280 → Cascade Lake-SP"),
            "{text}"
        );
    }

    #[test]
    fn given_watts_win_and_say_so() {
        let o = build_from(&[
            "--cpu",
            "AMD EPYC 7763",
            "--threads",
            "256",
            "--chips",
            "2",
            "--model-max-w",
            "500",
            "--model-curve",
            "linear",
        ]);
        assert_eq!(o.full_w, 500.0);
        assert!(
            o.overridden_by
                .as_deref()
                .is_some_and(|b| b.contains("--model-max-w"))
        );
        assert_eq!(o.curve, Curve::Linear);
        assert!(o.row.contains("Zen 3 (Milan) (no servers"), "{}", o.row);
    }

    #[test]
    fn nonsense_flags_are_refused() {
        let cli = Cli::try_parse_from(["model", "--cpu", "x", "--threads=-3"]).expect("parse");
        assert!(build(cli.args).is_err());
        assert!(
            Cli::try_parse_from(["model", "--threads", "3"]).is_err(),
            "--threads needs --cpu"
        );
    }
}
