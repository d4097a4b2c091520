//! The activity counter through the real `sched_switch` probe: a software event (this VM
//! has no hardware counters) chosen with `--activity-event`, counted per run, stored in the
//! recording and used by attribution. Cycles take the same path where the PMU has them.

use energy_bpf::record;

use crate::util::{Workload, process, report_json, require_root, run, text};

#[test]
fn software_activity_event_is_counted_per_run_and_weighs_the_split() {
    if !require_root("software_activity_event_is_counted_per_run_and_weighs_the_split") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("activity.ebpr");
    let busy = Workload::spawn("while :; do :; done", Some(0));
    crate::util::wait_running(busy.pid(), 100_000_000);
    let out = run(&[
        "record",
        "-d",
        "3",
        "--activity-event",
        "task-clock",
        "-o",
        file.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));

    let rec = record::read_file(&file).expect("recording reads back");
    assert_eq!(rec.header.activity_event, "task-clock");
    // The busy loop's runs carry counts, and task-clock counts ns: a run's count is its
    // length (the probe reads at the switch, a few µs after the timestamp at most).
    let timeline = energy_bpf::timeline::Timeline::of(&rec);
    let (mut counted_ns, mut count, mut runs) = (0u64, 0u64, 0);
    for run in timeline.cpus.iter().flat_map(|c| c.runs()) {
        if run.tgid == busy.pid()
            && let Some(a) = run.activity
        {
            counted_ns += run.len_ns();
            count += a;
            runs += 1;
        }
    }
    assert!(
        runs > 0 && count > 0,
        "no counted runs of the busy loop {}: {} switch events, {} with counts",
        busy.pid(),
        rec.switches.len(),
        rec.switches.iter().filter(|s| s.activity.is_some()).count()
    );
    let ratio = count as f64 / counted_ns as f64;
    assert!(
        (0.9..=1.1).contains(&ratio),
        "task-clock counted {count} over {counted_ns} ns of {runs} runs ({ratio:.3}/ns)"
    );

    // Attribution says it used the counts, and the busy loop gets energy by them.
    let report = report_json(&file);
    assert_eq!(report["activity"]["event"], "task-clock", "{report:#}");
    assert_eq!(report["activity"]["weighted"], true, "{report:#}");
    let coverage = report["activity"]["coverage"].as_f64().expect("coverage");
    assert!(
        coverage > 0.5,
        "only {:.0}% of busy time counted",
        coverage * 100.0
    );
    let b = process(&report, busy.pid()).expect("busy loop in the report");
    let joules = b["energy_j"]["package"].as_f64().expect("package J");
    assert!(joules > 0.0, "busy loop got no energy: {b:#}");

    let table = run(&["report", file.to_str().expect("path")]);
    assert!(
        text(&table).contains("activity: task-clock ("),
        "report header: {}",
        text(&table)
    );
}

#[test]
fn without_a_counter_every_output_says_time() {
    if !require_root("without_a_counter_every_output_says_time") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("none.ebpr");
    let out = run(&[
        "record",
        "-d",
        "1",
        "--activity-event",
        "none",
        "-o",
        file.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    let report = report_json(&file);
    assert_eq!(report["activity"]["weighted"], false, "{report:#}");
    let table = run(&["report", file.to_str().expect("path")]);
    assert!(
        text(&table).contains("activity: none: split by time"),
        "{}",
        text(&table)
    );
    // Asking for cycles where the PMU has none is a clear error, not a silent fallback.
    let cycles = run(&[
        "record",
        "-d",
        "1",
        "--activity-event",
        "cycles",
        "-o",
        file.to_str().expect("path"),
    ]);
    if !cycles.status.success() {
        assert!(
            text(&cycles).contains("--activity-event none"),
            "{}",
            text(&cycles)
        );
    }
}
