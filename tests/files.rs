//! Output files: owner-only even when they existed, never through a planted symlink, and
//! a full disk stops `record` cleanly with a file that still reads.

use std::os::unix::fs::PermissionsExt as _;

use crate::util::{require_root, run, text};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
}

#[test]
fn record_onto_an_existing_0644_file_leaves_it_0600() {
    if !require_root("record_onto_an_existing_0644_file_leaves_it_0600") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("old.ebpr");
    std::fs::write(&file, "an older, world-readable file").expect("write");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = run(&["record", "-d", "1", "-o", file.to_str().expect("path")]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    assert_eq!(mode(&file), 0o600, "existing file not tightened");
    let report = crate::util::report_json(&file);
    assert_eq!(report["truncated"], false);
}

#[test]
fn a_symlink_planted_at_the_output_path_is_refused() {
    if !require_root("a_symlink_planted_at_the_output_path_is_refused") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").expect("write");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let link = dir.path().join("out");
    std::os::unix::fs::symlink(&victim, &link).expect("symlink");
    for args in [
        vec!["record", "-d", "1", "-o", link.to_str().expect("path")],
        vec![
            "flamegraph",
            "-o",
            link.to_str().expect("path"),
            "/nonexistent",
        ],
    ] {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} must refuse");
        let msg = text(&out);
        if args[0] == "record" {
            assert!(msg.contains("symbolic link"), "{args:?}: {msg}");
            assert_eq!(msg.lines().count(), 1, "one clear line: {msg}");
        }
        assert!(!msg.contains("panicked"), "{msg}");
        assert_eq!(std::fs::read(&victim).expect("read"), b"precious");
        assert_eq!(mode(&victim), 0o644, "the link's target keeps its mode");
    }
}

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        if out.status.success() {
            Some(Self(dir))
        } else {
            eprintln!(
                "SKIPPED full disk test: cannot mount a tmpfs: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            None
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_full_disk_stops_record_cleanly_with_a_readable_file() {
    if !require_root("a_full_disk_stops_record_cleanly_with_a_readable_file") {
        return;
    }
    let _guard = crate::util::exclusive();
    let Some(tmpfs) = Tmpfs::mount("256k") else {
        return;
    };
    let file = tmpfs.0.path().join("full.ebpr");
    // 999 Hz on a busy CPU writes far more than 256 KiB in 30 s.
    let busy = crate::util::Workload::spawn("while :; do :; done", None);
    let started = std::time::Instant::now();
    let out = run(&[
        "record",
        "-F",
        "999",
        "-d",
        "30",
        "-o",
        file.to_str().expect("path"),
    ]);
    drop(busy);
    let msg = text(&out);
    assert!(!out.status.success(), "a full disk is an error: {msg}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(25),
        "record stopped at the full disk, not at its duration"
    );
    assert!(
        msg.contains("disk is full") && msg.contains("No space left"),
        "says why: {msg}"
    );
    assert!(!msg.contains("panicked"), "{msg}");
    let report = crate::util::report_json(&file);
    let secs = report["duration_ns"].as_u64().expect("duration") as f64 / 1e9;
    assert!(secs > 0.1, "the file keeps what fit ({secs} s)");
    assert_eq!(report["damage"]["records_damaged"], 0, "{report:#}");
}
