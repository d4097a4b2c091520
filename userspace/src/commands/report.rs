//! `energy-bpf report FILE`: per process and thread, on-CPU time, share of each CPU,
//! samples and lost events.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;

use crate::{record, summary};

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
    let timeline = rec.timeline();
    let summary = summary::summarize(&rec, &timeline);
    let out = match args.format {
        Format::Json => json(&summary, &rec),
        Format::Table => table(&summary, &rec, args.limit),
    };
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

fn json(s: &summary::Summary, rec: &record::Recording) -> String {
    let value = serde_json::json!({
        "processes": s.processes,
        "duration_ns": s.duration_ns,
        "lost_events": s.lost_events,
        "truncated": rec.truncated,
        "unknown_ns": s.unknown_ns,
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

fn table(s: &summary::Summary, rec: &record::Recording, limit: usize) -> String {
    use std::fmt::Write as _;
    let secs = s.duration_ns as f64 / 1e9;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# {} s on {} ({} CPUs), {} Hz sampling, {} events lost{}",
        fmt_f(secs, 1),
        rec.header.hostname,
        s.cpus.len(),
        rec.header.sample_hz,
        s.lost_events,
        if rec.truncated { ", TRUNCATED" } else { "" }
    );
    let cpu_cols: String = s
        .cpus
        .iter()
        .map(|c| format!(" {:>6}", format!("cpu{c}%")))
        .collect();
    let _ = writeln!(
        out,
        "{:>8} {:>8} {:<16} {:>10} {:>6}{cpu_cols} {:>8}",
        "PID", "TID", "COMM", "CPU s", "CPU%", "SAMPLES"
    );
    let share = |ns: u64| {
        if s.duration_ns == 0 {
            0.0
        } else {
            100.0 * ns as f64 / s.duration_ns as f64
        }
    };
    for p in s.processes.iter().take(limit) {
        let per_cpu: String = s
            .cpus
            .iter()
            .map(|c| {
                format!(
                    " {:>6}",
                    fmt_f(share(*p.cpu_ns_by_cpu.get(c).unwrap_or(&0)), 1)
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{:>8} {:>8} {:<16} {:>10} {:>6}{per_cpu} {:>8}",
            p.pid,
            "-",
            p.comm,
            fmt_f(p.cpu_ns as f64 / 1e9, 3),
            fmt_f(share(p.cpu_ns), 1),
            p.samples
        );
        if p.threads.len() > 1 {
            for t in &p.threads {
                let per_cpu: String = s
                    .cpus
                    .iter()
                    .map(|c| {
                        format!(
                            " {:>6}",
                            fmt_f(share(*t.cpu_ns_by_cpu.get(c).unwrap_or(&0)), 1)
                        )
                    })
                    .collect();
                let _ = writeln!(
                    out,
                    "{:>8} {:>8} {:<16} {:>10} {:>6}{per_cpu} {:>8}",
                    "",
                    t.tid,
                    t.comm,
                    fmt_f(t.cpu_ns as f64 / 1e9, 3),
                    fmt_f(share(t.cpu_ns), 1),
                    t.samples
                );
            }
        }
    }
    out
}

fn fmt_f(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}
