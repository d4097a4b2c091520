//! Tests of `record/symbols.rs`.

use super::*;
use crate::pb::v1::{SymbolFile, SymbolFrame};

fn table() -> SymbolTable {
    SymbolTable {
        strings: vec!["main".into(), "/src/main.c".into()],
        files: vec![SymbolFile {
            path: "/bin/x".into(),
            build_id: vec![1, 2],
            addresses: vec![SymbolAddress {
                address: 0x1000,
                frames: vec![SymbolFrame {
                    function: 0,
                    file: Some(1),
                    line: Some(3),
                    inlined: false,
                }],
            }],
        }],
        kernel: vec![SymbolAddress {
            address: 0xffff_0000,
            frames: Vec::new(),
        }],
    }
}

#[test]
fn a_table_within_bounds_passes_and_each_bound_is_enforced() {
    assert_eq!(check(&table()), Ok(()));

    let mut t = table();
    t.files[0].addresses[0].frames[0].file = Some(2);
    assert_eq!(check(&t), Err(SymbolsError::BadIndex { index: 2, len: 2 }));

    let mut t = table();
    t.files[0].addresses[0].frames[0].function = u32::MAX;
    assert!(matches!(check(&t), Err(SymbolsError::BadIndex { .. })));

    let mut t = table();
    t.strings[0] = "x".repeat(MAX_STRING_LEN + 1);
    assert!(matches!(
        check(&t),
        Err(SymbolsError::TooMany {
            what: "bytes in a string",
            ..
        })
    ));

    let mut t = table();
    let frame = t.files[0].addresses[0].frames[0];
    t.files[0].addresses[0].frames = vec![frame; MAX_FRAMES + 1];
    assert!(matches!(
        check(&t),
        Err(SymbolsError::TooMany {
            what: "frames for one address",
            ..
        })
    ));

    let mut t = table();
    t.kernel = vec![SymbolAddress::default(); MAX_ADDRESSES];
    assert!(matches!(
        check(&t),
        Err(SymbolsError::TooMany {
            what: "addresses",
            ..
        })
    ));

    let mut t = table();
    t.strings = vec![String::new(); MAX_STRINGS + 1];
    assert!(matches!(
        check(&t),
        Err(SymbolsError::TooMany {
            what: "strings",
            ..
        })
    ));
}

/// A recording of `chunks` chunks, then `table` (when given) and a trailer.
fn recording(dir: &std::path::Path, chunks: u64, table: &SymbolTable) -> Vec<u8> {
    use crate::pb::v1::{Chunk, Header, SwitchEvent, Trailer};
    let path = dir.join("s.ebpr");
    let header = Header {
        format_version: super::super::FORMAT_VERSION,
        start_ns: 1_000,
        ..Header::default()
    };
    let mut w = super::super::Writer::create(&path, &header).expect("create");
    for i in 0..chunks {
        w.chunk(Chunk {
            switches: vec![SwitchEvent {
                ts_ns: 2_000 + i,
                tid: 1,
                ..SwitchEvent::default()
            }],
            ..Chunk::default()
        })
        .expect("chunk");
    }
    w.symbols(table.clone()).expect("symbols");
    w.finish(Trailer {
        end_ns: 9_000,
        ..Trailer::default()
    })
    .expect("finish");
    std::fs::read(&path).expect("read")
}

#[test]
fn a_file_cut_anywhere_keeps_what_was_whole_before_the_cut() {
    let dir = tempfile::tempdir().expect("tempdir");
    let full = recording(dir.path(), 4, &table());
    let path = std::path::Path::new("s.ebpr");
    let whole = super::super::read_from(full.as_slice(), path).expect("read");
    assert_eq!(*whole.symbols, vec![table()]);
    assert!(!whole.truncated);
    let mut last = (0, 0);
    for cut in 40..full.len() {
        let Ok(rec) = super::super::read_from(&full[..cut], path) else {
            continue;
        };
        let now = (rec.switches.len(), rec.symbols.len());
        assert!(now >= last, "cut at {cut}: {now:?} after {last:?}");
        assert!(rec.symbols.iter().all(|t| *t == table()));
        last = now;
    }
    assert_eq!(
        last,
        (4, 1),
        "cut in the trailer: chunks and names all kept"
    );
}

#[test]
fn a_table_out_of_bounds_is_damage_and_the_rest_reads() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut bad = table();
    bad.files[0].addresses[0].frames[0].function = 9;
    let bytes = recording(dir.path(), 2, &bad);
    let rec =
        super::super::read_from(bytes.as_slice(), std::path::Path::new("s.ebpr")).expect("read");
    assert!(rec.symbols.is_empty());
    assert_eq!(rec.damage.records_damaged, 1);
    assert_eq!(rec.switches.len(), 2);
    assert!(!rec.truncated, "the trailer after it is read");
}

#[test]
fn a_real_sized_table_is_within_the_decoding_budget() {
    use prost::Message as _;
    // 20,000 addresses of two frames each, names of a C++ program's length.
    let strings: Vec<String> = (0..20_000)
        .map(|i| format!("ns::Class<int>::method_{i}(std::string const&)"))
        .collect();
    let frame = |i: u32| SymbolFrame {
        function: i,
        file: Some(i / 2),
        line: Some(i),
        inlined: i % 2 == 1,
    };
    let t = SymbolTable {
        strings,
        files: vec![SymbolFile {
            path: "/usr/lib/libx.so".into(),
            build_id: vec![0; 20],
            addresses: (0..20_000u32)
                .map(|i| SymbolAddress {
                    address: 0x1000 + u64::from(i) * 16,
                    frames: vec![frame(i), frame(19_999 - i)],
                })
                .collect(),
        }],
        kernel: (0..1_000u64)
            .map(|i| SymbolAddress {
                address: 0xffff_ffff_8100_0000 + i,
                frames: Vec::new(),
            })
            .collect(),
    };
    assert_eq!(check(&t), Ok(()));
    let record = crate::pb::v1::Record {
        kind: Some(crate::pb::v1::record::Kind::Symbols(t)),
    }
    .encode_to_vec();
    let cost = super::super::budget::cost(&record).expect("scans");
    let ratio = cost.kept / record.len() as u64;
    assert!(cost.kept > record.len() as u64, "{cost:?}");
    assert!(
        ratio < super::super::budget::MAX_RECORD_RATIO,
        "{ratio}: a real table must never be refused as too dense"
    );
}
