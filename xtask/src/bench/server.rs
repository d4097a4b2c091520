//! `cargo xtask bench server [ROUNDS] [REQUESTS]`: what each tool costs a saturated server.
//! redis-server pinned to CPU 0, `redis-benchmark -c 8 -t get,set` pinned to CPU 1 (both
//! saturated, tens of thousands of context switches per second); the benchmark runs alone,
//! under the agent (its default aggregating mode, and `--switches stream`), under
//! `energy-bpf record` and under `perf record -a -g -F 99`, each once per round in
//! rotating order (>= 15 rounds). Reported per mode: median requests/s, the median over
//! rounds of the change against the same round's run alone with its 95% interval
//! (bootstrap over rounds), and the tool's own CPU per context switch of the machine
//! during the run (`BENCH_SERVER_MODES=agent,agent-carbon,...` picks the modes beside
//! `alone`; `agent-carbon` adds `--carbon-intensity 400`), its probe's run time per `sched_switch` (`kernel.bpf_stats_enabled`, on
//! for the bench) and its peak RSS. Every run starts a new redis-benchmark process: a
//! new client, as a fleet machine sees all the time.
//!
//! Each run starts with a warm-up that is not measured, under every mode alike: a tenth of
//! the requests (at least 10,000), and at least [`WARM`] in all. An always-on agent has long
//! since loaded the unwind tables of redis-benchmark's files (once per file and machine)
//! and closed its first window (which names every process it found) when a new client
//! starts: the agent modes' warm-up also lasts until the agent's `/readyz` says its first
//! window closed, and [`SETTLE`] more. Those one-off costs are not a context switch's; the
//! warm-up's own tool CPU is printed apart so it stays visible.
//!
//! Self-contained: starts its own redis on a free loopback port with persistence off, in a
//! private directory, and stops everything it started (also on error).
//!
//! For a machine without cargo or perf: `ENERGY_BPF_BIN=/path` runs that binary and builds
//! nothing; without a working `perf` the perf mode is skipped with a printed reason. On a
//! machine with many cores the tools run on idle CPUs and never compete with redis;
//! `BENCH_PIN_TOOLS=1` pins each tool to CPUs 0 and 1, redis's own, as on a saturated server.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::util::{self, Result};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Alone,
    Agent,
    AgentStream,
    AgentCarbon,
    Record,
    Perf,
}

impl Mode {
    /// Every mode but `AgentCarbon`, which runs when `BENCH_SERVER_MODES` names it.
    const ALL: [Mode; 5] = [
        Mode::Alone,
        Mode::Agent,
        Mode::AgentStream,
        Mode::Record,
        Mode::Perf,
    ];

    fn name(self) -> &'static str {
        match self {
            Mode::Alone => "alone",
            Mode::Agent => "energy-bpf agent",
            Mode::AgentStream => "agent --switches stream",
            Mode::AgentCarbon => "agent --carbon-int. 400",
            Mode::Record => "energy-bpf record",
            Mode::Perf => "perf record -a -g",
        }
    }
}

/// The least time from a tool's start to the measured run: the agent's 5 s window and 1 s.
const WARM: Duration = Duration::from_secs(6);

/// After the agent's first window: time for the work it started to finish.
const SETTLE: Duration = Duration::from_secs(1);

/// Waits until the agent at `addr` says `/readyz` 200 (its first window has closed).
fn agent_ready(addr: &str) -> Result {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = super::agent::get(addr, "/readyz").unwrap_or_default();
        if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the agent at {addr} was not ready within 60 s: {answer}"
            ));
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Kills (and reaps) a child when dropped: nothing is left running after an error.
struct Guard(Option<Child>);

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One run: requests/s (mean of SET and GET), the tool's CPU seconds and the machine's
/// context switches while the benchmark ran, and the tool's peak RSS.
#[derive(Clone, Copy, Default)]
struct Run {
    rps: f64,
    tool_cpu_s: f64,
    switches: u64,
    peak_rss_kib: u64,
    /// The tool's busiest eBPF program (`sched_switch`): ns per run, where the kernel
    /// counts it (`kernel.bpf_stats_enabled`).
    probe_ns: Option<f64>,
}

/// What a run needs besides its arguments: the binary, the modes that can run here, and
/// whether the tools share redis's CPUs.
struct Setup {
    bin: PathBuf,
    modes: Vec<Mode>,
    pin_tools: bool,
}

