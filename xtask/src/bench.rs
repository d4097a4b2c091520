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
mod probe;
mod server;
mod vms;
mod web;

use std::{
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::util::{self, Result};

/// Dispatches a benchmark by name.
pub fn run(args: &[String]) -> Result {
    match args.first().map(String::as_str) {
        Some("overhead") => overhead(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5)),
        Some("python") => python(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5)),
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
        Some("outputs") => outputs(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60)),
        Some("outputs-synthetic") => util::cargo(&["bench", "--locked", "-p", "energy-bpf", "--bench", "outputs"]),
        Some("diff") => diff(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60)),
        Some("top") => top(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(30)),
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
        _ => Err("usage: cargo xtask bench overhead [ROUNDS] | python [ROUNDS] | accuracy | power-model | outputs [SECS] | outputs-synthetic | diff [SECS] | top [SECS] | agent [SECS] | server [ROUNDS] [REQUESTS] | probe [ROUNDS] [SWITCHES] | web [ROUNDS] | agent-scale | vms [SECS] [N] [ROUNDS]".into()),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Alone,
    /// `energy-bpf record` with frame pointers only.
    EnergyBpfFp,
    /// `energy-bpf record` walking user stacks with unwind tables, at this rate.
    EnergyBpfDwarf(u32),
    Perf,
    /// perf copying 8 KiB of user stack per sample and unwinding it afterwards: the
    /// like-for-like tool for stacks without frame pointers.
    PerfDwarf,
    /// perf also tracing every context switch: the like-for-like comparison for the
    /// context-switch workload, since plain `perf record` only samples.
    PerfSwitches,
}

impl Mode {
    const ALL: [Mode; 7] = [
        Mode::Alone,
        Mode::EnergyBpfFp,
        Mode::EnergyBpfDwarf(99),
        Mode::EnergyBpfDwarf(999),
        Mode::Perf,
        Mode::PerfDwarf,
        Mode::PerfSwitches,
    ];

    fn name(self) -> String {
        match self {
            Mode::Alone => "alone".into(),
            Mode::EnergyBpfFp => "energy-bpf record --unwind fp -F 99".into(),
            Mode::EnergyBpfDwarf(hz) => format!("energy-bpf record --unwind dwarf -F {hz}"),
            Mode::Perf => "perf record -a -g -F 99".into(),
            Mode::PerfDwarf => "perf record -a --call-graph dwarf -F 99".into(),
            Mode::PerfSwitches => "perf record -a -g -F 99 --switch-events".into(),
        }
    }

    fn index(self) -> usize {
        Mode::ALL.iter().position(|&m| m == self).unwrap_or(0)
    }
}

/// Usage of one recorder run.
#[derive(Default, Clone, Copy)]
struct RecorderCost {
    cpu_s: f64,
    peak_rss_kib: u64,
}

