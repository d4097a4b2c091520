//! `cargo xtask bench agent SECS`: the release agent at its default settings (metrics on a
//! free loopback port), first on the machine as it is ("quiet"), then while a churn
//! workload starts about 200 short-lived processes per second, each phase SECS long.
//! `BENCH_AGENT_CHURN` sets the command each start runs (words split at spaces; default
//! `true`), `BENCH_AGENT_RATE` the starts per second (e.g. `python3 -c pass` at 10: a
//! pyenv shim starts dozens of processes per interpreter).
//! Reports the agent's CPU as a percentage of one CPU and per start (the CPU churn
//! adds, over the starts), its RSS (peak, and growth after the first minute of
//! churn), and the events and drops its own metrics count.
use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use crate::util::Result;

/// Processes per second the churn phase starts, unless `BENCH_AGENT_RATE` says.
const CHURN_PER_SEC: u64 = 200;

/// What the churn phase starts: `BENCH_AGENT_CHURN`'s words (default `true`) and
/// `BENCH_AGENT_RATE` starts per second.
fn churn_workload() -> Result<(Vec<String>, u64)> {
    let words: Vec<String> = std::env::var("BENCH_AGENT_CHURN")
        .unwrap_or_else(|_| "true".into())
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if words.is_empty() {
        return Err("BENCH_AGENT_CHURN is empty: give a command".into());
    }
    let rate = match std::env::var("BENCH_AGENT_RATE") {
        Ok(r) => r
            .parse()
            .ok()
            .filter(|&r| r > 0)
            .ok_or_else(|| format!("BENCH_AGENT_RATE={r}: expected starts per second, > 0"))?,
        Err(_) => CHURN_PER_SEC,
    };
    Ok((words, rate))
}

/// Runs the benchmark.
pub fn run(secs: u64) -> Result {
    let (command, rate) = churn_workload()?;
    let bin = super::release_bin()?;
    let dir = std::env::temp_dir().join(format!("energy-bpf-bench-agent-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut child = Command::new(&bin)
        .args(["agent", "--metrics-addr", "127.0.0.1:0", "--socket"])
        .arg(dir.join("agent.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the agent: {e}"))?;
    let pid = child.id();
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let addr = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(rest) = line.split("metrics at http://").nth(1) {
                    break rest.trim_end_matches("/metrics").trim().to_string();
                }
            }
            _ => return Err("the agent exited before serving metrics".into()),
        }
    };
    thread::spawn(move || lines.for_each(drop));
    println!(
        "# bench agent: `energy-bpf agent` (defaults: 5 s windows, 49 Hz stacks, auto energy source), {secs} s quiet then {secs} s of churn: `{}` {rate} times a second",
        command.join(" ")
    );
    // The first windows allocate what the steady state reuses.
    thread::sleep(Duration::from_secs(10));

    let quiet = phase(pid, secs, None)?;
    println!(
        "quiet: CPU {:.2}% of one CPU, RSS {:.1} MiB at start, {:.1} MiB peak",
        quiet.cpu_pct,
        mib(quiet.rss_kib.first().copied().unwrap_or(0)),
        mib(quiet.peak_kib)
    );

    let stop = Arc::new(AtomicBool::new(false));
    let started = Arc::new(AtomicU64::new(0));
    let churn = {
        let (stop, started) = (Arc::clone(&stop), Arc::clone(&started));
        thread::spawn(move || churn(&command, rate, &stop, &started))
    };
    let loaded = phase(pid, secs, Some(&started));
    stop.store(true, Ordering::Relaxed);
    let _ = churn.join();
    let loaded = loaded?;
    // Growth is judged after the first minute (or the first half of a shorter run).
    let settle = (secs / 2).min(60) as usize;
    let at_settle = loaded.rss_kib.get(settle).copied().unwrap_or(0);
    let last = loaded.rss_kib.last().copied().unwrap_or(0);
    let max_after = loaded.rss_kib[settle.min(loaded.rss_kib.len())..]
        .iter()
        .copied()
        .max()
        .unwrap_or(0);
    println!(
        "churn: {:.0} starts/s, CPU {:.2}% of one CPU, RSS {:.1} MiB after {settle} s, {:.1} MiB at the end, {:.1} MiB peak after {settle} s ({:+.1}%)",
        loaded.churn_rate,
        loaded.cpu_pct,
        mib(at_settle),
        mib(last),
        mib(max_after),
        100.0 * (max_after as f64 - at_settle as f64) / at_settle.max(1) as f64
    );
    // What a new process costs the agent: the CPU churn adds, per start.
    println!(
        "per start: {:.0} µs of agent CPU",
        (loaded.cpu_pct - quiet.cpu_pct) / 100.0 * 1e6 / loaded.churn_rate.max(1e-9)
    );

    let metrics = scrape(&addr)?;
    for line in metrics.lines().filter(|l| {
        l.starts_with("energy_bpf_dropped_events_total")
            || l.starts_with("energy_bpf_events_total")
            || l.starts_with("energy_bpf_process_series ")
            || l.starts_with("energy_bpf_window_processing_seconds{")
    }) {
        println!("  {line}");
    }
    // SAFETY: kill with a valid pid of our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = child.wait().map_err(|e| format!("wait: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !status.success() {
        return Err(format!("the agent exited with {status} on SIGTERM"));
    }
    Ok(())
}

