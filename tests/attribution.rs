//! End to end with real eBPF: an emulated RAPL package whose energy grows with the real
//! on-CPU time of two pinned workloads at different watts per CPU-second (read from
//! /proc/PID/schedstat every millisecond), recorded through `--sysfs-root`, then checked:
//! each workload's attributed energy against the emulated truth, and conservation.
//!
//! The truth is what the emulator put into the counter for each workload between the first
//! and last reading the recorder took, not watts × the workload's CPU time over the whole
//! recording: CPU time outside the readings' span has no measured energy to split.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use energy_bpf::clock::monotonic_ns;

use crate::util::{Recorder, Workload, process, reading_span, require_root, run, text};

const STATIC_W: f64 = 3.0;
const WATTS_A: f64 = 24.0;
const WATTS_B: f64 = 6.0;

/// On-CPU ns of a process's main thread, read with pread on a kept-open
/// /proc/PID/schedstat so the emulator itself stays a negligible load.
struct OnCpu(std::fs::File);

impl OnCpu {
    fn open(pid: u32) -> Self {
        Self(std::fs::File::open(format!("/proc/{pid}/schedstat")).expect("open schedstat"))
    }

    fn ns(&self) -> u64 {
        use std::os::unix::fs::FileExt as _;
        let mut buf = [0u8; 64];
        let n = self.0.read_at(&mut buf, 0).unwrap_or(0);
        std::str::from_utf8(&buf[..n])
            .ok()
            .and_then(|s| s.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// A busy/sleep duty cycle in Python (busy `on` ms, then sleep `off` ms, phases drifting),
/// pinned to one CPU.
pub(crate) fn duty_cycle(cpu: u32, on_ms: u32, off_ms: u32) -> Workload {
    let script = format!(
        "python3 -c 'import time\nwhile True:\n  t=time.monotonic()+{on}/1000\n  while time.monotonic()<t: pass\n  time.sleep({off}/1000)'",
        on = on_ms,
        off = off_ms
    );
    // exec so the pid we watch is the python process itself.
    Workload::spawn(&format!("exec {script}"), Some(cpu))
}

#[test]
fn emulated_rapl_energy_follows_real_cpu_time_per_process() {
    if !require_root("emulated_rapl_energy_follows_real_cpu_time_per_process") {
        return;
    }
    let _guard = crate::util::exclusive();
    let fake = crate::util::two_cpu_package();
    let (dir, sysfs, energy_file) = (&fake.dir, &fake.sysfs, fake.energy_uj.clone());

    // Periods of 115 ms and 83 ms drift against each other, so the two classes' CPU time is
    // not collinear over the regression's 50 ms rows. (With equal periods the phase stays
    // fixed and no regression can tell their watts apart.)
    let a = duty_cycle(0, 70, 45);
    let b = duty_cycle(1, 23, 60);
    crate::util::wait_running(a.pid(), 50_000_000);
    crate::util::wait_running(b.pid(), 20_000_000);
    let (pid_a, pid_b) = (a.pid(), b.pid());
    let stop = Arc::new(AtomicBool::new(false));
    let emulator = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt as _;
            let (cpu_a, cpu_b) = (OnCpu::open(pid_a), OnCpu::open(pid_b));
            // Rewritten in place with a fixed width, so every read sees a whole number.
            let out = std::fs::OpenOptions::new()
                .write(true)
                .open(&energy_file)
                .expect("energy_uj");
            let t0 = std::time::Instant::now();
            let (a0, b0) = (cpu_a.ns(), cpu_b.ns());
            // (CLOCK_MONOTONIC after the write, J put in for A, for B) per update.
            let mut log = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let dt_ns = t0.elapsed().as_nanos() as f64;
                let da = cpu_a.ns().saturating_sub(a0) as f64;
                let db = cpu_b.ns().saturating_sub(b0) as f64;
                // W × ns = nJ; /1000 = µJ, in whole µJ like the real counter.
                let uj = (STATIC_W * dt_ns + WATTS_A * da + WATTS_B * db) / 1000.0;
                out.write_all_at(format!("{:020}\n", uj as u64).as_bytes(), 0)
                    .expect("write energy_uj");
                log.push((monotonic_ns(), WATTS_A * da / 1e9, WATTS_B * db / 1e9));
                std::thread::sleep(Duration::from_millis(1));
            }
            log
        })
    };
    let file = dir.path().join("e2e.ebpr");
    let rec = Recorder::start(&[
        "-o",
        file.to_str().expect("path"),
        "--sysfs-root",
        sysfs.to_str().expect("path"),
    ]);
    std::thread::sleep(Duration::from_secs(20));
    rec.stop();
    stop.store(true, Ordering::Relaxed);
    let log = emulator.join().expect("emulator");
    let truth = truth_between_readings(&file, &log);

    let out = run(&[
        "report",
        "--format",
        "json",
        "--static-power-w",
        &STATIC_W.to_string(),
        file.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "report: {}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["estimated"], false, "a counter was read");
    assert_eq!(report["source"], "powercap");

    // Conservation: attributed + idle + unknown = measured, within 0.1%.
    let total = report["total_j"].as_f64().expect("total_j");
    let idle = report["idle_j"].as_f64().expect("idle_j");
    let unknown = report["unknown_j"].as_f64().expect("unknown_j");
    let attributed: f64 = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| p["energy_j"]["package"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(
        total > 20.0,
        "about 20 s at 3-30 W was measured, got {total} J"
    );
    let gap = (attributed + idle + unknown - total).abs() / total;
    assert!(
        gap < 0.001,
        "conservation: {attributed} + {idle} + {unknown} vs {total} J ({:.4}%)",
        gap * 100.0
    );

    // Each workload's energy against the emulated truth: its watts × its exact CPU time.
    // The emulated counter gives every other thread 0 W: this test's own emulator thread,
    // the recorder and kernel threads (together ~1.3 CPU-s of the ~19 here). The regression
    // cannot know that; its ridge pulls their one "other" class toward equal power, so about
    // 1-1.5% of the total lands on them and is missing from the two classes. Bound that too.
    let mut classes_j = 0.0;
    for (pid, watts, truth) in [(pid_a, WATTS_A, truth.0), (pid_b, WATTS_B, truth.1)] {
        let p = process(&report, pid).unwrap_or_else(|| panic!("pid {pid} missing: {report:#}"));
        let joules = p["energy_j"]["package"].as_f64().expect("package J");
        classes_j += joules;
        let err = (joules - truth) / truth;
        // The 6 W class holds ~10% of the energy, so a small misfit is a large relative
        // error for it. Over 11 quiet runs here the 24 W class stayed within -0.2..-2.0%
        // (at most 1.5% of the total) and the 6 W class within ±8.3%. Bound both the
        // relative error and the error as a share of the total.
        assert!(
            err.abs() < 0.15 && (joules - truth).abs() < 0.03 * total,
            "pid {pid} at {watts} W/CPU-s: attributed {joules:.2} J, truth {truth:.2} J ({:+.1}%, {:.2}% of total), power model {}",
            err * 100.0,
            100.0 * (joules - truth).abs() / total,
            report["power_model"]
        );
    }
    let others = attributed - classes_j;
    assert!(
        others < 0.03 * total,
        "threads the counter gives 0 W got {others:.2} J of {total:.2} J"
    );
    drop((a, b));
}

/// Energy the emulator put into the counter for A and for B between the recording's first
/// and last reading: each reading saw the last value written before it.
fn truth_between_readings(file: &std::path::Path, log: &[(u64, f64, f64)]) -> (f64, f64) {
    let (first, last) = reading_span(file);
    let at = |ts: u64| {
        let i = log.partition_point(|&(t, _, _)| t <= ts);
        assert!(i > 0, "a reading before the emulator's first write");
        (log[i - 1].1, log[i - 1].2)
    };
    let (a0, b0) = at(first);
    let (a1, b1) = at(last);
    (a1 - a0, b1 - b0)
}

/// The issue's machine on the real kernel (6 W static, 10 W per busy CPU-second, a process
/// pinned to CPU 0 that never sleeps, a second one half busy on CPU 1), recorded with no
/// `--static-power-w` and no calibration: static power has to be found from the recording
/// itself, and the pinned process's absolute joules must be right within 5%.
///
/// The counter charges every busy CPU-second of the machine (`util::BusyEmulator`), so
/// whatever else runs here draws the same watts as the workloads and the truth for any
/// process is 10 W × its CPU time, as the report counts it. With `--idle separate` static
/// power is the idle row and that is the whole expectation; with `--idle proportional` the
/// process also carries its busy-time share of the static energy, 6 W × the report's
/// duration × its share of all busy CPU time in the report. A report with the true static
/// power given comes first, as a control of the split and the emulator that holds however
/// busy the machine is; static power found from the recording needs idle time on CPU 1.
#[test]
fn pinned_process_absolute_joules_without_static_power_or_calibration() {
    if !require_root("pinned_process_absolute_joules_without_static_power_or_calibration") {
        return;
    }
    if !crate::util::unless_cpu_taken(
        "pinned_process_absolute_joules_without_static_power_or_calibration",
        "static power is identified only from idle time on the package, and a spinner leaves none",
    ) {
        return;
    }
    const STATIC: f64 = 6.0;
    const PER_CPU: f64 = 10.0;
    let _guard = crate::util::exclusive();
    let fake = crate::util::two_cpu_package();
    let (dir, sysfs) = (&fake.dir, &fake.sysfs);
    let _emulator = crate::util::BusyEmulator::start(&fake.energy_uj, STATIC, PER_CPU);
    // No calibration, even where the test machine has one at the default path.
    let none = dir.path().join("none.json");
    std::fs::write(&none, r#"{"version":1,"hosts":{}}"#).expect("write calibration");
    let none = none.to_str().expect("path");

    let pinned = Workload::spawn("while :; do :; done", Some(0));
    let half = duty_cycle(1, 1000, 1000);
    crate::util::wait_running(pinned.pid(), 100_000_000);
    crate::util::wait_running(half.pid(), 50_000_000);
    let file = dir.path().join("issue.ebpr");
    let file = file.to_str().expect("path");
    // The emulated tree, whatever this machine's real RAPL offers.
    let rec = Recorder::start(&[
        "-o",
        file,
        "--energy-source",
        "powercap",
        "--sysfs-root",
        sysfs.to_str().expect("path"),
        "--calibration",
        none,
    ]);
    std::thread::sleep(Duration::from_secs(20));
    rec.stop();
    drop(half);

    // First the control: the true static power given. That checks the split and the
    // emulator against each other whatever the load; then the recording alone.
    let given = STATIC.to_string();
    for (idle, static_arg) in [
        ("separate", Some(given.as_str())),
        ("separate", None),
        ("proportional", None),
    ] {
        let mut args = vec![
            "report",
            "--format",
            "json",
            "--idle",
            idle,
            "--calibration",
            none,
        ];
        if let Some(w) = static_arg {
            args.extend(["--static-power-w", w]);
        }
        args.push(file);
        let out = run(&args);
        assert!(out.status.success(), "report: {}", text(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(report["source"], "powercap", "{report:#}");
        let origin = &report["static"][0]["origin"]["kind"];
        let expected_origin_given = static_arg.is_some();
        assert!(
            (origin == "given") == expected_origin_given && origin != "calibrated",
            "static power must be found from the recording: {:#}",
            report["static"]
        );
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        let duration_s = report["duration_ns"].as_f64().expect("duration_ns") / 1e9;
        let busy_s = (report["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .map(|p| p["cpu_ns"].as_f64().unwrap_or(0.0))
            .sum::<f64>()
            + report["unknown_ns"].as_f64().unwrap_or(0.0))
            / 1e9;
        // Only variation in utilisation identifies static power: if other load kept every
        // CPU busy, nothing can (the report rightly says unidentified). Say so plainly.
        assert!(
            origin != "unidentified",
            "static power unidentified: {busy_s:.1} busy CPU-s in {duration_s:.1} s on {cpus} CPUs; \
             is other load filling CPU 1's idle time? rerun on a quieter machine. {:#}",
            report["static"]
        );
        let static_w = report["static"][0]["static_w"].as_f64().expect("static_w");
        let p = process(&report, pinned.pid()).unwrap_or_else(|| panic!("pinned missing"));
        let cpu_s = p["cpu_ns"].as_f64().expect("cpu_ns") / 1e9;
        let joules = p["energy_j"]["package"].as_f64().expect("package J");
        let expected = match idle {
            "separate" => PER_CPU * cpu_s,
            _ => PER_CPU * cpu_s + STATIC * duration_s * cpu_s / busy_s,
        };
        let err = (joules - expected) / expected;
        eprintln!(
            "--idle {idle}{}: pinned {cpu_s:.2} CPU-s, {joules:.2} J, expected {expected:.2} J ({:+.2}%); static {static_w:.2} W ({origin}), {busy_s:.2} busy CPU-s over {duration_s:.2} s",
            static_arg.map_or(String::new(), |w| format!(" --static-power-w {w}")),
            err * 100.0
        );
        // The issue's target: within 5% with static power given and without it. Found from
        // the recording, static power is extrapolated from 1 to 2 busy CPUs down to 0, so
        // the slope must be right: CPU 1's load changes every second (as a fleet machine's
        // does, over seconds), not every 50 ms, whose rows average to 1.5 busy CPUs and leave
        // the emulator's 10 ms write lag to bend the slope (-3% to -21% seen that way).
        let bound = 0.05;
        assert!(
            err.abs() < bound,
            "--idle {idle}: pinned process {joules:.2} J, expected {expected:.2} J ({:+.1}%, bound {:.0}%); static {static_w:.2} W ({origin}), {cpu_s:.2} CPU-s, {busy_s:.2} busy CPU-s over {duration_s:.2} s",
            err * 100.0,
            bound * 100.0
        );
    }
    drop(pinned);
}
