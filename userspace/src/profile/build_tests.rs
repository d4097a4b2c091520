//! Tests of the profile build: interning, locations, mappings, filters, residuals, JIT.

use super::*;
use crate::pb::v1::{Header, Sample, ThreadInfo};
use crate::profile::{KERNEL_MAPPING, Residual};
use crate::record::Recording;

fn rec() -> Recording {
    let mut rec = Recording {
        header: Header {
            sample_hz: 100,
            hostname: "box".into(),
            ..Header::default()
        },
        end_ns: 2_000_000_000,
        ..Recording::default()
    };
    for (tid, tgid, comm) in [(10, 10, "app"), (11, 10, "worker"), (20, 20, "other")] {
        rec.threads.insert(
            tid,
            ThreadInfo {
                tid,
                tgid,
                comm: comm.into(),
                ..Default::default()
            },
        );
    }
    rec.mappings.insert(
        10,
        vec![Mapping {
            tgid: 10,
            start: 0x1000,
            end: 0x2000,
            path: "/nonexistent/app".into(),
            ..Default::default()
        }],
    );
    let sample = |tid, tgid, user: Vec<u64>, kernel: Vec<u64>| Sample {
        tid,
        tgid,
        cpu: 1,
        cgroup_id: 5,
        user_stack: user,
        kernel_stack: kernel,
        ..Default::default()
    };
    rec.samples = vec![
        sample(10, 10, vec![0x1010, 0x1101], vec![]),
        sample(11, 10, vec![0x1010, 0x1101], vec![0xffff_0000]),
        sample(20, 20, vec![0x5000], vec![]),
    ];
    rec
}

#[test]
fn addresses_in_recorded_perf_map_entries_are_jit_frames_of_their_process() {
    use crate::pb::v1::JitSymbol;
    use crate::symbolize::FrameKind;
    let mut rec = rec();
    rec.threads.get_mut(&20).expect("pid 20").comm = "node".into();
    rec.jit_symbols.insert(
        20,
        vec![JitSymbol {
            tgid: 20,
            start: 0x4f00,
            size: 0x200,
            name: "JS:*hot /srv/app.js:7:3".into(),
            ts_ns: 0,
        }],
    );
    // Process 10 has no entries: the same address stays unresolved there.
    rec.samples.push(Sample {
        tid: 10,
        tgid: 10,
        user_stack: vec![0x5000],
        ..Default::default()
    });
    let mut sym = Symbolizer::with_kallsyms(None);
    let p = build(
        &rec,
        &SampleValues::cpu_time(&rec),
        &mut sym,
        &Filter::default(),
    );
    let leaf = |i: usize| &p.frames[p.samples[i].frames[0] as usize];
    let jit = leaf(2);
    assert_eq!(jit.function, "hot");
    assert_eq!(
        (jit.file.as_deref(), jit.line),
        (Some("/srv/app.js"), Some(7))
    );
    assert_eq!(jit.kind, FrameKind::Jit(JitRuntime::V8));
    assert_eq!(jit.kind.otel_name(), "v8js");
    assert_eq!(leaf(3).function, "[unknown]+0x5000");
    assert_eq!(leaf(3).kind, FrameKind::Native);
}

