//! Tests of `record::budget`.

use prost::Message as _;

use super::*;
use crate::pb::v1::{Chunk, Record, SwitchColumns, record::Kind};

fn chunk_record(chunk: Chunk) -> Vec<u8> {
    Record {
        kind: Some(Kind::Chunk(chunk)),
    }
    .encode_to_vec()
}

#[test]
fn empty_messages_cost_their_decoded_size() {
    let n = 10_000;
    let bytes = chunk_record(Chunk {
        sources: vec![EnergySource::default(); n],
        samples: vec![Sample::default(); n],
        switches: vec![SwitchEvent::default(); n],
        threads: vec![ThreadInfo::default(); n],
        mappings: vec![Mapping::default(); n],
        jit_symbols: vec![JitSymbol::default(); n],
        readings: vec![EnergyReading::default(); n],
        process_events: vec![ProcessEvent::default(); n],
        ..Default::default()
    });
    assert!(bytes.len() < 17 * n, "two bytes each: {}", bytes.len());
    let cost = cost(&bytes).expect("scans");
    let at_least = (n
        * (size_of::<EnergySource>()
            + size_of::<Sample>()
            + size_of::<SwitchEvent>()
            + size_of::<ThreadInfo>()
            + size_of::<Mapping>()
            + size_of::<JitSymbol>()
            + size_of::<EnergyReading>()
            + size_of::<ProcessEvent>())) as u64;
    assert!(cost.kept >= at_least, "{cost:?} < {at_least}");
    // Vectors grown one push at a time: at most twice their length.
    assert!(cost.kept <= 2 * at_least, "{cost:?}");
    assert!(
        cost.kept > 40 * bytes.len() as u64,
        "the expansion it guards against"
    );
}

#[test]
fn switch_columns_cost_their_events() {
    let n = 5_000u32;
    let bytes = chunk_record(Chunk {
        switch_columns: Some(SwitchColumns {
            cpu: vec![0],
            cpu_run_length: vec![n],
            ts_delta_ns: vec![1; n as usize],
            flags: vec![12; n as usize],
            ..Default::default()
        }),
        ..Default::default()
    });
    let cost = cost(&bytes).expect("scans");
    let events = u64::from(n) * size::<SwitchEvent>();
    // The events stay; the columns (8 + 4 bytes an entry, at capacity) and the
    // timestamps validation sorts do not.
    let columns = capacity(u64::from(n), 8) * (8 + 4) + 2 * 4 * 4;
    let timestamps = capacity(u64::from(n), 8) * 8;
    assert_eq!(cost.kept, events);
    assert_eq!(cost.peak, events + columns + timestamps);
}

/// Prost merges every occurrence of an inline message, so columns split over many
/// occurrences grow one set of vectors.
#[test]
fn repeated_inline_messages_are_merged_as_prost_merges_them() {
    let part = chunk_record(Chunk {
        switch_columns: Some(SwitchColumns {
            flags: vec![1; 3],
            ..Default::default()
        }),
        ..Default::default()
    });
    let many: Vec<u8> = part
        .iter()
        .copied()
        .cycle()
        .take(part.len() * 100)
        .collect();
    let decoded = Record::decode(many.as_slice()).expect("prost merges");
    let Some(Kind::Chunk(c)) = decoded.kind else {
        panic!("a chunk")
    };
    let flags = c.switch_columns.expect("columns").flags;
    assert_eq!(flags.len(), 300);
    let cost = cost(&many).expect("scans");
    assert_eq!(cost.peak - cost.kept, capacity(300, 4) * 4);
}

#[test]
fn real_records_scan_and_malformed_ones_do_not() {
    let real = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fuzz/seeds/recording/real-v3.ebpr"
    ))
    .expect("seed recording");
    let first = real
        .windows(4)
        .position(|w| w == super::super::frame::SYNC)
        .expect("a frame");
    let mut at = first;
    let mut kept = 0;
    while let super::super::frame::Frame::Whole { payload, len } =
        super::super::frame::parse(&real[at..])
    {
        let c = cost(payload).expect("a real record scans");
        assert!(c.kept <= c.peak);
        kept += c.kept;
        at += len;
    }
    assert_eq!(at, real.len());
    assert!(kept < PER_INPUT_BYTE * real.len() as u64, "{kept}");
    // Whatever prost decodes, the scan reads too (it is never the stricter one).
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..2_000 {
        let mut bytes = real[first + 12..].to_vec();
        for _ in 0..=x % 3 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x >> 16) as usize % bytes.len();
            bytes[i] ^= (x >> 48) as u8 | 1;
        }
        if Record::decode(bytes.as_slice()).is_ok() {
            assert!(cost(&bytes).is_ok(), "prost decodes what the scan refused");
        }
    }
    assert_eq!(
        cost(&[0x12, 0x05, 0x01]),
        Err(Malformed),
        "length past the end"
    );
    assert_eq!(cost(&[0x14]), Err(Malformed), "an end-group with no group");
    assert_eq!(cost(&[0xff; 11]), Err(Malformed), "an endless varint");
}
