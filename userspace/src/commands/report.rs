//! `energy-bpf report FILE`: per process and thread, on-CPU time, share of each CPU,
//! samples, lost events, and energy per domain with average power, share and a 95%
//! confidence interval; the idle/static row and the totals; the source and `estimated`.

use std::{collections::HashMap, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use serde::Serialize;

use crate::{
    analysis::{self, Analysis, ModelOverride},
    attribute::{self, AttributeArgs, PerDomain, ThreadEnergy},
    record::{self, Recording},
    summary::{self, Summary},
};

/// Output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Aligned table for people.
    #[default]
    Table,
    /// JSON for programs.
    Json,
}

/// Arguments of `energy-bpf report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Recording written by `energy-bpf record`.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub format: Format,
    /// Show at most this many processes (table only).
    #[arg(long, default_value_t = 25)]
    pub limit: usize,
    /// How energy is split.
    #[command(flatten)]
    pub attribute: AttributeArgs,
    /// Recompute estimated energy with other model parameters.
    #[command(flatten)]
    pub model: ModelOverride,
}

/// One thread in the report.
#[derive(Debug, Serialize)]
pub struct ThreadRow {
    tid: u32,
    comm: String,
    cpu_ns: u64,
    samples: u64,
    energy_j: std::collections::BTreeMap<&'static str, f64>,
    power_w: f64,
}

