//! `cargo xtask bench outputs`, `diff` and `top`: our commands on a real recording of
//! `burn`, timed against what a user would otherwise run.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::Instant,
};

use super::release_bin;
use crate::util::{self, Result};

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

pub(super) fn diff(secs: u64) -> Result {
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

pub(super) fn outputs(secs: u64) -> Result {
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

pub(super) fn top(secs: u64) -> Result {
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
