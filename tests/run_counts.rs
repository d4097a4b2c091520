//! Run counters (`record --activity-events`) through the real probes: software events
//! stand in for the hardware ones this VM lacks and take the same path (opened per CPU,
//! read at every switch and sampler tick, stored as `RunCounts`, split over the stack
//! samples). `report --by function --roofline` on a recording without hardware counts says
//! which event is missing and why, shows the machine-level roofline, and succeeds.

use std::{collections::HashMap, path::Path, process::Command};

use energy_bpf::{
    analysis,
    record::{self, Recording},
    roofline::per_function,
};

use crate::util::{bin, exclusive, require_root, run, text};

/// `tests/workloads/faults.c`: one thread alternating page faults and pure arithmetic.
fn build_faults(dir: &Path) -> std::path::PathBuf {
    let src = crate::util::workload("faults.c");
    let out = dir.join("faults");
    crate::util::gcc(&src, &out, &["-O1", "-g", "-fno-omit-frame-pointer"])
}

/// Records `faults 2` with page faults, cpu-clock and instructions counted per interval.
fn record_faults(dir: &Path) -> (std::path::PathBuf, String) {
    let prog = build_faults(dir);
    let file = dir.join("faults.ebpr");
    let out = Command::new(bin())
        .args(["record", "-F", "199", "--energy-source", "model"])
        .args([
            "--activity-events",
            "page-faults,cpu-clock,instructions",
            "-o",
        ])
        .arg(&file)
        .arg("--")
        .arg(&prog)
        // 2 s, and on until 1.5 s of CPU: enough intervals and faults on any machine.
        .args(["2", "1.5"])
        .output()
        .expect("run energy-bpf record");
    assert!(out.status.success(), "record failed: {}", text(&out));
    (file, text(&out))
}

/// Page faults of samples with `function` anywhere on their stack.
fn faults_under(profile: &energy_bpf::profile::Profile, function: &str) -> f64 {
    let idx = profile
        .value_index(&per_function::value_name("page-faults"))
        .expect("page-fault values");
    profile
        .samples
        .iter()
        .filter(|s| {
            s.frames
                .iter()
                .any(|&f| profile.frames[f as usize].function == function)
        })
        .map(|s| s.values[idx])
        .sum()
}

#[test]
fn software_run_counters_are_counted_per_interval_and_reach_the_right_function() {
    if !require_root("software_run_counters_are_counted_per_interval_and_reach_the_right_function")
    {
        return;
    }
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, said) = record_faults(dir.path());
    assert!(
        said.contains("counting page-faults per run"),
        "record says what it counts: {said}"
    );
    let rec: Recording = record::read_file(&file).expect("recording reads back");
    let names: Vec<&str> = rec
        .header
        .run_counters
        .iter()
        .map(|c| c.event.as_str())
        .collect();
    assert_eq!(names, ["page-faults", "cpu-clock", "instructions"]);
    assert!(
        rec.header.run_counters[..2]
            .iter()
            .all(|c| c.unavailable.is_empty())
    );
    let pmu = Path::new("/sys/bus/event_source/devices/cpu").exists();
    if !pmu {
        let why = &rec.header.run_counters[2].unavailable;
        assert!(
            why.contains("perf_event_open(instructions)") && why.contains("ENOENT"),
            "the missing PMU is named with its errno: {why:?}"
        );
    }

    // cpu-clock counts ns: per CPU, the counted intervals of the workload add up to the
    // time between their reads.
    let prog_tid: u32 = rec
        .threads
        .values()
        .find(|t| t.comm == "faults")
        .map(|t| t.tid)
        .expect("the workload's thread is known");
    let mut per_cpu: HashMap<u32, Vec<_>> = HashMap::new();
    for r in &rec.run_counts {
        per_cpu.entry(r.cpu).or_default().push(*r);
    }
    let (mut counted_ns, mut between_ns, mut lengths) = (0u64, 0u64, Vec::new());
    for runs in per_cpu.values_mut() {
        runs.sort_by_key(|r| r.ts_ns);
        for pair in runs.windows(2) {
            if pair[1].tid == prog_tid
                && let Some(ns) = pair[1].counts[1]
            {
                counted_ns += ns;
                between_ns += pair[1].ts_ns - pair[0].ts_ns;
                lengths.push(pair[1].ts_ns - pair[0].ts_ns);
            }
        }
    }
    assert!(
        lengths.len() > 100,
        "{} counted intervals of the workload",
        lengths.len()
    );
    let ratio = counted_ns as f64 / between_ns as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "cpu-clock {counted_ns} ns over {between_ns} ns between reads ({ratio:.3})"
    );
    // Intervals end at ticks too: a busy thread's are at most about one period (5 ms).
    lengths.sort_unstable();
    let median_ms = lengths[lengths.len() / 2] as f64 / 1e6;
    assert!(median_ms < 7.5, "median interval {median_ms:.2} ms");

    // Per function: the faults are under fault_pages, not spin, though one thread ran both.
    let cfg = analysis::config(
        &rec,
        energy_bpf::attribute::Options::default(),
        &analysis::ModelOverride::default(),
    );
    let a = analysis::analyze(&rec, &cfg);
    let events: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let profile = per_function::profile(&rec, &a, &events);
    let (faulting, spinning) = (
        faults_under(&profile, "fault_pages"),
        faults_under(&profile, "spin"),
    );
    eprintln!(
        "run counters: {} intervals, cpu-clock/time {ratio:.4}, median interval {median_ms:.2} ms, \
         page faults under fault_pages {faulting:.0}, under spin {spinning:.0}",
        lengths.len()
    );
    assert!(
        faulting > 2000.0 && faulting >= 0.85 * (faulting + spinning),
        "page faults under fault_pages {faulting:.0}, under spin {spinning:.0}"
    );
    // No count lost or made up: samples plus residuals hold every busy interval's faults.
    let idx = profile
        .value_index(&per_function::value_name("page-faults"))
        .expect("values");
    let in_profile: f64 = profile.samples.iter().map(|s| s.values[idx]).sum();
    let counted: f64 = rec
        .run_counts
        .iter()
        .filter(|r| r.tid != 0)
        .filter_map(|r| r.counts[0])
        .map(|n| n as f64)
        .sum();
    assert!(
        (in_profile - counted).abs() <= 1e-6 * counted.max(1.0),
        "profile {in_profile} vs counted {counted}"
    );
}

