//! Development harness for the `top` view: drives `commands::top::run_with_feed` with a feed
//! that is NOT the product's (no eBPF, no energy counters), to exercise the TUI, the tmux
//! test and the CPU-cost measurement before and apart from the live feed.
//!
//! - `top_feed top [ARGS]`: per-process CPU time from /proc, power from a linear model
//!   (labelled estimated), so a busy process really rises to the top.
//! - `top_feed --synthetic ROWS top [ARGS]`: ROWS made-up processes with 4 threads each,
//!   new values every interval (for measuring the render loop's own cost).
use std::collections::HashMap;
use std::fs;
use std::process::ExitCode;
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::Duration;

use clap::{Parser, Subcommand};
use energy_bpf::commands::top::{self, run_with_feed};
use energy_bpf::tui::{DomainPower, Header, ProcessRow, Snapshot, ThreadRow};

#[derive(Parser)]
struct Cli {
    /// Send this many synthetic processes instead of reading /proc.
    #[arg(long)]
    synthetic: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Same arguments as `energy-bpf top`.
    Top(top::Args),
}

/// Model power of the demo feed: idle and full-load watts of the whole machine.
const IDLE_W: f64 = 5.0;
const MAX_W: f64 = 25.0;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Top(args) = cli.command;
    let (tx, rx) = mpsc::channel();
    let interval = args.interval();
    let freq = args.freq;
    let synthetic = cli.synthetic;
    thread::spawn(move || match synthetic {
        Some(rows) => synthetic_feed(&tx, rows, interval, freq),
        None => proc_feed(&tx, interval, freq),
    });
    match run_with_feed(&args, rx) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("top_feed: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn cpus() -> u32 {
    thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

fn header(total_w: f64, freq: u32, source: &str) -> Header {
    Header {
        domains: vec![DomainPower {
            name: "package-0".into(),
            watts: total_w,
        }],
        idle_w: IDLE_W,
        total_w,
        source: source.into(),
        estimated: true,
        sample_hz: freq,
        lost_events: 0,
        cpus: cpus(),
        model_row: None,
    }
}

fn synthetic_feed(tx: &Sender<Snapshot>, rows: usize, interval: Duration, freq: u32) {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        // xorshift: cheap, deterministic values that change every interval.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % 10_000) as f64 / 10_000.0
    };
    let mut energy = vec![0.0; rows];
    for tick in 1u64.. {
        let mut processes = Vec::with_capacity(rows);
        for (i, e) in energy.iter_mut().enumerate() {
            let power = next() * MAX_W / rows as f64 * 4.0;
            *e += power * interval.as_secs_f64();
            let pid = 1000 + i as u32;
            processes.push(ProcessRow {
                pid,
                comm: format!("proc{i}"),
                cmdline: format!("/usr/bin/proc{i} --worker {i}"),
                cgroup: format!("/system.slice/svc{}.service", i % 17),
                power_w: power,
                since_start_j: *e,
                cpu_pct: power * 10.0,
                share: power / MAX_W,
                threads: (0..4)
                    .map(|t| ThreadRow {
                        tid: pid * 10 + t,
                        comm: format!("worker{t}"),
                        power_w: power / 4.0,
                        since_start_j: *e / 4.0,
                        cpu_pct: power * 2.5,
                        share: power / MAX_W / 4.0,
                        ..ThreadRow::default()
                    })
                    .collect(),
                ..ProcessRow::default()
            });
        }
        let snapshot = Snapshot {
            start_ns: (tick - 1) * interval.as_nanos() as u64,
            totals: Default::default(),
            ts_ns: tick * interval.as_nanos() as u64,
            interval_s: interval.as_secs_f64(),
            header: header(MAX_W, freq, "synthetic"),
            rows: processes,
        };
        if tx.send(snapshot).is_err() {
            return;
        }
        thread::sleep(interval);
    }
}

/// One process as read from /proc: name, command line, cgroup, CPU ticks.
struct ProcInfo {
    comm: String,
    cmdline: String,
    cgroup: String,
    ticks: u64,
}

fn read_stat(path: &str) -> Option<(String, u64)> {
    let text = fs::read_to_string(path).ok()?;
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    // proc(5): after "(comm)", field 0 is state; utime and stime are fields 11 and 12.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

fn read_proc() -> HashMap<u32, ProcInfo> {
    let mut out = HashMap::new();
    let Ok(dir) = fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Some((comm, ticks)) = read_stat(&format!("/proc/{pid}/stat")) else {
            continue;
        };
        let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
            .map(|b| {
                String::from_utf8_lossy(&b)
                    .split('\0')
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("0::").map(str::to_string))
            })
            .unwrap_or_default();
        out.insert(
            pid,
            ProcInfo {
                comm,
                cmdline,
                cgroup,
                ticks,
            },
        );
    }
    out
}

fn read_threads(pid: u32) -> Vec<ThreadRow> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let (comm, _) = read_stat(&format!("/proc/{pid}/task/{tid}/stat"))?;
            // Per-thread deltas would need another table; the demo shows names only.
            Some(ThreadRow {
                tid,
                comm,
                power_w: 0.0,
                since_start_j: 0.0,
                cpu_pct: 0.0,
                share: 0.0,
                ..ThreadRow::default()
            })
        })
        .collect()
}

fn proc_feed(tx: &Sender<Snapshot>, interval: Duration, freq: u32) {
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let cpus = f64::from(cpus());
    let secs = interval.as_secs_f64();
    let window_ticks = hz * secs * cpus;
    let mut before = read_proc();
    let mut energy: HashMap<u32, f64> = HashMap::new();
    for tick in 1u64.. {
        thread::sleep(interval);
        let now = read_proc();
        let deltas: Vec<(u32, u64)> = now
            .iter()
            .map(|(pid, p)| {
                let prev = before.get(pid).map_or(p.ticks, |b| b.ticks);
                (*pid, p.ticks.saturating_sub(prev))
            })
            .collect();
        let busy: u64 = deltas.iter().map(|(_, d)| d).sum();
        // Linear utilisation model (docs/ARCHITECTURE.md, "Estimated energy").
        let busy_frac = (busy as f64 / window_ticks).min(1.0);
        let total_w = IDLE_W + (MAX_W - IDLE_W) * busy_frac;
        let rows = deltas
            .into_iter()
            .filter_map(|(pid, d)| {
                let p = now.get(&pid)?;
                let power_w = (MAX_W - IDLE_W) * d as f64 / window_ticks;
                let e = energy.entry(pid).or_default();
                *e += power_w * secs;
                Some(ProcessRow {
                    pid,
                    comm: p.comm.clone(),
                    cmdline: p.cmdline.clone(),
                    cgroup: p.cgroup.clone(),
                    power_w,
                    since_start_j: *e,
                    cpu_pct: 100.0 * d as f64 / (hz * secs),
                    share: power_w / total_w,
                    threads: if d > 0 { read_threads(pid) } else { Vec::new() },
                    ..ProcessRow::default()
                })
            })
            .collect();
        let snapshot = Snapshot {
            start_ns: (tick - 1) * interval.as_nanos() as u64,
            totals: Default::default(),
            ts_ns: tick * interval.as_nanos() as u64,
            interval_s: secs,
            header: header(total_w, freq, "demo model (/proc CPU time)"),
            rows,
        };
        if tx.send(snapshot).is_err() {
            return;
        }
        before = now;
    }
}
