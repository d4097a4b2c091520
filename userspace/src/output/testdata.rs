//! A small hand-built profile and golden-file comparison for exporter tests.

use std::path::PathBuf;
use std::sync::Arc;

use crate::profile::{Frame, Labels, Profile, ProfileMeta, ProfileSample, ValueType};

fn frame(function: &str, file: Option<&str>, line: Option<u32>, module: &str) -> Frame {
    Frame {
        function: function.into(),
        file: file.map(str::to_string),
        line,
        module: module.into(),
        inlined: false,
        kernel: false,
    }
}

/// Two processes; `burn` spends 3x more in `hot_heavy` than in `hot_light`.
pub(crate) fn profile() -> Profile {
    let mut inlined = frame("square", Some("/src/burn.c"), Some(8), "/opt/burn");
    inlined.inlined = true;
    let mut kernel = frame("do_syscall_64", None, None, "[kernel]");
    kernel.kernel = true;
    let frames = vec![
        frame("main", Some("/src/burn.c"), Some(40), "/opt/burn"), // 0
        frame("hot_heavy", Some("/src/burn.c"), Some(12), "/opt/burn"), // 1
        frame("hot_light", Some("/src/burn.c"), Some(22), "/opt/burn"), // 2
        inlined,                                                   // 3
        kernel,                                                    // 4
        Frame::unresolved("/usr/lib/libc.so.6", 0x1234, false),    // 5
        Frame::synthetic(crate::profile::NO_STACK_SAMPLE),         // 6
    ];
    let labels = |pid, tid, comm: &str, cpu| Labels {
        pid,
        tid,
        comm: Arc::from(comm),
        cpu,
        cgroup: 7,
    };
    let s = |frames: Vec<u32>, values: Vec<f64>, labels| ProfileSample {
        frames,
        values,
        labels,
    };
    let mut p = Profile {
        meta: ProfileMeta {
            title: "energy-bpf on testbox".into(),
            totals: Vec::new(),
            duration_ns: 2_000_000_000,
            estimated: true,
            source: "model".into(),
            sample_hz: 100,
            start_unix_ns: 1_700_000_000_000_000_000,
            lost_events: 0,
        },
        value_types: vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
            ValueType::energy("package"),
            ValueType::energy("dram"),
        ],
        frames,
        samples: vec![
            s(
                vec![3, 1, 0],
                vec![1.0, 1e7, 300_000.4, 30_000.0],
                labels(100, 100, "burn", Some(0)),
            ),
            s(
                vec![1, 0],
                vec![1.0, 1e7, 299_999.8, 30_000.0],
                labels(100, 100, "burn", Some(0)),
            ),
            s(
                vec![2, 0],
                vec![1.0, 1e7, 200_000.0, 20_000.0],
                labels(100, 101, "burn", Some(1)),
            ),
            s(
                vec![4, 5],
                vec![1.0, 1e7, 100_000.0, 10_000.0],
                labels(200, 200, "sshd", Some(1)),
            ),
            s(
                vec![6],
                vec![0.0, 0.0, 50_000.0, 0.0],
                labels(200, 201, "sshd", None),
            ),
        ],
    };
    p.recompute_totals();
    p
}

/// Compares `got` with `golden/<name>`; `UPDATE_GOLDEN=1` rewrites the file instead.
pub(crate) fn assert_golden(name: &str, got: &[u8]) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/output/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).expect("write golden file");
        return;
    }
    let want = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        want == got,
        "{} differs from output:\n{}",
        path.display(),
        String::from_utf8_lossy(got)
    );
}