/// A calibration file whose roofline for `host` races to halt (B_τ = 4, B_ε = 2).
fn calibration_with_roofline(path: &Path, host: &str) {
    let fit = serde_json::json!({
        "kernels": 11, "energy_residual_median": 0.01, "energy_residual_max": 0.02,
        "time_residual_median": 0.01, "time_residual_max": 0.02, "energy_r2": 0.99,
        "intervals": {"const_w": [1.9, 2.1], "j_per_flop": [1e-10, 1e-10],
            "j_per_byte": [2e-10, 2e-10], "s_per_flop": [1e-10, 1e-10], "s_per_byte": [4e-10, 4e-10]}
    });
    let cal = serde_json::json!({
        "version": 1,
        "hosts": {host: {"sources": {"powercap:package-0": {
            "date": "2026-01-01T00:00:00Z", "duration_s": 5.0,
            "key": "powercap:package-0", "name": "package-0", "static_w": 2.0,
            "per_busy_cpu_w": null, "busy_share": 0.0, "method": "idle_median", "intervals": 10,
            "roofline": {
                "estimated": false, "isa": "avx2+fma", "buffer_bytes": 67108864,
                "threads": 2, "const_w": 2.0, "j_per_flop": 1e-10, "j_per_byte": 2e-10,
                "s_per_flop": 1e-10, "s_per_byte": 4e-10,
                "time_balance": 4.0, "energy_balance": 2.0, "effective_energy_balance": 1.6,
                "eta_flop": 0.333, "race_to_halt": true, "fit": fit, "kernels": []
            }
        }}}}
    });
    std::fs::write(path, format!("{cal:#}")).expect("write calibration");
    energy_bpf::calibration::CalibrationFile::load(path).expect("a valid calibration file");
}

#[test]
fn roofline_report_without_hardware_counts_says_why_and_shows_the_machine() {
    if !require_root("roofline_report_without_hardware_counts_says_why_and_shows_the_machine") {
        return;
    }
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let (file, _) = record_faults(dir.path());
    let rec = record::read_file(&file).expect("recording reads back");
    let cal = dir.path().join("calibration.json");
    calibration_with_roofline(&cal, &rec.header.hostname);
    let f = file.to_str().expect("path");
    let c = cal.to_str().expect("path");

    let out = run(&[
        "report",
        f,
        "--by",
        "function",
        "--roofline",
        "--calibration",
        c,
    ]);
    let said = text(&out);
    assert!(out.status.success(), "the report must not fail: {said}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("time balance B_τ = 4.000 flop/byte"),
        "{stdout}"
    );
    assert!(stdout.contains("race to halt: saves energy"), "{stdout}");
    assert!(stdout.contains("per function: not available: "), "{stdout}");
    // llc-misses was never asked for; instructions, where there is no PMU, failed to open.
    if !Path::new("/sys/bus/event_source/devices/cpu").exists() {
        assert!(
            stdout.contains("instructions could not be counted when recording")
                && stdout.contains("ENOENT")
                && stdout.contains("PMU"),
            "names the event, the errno and what to do: {stdout}"
        );
    } else {
        assert!(stdout.contains("llc-misses was not counted"), "{stdout}");
    }
    assert!(said.contains("warning: no per-function roofline"), "{said}");

    let json = run(&[
        "report",
        f,
        "--by",
        "function",
        "--roofline",
        "--calibration",
        c,
        "--format",
        "json",
    ]);
    assert!(json.status.success(), "{}", text(&json));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(v["machine"]["race_to_halt"], true, "{v:#}");
    assert!(v["per_function_unavailable"].as_str().is_some(), "{v:#}");
    assert_eq!(v["functions"].as_array().map(Vec::len), Some(0), "{v:#}");

    // Without `--by function` it is refused with what to do, non-zero.
    let wrong = run(&["report", f, "--roofline", "--calibration", c]);
    assert!(!wrong.status.success());
    assert!(
        text(&wrong).contains("use it with `--by function`"),
        "{}",
        text(&wrong)
    );
    // A calibration without a roofline: what to run, non-zero.
    let plain = dir.path().join("plain.json");
    std::fs::write(&plain, r#"{"version":1,"hosts":{}}"#).expect("write");
    let none = run(&[
        "report",
        f,
        "--by",
        "function",
        "--roofline",
        "--calibration",
        plain.to_str().expect("path"),
    ]);
    assert!(!none.status.success());
    assert!(
        text(&none).contains("calibrate --roofline"),
        "{}",
        text(&none)
    );
}
