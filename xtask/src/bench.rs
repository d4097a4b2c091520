//! `cargo xtask bench ...`:
//! - `overhead`: a CPU-bound and a context-switch-heavy workload, each alone, under
//!   `energy-bpf record` (frame pointers at 99 Hz, unwind tables at 99 and 999 Hz) and under
//!   `perf record -a` (`-g`, `--call-graph dwarf`, `--switch-events`), alternating runs;
//!   medians, ratios, and the recorder's own CPU time and peak memory.
//! - `python [ROUNDS]`: a CPU-bound pure-Python loop (Debian's python3) alone and under
//!   `energy-bpf record --unwind fp -F 99` with the CPython frame walker off and on.
//! - `accuracy`: the attribution accuracy benchmark (`cargo bench --bench accuracy`).
//! - `power-model`: only its power-model runs (two scenarios of unequal watts and one of
//!   equal watts, ten seeds each, on three counters; each run's error).
//! - `power-model-real [RUNS] [SECS]`: the two unequal-watts scenarios with real Python
//!   processes, recorded with real eBPF against an emulated RAPL counter ([`real_power`]).
//! - `outputs`: records our `burn` workload on both CPUs for 60 s at 999 Hz, then times
//!   `report` and `flamegraph` (every format) on that real recording (best of 3).
//! - `diff`: records `burn` twice (60 s at 999 Hz on both CPUs each), then times
//!   `energy-bpf diff` of the two (table, SVG, by process) against the two `report --by
//!   function` runs a user would otherwise read side by side (best of 3, ratio).
//! - `top`: CPU used by `energy-bpf top` itself at the default 1 s refresh.
//! - `agent SECS`: the agent's CPU and RSS, quiet and under process churn ([`agent`]).
//! - `server [ROUNDS] [REQUESTS]`: redis throughput alone and under the agent (aggregating
//!   and streaming), `record` and `perf record -a -g`, with each tool's CPU per context
//!   switch and the 95% interval of the paired change ([`server`]).
//! - `probe [ROUNDS] [SWITCHES]`: the agent's `sched_switch` run time per switch in both
//!   modes against two floor programs on the same switches ([`probe`]).
//! - `web [ROUNDS]`: the agent's CPU with its web view and with `--no-web`, paired ([`web`]).
//! - `vms [SECS] [N] [ROUNDS]`: the agent's CPU per running VM at 1 s updates, N fake VMs ([`vms`]).
mod agent;
mod outputs;
mod overhead;
mod probe;
mod python;
mod real_power;
mod server;
mod vms;
mod web;

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::Duration,
};

use crate::util::{self, Result};

/// Dispatches a benchmark by name.
pub fn run(args: &[String]) -> Result {
    match args.first().map(String::as_str) {
        Some("overhead") => overhead::run(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5)),
        Some("python") => python::run(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5)),
        Some("accuracy") => util::cargo(&[
            "bench",
            "--locked",
            "-p",
            "energy-bpf",
            "--bench",
            "accuracy",
        ]),
        Some("power-model") => util::cargo(&[
            "bench",
            "--locked",
            "-p",
            "energy-bpf",
            "--bench",
            "accuracy",
            "--",
            "power-model",
        ]),
        Some("power-model-real") => real_power::run(
            args.get(1).and_then(|s| s.parse().ok()).unwrap_or(10),
            args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20),
        ),
        Some("outputs") => outputs::outputs(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60)),
        Some("outputs-synthetic") => util::cargo(&["bench", "--locked", "-p", "energy-bpf", "--bench", "outputs"]),
        Some("diff") => outputs::diff(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60)),
        Some("top") => outputs::top(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30)),
        Some("agent") => agent::run(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(600)),
        Some("server") => server::run(
            args.get(1).and_then(|s| s.parse().ok()).unwrap_or(15),
            args.get(2).and_then(|s| s.parse().ok()).unwrap_or(400_000),
        ),
        Some("probe") => probe::run(
            args.get(1).and_then(|s| s.parse().ok()).unwrap_or(15),
            args.get(2).and_then(|s| s.parse().ok()).unwrap_or(300_000),
        ),
        Some("web") => web::run(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(15)),
        Some("vms") => vms::run(
            args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60),
            args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20),
            args.get(3).and_then(|s| s.parse().ok()).unwrap_or(3),
        ),
        Some("agent-scale") => util::cargo(&["bench", "--locked", "-p", "energy-bpf", "--bench", "agent_scale"]),
        _ => Err("usage: cargo xtask bench overhead [ROUNDS] | python [ROUNDS] | accuracy | power-model | power-model-real [RUNS] [SECS] | outputs [SECS] | outputs-synthetic | diff [SECS] | top [SECS] | agent [SECS] | server [ROUNDS] [REQUESTS] | probe [ROUNDS] [SWITCHES] | web [ROUNDS] | agent-scale | vms [SECS] [N] [ROUNDS]".into()),
    }
}