/// One process in the report.
#[derive(Debug, Serialize)]
pub struct ProcessRow {
    pid: u32,
    #[serde(skip_serializing_if = "is_zero")]
    instance: u32,
    comm: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    cmdline: String,
    cpu_ns: u64,
    samples: u64,
    energy_j: std::collections::BTreeMap<&'static str, f64>,
    power_w: f64,
    share: f64,
    /// 95% confidence interval of the headline energy, J, from the stack samples (seed 001).
    ci_j: [f64; 2],
    threads: Vec<ThreadRow>,
    #[serde(skip)]
    cpu_share: Vec<f64>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let rec = record::read_file(&args.file).context("cannot report")?;
    if rec.truncated {
        eprintln!(
            "energy-bpf: warning: {} was cut short (recorder killed or disk full); reporting the {:.1} s it holds",
            args.file.display(),
            rec.duration_ns() as f64 / 1e9
        );
    }
    let analysis = analysis::analyze(&rec, &args.attribute.options(), &args.model);
    let summary = summary::summarize(&rec, &analysis.timeline);
    let rows = rows(&summary, &analysis);
    let out = match args.format {
        Format::Json => json(&rows, &summary, &rec, &analysis),
        Format::Table => table(&rows, &summary, &rec, &analysis, args.limit),
    };
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

/// Joins the exact CPU-time summary with the attribution. A pid reused within the
/// recording appears once per instance; attribution keys threads by pid, so a reused pid's
/// energy is divided between its instances by their CPU time.
fn rows(summary: &Summary, analysis: &Analysis) -> Vec<ProcessRow> {
    let attr = &analysis.attribution;
    let secs = (summary.duration_ns as f64 / 1e9).max(1e-9);
    let total = attr.total_uj();
    let threads: HashMap<(u32, u32), &ThreadEnergy> =
        attr.threads.iter().map(|t| ((t.tgid, t.tid), t)).collect();
    let groups: HashMap<u32, attribute::Group> = attribute::by_process(attr)
        .into_iter()
        .filter_map(|g| match g.key {
            attribute::GroupKey::Process(pid) => Some((pid, g)),
            _ => None,
        })
        .collect();
    let mut instance_cpu: HashMap<u32, u64> = HashMap::new();
    for p in &summary.processes {
        *instance_cpu.entry(p.pid).or_default() += p.cpu_ns;
    }
    let mut rows: Vec<ProcessRow> = summary
        .processes
        .iter()
        .map(|p| {
            let all = instance_cpu.get(&p.pid).copied().unwrap_or(0);
            let part = if all == 0 {
                1.0
            } else {
                p.cpu_ns as f64 / all as f64
            };
            let mut energy = PerDomain::default();
            let thread_rows = p
                .threads
                .iter()
                .map(|t| {
                    let e = threads
                        .get(&(p.pid, t.tid))
                        .map(|te| scale(&te.energy, part))
                        .unwrap_or_default();
                    energy.add_all(&e);
                    ThreadRow {
                        tid: t.tid,
                        comm: t.comm.clone(),
                        cpu_ns: t.cpu_ns,
                        samples: t.samples,
                        power_w: attr.headline_uj(&e) * 1e-6 / secs,
                        energy_j: e.joules_by_name(),
                    }
                })
                .collect();
            let headline = attr.headline_uj(&energy);
            let ci_j = groups.get(&p.pid).map_or([0.0; 2], |g| {
                // The interval is about sampling error; shift it to this instance's energy.
                let lo = g.estimate.lo_uj - g.estimate.energy_uj;
                let hi = g.estimate.hi_uj - g.estimate.energy_uj;
                [
                    ((headline + lo * part) * 1e-6).max(0.0),
                    (headline + hi * part) * 1e-6,
                ]
            });
            ProcessRow {
                pid: p.pid,
                instance: p.instance,
                comm: p.comm.clone(),
                cmdline: p.cmdline.clone(),
                cpu_ns: p.cpu_ns,
                samples: p.samples,
                power_w: headline * 1e-6 / secs,
                share: if total > 0.0 { headline / total } else { 0.0 },
                ci_j,
                energy_j: energy.joules_by_name(),
                threads: thread_rows,
                cpu_share: summary
                    .cpus
                    .iter()
                    .map(|c| {
                        *p.cpu_ns_by_cpu.get(c).unwrap_or(&0) as f64
                            / summary.duration_ns.max(1) as f64
                    })
                    .collect(),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.share
            .total_cmp(&a.share)
            .then(b.cpu_ns.cmp(&a.cpu_ns))
            .then(a.pid.cmp(&b.pid))
    });
    rows
}

fn scale(e: &PerDomain, k: f64) -> PerDomain {
    let mut out = *e;
    for v in &mut out.0 {
        *v *= k;
    }
    out
}

fn json(rows: &[ProcessRow], s: &Summary, rec: &Recording, a: &Analysis) -> String {
    let attr = &a.attribution;
    let value = serde_json::json!({
        "processes": rows,
        "duration_ns": s.duration_ns,
        "lost_events": s.lost_events,
        "truncated": rec.truncated,
        "unknown_ns": s.unknown_ns,
        "idle_j": attr.headline_uj(&attr.idle) * 1e-6,
        "unknown_j": attr.headline_uj(&attr.unknown) * 1e-6,
        "total_j": attr.total_uj() * 1e-6,
        "energy_j": attr.measured.joules_by_name(),
        "idle_by_domain_j": attr.idle.joules_by_name(),
        "source": analysis::source_label(&a.sources),
        "estimated": attr.estimated,
        "power_model": attr.power_model(),
        "static": attr.sources.iter().map(|src| serde_json::json!({
            "source": src.name,
            "static_w": src.static_w,
            "origin": src.static_origin,
            "power_model": src.power_model,
            "note": src.power_model_note,
        })).collect::<Vec<_>>(),
        "losses": {
            "switch_dropped": rec.losses.switch_dropped,
            "sample_dropped": rec.losses.sample_dropped,
            "process_dropped": rec.losses.process_dropped,
            "stack_errors": rec.losses.stack_errors,
            "vanished_processes": rec.losses.vanished_processes,
        },
    });
    format!("{value:#}\n")
}

fn table(rows: &[ProcessRow], s: &Summary, rec: &Recording, a: &Analysis, limit: usize) -> String {
    use std::fmt::Write as _;
    let attr = &a.attribution;
    let secs = (s.duration_ns as f64 / 1e9).max(1e-9);
    let est = if attr.estimated { " ESTIMATED" } else { "" };
    let total_j = (attr.total_uj() * 1e-6).max(0.0);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# {secs:.1} s on {} ({} CPUs), {} Hz sampling, {} events lost{}",
        rec.header.hostname,
        s.cpus.len(),
        rec.header.sample_hz,
        s.lost_events,
        if rec.truncated { ", TRUNCATED" } else { "" }
    );
    let _ = writeln!(
        out,
        "# energy: {total_j:.3} J{est} ({:.2} W) from {}, split by {:?}; idle/static {:.3} J",
        total_j / secs,
        analysis::source_label(&a.sources),
        attr.power_model(),
        (attr.headline_uj(&attr.idle) * 1e-6).max(0.0),
    );
    let cpu_cols: String = s
        .cpus
        .iter()
        .map(|c| format!(" {:>6}", format!("cpu{c}%")))
        .collect();
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:<16} {:>9} {:>6}{cpu_cols} {:>7} {:>10} {:>8} {:>6} {:>19}",
        "PID",
        "TID",
        "COMM",
        "CPU s",
        "CPU%",
        "SAMPLES",
        format!("ENERGY J{}", if attr.estimated { "*" } else { "" }),
        "POWER W",
        "SHARE",
        "95% CI J"
    );
    for p in rows.iter().take(limit) {
        let per_cpu: String = p
            .cpu_share
            .iter()
            .map(|v| format!(" {:>6.1}", v * 100.0))
            .collect();
        let j: f64 = (p.power_w * secs).max(0.0);
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:<16} {:>9.3} {:>6.1}{per_cpu} {:>7} {:>10.3} {:>8.3} {:>5.1}% {:>19}",
            p.pid,
            "-",
            truncate(&p.comm, 16),
            p.cpu_ns as f64 / 1e9,
            100.0 * p.cpu_ns as f64 / s.duration_ns.max(1) as f64,
            p.samples,
            j,
            p.power_w.max(0.0),
            p.share * 100.0,
            format!("[{:.3}, {:.3}]", p.ci_j[0], p.ci_j[1]),
        );
        if p.threads.len() > 1 {
            for t in &p.threads {
                let _ = writeln!(
                    out,
                    "{:>8} {:>8} {:<16} {:>9.3} {:>6.1}{} {:>7} {:>10.3} {:>8.3}",
                    "",
                    t.tid,
                    truncate(&t.comm, 16),
                    t.cpu_ns as f64 / 1e9,
                    100.0 * t.cpu_ns as f64 / s.duration_ns.max(1) as f64,
                    " ".repeat(7 * s.cpus.len()),
                    t.samples,
                    (t.power_w * secs).max(0.0),
                    t.power_w.max(0.0),
                );
            }
        }
    }
    let idle_j = (attr.headline_uj(&attr.idle) * 1e-6).max(0.0);
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:<16} {:>9} {:>6}{} {:>7} {:>10.3} {:>8.3}",
        "-",
        "-",
        "[idle/static]",
        "",
        "",
        " ".repeat(7 * s.cpus.len()),
        "",
        idle_j,
        idle_j / secs
    );
    let unknown_j = attr.headline_uj(&attr.unknown) * 1e-6;
    if unknown_j > 0.0 {
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:<16} {:>9} {:>6}{} {:>7} {:>10.3} {:>8.3}",
            "-",
            "-",
            "[unknown]",
            "",
            "",
            " ".repeat(7 * s.cpus.len()),
            "",
            unknown_j,
            unknown_j / secs
        );
    }
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:<16} {:>9} {:>6}{} {:>7} {:>10.3} {:>8.3}",
        "-",
        "-",
        "[total]",
        "",
        "",
        " ".repeat(7 * s.cpus.len()),
        "",
        total_j,
        total_j / secs
    );
    if attr.estimated {
        let _ = writeln!(
            out,
            "* estimated: no energy counter was read; energy comes from the utilisation model (see `energy-bpf sources`)"
        );
    }
    out
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