fn overhead(rounds: usize) -> Result {
    util::cargo(&[
        "build",
        "--locked",
        "--release",
        "-p",
        "energy-bpf",
        "-p",
        "xtask",
        "--bin",
        "energy-bpf",
        "--bin",
        "bench-workload",
    ])?;
    let root = util::root();
    let workload = root.join("target/release/bench-workload");
    let recorder = root.join("target/release/energy-bpf");
    let out = root.join("bench-out");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    // Sizes chosen to take about 1.2 s alone on our 2-CPU machines: many short rounds
    // average out this VM's drift better than a few long ones.
    let workloads = [
        ("cpu-bound", vec!["cpu", "50"]),
        (
            "context-switch (pipe ping-pong)",
            vec!["pingpong", "100000"],
        ),
    ];
    println!(
        "# bench overhead: {rounds} rounds; each round runs every mode once, in rotating order;\n\
         # slowdown = median over rounds of (time / the same round's time alone) - 1, [quartiles]"
    );
    for (name, wargs) in &workloads {
        let mut times: [Vec<f64>; Mode::ALL.len()] = Default::default();
        let mut costs: [Vec<RecorderCost>; Mode::ALL.len()] = Default::default();
        for round in 0..rounds {
            for k in 0..Mode::ALL.len() {
                let i = (k + round) % Mode::ALL.len();
                let mode = Mode::ALL[i];
                let (secs, cost) = one_run(
                    mode,
                    &workload,
                    wargs,
                    &recorder,
                    &out.join(format!("r{round}")),
                )?;
                times[i].push(secs);
                costs[i].push(cost);
            }
        }
        // Each round's time against the same round's run alone: pairs cancel slow drift.
        let slowdowns: Vec<Vec<f64>> = times
            .iter()
            .map(|t| t.iter().zip(&times[0]).map(|(t, a)| t / a - 1.0).collect())
            .collect();
        println!("\n## {name}");
        println!(
            "{:<44} {:>9} {:>9} {:>17} {:>14} {:>12}",
            "mode", "median s", "slowdown", "quartiles", "recorder CPU s", "recorder RSS"
        );
        for (i, mode) in Mode::ALL.into_iter().enumerate() {
            let m = median(&times[i]);
            let (q1, q2, q3) = quartiles(&slowdowns[i]);
            let (cpu, rss) = if mode == Mode::Alone {
                ("-".to_string(), "-".to_string())
            } else {
                let cpu = median(&costs[i].iter().map(|c| c.cpu_s).collect::<Vec<_>>());
                let rss = costs[i].iter().map(|c| c.peak_rss_kib).max().unwrap_or(0);
                (format!("{cpu:.3}"), format!("{} MiB", rss / 1024))
            };
            println!(
                "{:<44} {:>9.3} {:>8.2}% {:>17} {:>14} {:>12}",
                mode.name(),
                m,
                100.0 * q2,
                format!("[{:+.1}%, {:+.1}%]", 100.0 * q1, 100.0 * q3),
                cpu,
                rss
            );
        }
        let at = |m: Mode| median(&slowdowns[m.index()]);
        for (ours, theirs) in [
            (Mode::EnergyBpfFp, Mode::Perf),
            (Mode::EnergyBpfFp, Mode::PerfSwitches),
            (Mode::EnergyBpfDwarf(99), Mode::PerfDwarf),
        ] {
            let (a, b) = (at(ours), at(theirs));
            if b > 0.0 {
                println!(
                    "slowdown ratio {} / {}: {:.2}",
                    ours.name(),
                    theirs.name(),
                    a / b
                );
            } else {
                println!(
                    "slowdown ratio {} / {}: n/a (no slowdown measured)",
                    ours.name(),
                    theirs.name()
                );
            }
        }
        println!(
            "dwarf - fp slowdown at 99 Hz: {:+.2} percentage points",
            100.0 * (at(Mode::EnergyBpfDwarf(99)) - at(Mode::EnergyBpfFp))
        );
    }
    unwind_tables()
}