/// Usage of one recorder run.
#[derive(Default, Clone, Copy)]
struct RecorderCost {
    cpu_s: f64,
    peak_rss_kib: u64,
}

/// A fresh private directory under the bench output.
fn tempfile_dir(name: &str) -> Result<std::path::PathBuf> {
    let dir = util::root().join("bench-out").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(dir)
}

fn start_recorder(cmd: &mut Command, ready_line: Option<&str>) -> Result<Child> {
    // perf prints nothing when ready; give both the same settling time.
    start_tool(cmd, ready_line, Duration::from_millis(1000))
}

/// Starts a tool, waits for its ready line on stderr (a tool that exits first is an error,
/// and is reaped), then `settle` more; the rest of stderr is drained so it never blocks.
pub(super) fn start_tool(
    cmd: &mut Command,
    ready: Option<&str>,
    settle: Duration,
) -> Result<Child> {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    let stderr = child.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    if let Some(ready) = ready {
        loop {
            match lines.next() {
                Some(Ok(line)) if line.contains(ready) => break,
                Some(Ok(_)) => {}
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{cmd:?} exited before it was ready"));
                }
            }
        }
    }
    thread::spawn(move || lines.for_each(drop));
    thread::sleep(settle);
    Ok(child)
}

fn stop_recorder(child: &mut Child) -> Result<RecorderCost> {
    // SAFETY: kill with a valid pid of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 on our own child fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers; the child has not been reaped yet.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    if pid < 0 {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(RecorderCost {
        cpu_s: tv(usage.ru_utime) + tv(usage.ru_stime),
        peak_rss_kib: usage.ru_maxrss as u64,
    })
}

/// First quartile, median, third quartile (nearest rank).
fn quartiles(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.25), median(&v), at(0.75))
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A release agent a bench started (metrics on a free loopback port, its socket in a
/// directory of its own), serving once [`BenchAgent::start`] returns; stopped with SIGINT,
/// and waited for, when dropped.
struct BenchAgent {
    child: Child,
    dir: PathBuf,
}

impl BenchAgent {
    /// Starts `bin agent` with `args` and waits until it serves metrics.
    fn start(bin: &Path, args: &[&str]) -> Result<Self> {
        let dir = std::env::temp_dir().join(format!("energy-bpf-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let child = Command::new(bin)
            .args([
                "agent",
                "--metrics-addr",
                "127.0.0.1:0",
                "--vm-share",
                "none",
                "--socket",
            ])
            .arg(dir.join("agent.sock"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting the agent: {e}"))?;
        let mut agent = Self { child, dir };
        let mut lines = BufReader::new(agent.child.stderr.take().ok_or("no stderr")?).lines();
        if !lines.any(|l| l.is_ok_and(|l| l.contains("metrics at http://"))) {
            return Err("the agent exited before serving metrics".into());
        }
        thread::spawn(move || lines.for_each(drop));
        Ok(agent)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BenchAgent {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of our child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The energy-bpf under test: `ENERGY_BPF_BIN` when set (no cargo), else a release build.
fn release_bin() -> Result<std::path::PathBuf> {
    if let Some(bin) = std::env::var_os("ENERGY_BPF_BIN") {
        return Ok(bin.into());
    }
    util::cargo(&[
        "build",
        "--locked",
        "--release",
        "-p",
        "energy-bpf",
        "--bin",
        "energy-bpf",
    ])?;
    Ok(util::root().join("target/release/energy-bpf"))
}
