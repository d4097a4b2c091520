//! Tests of `record/run_counts.rs`.

use proptest::prelude::*;

use super::*;

#[test]
fn columns_round_trip_with_missing_counts() {
    let runs = vec![
        CountedRun {
            ts_ns: 1_000,
            cpu: 1,
            tid: 7,
            counts: [Some(10), None, Some(3)],
        },
        CountedRun {
            ts_ns: 900,
            cpu: 0,
            tid: 0,
            counts: [None, Some(u64::MAX), None],
        },
    ];
    let c = to_columns(&runs, 4);
    assert_eq!(c.valid, [0b101, 0b010]);
    assert_eq!(c.count, [10, 3, u64::MAX]);
    assert_eq!(c.dropped, 4);
    assert_eq!(from_columns(&c).expect("unpack"), runs);
}

#[test]
fn inconsistent_columns_are_refused() {
    let good = to_columns(
        &[CountedRun {
            ts_ns: 5,
            cpu: 0,
            tid: 1,
            counts: [Some(1), Some(2), None],
        }],
        0,
    );
    let mut short = good.clone();
    short.count.pop();
    assert!(from_columns(&short).is_err());
    let mut extra = good.clone();
    extra.count.push(9);
    assert!(from_columns(&extra).is_err());
    let mut wide = good.clone();
    wide.valid[0] = 1 << MAX_COUNTERS;
    assert!(from_columns(&wide).is_err());
    let mut ragged = good;
    ragged.tid.push(3);
    assert!(from_columns(&ragged).is_err());
}

/// A recording with run counters in its header and `chunks` of run counts.
fn write(dir: &std::path::Path, chunks: &[RunCounts]) -> std::path::PathBuf {
    use crate::pb::v1::{Chunk, Header, RunCounter, Trailer};
    let path = dir.join("counts.ebpr");
    let header = Header {
        format_version: crate::record::FORMAT_VERSION,
        start_ns: 1,
        cpus: vec![
            crate::pb::v1::Cpu::default(),
            crate::pb::v1::Cpu {
                id: 1,
                ..Default::default()
            },
        ],
        run_counters: vec![
            RunCounter {
                event: "instructions".into(),
                unavailable: String::new(),
            },
            RunCounter {
                event: "llc-misses".into(),
                unavailable: "perf_event_open(llc-misses) on CPU 0 failed".into(),
            },
        ],
        ..Header::default()
    };
    let mut w = crate::record::Writer::create(&path, &header).expect("create");
    for c in chunks {
        w.chunk(Chunk {
            run_counts: Some(c.clone()),
            ..Chunk::default()
        })
        .expect("chunk");
    }
    w.finish(Trailer {
        end_ns: 10_000,
        ..Trailer::default()
    })
    .expect("finish");
    path
}

#[test]
fn run_counts_round_trip_through_a_file_and_old_files_have_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = vec![
        CountedRun {
            ts_ns: 100,
            cpu: 0,
            tid: 7,
            counts: [Some(1_000), None, None],
        },
        CountedRun {
            ts_ns: 120,
            cpu: 1,
            tid: 8,
            counts: [Some(5), None, None],
        },
    ];
    let b = vec![CountedRun {
        ts_ns: 300,
        cpu: 0,
        tid: 7,
        counts: [Some(9), None, None],
    }];
    let path = write(dir.path(), &[to_columns(&a, 0), to_columns(&b, 3)]);
    let rec = crate::record::read_file(&path).expect("read");
    assert_eq!(rec.run_counts, [a, b].concat());
    assert_eq!(rec.run_counts_dropped, 3);
    assert_eq!(rec.header.run_counters.len(), 2);
    assert!(
        rec.header.run_counters[1]
            .unavailable
            .contains("llc-misses")
    );
    assert_eq!(rec.damage.records_damaged, 0);
    // A recording made before run counters: no counts.
    let old = write(dir.path(), &[]);
    let rec = crate::record::read_file(&old).expect("read");
    assert!(rec.run_counts.is_empty());
}

#[test]
fn inconsistent_run_counts_are_a_damaged_record_not_a_failed_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = to_columns(
        &[CountedRun {
            ts_ns: 50,
            cpu: 0,
            tid: 3,
            counts: [Some(4), Some(5), None],
        }],
        0,
    );
    let mut bad = good.clone();
    bad.count.push(1);
    let rec = crate::record::read_file(&write(dir.path(), &[bad, good])).expect("read");
    assert_eq!(rec.damage.records_damaged, 1);
    assert_eq!(rec.run_counts.len(), 1);
}

proptest! {
    #[test]
    fn any_runs_round_trip(raw in proptest::collection::vec(
        (any::<u64>(), 0u32..8, any::<u32>(), proptest::array::uniform3(proptest::option::of(any::<u64>()))),
        0..64,
    )) {
        let runs: Vec<CountedRun> = raw
            .into_iter()
            .map(|(ts_ns, cpu, tid, counts)| CountedRun { ts_ns, cpu, tid, counts })
            .collect();
        prop_assert_eq!(from_columns(&to_columns(&runs, 0)).expect("unpack"), runs);
    }
}
