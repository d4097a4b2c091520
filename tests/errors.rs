//! Bad input and missing privileges: one clear line, non-zero exit, nothing lost.

use std::process::Command;

use crate::util::{bin, report_json, require_root, run, text};

fn recording(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("ok.ebpr");
    let out = run(&["record", "-d", "1.5", "-o", file.to_str().expect("path")]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    file
}

#[test]
fn truncated_recording_still_reports() {
    if !require_root("truncated_recording_still_reports") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    // Busy for 4 s at 999 Hz, so most of the file is sample chunks rather than the first
    // chunk's one-off thread names and mappings: half the file then holds part of the run.
    let busy = crate::util::Workload::spawn("while :; do :; done", None);
    let file = dir.path().join("ok.ebpr");
    let out = run(&[
        "record",
        "-F",
        "999",
        "-d",
        "4",
        "-o",
        file.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    drop(busy);
    let bytes = std::fs::read(&file).expect("read");
    let half = dir.path().join("half.ebpr");
    std::fs::write(&half, &bytes[..bytes.len() / 2]).expect("write");
    let out = run(&["report", half.to_str().expect("path")]);
    assert!(
        out.status.success(),
        "a cut file still reports: {}",
        text(&out)
    );
    assert!(
        text(&out).contains("cut short"),
        "and says it was truncated: {}",
        text(&out)
    );
    let full = report_json(&file);
    let cut = report_json(&half);
    assert_eq!(cut["truncated"], true);
    assert!(
        cut["duration_ns"].as_u64() > Some(0),
        "half the file holds part of the capture"
    );
    assert!(cut["duration_ns"].as_u64() <= full["duration_ns"].as_u64());
}

#[test]
fn garbage_empty_and_missing_files_are_clear_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let garbage = dir.path().join("garbage.ebpr");
    std::fs::write(&garbage, b"GIF89a not a recording at all").expect("write");
    let empty = dir.path().join("empty.ebpr");
    std::fs::write(&empty, b"").expect("write");
    for (file, want) in [
        (garbage, "not an energy-bpf recording"),
        (empty, "not an energy-bpf recording"),
        (dir.path().join("missing.ebpr"), "No such file"),
    ] {
        let out = run(&["report", file.to_str().expect("path")]);
        assert!(!out.status.success(), "{} must fail", file.display());
        let msg = text(&out);
        assert!(msg.contains(want), "{}: {msg}", file.display());
        assert!(!msg.contains("panicked"), "no panic: {msg}");
        assert_eq!(msg.lines().count(), 1, "one clear line: {msg}");
    }
}

#[test]
fn unknown_format_version_is_a_clear_error() {
    if !require_root("unknown_format_version_is_a_clear_error") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = recording(dir.path());
    // The header is the first record after the 8-byte magic: length varint, then
    // Record{header(1)} -> Header{format_version(1) = FORMAT_VERSION}. Patch the version
    // byte.
    let version = energy_bpf::record::FORMAT_VERSION;
    assert!(version < 0x80, "one-byte varint");
    let mut bytes = std::fs::read(&file).expect("read");
    let at = bytes[8..40]
        .windows(2)
        .position(|w| w == [0x08, version as u8])
        .map(|p| p + 8 + 1)
        .expect("format_version field near the start");
    bytes[at] = 0x07;
    let patched = dir.path().join("v7.ebpr");
    std::fs::write(&patched, &bytes).expect("write");
    let out = run(&["report", patched.to_str().expect("path")]);
    assert!(!out.status.success());
    assert!(text(&out).contains("format version 7"), "{}", text(&out));
}

#[test]
fn unprivileged_user_is_told_what_to_do() {
    if !require_root("unprivileged_user_is_told_what_to_do") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(bin())
        .args(["record", "-d", "1", "-o"])
        .arg(dir.path().join("x.ebpr"))
        .output()
        .expect("setpriv");
    assert!(!out.status.success(), "unprivileged record must fail");
    let msg = text(&out);
    assert!(
        msg.contains("permission denied") && msg.contains("sudo"),
        "{msg}"
    );
    assert!(!msg.contains("panicked"), "{msg}");
}

#[test]
fn unwritable_output_is_a_clear_error() {
    if !require_root("unwritable_output_is_a_clear_error") {
        return;
    }
    let _guard = crate::util::exclusive();
    let out = run(&["record", "-d", "1", "-o", "/nonexistent-dir/x.ebpr"]);
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(
        msg.contains("/nonexistent-dir/x.ebpr") && msg.contains("-o"),
        "{msg}"
    );
}

#[test]
fn recordings_are_not_world_readable() {
    if !require_root("recordings_are_not_world_readable") {
        return;
    }
    let _guard = crate::util::exclusive();
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = recording(dir.path());
    let mode = std::fs::metadata(&file).expect("stat").permissions().mode();
    assert_eq!(mode & 0o077, 0, "mode {mode:o} leaks to group/others");
}

#[test]
fn recorder_killed_with_sigkill_keeps_what_it_recorded() {
    if !require_root("recorder_killed_with_sigkill_keeps_what_it_recorded") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("killed.ebpr");
    let mut child = Command::new(bin())
        .args(["record", "-o"])
        .arg(&file)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn record");
    // Loading the probes takes from under a second to several on a loaded
    // machine: the clock starts when the recorder says it is recording.
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("energy-bpf: recording") {
                let _ = tx.send(());
            }
        }
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the recorder starts recording within 60 s");
    // Killed once its flushed chunks hold more than 0.5 s (read from the live file, as
    // `report` reads a recording cut short), at least 2 s in: how soon a chunk reaches
    // the disk depends on the machine.
    let started = std::time::Instant::now();
    let flushed_s = || {
        let out = run(&["report", "--format", "json", file.to_str().expect("path")]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|r| r["duration_ns"].as_u64())
            .map_or(0.0, |ns| ns as f64 / 1e9)
    };
    let mut seen = 0.0;
    crate::util::until(std::time::Duration::from_secs(60), || {
        seen = flushed_s();
        started.elapsed() >= std::time::Duration::from_secs(2) && seen > 0.5
    });
    child.kill().expect("SIGKILL");
    let _ = child.wait();
    let report = report_json(&file);
    assert_eq!(report["truncated"], true, "{report:#}");
    let secs = report["duration_ns"].as_u64().expect("duration") as f64 / 1e9;
    assert!(
        secs > 0.5 && secs >= seen,
        "the chunks written before the kill are kept ({secs:.2} s; {seen:.2} s were on disk \
         before the kill)"
    );
    assert!(
        report["processes"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{report:#}"
    );
}