/// The CPython frame walker's cost: a CPU-bound pure-Python loop alone, under `record
/// --unwind fp -F 99` with the walker off (`ENERGY_BPF_PYTHON=0`), and with it on; rounds
/// rotate the order, slowdowns are against the same round's run alone.
fn python(rounds: usize) -> Result {
    let recorder = release_bin()?;
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        return Err("bench python needs /usr/bin/python3".into());
    }
    let out = util::root().join("bench-out");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    // About 1.5 s alone; nested calls so every sample has a few Python frames.
    let script = "def leaf(n):\n    t = 0\n    for i in range(n):\n        t += i * i % 7\n    return t\n\
                  def mid(n):\n    return leaf(n)\n\
                  def top(r):\n    for _ in range(r):\n        mid(100000)\n\
                  top(150)\n";
    let modes = ["alone", "fp, python walker off", "fp, python walker on"];
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        for k in 0..modes.len() {
            let i = (k + round) % modes.len();
            let mut rec = match i {
                0 => None,
                _ => Some(start_recorder(
                    Command::new(&recorder)
                        .args(["record", "--unwind", "fp", "-F", "99", "-o"])
                        .arg(out.join(format!("py{round}-{i}.ebpr")))
                        .env("ENERGY_BPF_PYTHON", if i == 1 { "0" } else { "1" }),
                    Some("recording"),
                )?),
            };
            let started = Instant::now();
            let status = Command::new(python)
                .args(["-c", script])
                .status()
                .map_err(|e| format!("python3: {e}"))?;
            times[i].push(started.elapsed().as_secs_f64());
            if !status.success() {
                return Err(format!("python3 failed: {status}"));
            }
            if let Some(child) = rec.as_mut() {
                cpu[i].push(stop_recorder(child)?.cpu_s);
            }
        }
    }
    let slowdowns: Vec<Vec<f64>> = times
        .iter()
        .map(|t| t.iter().zip(&times[0]).map(|(t, a)| t / a - 1.0).collect())
        .collect();
    println!(
        "# bench python: {rounds} rounds, CPU-bound pure Python under record -F 99 --unwind fp;\n\
         # slowdown = median over rounds of (time / the same round's time alone) - 1, [quartiles]"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>17} {:>14}",
        "mode", "median s", "slowdown", "quartiles", "recorder CPU s"
    );
    for (i, name) in modes.iter().enumerate() {
        let (q1, q2, q3) = quartiles(&slowdowns[i]);
        let rec_cpu = if cpu[i].is_empty() {
            "-".to_string()
        } else {
            format!("{:.3}", median(&cpu[i]))
        };
        println!(
            "{:<28} {:>9.3} {:>8.2}% {:>17} {:>14}",
            name,
            median(&times[i]),
            100.0 * q2,
            format!("[{:+.1}%, {:+.1}%]", 100.0 * q1, 100.0 * q3),
            rec_cpu
        );
    }
    println!(
        "python walker on - off slowdown at 99 Hz: {:+.2} percentage points",
        100.0 * (median(&slowdowns[2]) - median(&slowdowns[1]))
    );
    // The same runs as a ratio: each round's walker-on time over its walker-off time.
    let ratios: Vec<f64> = times[2]
        .iter()
        .zip(&times[1])
        .map(|(on, off)| on / off)
        .collect();
    let (r1, r2, r3) = quartiles(&ratios);
    println!(
        "python walker on / --unwind fp walker off, time ratio: {r2:.4} [{r1:.4}, {r3:.4}] \
         (median [quartiles] over rounds)"
    );
    Ok(())
}

