//! One pipeline for every output: on the same recording, `report`'s processes, the sum of
//! `report --window 1` windows and the sum of `top --replay --batch --format json -i 1`
//! frames agree per process, in absolute joules. `report` builds the exact timeline of
//! every switch; `top` (live and `--replay`) folds switches into per-interval runs as they
//! come: each replayed frame also agrees with the report window of the same span.
//!
//! The recording pins `--energy-source model` so it holds on machines with real counters
//! too; with the time split and the model's fixed idle power, windows add up exactly, so
//! 0.1% is room for rounding, not for a different computation.

use std::collections::BTreeMap;

use crate::util::{Workload, require_root, run, text};

/// Joules per pid summed over every domain of some `processes[]` arrays.
fn joules_by_pid<'a>(arrays: impl Iterator<Item = &'a serde_json::Value>) -> BTreeMap<u64, f64> {
    let mut out = BTreeMap::new();
    for processes in arrays {
        for p in processes.as_array().expect("processes[] is an array") {
            let pid = p["pid"].as_u64().expect("pid");
            let j: f64 = p["energy_j"]
                .as_object()
                .expect("energy_j is an object")
                .values()
                .map(|v| v.as_f64().expect("joules"))
                .sum();
            *out.entry(pid).or_default() += j;
        }
    }
    out
}

fn assert_agree(what: &str, want: &BTreeMap<u64, f64>, got: &BTreeMap<u64, f64>, context: &str) {
    let total: f64 = want.values().sum();
    assert!(total > 0.0, "the report attributed no energy");
    for (pid, &w) in want {
        let g = got.get(pid).copied().unwrap_or(0.0);
        // 0.1% of the process, with a floor of 1e-6 of the total for processes of a few µJ.
        let tol = (w.abs() * 1e-3).max(total * 1e-6);
        assert!(
            (g - w).abs() <= tol,
            "{what}: pid {pid} has {g} J, report says {w} J ({context})"
        );
    }
    for (pid, &g) in got {
        assert!(
            want.contains_key(pid) || g.abs() <= total * 1e-6,
            "{what}: pid {pid} has {g} J but is not in the report ({context})"
        );
    }
}

