//! A small hand-built profile and golden-file comparison for exporter tests.

use std::path::PathBuf;
use std::sync::Arc;

use crate::profile::{
    Frame, FrameKind, KERNEL_MAPPING, Labels, Location, Profile, ProfileMapping, ProfileMeta,
    ProfileSample, ValueType,
};

fn frame(function: &str, file: Option<&str>, line: Option<u32>, module: &str) -> Frame {
    Frame {
        function: function.into(),
        file: file.map(str::to_string),
        line,
        module: module.into(),
        inlined: false,
        kind: FrameKind::Native,
    }
}

/// Two processes; `burn` spends 3x more in `hot_heavy` than in `hot_light`. Mappings: the
/// kernel, libc without a build-id (its one frame unresolved), then `/opt/burn`; `square`
/// is inlined into `hot_heavy` at one of its two sampled addresses.
pub(crate) fn profile() -> Profile {
    let mut inlined = frame("square", Some("/src/burn.c"), Some(8), "/opt/burn");
    inlined.inlined = true;
    let mut kernel = frame("do_syscall_64", None, None, "[kernel]");
    kernel.kind = FrameKind::Kernel;
    let frames = vec![
        frame("main", Some("/src/burn.c"), Some(40), "/opt/burn"), // 0
        frame("hot_heavy", Some("/src/burn.c"), Some(12), "/opt/burn"), // 1
        frame("hot_light", Some("/src/burn.c"), Some(22), "/opt/burn"), // 2
        inlined,                                                   // 3
        kernel,                                                    // 4
        Frame::unresolved("/usr/lib/libc.so.6", 0x1234, FrameKind::Native), // 5
        Frame::synthetic(crate::profile::NO_STACK_SAMPLE),         // 6
    ];
    let labels = |pid, tid, comm: &str, cpu| Labels {
        pid,
        tid,
        comm: Arc::from(comm),
        cpu,
        cgroup: 7,
    };
    let mappings = vec![
        ProfileMapping {
            start: 0xffff_ffff_8100_0000,
            end: 0xffff_ffff_8100_2000,
            file_offset: 0xffff_ffff_8100_0000,
            path: KERNEL_MAPPING.into(),
            build_id: Vec::new(),
        },
        ProfileMapping {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0010_0000,
            file_offset: 0,
            path: "/usr/lib/libc.so.6".into(),
            build_id: Vec::new(),
        },
        ProfileMapping {
            start: 0x5555_5555_5000,
            end: 0x5555_5555_6000,
            file_offset: 0x1000,
            path: "/opt/burn".into(),
            build_id: vec![0xde, 0xad, 0xbe, 0xef],
        },
    ];
    let at = |mapping: Option<u32>, address: u64, frames: Vec<u32>| Location {
        mapping,
        address,
        frames,
    };
    let locations = vec![
        at(Some(2), 0x5555_5555_5150, vec![3, 1]), // 0: square inlined in hot_heavy
        at(Some(2), 0x5555_5555_5180, vec![1]),    // 1: hot_heavy
        at(Some(2), 0x5555_5555_5200, vec![2]),    // 2: hot_light
        at(Some(2), 0x5555_5555_5300, vec![0]),    // 3: main
        at(Some(0), 0xffff_ffff_8100_1000, vec![4]), // 4: do_syscall_64
        at(Some(1), 0x7f00_0000_1234, vec![5]),    // 5: libc+0x1234
        at(None, 0, vec![6]),                      // 6: [no stack sample]
    ];
    let s = |locs: Vec<u32>, values: Vec<f64>, labels| ProfileSample {
        frames: locs
            .iter()
            .flat_map(|&l| locations[l as usize].frames.iter().copied())
            .collect(),
        locations: locs,
        values,
        labels,
    };
    let samples = vec![
        s(
            vec![0, 3],
            vec![1.0, 1e7, 300_000.4, 30_000.0],
            labels(100, 100, "burn", Some(0)),
        ),
        s(
            vec![1, 3],
            vec![1.0, 1e7, 299_999.8, 30_000.0],
            labels(100, 100, "burn", Some(0)),
        ),
        s(
            vec![2, 3],
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
    ];
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
            unwind: "user stacks: 3 by unwind tables (75.0%), 1 by frame pointers".into(),
            ..ProfileMeta::default()
        },
        value_types: vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
            ValueType::energy("package"),
            ValueType::energy("dram"),
        ],
        frames,
        locations,
        mappings,
        samples,
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