struct Phase {
    cpu_pct: f64,
    /// VmRSS once a second.
    rss_kib: Vec<u64>,
    /// VmHWM at the end.
    peak_kib: u64,
    churn_rate: f64,
}

fn phase(pid: u32, secs: u64, churned: Option<&AtomicU64>) -> Result<Phase> {
    let t0 = Instant::now();
    let cpu0 = cpu_seconds(pid)?;
    let churn0 = churned.map_or(0, |c| c.load(Ordering::Relaxed));
    let mut rss_kib = Vec::new();
    for _ in 0..secs {
        rss_kib.push(status_kib(pid, "VmRSS:")?);
        thread::sleep(Duration::from_secs(1));
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(pid)? - cpu0;
    let churn = churned.map_or(0, |c| c.load(Ordering::Relaxed)) - churn0;
    Ok(Phase {
        cpu_pct: 100.0 * cpu / wall,
        rss_kib,
        peak_kib: status_kib(pid, "VmHWM:")?,
        churn_rate: churn as f64 / wall,
    })
}

/// Runs `command` `rate` times a second until `stop` (each to its end), counting the
/// starts.
fn churn(command: &[String], rate: u64, stop: &AtomicBool, started: &AtomicU64) {
    let period = Duration::from_secs(1) / rate.min(u64::from(u32::MAX)) as u32;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let spawned = Command::new(&command[0])
            .args(&command[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        if let Ok(mut c) = spawned {
            let _ = c.wait();
            started.fetch_add(1, Ordering::Relaxed);
        }
        next += period;
        thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

/// CPU time process `pid` used so far, every thread's (exited ones too), in seconds: from
/// its CPU-time clock, exact to the nanosecond, or from `/proc/PID/stat` in clock ticks
/// (10 ms: too coarse for a few seconds of a lean tool) where that clock cannot be read.
pub(super) fn cpu_seconds(pid: u32) -> Result<f64> {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes only through the valid pointer it is given.
    let found = unsafe { libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) } == 0;
    // SAFETY: as above; `clock` is only read when the call before set it.
    if found && unsafe { libc::clock_gettime(clock, &mut ts) } == 0 {
        return Ok(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9);
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("agent gone: {e}"))?;
    let after = stat.rsplit_once(") ").ok_or("odd /proc stat")?.1;
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok((f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)) as f64 / hz)
}

pub(super) fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map_err(|e| format!("agent gone: {e}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| format!("no {key} in /proc/{pid}/status"))
}

fn scrape(addr: &str) -> Result<String> {
    get(addr, "/metrics")
}

/// The whole HTTP/1.0 answer (status line, headers, body) to `GET path` at `addr`.
pub(super) fn get(addr: &str, path: &str) -> Result<String> {
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    Ok(text)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}
