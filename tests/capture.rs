//! Real probes on the running kernel: a pinned busy loop and a sleeper, recorded for a
//! few seconds, and the rebuilt timeline checked against what they must have done.

use crate::util::{Workload, process, report_json, require_root, run, text};

const HZ: u64 = 99;

#[test]
fn busy_loop_owns_its_cpu_and_sleeper_barely_runs() {
    if !require_root("busy_loop_owns_its_cpu_and_sleeper_barely_runs") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("busy.ebpr");
    let busy = Workload::spawn("while :; do :; done", Some(0));
    let sleeper = Workload::spawn("while :; do sleep 0.2; done", Some(1));
    crate::util::wait_running(busy.pid(), 100_000_000);
    // The truth: the share of wall time the kernel gave the busy loop while `record` ran
    // (probe loading included). Alone on CPU 0 that is ~100%; on a loaded machine less,
    // and the recording must show what it got, not what it would get alone.
    let (wall0, on_cpu0) = (
        std::time::Instant::now(),
        crate::util::on_cpu_ns(busy.pid()),
    );
    let out = run(&[
        "record",
        "-F",
        &HZ.to_string(),
        "-d",
        "4",
        "-o",
        file.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    let got =
        (crate::util::on_cpu_ns(busy.pid()) - on_cpu0) as f64 / wall0.elapsed().as_nanos() as f64;
    let report = report_json(&file);
    let duration_ns = report["duration_ns"].as_u64().expect("duration_ns");
    assert!(
        duration_ns >= 3_900_000_000,
        "recorded {duration_ns} ns, asked for 4 s"
    );

    let b = process(&report, busy.pid())
        .unwrap_or_else(|| panic!("busy loop {} missing: {report:#}", busy.pid()));
    let busy_ns = b["cpu_ns"].as_u64().expect("cpu_ns");
    let share = busy_ns as f64 / duration_ns as f64;
    eprintln!(
        "busy loop: {:.1}% of CPU 0 recorded, {:.1}% measured by the kernel",
        share * 100.0,
        got * 100.0
    );
    assert!(
        share >= 0.95 * got,
        "busy loop pinned to CPU 0 got {:.1}% of it in the recording, {:.1}% by the kernel's \
         account",
        share * 100.0,
        got * 100.0
    );
    assert!(
        share <= 1.001,
        "busy loop cannot exceed one CPU: {:.2}%",
        share * 100.0
    );

    let samples = b["samples"].as_u64().expect("samples") as f64;
    // cpu-clock samples the task on the CPU: one per 1/HZ s of its CPU time.
    let expected = HZ as f64 * busy_ns as f64 / 1e9;
    assert!(
        (samples - expected).abs() <= 0.05 * expected,
        "busy loop has {samples} samples, expected {expected:.0} ± 5% at {HZ} Hz for \
         {busy_ns} ns on CPU"
    );

    // The sleeper's shell wakes 5 times a second for a fork+exec of sleep: well under 1%.
    let sleeper_ns = process(&report, sleeper.pid())
        .and_then(|p| p["cpu_ns"].as_u64())
        .unwrap_or(0);
    let sleeper_share = sleeper_ns as f64 / duration_ns as f64;
    assert!(
        sleeper_share < 0.01,
        "sleeper used {:.2}% of its CPU",
        sleeper_share * 100.0
    );
    assert_eq!(
        report["lost_events"], 0,
        "no events should be lost at this load"
    );
    assert!(
        report["unknown_ns"].as_u64().expect("unknown_ns") < duration_ns / 100,
        "timeline has unknown stretches: {report:#}"
    );
}

#[test]
fn command_mode_stops_when_the_command_exits() {
    if !require_root("command_mode_stops_when_the_command_exits") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("cmd.ebpr");
    let started = std::time::Instant::now();
    let out = run(&[
        "record",
        "-o",
        file.to_str().expect("path"),
        "--",
        "sh",
        "-c",
        "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    assert!(
        started.elapsed().as_secs() < 30,
        "record did not stop with its command"
    );
    assert!(text(&out).contains("command exited"), "{}", text(&out));
    let report = report_json(&file);
    let sh = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["comm"] == "sh" && p["samples"].as_u64().unwrap_or(0) > 0);
    assert!(
        sh.is_some(),
        "the command's samples are recorded: {report:#}"
    );
    // Its mappings, read at its first sample, are recorded with build-ids (so the
    // recording symbolizes after the process is gone).
    let rec = energy_bpf::record::read_file(&file).expect("read recording");
    let shells: Vec<u32> = rec
        .threads
        .values()
        .filter(|t| t.comm == "sh" && rec.samples.iter().any(|s| s.tgid == t.tgid))
        .map(|t| t.tgid)
        .collect();
    assert!(!shells.is_empty(), "a sampled shell");
    for tgid in shells {
        let maps = rec.mappings.get(&tgid).map(Vec::as_slice).unwrap_or(&[]);
        assert!(
            maps.iter().any(|m| m.path.ends_with("sh")
                || m.path.ends_with("dash")
                || m.path.ends_with("bash")),
            "the sampled shell {tgid}'s own executable is among its mappings: {maps:?}"
        );
        assert!(
            maps.iter()
                .any(|m| m.path.contains("libc") && !m.build_id.is_empty()),
            "libc mapped by the time of its first sample, with its build-id: {maps:?}"
        );
    }
}

#[test]
fn lifecycle_events_name_forks_execs_and_exits() {
    use energy_bpf::pb::v1::process_event::Kind;
    if !require_root("lifecycle_events_name_forks_execs_and_exits") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("life.ebpr");
    let out = run(&[
        "record",
        "-o",
        file.to_str().expect("path"),
        "--",
        "sh",
        "-c",
        "sleep 0.3 & wait",
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    let rec = energy_bpf::record::read_file(&file).expect("read recording");
    let sh = rec
        .process_events
        .iter()
        .find(|e| e.kind() == Kind::Exec && e.comm == "sleep")
        .expect("exec of sleep recorded");
    let fork = rec
        .process_events
        .iter()
        .find(|e| e.kind() == Kind::Fork && e.child_tgid == sh.tgid)
        .expect("fork that created the sleep process, with the child's pid read from task_struct");
    assert_ne!(fork.tgid, fork.child_tgid, "a new process, not a thread");
    assert!(fork.ts_ns < sh.ts_ns, "fork precedes exec");
    let exit = rec
        .process_events
        .iter()
        .find(|e| e.kind() == Kind::Exit && e.tgid == sh.tgid)
        .expect("exit of the sleep process");
    let lived = exit.ts_ns - sh.ts_ns;
    assert!(
        (250_000_000..2_000_000_000).contains(&lived),
        "sleep 0.3 lived {lived} ns"
    );
    let info = rec
        .threads
        .get(&sh.tgid)
        .expect("thread info for the sleep process");
    assert_eq!(info.comm, "sleep");
    // A process's mappings are read at its first sample: the shell, which mostly waits,
    // has them exactly when it was sampled.
    let sampled = rec.samples.iter().any(|s| s.tgid == fork.tgid);
    assert_eq!(
        rec.mappings.get(&fork.tgid).is_some_and(|m| !m.is_empty()),
        sampled,
        "the shell's mappings are recorded if and only if it was sampled"
    );
}

/// Work that repeats at exactly twice the sampling period (`tests/workloads/phase.c`: 3/4
/// of each 2/999 s of its CPU time in `phase_heavy`, 1/4 in `phase_light`), recorded at
/// 999 Hz: the two functions' samples must split as the CPU time the workload measured in
/// each, within four standard errors of the counts (never under 10%). A timer at a fixed
/// 999 Hz meets such a loop at nearly the same phase for seconds and gives one function
/// most of the samples; the sampler's wandering rate (`capture/sampler.rs`) must not.
#[test]
fn work_periodic_at_the_sampling_period_is_sampled_in_proportion() {
    if !require_root("work_periodic_at_the_sampling_period_is_sampled_in_proportion") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = crate::util::gcc(
        &crate::util::workload("phase.c"),
        &dir.path().join("phase"),
        &["-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline"],
    );
    let file = dir.path().join("phase.ebpr");
    // 2/999 s; on until phase_light has had 2 s of CPU (about 2,000 samples), at most 60 s.
    let period_ns = (2e9 / 999.0_f64).round().to_string();
    let out = run(&[
        "record",
        "--energy-source",
        "model",
        "--unwind",
        "fp",
        "-F",
        "999",
        "-o",
        file.to_str().expect("path"),
        "--",
        prog.to_str().expect("path"),
        &period_ns,
        "2",
        "60",
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    let measured = crate::util::time_s(&out.stdout)
        .unwrap_or_else(|| panic!("no `time_s HEAVY LIGHT` line: {}", text(&out)));
    let truth = measured[0] / measured[1];
    // Each function's share of the workload's stacks (its energy, which on the model
    // follows the samples), and the sample counts they stand for.
    let report = report_json(&file);
    let p = report["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["comm"] == "phase"))
        .unwrap_or_else(|| panic!("no phase process in {report}"));
    let (pid, all) = (
        p["pid"].as_u64().expect("pid").to_string(),
        p["samples"].as_u64().expect("samples"),
    );
    let stacks = crate::util::collapsed(&file, &["--domain", "package", "--pid", &pid]);
    let total: u64 = stacks.values().sum();
    let under = |name: &str| -> u64 {
        stacks
            .iter()
            .filter(|(s, _)| s.split(';').any(|f| f == name))
            .map(|(_, n)| n)
            .sum()
    };
    let (e_h, e_l) = (under("phase_heavy"), under("phase_light"));
    assert!(
        (e_h + e_l) as f64 >= 0.9 * total as f64,
        "{e_h} + {e_l} of {total} µJ under the two functions (want >= 90%): {stacks:?}"
    );
    let n = |e: u64| (all as f64 * e as f64 / total.max(1) as f64).round() as u64;
    let (n_h, n_l) = (n(e_h), n(e_l));
    // The workload ran until phase_light had 2 s of CPU: about 8,000 samples in all. The
    // counts must be enough to judge the split, not the split itself (a fixed rate gave
    // phase_light none).
    assert!(
        all >= 4000,
        "{all} samples of the workload: too few to judge how they split"
    );
    let ratio = e_h as f64 / e_l.max(1) as f64;
    let bound = (4.0 * (1.0 / n_h.max(1) as f64 + 1.0 / n_l.max(1) as f64).sqrt()).max(0.1);
    eprintln!(
        "phase_heavy/phase_light: {e_h} / {e_l} µJ = {ratio:.3} (about {n_h} / {n_l} of \
         {all} samples, {total} µJ), measured CPU time {:.3} / {:.3} s = {truth:.3}; \
         bound ±{:.1}%",
        measured[0],
        measured[1],
        bound * 100.0
    );
    assert!(
        (ratio / truth - 1.0).abs() <= bound,
        "energy split {ratio:.3}:1 between two functions that ran {truth:.3}:1 in CPU time \
         (bound ±{:.1}%): the sampler aliases with work periodic at its period",
        bound * 100.0
    );
}
