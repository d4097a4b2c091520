//! `cargo xtask bench overhead`: a CPU-bound and a context-switch-heavy workload, each
//! alone, under `energy-bpf record` and under `perf record -a`, in rotating rounds; then
//! the unwind tables' memory and build time.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Instant,
};

use super::{RecorderCost, median, quartiles, start_recorder, stop_recorder, tempfile_dir};
use crate::util::{self, Result};

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

pub(super) fn run(rounds: usize) -> Result {
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