/// Runs the benchmark.
pub fn run(rounds: usize, requests: u64) -> Result {
    let rounds = rounds.max(15);
    for tool in ["redis-server", "redis-benchmark", "taskset"] {
        if util::output("sh", &["-c", &format!("command -v {tool}")]).is_none_or(|s| s.is_empty()) {
            return Err(format!(
                "{tool} not found: run `sudo cargo xtask setup` (redis-server, redis-tools, util-linux)"
            ));
        }
    }
    let mut modes = Mode::ALL.to_vec();
    // `BENCH_SERVER_MODES=agent,agent-carbon` runs only those beside `alone`.
    if let Ok(list) = std::env::var("BENCH_SERVER_MODES") {
        let mut chosen = vec![Mode::Alone];
        for key in list.split(',').map(str::trim).filter(|k| !k.is_empty()) {
            chosen.push(match key {
                "agent" => Mode::Agent,
                "agent-stream" => Mode::AgentStream,
                "agent-carbon" => Mode::AgentCarbon,
                "record" => Mode::Record,
                "perf" => Mode::Perf,
                other => {
                    return Err(format!(
                        "BENCH_SERVER_MODES: unknown mode {other} (agent, agent-stream, agent-carbon, record, perf)"
                    ));
                }
            });
        }
        modes = chosen;
    }
    if util::output("perf", &["--version"]).is_none() {
        println!(
            "# {}: skipped, `perf --version` does not run here",
            Mode::Perf.name()
        );
        modes.retain(|&m| m != Mode::Perf);
    }
    let bin = super::release_bin()?;
    // The kernel counts each eBPF program's runs and run time only while this is on.
    let stats = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok();
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
    let pin_tools = std::env::var("BENCH_PIN_TOOLS").is_ok_and(|v| !v.is_empty() && v != "0");
    let setup = Setup {
        bin,
        modes,
        pin_tools,
    };
    let dir = std::env::temp_dir().join(format!("energy-bpf-bench-server-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let result = rounds_in(&dir, &setup, rounds, requests);
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(stats) = stats {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats.trim());
    }
    result
}

fn rounds_in(dir: &Path, setup: &Setup, rounds: usize, requests: u64) -> Result {
    let modes = &setup.modes;
    let port = free_port()?;
    let _redis = Guard(Some(
        Command::new("taskset")
            .args(["-c", "0", "redis-server", "--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server: {e}"))?,
    ));
    wait_for_port(port)?;
    println!(
        "# bench server: redis-server on CPU 0, redis-benchmark -c 8 -t get,set -n {requests} on CPU 1; \
         {rounds} rounds, modes in rotating order; change = median over rounds of (rps / the \
         same round's rps alone) - 1"
    );
    println!(
        "# {} CPUs online; {} ({})",
        online_cpus(),
        if setup.pin_tools {
            "tools pinned to CPUs 0,1 with redis"
        } else {
            "tools free to run on any CPU"
        },
        setup.bin.display()
    );
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); modes.len()];
    for round in 0..rounds {
        for k in 0..modes.len() {
            let i = (k + round) % modes.len();
            let run = one_run(modes[i], setup, dir, port, requests)?;
            runs[i].push(run);
        }
        eprintln!("bench server: round {} of {rounds} done", round + 1);
    }
    println!(
        "{:<24} {:>12} {:>9} {:>19} {:>19} {:>16} {:>14} {:>10}",
        "mode",
        "median rps",
        "change",
        "95% interval",
        "quartiles",
        "tool ns/switch",
        "probe ns/run",
        "tool RSS"
    );
    for (i, &mode) in modes.iter().enumerate() {
        let rps: Vec<f64> = runs[i].iter().map(|r| r.rps).collect();
        let change: Vec<f64> = runs[i]
            .iter()
            .zip(&runs[0])
            .map(|(r, a)| r.rps / a.rps - 1.0)
            .collect();
        let (q1, q2, q3) = super::quartiles(&change);
        let (lo, hi) = median_interval(&change);
        let probe: Vec<f64> = runs[i].iter().filter_map(|r| r.probe_ns).collect();
        let probe = if probe.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}", super::median(&probe))
        };
        let (per_switch, rss) = if mode == Mode::Alone {
            ("-".to_string(), "-".to_string())
        } else {
            let ns: Vec<f64> = runs[i]
                .iter()
                .map(|r| r.tool_cpu_s * 1e9 / r.switches.max(1) as f64)
                .collect();
            let rss = runs[i].iter().map(|r| r.peak_rss_kib).max().unwrap_or(0);
            (
                format!("{:.0}", super::median(&ns)),
                format!("{} MiB", rss / 1024),
            )
        };
        println!(
            "{:<24} {:>12.0} {:>8.2}% {:>19} {:>19} {:>16} {:>14} {:>10}",
            mode.name(),
            super::median(&rps),
            100.0 * q2,
            format!("[{:+.2}%, {:+.2}%]", 100.0 * lo, 100.0 * hi),
            format!("[{:+.2}%, {:+.2}%]", 100.0 * q1, 100.0 * q3),
            per_switch,
            probe,
            rss
        );
    }
    let switches: Vec<f64> = runs.iter().flatten().map(|r| r.switches as f64).collect();
    println!(
        "machine context switches per run: median {:.0}",
        super::median(&switches)
    );
    Ok(())
}

