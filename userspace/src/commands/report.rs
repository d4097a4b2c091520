//! `energy-bpf report FILE`: per process and thread, on-CPU time, share of each CPU,
//! samples, lost events, and energy per domain with average power, share and a 95%
//! confidence interval; the idle/static row and the totals; the source and `estimated`.
//! `--by process|thread|function` picks the rows; tables and CSV (and JSON for threads and
//! functions) are rendered by [`crate::output::table`]; `--by process --format json` keeps
//! the document scripts already read.

use std::{collections::HashMap, io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use serde::Serialize;

use crate::{
    analysis::{self, Analysis, ModelOverride},
    attribute::{self, AttributeArgs, PerDomain, ThreadEnergy, domain_name},
    output::{
        functions,
        table::{self, By, EnergyCell, Format, RenderOptions, Report, ReportRow, RowKey},
    },
    profile::Filter,
    record::{self, Recording},
    summary::{self, Summary},
};

/// Rows a table shows when `--limit` is not given (JSON and CSV show all).
const DEFAULT_TABLE_ROWS: usize = 25;

/// Arguments of `energy-bpf report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Recording written by `energy-bpf record`.
    pub file: PathBuf,
    /// One row per process, thread, or function (self and total energy).
    #[arg(long, value_enum, default_value_t = By::Process)]
    pub by: By,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Sort by this column (a unique prefix is enough, e.g. `samples`, `cpu_s`,
    /// `total_package`); default: the first energy column, else CPU time.
    #[arg(long, value_name = "COLUMN")]
    pub sort: Option<String>,
    /// Show at most this many rows (default: 25 in a table, all in JSON and CSV; `--by
    /// process --format json` always lists every process).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
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
    if let Some(note) = rec.damage.note() {
        eprintln!(
            "energy-bpf: warning: {} is damaged: {note}; reporting the rest",
            args.file.display()
        );
    }
    let analysis = analysis::analyze(&rec, &args.attribute.options(), &args.model);
    let summary = summary::summarize(&rec, &analysis.timeline);
    let rows = rows(&summary, &analysis);
    let mut stdout = std::io::stdout().lock();
    if args.by == By::Process && args.format == Format::Json {
        stdout
            .write_all(json(&rows, &summary, &rec, &analysis).as_bytes())
            .context("cannot write to standard output")?;
        return Ok(ExitCode::SUCCESS);
    }
    let report = report(args.by, &rows, &summary, &rec, &analysis);
    let opts = RenderOptions {
        sort: args.sort.clone(),
        limit: args
            .limit
            .or((args.format == Format::Table).then_some(DEFAULT_TABLE_ROWS)),
    };
    let mut out = std::io::BufWriter::new(&mut stdout);
    table::render(&report, &opts, args.format, &mut out).context("cannot report")?;
    out.flush().context("cannot write to standard output")?;
    Ok(ExitCode::SUCCESS)
}

/// The rows of `--by` with the title, notes and the idle/unknown/total rows.
fn report(by: By, rows: &[ProcessRow], s: &Summary, rec: &Recording, a: &Analysis) -> Report {
    let attr = &a.attribution;
    let domains = analysis::domains(a);
    let names: Vec<String> = domains
        .iter()
        .map(|&d| domain_name(d).to_string())
        .collect();
    let secs = (s.duration_ns as f64 / 1e9).max(1e-9);
    let total = attr.total_uj();
    let title = format!(
        "energy-bpf report: {secs:.1} s on {} ({} CPUs), {} Hz sampling{}",
        rec.header.hostname,
        s.cpus.len(),
        rec.header.sample_hz,
        if rec.truncated { ", TRUNCATED" } else { "" }
    );
    let notes = vec![
        format!(
            "energy: {:.3} J ({:.2} W) from {}, split by {:?}; idle/static {:.3} J",
            total * 1e-6,
            total * 1e-6 / secs,
            analysis::source_description(&a.sources),
            attr.power_model(),
            (attr.headline_uj(&attr.idle) * 1e-6).max(0.0),
        ),
        format!("{} events lost", s.lost_events),
    ];
    // Whole threads and processes carry no sampling error (attribute::ci), so their
    // interval is the headline interval (`ci_j`) scaled to each domain.
    let cells = |e: &PerDomain, ci: Option<[f64; 2]>| -> Vec<EnergyCell> {
        let headline = attr.headline_uj(e) * 1e-6;
        domains
            .iter()
            .map(|&d| {
                let joules = e.get(d) * 1e-6;
                let (lo, hi) = match ci {
                    Some([lo, hi]) if headline > 0.0 => (lo / headline, hi / headline),
                    _ => (1.0, 1.0),
                };
                EnergyCell {
                    joules,
                    ci_low: joules * lo,
                    ci_high: joules * hi,
                }
            })
            .collect()
    };
    let per_domain = |m: &std::collections::BTreeMap<&'static str, f64>| {
        let mut e = PerDomain::default();
        for &d in &domains {
            e.add(d, m.get(domain_name(d)).copied().unwrap_or(0.0) * 1e6);
        }
        e
    };
    let summary_row = |label: &str, e: &PerDomain| {
        let uj = attr.headline_uj(e);
        ReportRow {
            key: RowKey::Label(label.into()),
            cpu_ns: 0.0,
            samples: 0,
            energy: cells(e, None),
            total_energy: None,
            power_w: uj * 1e-6 / secs,
            share: if total > 0.0 { uj / total } else { 0.0 },
            cpu_share: Vec::new(),
        }
    };
    let mut footer = vec![summary_row("[idle/static]", &attr.idle)];
    if attr.headline_uj(&attr.unknown) != 0.0 {
        footer.push(summary_row("[unknown]", &attr.unknown));
    }
    footer.push(summary_row("[total]", &attr.measured));
    let (rows, cpus, duration_ns) = match by {
        By::Process => (
            rows.iter()
                .map(|p| ReportRow {
                    key: RowKey::Process {
                        pid: p.pid,
                        comm: p.comm.clone(),
                    },
                    cpu_ns: p.cpu_ns as f64,
                    samples: p.samples,
                    energy: cells(&per_domain(&p.energy_j), Some(p.ci_j)),
                    total_energy: None,
                    power_w: p.power_w,
                    share: p.share,
                    cpu_share: p.cpu_share.clone(),
                })
                .collect(),
            s.cpus.clone(),
            s.duration_ns,
        ),
        By::Thread => (
            rows.iter()
                .flat_map(|p| {
                    p.threads.iter().map(|t| {
                        let e = per_domain(&t.energy_j);
                        let uj = attr.headline_uj(&e);
                        ReportRow {
                            key: RowKey::Thread {
                                pid: p.pid,
                                tid: t.tid,
                                comm: t.comm.clone(),
                            },
                            cpu_ns: t.cpu_ns as f64,
                            samples: t.samples,
                            energy: cells(&e, None),
                            total_energy: None,
                            power_w: t.power_w,
                            share: if total > 0.0 { uj / total } else { 0.0 },
                            cpu_share: Vec::new(),
                        }
                    })
                })
                .collect(),
            Vec::new(),
            s.duration_ns,
        ),
        By::Function => {
            let profile = analysis::profile(rec, a, &Filter::default());
            let mut r = functions::by_function(&profile, &names);
            r.title = title;
            r.notes = notes;
            r.notes.push(
                "self = samples whose leaf is the function; total = anywhere on the stack".into(),
            );
            return r;
        }
    };
    Report {
        by,
        domains: names,
        rows,
        estimated: attr.estimated,
        title,
        notes,
        cpus,
        duration_ns,
        footer,
    }
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
        "damage": rec.damage.to_json(),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn render_fixture(by: By, format: Format, sort: Option<&str>) -> String {
        let rec = crate::analysis::fixture::recording();
        let a = analysis::analyze(
            &rec,
            &AttributeArgs::default().options(),
            &ModelOverride::default(),
        );
        let s = summary::summarize(&rec, &a.timeline);
        let report = report(by, &rows(&s, &a), &s, &rec, &a);
        let opts = RenderOptions {
            sort: sort.map(String::from),
            limit: None,
        };
        let mut out = Vec::new();
        table::render(&report, &opts, format, &mut out).expect("render");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn process_table_has_energy_intervals_idle_total_and_estimated() {
        let text = render_fixture(By::Process, Format::Table, None);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("[estimated]"), "{text}");
        assert!(
            lines[1].contains("energy: 3.000 J (3.00 W) from model (estimated)"),
            "{text}"
        );
        assert!(text.contains("0 events lost"), "{text}");
        // heavy 1.2 J over 1 s (60% of the CPU), then light, then quiet.
        let row = |name: &str| {
            lines
                .iter()
                .find(|l| l.split_whitespace().nth(1) == Some(name))
                .unwrap_or_else(|| panic!("no {name} row: {text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(&row("heavy")[2..7], ["0.600", "60.0", "60.0", "6", "1.200"]);
        assert_eq!(row("heavy")[7..9], ["[1.200,", "1.200]"]);
        assert_eq!(row("quiet")[6], "0.200");
        assert_eq!(row("[idle/static]")[2], "1.000");
        assert_eq!(row("[total]")[2..4], ["3.000", "[3.000,"]);
        let heavy_at = text.find("heavy").expect("heavy");
        assert!(
            heavy_at < text.find("light").expect("light"),
            "sorted by energy"
        );
        assert!(text.contains("energy is estimated"), "{text}");
    }

    #[test]
    fn thread_csv_sorts_by_samples_and_tags_estimated() {
        let text = render_fixture(By::Thread, Format::Csv, Some("samples"));
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "pid,tid,comm,cpu_s,cpu_pct,samples,package_j,package_ci_low,package_ci_high,power_w,share_pct,estimated"
            )
        );
        let first: Vec<&str> = lines.next().expect("row").split(',').collect();
        assert_eq!(first[..3], ["10", "10", "heavy"]);
        assert_eq!(first[5], "6");
        assert_eq!(first.last(), Some(&"true"));
        assert!(
            text.lines().any(|l| l.starts_with("-,-,[total],")),
            "{text}"
        );
    }

    #[test]
    fn function_json_has_self_and_total_energy() {
        let text = render_fixture(By::Function, Format::Json, None);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["estimated"], true);
        let rows = v["rows"].as_array().expect("rows");
        let j = |name: &str| {
            rows.iter()
                .find(|r| r["function"].as_str().is_some_and(|f| f.contains(name)))
                .and_then(|r| r["self_package_j"].as_f64())
                .unwrap_or_else(|| panic!("no {name}: {text}"))
        };
        assert!((j("+0x100a") - 1.2).abs() < 1e-6, "{text}");
        assert!((j("+0x1014") - 0.6).abs() < 1e-6, "{text}");
        assert!((j("[no stack sample]") - 0.2).abs() < 1e-6, "{text}");
    }
}