#[test]
fn report_windows_and_replayed_frames_agree_per_process() {
    if !require_root("report_windows_and_replayed_frames_agree_per_process") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("x.ebpr");
    let path = file.to_str().expect("utf-8 path");
    let busy = Workload::spawn("while :; do :; done", Some(0));
    // Short-lived processes too, so some start and end inside windows.
    let churn = Workload::spawn(
        "while :; do sh -c 'i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done'; sleep 0.05; done",
        Some(1),
    );
    let out = run(&[
        "record",
        "-d",
        "4",
        "-F",
        "99",
        "--energy-source",
        "model",
        "-o",
        path,
    ]);
    drop((busy, churn));
    assert!(out.status.success(), "record failed: {}", text(&out));

    let whole = run(&["report", "--format", "json", path]);
    assert!(whole.status.success(), "{}", text(&whole));
    let whole: serde_json::Value = serde_json::from_slice(&whole.stdout).expect("report JSON");
    let want = joules_by_pid(std::iter::once(&whole["processes"]));
    assert!(want.len() >= 3, "too few processes: {want:?}");

    let windowed = run(&["report", "--window", "1", "--format", "json", path]);
    assert!(windowed.status.success(), "{}", text(&windowed));
    let windowed: serde_json::Value =
        serde_json::from_slice(&windowed.stdout).expect("windowed JSON");
    let windows = windowed["windows"].as_array().expect("windows[]");
    assert!(windows.len() >= 4, "{} windows for 4 s", windows.len());
    for pair in windows.windows(2) {
        assert_eq!(pair[0]["end_ns"], pair[1]["start_ns"], "windows tile time");
    }
    let context = format!(
        "power model {} whole, {:?} per window; {} events lost",
        whole["power_model"],
        windows
            .iter()
            .map(|w| w["power_model"].to_string())
            .collect::<Vec<_>>(),
        whole["lost_events"]
    );
    assert_agree(
        "report --window 1",
        &want,
        &joules_by_pid(windows.iter().map(|w| &w["processes"])),
        &context,
    );
    // Conservation in every document: rows + idle/static + unknown = measured.
    for doc in windows.iter().chain(std::iter::once(&whole)) {
        let rows: f64 = joules_by_pid(std::iter::once(&doc["processes"]))
            .values()
            .sum();
        let idle = doc["idle_j"].as_f64().expect("idle_j");
        let unknown = doc["unknown_j"].as_f64().expect("unknown_j");
        let total = doc["total_j"].as_f64().expect("total_j");
        assert!(
            (rows + idle + unknown - total).abs() <= total * 1e-6,
            "rows {rows} + idle {idle} + unknown {unknown} != {total} J"
        );
    }
    let total_windows: f64 = windows
        .iter()
        .map(|w| w["total_j"].as_f64().expect("total_j"))
        .sum();
    let total = whole["total_j"].as_f64().expect("total_j");
    assert!(
        (total_windows - total).abs() <= total * 1e-3,
        "{total_windows} vs {total}"
    );

    let replay = run(&[
        "top", "--replay", path, "--batch", "--format", "json", "-i", "1",
    ]);
    assert!(replay.status.success(), "{}", text(&replay));
    let frames: Vec<serde_json::Value> = String::from_utf8_lossy(&replay.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON document per line"))
        .collect();
    assert_eq!(frames.len(), windows.len(), "one frame per window");
    for f in &frames {
        assert!(f["start_ns"].as_u64() < f["end_ns"].as_u64(), "{f}");
        // Same keys as the report's process rows.
        if let (Some(a), Some(b)) = (
            f["processes"].as_array().and_then(|p| p.first()),
            whole["processes"].as_array().and_then(|p| p.first()),
        ) {
            for key in [
                "pid", "comm", "cpu_ns", "samples", "energy_j", "power_w", "share", "ci_j",
                "threads",
            ] {
                assert!(
                    a.get(key).is_some() && b.get(key).is_some(),
                    "{key} missing"
                );
            }
        }
    }
    // The folded path (top) against the exact one (report), window by window.
    for (w, f) in windows.iter().zip(&frames) {
        assert_eq!(
            (&w["start_ns"], &w["end_ns"]),
            (&f["start_ns"], &f["end_ns"]),
            "same spans"
        );
        assert_agree(
            "top --replay frame (folded) against report --window 1 (exact)",
            &joules_by_pid(std::iter::once(&w["processes"])),
            &joules_by_pid(std::iter::once(&f["processes"])),
            &context,
        );
    }
    assert_agree(
        "top --replay",
        &want,
        &joules_by_pid(frames.iter().map(|f| &f["processes"])),
        &context,
    );
}

/// Removes a test cgroup on drop (after its processes are gone).
struct TestCgroup(std::path::PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[test]
fn report_names_containers_from_recorded_cgroup_paths() {
    if !require_root("report_names_containers_from_recorded_cgroup_paths") {
        return;
    }
    let _guard = crate::util::exclusive();
    let id = "e1e2e3e4e5e6e7e8e9e0a1a2a3a4a5a6a7a8a9b0b1b2b3b4b5b6b7b8b9c0c1c2";
    let mount = energy_bpf::capture::host::cgroup2_mount();
    let cg = TestCgroup(std::path::Path::new(mount).join(format!("docker-{id}.scope")));
    std::fs::create_dir_all(&cg.0).expect("create a cgroup (cgroup v2, root)");
    let busy = Workload::spawn("while :; do :; done", Some(0));
    std::fs::write(cg.0.join("cgroup.procs"), busy.pid().to_string()).expect("move into it");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("c.ebpr");
    let path = file.to_str().expect("utf-8 path");
    let out = run(&["record", "-d", "2", "--energy-source", "model", "-o", path]);
    let pid = busy.pid();
    drop(busy);
    assert!(out.status.success(), "{}", text(&out));

    let report = crate::util::report_json(&file);
    let row = crate::util::process(&report, pid).expect("the busy process");
    assert_eq!(row["container_id"], id, "{row}");
    assert!(
        row["cgroup"]
            .as_str()
            .is_some_and(|c| c.ends_with(&format!("docker-{id}.scope")))
    );
    let table = run(&["report", "--by", "container", path]);
    let text = text(&table);
    assert!(table.status.success(), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with(id)),
        "a row for the container:\n{text}"
    );
    assert!(text.contains("[host]"), "the rest is the host:\n{text}");
}
