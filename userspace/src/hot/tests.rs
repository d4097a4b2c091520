//! The hot-function pick and its bounds.

use super::*;
use crate::pipeline::ThreadRow;

fn leaf(name: &str, file: Option<&str>, line: u32) -> Leaf {
    Leaf {
        name: name.into(),
        file: file.map(Arc::from),
        line,
    }
}

#[test]
fn lines_of_one_function_count_together() {
    // `spin` has the most samples on one line, `train_step` the most in all.
    let tally: Tally = [
        (leaf("py:spin", Some("a.py"), 3), 5),
        (leaf("py:train_step", Some("m.py"), 88), 4),
        (leaf("py:train_step", Some("m.py"), 90), 3),
        (leaf("memcpy", None, 0), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(pick(&tally).as_deref(), Some("py:train_step (m.py:88)"));
}

#[test]
fn ties_go_to_the_smaller_name_and_empty_tallies_name_nothing() {
    let tally: Tally = [(leaf("b", None, 0), 2), (leaf("a", None, 0), 2)]
        .into_iter()
        .collect();
    assert_eq!(pick(&tally).as_deref(), Some("a"));
    assert_eq!(pick(&Tally::new()), None);
    let no_line: Tally = [(leaf("py:f", Some("x.py"), 0), 1)].into_iter().collect();
    assert_eq!(pick(&no_line).as_deref(), Some("py:f (x.py)"));
}

fn sample(tgid: u32, tid: u32, python: &[u64], user: &[u64]) -> pb::Sample {
    pb::Sample {
        tgid,
        tid,
        python_stack: python.to_vec(),
        user_stack: user.to_vec(),
        ..Default::default()
    }
}

#[test]
fn python_beats_jit_beats_native_per_thread_and_process() {
    let mut hot = HotFunctions::new();
    let frame = |id, function: &str, line| pb::PythonFrame {
        id,
        function: function.into(),
        file: "/srv/model.py".into(),
        line,
    };
    hot.observe(&pb::Chunk {
        python_frames: vec![
            frame(1, "train_step", 88),
            frame(2, "evaluate", 12),
            frame(3, PY_UNKNOWN, 0),
        ],
        jit_symbols: vec![pb::JitSymbol {
            tgid: 20,
            start: 0x1000,
            size: 0x100,
            name: "LazyCompile:*hot burn.js:4".into(),
            ts_ns: 0,
        }],
        ..Default::default()
    });
    let samples = [
        // Python process 10: thread 11 runs train_step 3:1 to thread 12's evaluate.
        sample(10, 11, &[1], &[0xdead]),
        sample(10, 11, &[3, 1], &[0xdead]),
        sample(10, 11, &[1], &[]),
        sample(10, 12, &[2], &[0xdead]),
        // Node process 20: the JIT frame under a native leaf names the sample.
        sample(20, 20, &[], &[0x5, 0x1010, 0x9]),
        sample(20, 20, &[], &[0x1080]),
        // Nothing to name.
        sample(30, 30, &[], &[]),
    ];
    let thread = |tid| ThreadRow {
        tid,
        ..Default::default()
    };
    let mut rows = vec![
        ProcessRow {
            pid: 10,
            threads: vec![thread(11), thread(12)],
            ..Default::default()
        },
        ProcessRow {
            pid: 20,
            threads: vec![thread(20)],
            ..Default::default()
        },
        ProcessRow {
            pid: 30,
            threads: vec![thread(30)],
            ..Default::default()
        },
    ];
    hot.annotate(&samples, &mut rows);
    assert_eq!(rows[0].top_function, "py:train_step (model.py:88)");
    assert_eq!(
        rows[0].threads[0].top_function,
        "py:train_step (model.py:88)"
    );
    assert_eq!(rows[0].threads[1].top_function, "py:evaluate (model.py:12)");
    assert_eq!(rows[1].top_function, "LazyCompile:*hot burn.js:4");
    assert_eq!(rows[2].top_function, "");
    assert_eq!(rows[2].threads[0].top_function, "");
}

#[test]
fn the_native_budget_bounds_a_window_and_names_stay_cached() {
    let mut hot = HotFunctions::new();
    // Unmapped addresses: named `[unknown]+0x...`, one symbolization each.
    let samples: Vec<pb::Sample> = (0..NEW_NATIVE_PER_WINDOW as u64 + 10)
        .map(|i| sample(40, 40, &[], &[0x10_0000 + i]))
        .collect();
    let mut rows = vec![ProcessRow {
        pid: 40,
        ..Default::default()
    }];
    hot.annotate(&samples, &mut rows);
    let first = hot.native_cached;
    assert!(first > 0 && first <= NEW_NATIVE_PER_WINDOW, "{first}");
    // Later windows add what the budget left out, and look up what is cached.
    for _ in 0..20 {
        hot.annotate(&samples, &mut rows);
    }
    assert_eq!(hot.native_cached, samples.len());
    assert!(rows[0].top_function.starts_with("[unknown]+0x"), "{rows:?}");
    // An exit forgets the process after the next window.
    hot.observe(&pb::Chunk {
        process_events: vec![pb::ProcessEvent {
            kind: Kind::Exit as i32,
            tgid: 40,
            tid: 40,
            ..Default::default()
        }],
        ..Default::default()
    });
    hot.annotate(&[], &mut rows);
    assert!(hot.procs.is_empty());
    assert_eq!(hot.native_cached, 0);
}