fn one_run(mode: Mode, setup: &Setup, dir: &Path, port: u16, requests: u64) -> Result<Run> {
    let out: PathBuf = dir.join("out");
    let _ = std::fs::remove_file(&out);
    let tool = |program: &Path| {
        if setup.pin_tools {
            // taskset execs the tool: the pid (CPU, RSS, SIGINT) stays the tool's own.
            let mut c = Command::new("taskset");
            c.args(["-c", "0,1"]).arg(program);
            c
        } else {
            Command::new(program)
        }
    };
    let agent_addr = format!("127.0.0.1:{}", free_port()?);
    let tool = match mode {
        Mode::Alone => None,
        Mode::Agent | Mode::AgentStream | Mode::AgentCarbon => Some(start(
            tool(&setup.bin)
                .args(["agent", "--metrics-addr", &agent_addr, "--socket"])
                .arg(dir.join("agent.sock"))
                .args(["--vm-share", "none", "--switches"])
                .arg(if mode == Mode::AgentStream {
                    "stream"
                } else {
                    "aggregate"
                })
                .args(if mode == Mode::AgentCarbon {
                    &["--carbon-intensity", "400"][..]
                } else {
                    &[]
                }),
            Some("metrics at"),
        )?),
        Mode::Record => Some(start(
            tool(&setup.bin).arg("record").arg("-o").arg(&out),
            Some("recording"),
        )?),
        Mode::Perf => Some(start(
            tool(Path::new("perf"))
                .args(["record", "-a", "-g", "-F", "99", "-q", "-o"])
                .arg(&out),
            None,
        )?),
    };
    let mut guard = Guard(tool);
    let pid = guard.0.as_ref().map(Child::id);
    let warm0 = pid.map(cpu_seconds).transpose()?.unwrap_or(0.0);
    let warm_start = Instant::now();
    benchmark(port, (requests / 10).max(10_000))?;
    thread::sleep(WARM.saturating_sub(warm_start.elapsed()));
    if matches!(mode, Mode::Agent | Mode::AgentStream | Mode::AgentCarbon) {
        // Past the agent's first window too: its first close names every process it
        // found and loads what their first samples asked for, once per agent (50-80 ms
        // here), which a measured run of a few seconds would put on its switches.
        agent_ready(&agent_addr)?;
        thread::sleep(SETTLE);
    }
    let cpu0 = pid.map(cpu_seconds).transpose()?.unwrap_or(0.0);
    let prog0 = pid.and_then(busiest_program);
    let ctxt0 = ctxt()?;
    let t0 = Instant::now();
    let bench = benchmark(port, requests)?;
    let wall = t0.elapsed();
    let switches = ctxt()?.saturating_sub(ctxt0);
    let tool_cpu_s = pid.map(cpu_seconds).transpose()?.unwrap_or(0.0) - cpu0;
    let probe_ns = match (prog0, pid.and_then(busiest_program)) {
        (Some((id0, ns0, n0)), Some((id1, ns1, n1))) if id0 == id1 && n1 > n0 => {
            Some((ns1 - ns0) as f64 / (n1 - n0) as f64)
        }
        _ => None,
    };
    let peak_rss_kib = pid.map(|p| peak_rss(p).unwrap_or(0)).unwrap_or(0);
    let text = String::from_utf8_lossy(&bench.stdout);
    let rps: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("\"SET\"") || l.starts_with("\"GET\""))
        .filter_map(|l| l.split(',').nth(1)?.trim_matches('"').parse().ok())
        .collect();
    if rps.len() != 2 || !bench.status.success() {
        return Err(format!(
            "redis-benchmark under {} gave no rates ({}): {text}",
            mode.name(),
            bench.status
        ));
    }
    if let Some(mut c) = guard.0.take() {
        // SAFETY: kill with a valid pid of our own child.
        unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
        let _ = c.wait();
    }
    tracing_line(mode, wall, switches, cpu0 - warm0);
    Ok(Run {
        rps: rps.iter().sum::<f64>() / rps.len() as f64,
        tool_cpu_s,
        switches,
        peak_rss_kib,
        probe_ns,
    })
}