/// Table memory per 100 MiB of text, and build time cold and cached, for the largest
/// binary at hand (the toolchain's librustc_driver) and for libc and python3.
fn unwind_tables() -> Result {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("rustc --print sysroot: {e}"))?;
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_owned();
    let mut files: Vec<String> = std::fs::read_dir(Path::new(&sysroot).join("lib"))
        .map_err(|e| format!("reading {sysroot}/lib: {e}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.path().display().to_string())
        .filter(|p| p.contains("librustc_driver"))
        .collect();
    files.extend(
        ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3"]
            .iter()
            .filter(|p| Path::new(p).exists())
            .map(|p| p.to_string()),
    );
    let cache = tempfile_dir("unwind-cache")?;
    println!("\n## unwind tables (cold: compiled and stored; cached: read back)");
    for pass in ["cold", "cached"] {
        println!("### {pass}");
        let mut args = vec![
            "run",
            "--locked",
            "--release",
            "-q",
            "-p",
            "energy-bpf",
            "--example",
            "unwind_table",
            "--",
        ];
        args.extend(files.iter().map(String::as_str));
        args.extend(["--cache", cache.to_str().unwrap_or_default()]);
        util::cargo(&args)?;
    }
    let _ = std::fs::remove_dir_all(&cache);
    Ok(())
}

/// A fresh private directory under the bench output.
fn tempfile_dir(name: &str) -> Result<std::path::PathBuf> {
    let dir = util::root().join("bench-out").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(dir)
}

fn one_run(
    mode: Mode,
    workload: &Path,
    wargs: &[&str],
    recorder: &Path,
    out: &Path,
) -> Result<(f64, RecorderCost)> {
    let mut rec = match mode {
        Mode::Alone => None,
        Mode::EnergyBpfFp | Mode::EnergyBpfDwarf(_) => {
            let (unwind, hz) = match mode {
                Mode::EnergyBpfDwarf(hz) => ("dwarf", hz),
                _ => ("fp", 99),
            };
            Some(start_recorder(
                Command::new(recorder)
                    .args(["record", "--unwind", unwind, "-F", &hz.to_string(), "-o"])
                    .arg(out.with_extension("ebpr")),
                Some("recording"),
            )?)
        }
        Mode::Perf | Mode::PerfDwarf | Mode::PerfSwitches => Some(start_recorder(
            Command::new("perf")
                .args(["record", "-a", "-F", "99", "-q"])
                .args(if mode == Mode::PerfDwarf {
                    ["--call-graph", "dwarf"].as_slice()
                } else {
                    ["-g"].as_slice()
                })
                .args((mode == Mode::PerfSwitches).then_some("--switch-events"))
                .arg("-o")
                .arg(out.with_extension("perf.data")),
            None,
        )?),
    };
    let started = Instant::now();
    let status = Command::new(workload)
        .args(wargs)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("workload: {e}"))?;
    let secs = started.elapsed().as_secs_f64();
    if !status.success() {
        return Err(format!("workload failed: {status}"));
    }
    let cost = match rec.as_mut() {
        Some(child) => stop_recorder(child)?,
        None => RecorderCost::default(),
    };
    Ok((secs, cost))
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

/// Records `burn` on both CPUs for `secs` at 999 Hz into `file`.
fn record_burn(bin: &Path, secs: u64, file: &Path) -> Result {
    let out = util::root().join("bench-out");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    let burn = out.join("burn");
    util::status(
        Command::new("gcc")
            .args(["-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline", "-o"])
            .arg(&burn)
            .arg(util::root().join("tests/workloads/burn.c")),
    )?;
    let burns: Vec<Child> = (0..2)
        .map(|cpu| {
            Command::new("taskset")
                .args(["-c", &cpu.to_string()])
                .arg(&burn)
                .arg((secs + 5).to_string())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("burn: {e}"))
        })
        .collect::<Result<_>>()?;
    let status = util::status(
        Command::new(bin)
            .args(["record", "-F", "999", "-d", &secs.to_string(), "-o"])
            .arg(file),
    );
    for mut b in burns {
        let _ = b.kill();
        let _ = b.wait();
    }
    status
}