#[test]
fn builds_interned_leaf_first_stacks_with_cpu_time() {
    let rec = rec();
    let mut sym = Symbolizer::with_kallsyms(None);
    let p = build(
        &rec,
        &SampleValues::cpu_time(&rec),
        &mut sym,
        &Filter::default(),
    );
    assert_eq!(p.value_types[0], ValueType::new("samples", "count"));
    assert_eq!(p.value_types[1], ValueType::new("cpu", "nanoseconds"));
    assert_eq!(p.samples.len(), 3);
    assert_eq!(p.meta.totals, vec![3.0, 3e7]);
    let names = |s: &ProfileSample| -> Vec<&str> {
        s.frames
            .iter()
            .map(|&f| p.frames[f as usize].function.as_str())
            .collect()
    };
    // Unresolvable file: module+offset, caller looked up at addr - 1.
    assert_eq!(names(&p.samples[0]), vec!["app+0x10", "app+0x100"]);
    assert_eq!(
        names(&p.samples[1]),
        vec!["[kernel]+0xffff0000", "app+0x10", "app+0x100"]
    );
    assert_eq!(names(&p.samples[2]), vec!["[unknown]+0x5000"]);
    assert_eq!(p.samples[0].frames, p.samples[1].frames[1..]);
    assert_eq!(p.frames.len(), 4, "frames are interned");
    // Locations: one per (mapping, address), caller addresses minus one; the kernel
    // mapping spans the kernel pages sampled, an address in no mapping has none.
    let at = |s: &ProfileSample| -> Vec<(Option<&str>, u64)> {
        s.locations
            .iter()
            .map(|&l| {
                let l = &p.locations[l as usize];
                let path = l.mapping.map(|m| p.mappings[m as usize].path.as_str());
                (path, l.address)
            })
            .collect()
    };
    let app = Some("/nonexistent/app");
    assert_eq!(at(&p.samples[0]), vec![(app, 0x1010), (app, 0x1100)]);
    assert_eq!(
        at(&p.samples[1]),
        vec![
            (Some(KERNEL_MAPPING), 0xffff_0000),
            (app, 0x1010),
            (app, 0x1100)
        ]
    );
    assert_eq!(at(&p.samples[2]), vec![(None, 0x5000)]);
    assert_eq!(p.samples[0].locations, p.samples[1].locations[1..]);
    assert_eq!(p.locations.len(), 4);
    assert!(p.locations.iter().all(|l| l.frames.len() == 1));
    let spans: Vec<_> = p
        .mappings
        .iter()
        .map(|m| (m.path.as_str(), m.start, m.end, m.file_offset))
        .collect();
    assert_eq!(
        spans,
        vec![
            ("/nonexistent/app", 0x1000, 0x2000, 0),
            (KERNEL_MAPPING, 0xffff_0000, 0xffff_1000, 0xffff_0000),
        ]
    );
    assert_eq!(&*p.samples[1].labels.comm, "worker");
    assert_eq!(p.samples[1].labels.cpu, Some(1));
    assert_eq!(p.samples[1].labels.cgroup, 5);
}

#[test]
fn filters_by_pid_and_comm_and_adds_residuals() {
    let rec = rec();
    let mut sym = Symbolizer::with_kallsyms(None);
    let mut w = SampleValues::cpu_time(&rec);
    w.residuals.push(Residual {
        tgid: 10,
        tid: 11,
        values: vec![5e6],
    });
    w.residuals.push(Residual {
        tgid: 20,
        tid: 20,
        values: vec![7e6],
    });
    let by_pid = Filter {
        pids: vec![10],
        comms: vec![],
    };
    let p = build(&rec, &w, &mut sym, &by_pid);
    assert_eq!(p.samples.len(), 3);
    let last = &p.samples[2];
    assert_eq!(p.frames[last.frames[0] as usize].function, NO_STACK_SAMPLE);
    let residual = &p.locations[last.locations[0] as usize];
    assert_eq!((residual.mapping, residual.address), (None, 0));
    assert_eq!(residual.frames, last.frames);
    assert_eq!(last.values, vec![0.0, 5e6]);
    assert_eq!(p.meta.totals, vec![2.0, 2.5e7]);
    // A process name selects all its threads.
    let by_comm = Filter {
        pids: vec![],
        comms: vec!["app".into()],
    };
    assert_eq!(build(&rec, &w, &mut sym, &by_comm).samples.len(), 3);
    let none = Filter {
        pids: vec![99],
        comms: vec![],
    };
    let p = build(&rec, &w, &mut sym, &none);
    assert!(p.samples.is_empty());
    assert!(p.frames.is_empty());
    assert!(p.locations.is_empty());
}

#[test]
fn leaves_only_keeps_each_leaf_and_folds_its_callers_into_one_frame() {
    use crate::profile::NOT_SYMBOLIZED;
    let rec = rec();
    let w = SampleValues::cpu_time(&rec);
    let full = build(
        &rec,
        &w,
        &mut Symbolizer::with_kallsyms(None),
        &Filter::default(),
    );
    let mut sym = Symbolizer::with_kallsyms(None);
    let (user, kernel) = needed(&rec, &Filter::default(), true);
    sym.prefetch(user, kernel);
    let leaves = build_prefetched(&rec, &w, &mut sym, &Filter::default(), true);
    let names = |p: &Profile, s: &ProfileSample| -> Vec<String> {
        s.frames
            .iter()
            .map(|&f| p.frames[f as usize].function.clone())
            .collect()
    };
    let got: Vec<Vec<String>> = leaves.samples.iter().map(|s| names(&leaves, s)).collect();
    assert_eq!(
        got,
        vec![
            vec!["app+0x10".to_string(), NOT_SYMBOLIZED.into()],
            vec!["[kernel]+0xffff0000".into(), NOT_SYMBOLIZED.into()],
            vec!["[unknown]+0x5000".into()],
        ]
    );
    for (l, f) in leaves.samples.iter().zip(&full.samples) {
        assert_eq!(names(&leaves, l)[0], names(&full, f)[0], "same leaf");
        assert_eq!(l.values, f.values);
    }
    assert_eq!(leaves.meta.totals, full.meta.totals);
}