/// The eBPF program of process `pid` that ran most (its id, run time ns and runs, from
/// `/proc/PID/fdinfo`): `sched_switch` for our tools. `None` where the kernel does not
/// count (`kernel.bpf_stats_enabled` is 0) or the process holds no program.
pub(super) fn busiest_program(pid: u32) -> Option<(u64, u64, u64)> {
    let mut best: Option<(u64, u64, u64)> = None;
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let link = std::fs::read_link(fd.path()).unwrap_or_default();
        if !link.to_string_lossy().contains("bpf-prog") {
            continue;
        }
        let info = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        ))
        .unwrap_or_default();
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        if let (Some(id), Some(ns), Some(n)) =
            (field("prog_id:"), field("run_time_ns:"), field("run_cnt:"))
            && best.is_none_or(|b| n > b.2)
        {
            best = Some((id, ns, n));
        }
    }
    best.filter(|b| b.2 > 0)
}

/// The 95% interval of the median of `paired` (one figure per paired round: a ratio, or a
/// difference): 2,000 bootstrap resamples of the rounds, a fixed seed so a run's figures
/// can be recomputed.
pub(super) fn median_interval(paired: &[f64]) -> (f64, f64) {
    if paired.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut medians: Vec<f64> = (0..2000)
        .map(|_| {
            let resample: Vec<f64> = (0..paired.len())
                .map(|_| paired[(next() % paired.len() as u64) as usize])
                .collect();
            super::median(&resample)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (medians[50], medians[1949])
}

/// `redis-benchmark -c 8 -t get,set` of `requests` on CPU 1, its CSV output.
fn benchmark(port: u16, requests: u64) -> Result<std::process::Output> {
    Command::new("taskset")
        .args(["-c", "1", "redis-benchmark", "-h", "127.0.0.1", "-p"])
        .arg(port.to_string())
        .args(["-c", "8", "-t", "get,set", "--csv", "-n"])
        .arg(requests.to_string())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("redis-benchmark: {e}"))
}

fn tracing_line(mode: Mode, wall: Duration, switches: u64, warm_cpu_s: f64) {
    eprintln!(
        "  {:<20} {:.1} s, {:.0} switches/s (tool CPU in the warm-up before it: {:.3} s)",
        mode.name(),
        wall.as_secs_f64(),
        switches as f64 / wall.as_secs_f64().max(1e-9),
        warm_cpu_s
    );
}

/// Starts a tool and waits for its ready line (then 2 s more for the first windows).
fn start(cmd: &mut Command, ready: Option<&str>) -> Result<Child> {
    super::start_tool(cmd, ready, Duration::from_secs(2))
}

/// The machine's online CPUs (not this process's affinity mask, which a caller may narrow).
fn online_cpus() -> i64 {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

fn wait_for_port(port: u16) -> Result {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(50));
    }
    Err(format!(
        "redis-server did not listen on port {port} within 10 s"
    ))
}

/// Context switches of the machine since boot.
fn ctxt() -> Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat").map_err(|e| format!("/proc/stat: {e}"))?;
    stat.lines()
        .find_map(|l| l.strip_prefix("ctxt "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no ctxt line in /proc/stat".into())
}

fn cpu_seconds(pid: u32) -> Result<f64> {
    super::agent::cpu_seconds(pid)
}

fn peak_rss(pid: u32) -> Result<u64> {
    super::agent::status_kib(pid, "VmHWM:")
}