/// Best wall-clock time of 3 runs of `bin args`, s.
fn best_of_3(bin: &Path, name: &str, args: &[&str]) -> std::result::Result<f64, String> {
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let t = Instant::now();
        let status = Command::new(bin)
            .args(args)
            .stdout(Stdio::null())
            .status()
            .map_err(|e| format!("{name}: {e}"))?;
        if !status.success() {
            return Err(format!("{name} failed: {status}"));
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    Ok(best)
}

fn diff(secs: u64) -> Result {
    let bin = release_bin()?;
    let out = util::root().join("bench-out");
    let (base, new) = (out.join("diff-base.ebpr"), out.join("diff-new.ebpr"));
    record_burn(&bin, secs, &base)?;
    record_burn(&bin, secs, &new)?;
    let (b, n) = (base.to_string_lossy(), new.to_string_lossy());
    println!(
        "# bench diff: two {secs} s recordings at 999 Hz on 2 CPUs ({} + {} MiB); best of 3 wall-clock runs",
        std::fs::metadata(&base).map(|m| m.len()).unwrap_or(0) >> 20,
        std::fs::metadata(&new).map(|m| m.len()).unwrap_or(0) >> 20
    );
    let reports = best_of_3(&bin, "report base", &["report", "--by", "function", &b])?
        + best_of_3(&bin, "report new", &["report", "--by", "function", &n])?;
    println!("{:<40} {:>8} {:>8}", "command", "best s", "ratio");
    println!(
        "{:<40} {reports:>8.3} {:>8}",
        "report --by function, base + new", "1.00"
    );
    let cases: [(&str, Vec<&str>); 3] = [
        ("diff (table, by function)", vec!["diff", &b, &n]),
        (
            "diff --format svg",
            vec!["diff", &b, &n, "--format", "svg", "-o", "/dev/null"],
        ),
        ("diff --by process", vec!["diff", &b, &n, "--by", "process"]),
    ];
    for (name, args) in cases {
        let t = best_of_3(&bin, name, &args)?;
        println!("{name:<40} {t:>8.3} {:>8.2}", t / reports);
    }
    Ok(())
}

fn outputs(secs: u64) -> Result {
    let bin = release_bin()?;
    let out = util::root().join("bench-out");
    let file = out.join("outputs.ebpr");
    record_burn(&bin, secs, &file)?;
    let size = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    println!(
        "# bench outputs: {secs} s recording at 999 Hz on 2 CPUs ({} MiB); best of 3 wall-clock runs",
        size >> 20
    );
    let f = file.to_string_lossy().into_owned();
    let cases: [(&str, Vec<&str>); 7] = [
        ("report", vec!["report", &f]),
        (
            "report --by function",
            vec!["report", "--by", "function", &f],
        ),
        (
            "report --format json",
            vec!["report", "--format", "json", &f],
        ),
        (
            "flamegraph (svg)",
            vec!["flamegraph", &f, "-o", "/dev/null"],
        ),
        (
            "flamegraph --format pprof",
            vec!["flamegraph", "--format", "pprof", &f, "-o", "/dev/null"],
        ),
        (
            "flamegraph --format collapsed",
            vec!["flamegraph", "--format", "collapsed", &f, "-o", "/dev/null"],
        ),
        (
            "flamegraph --format speedscope",
            vec![
                "flamegraph",
                "--format",
                "speedscope",
                &f,
                "-o",
                "/dev/null",
            ],
        ),
    ];
    println!("{:<34} {:>10}", "command", "best s");
    for (name, args) in cases {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            let status = Command::new(&bin)
                .args(&args)
                .stdout(Stdio::null())
                .status()
                .map_err(|e| format!("{name}: {e}"))?;
            if !status.success() {
                return Err(format!("{name} failed: {status}"));
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{name:<34} {best:>10.3}");
    }
    Ok(())
}

fn top(secs: u64) -> Result {
    let bin = release_bin()?;
    let mut child = Command::new(&bin)
        .args(["top", "--batch", "-i", "1", "-n", &secs.to_string()])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("top: {e}"))?;
    let started = Instant::now();
    let mut status = 0;
    // SAFETY: rusage is plain data; wait4 on our own child fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers; the child has not been reaped.
    if unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) } < 0 {
        return Err(format!("wait4: {}", std::io::Error::last_os_error()));
    }
    let _ = child.try_wait();
    let wall = started.elapsed().as_secs_f64();
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = tv(usage.ru_utime) + tv(usage.ru_stime);
    println!(
        "# bench top: `energy-bpf top --batch -i 1 -n {secs}` (capture + energy + attribution + rendering)"
    );
    println!(
        "wall {wall:.1} s, CPU {cpu:.3} s = {:.2}% of one CPU, peak RSS {} MiB",
        100.0 * cpu / wall,
        usage.ru_maxrss / 1024
    );
    Ok(())
}
