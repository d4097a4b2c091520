//! Decoding a run of whole records on several threads.
//!
//! A record's decoding (protobuf, then its switch columns turned into events and packed
//! again for [`SwitchLog`]) needs nothing from the records before it; only admitting its
//! timestamps and merging it do ([`super::reader`]). The reader walks a batch of frames
//! ahead, charging each record to the memory budget in file order as before, decodes the
//! batch here and then admits and merges the results in file order, so what it reads is
//! the same as one record at a time.

use std::sync::atomic::{AtomicUsize, Ordering};

use prost::Message as _;

use super::SwitchLog;
use crate::pb::v1::{Record, record::Kind};

/// Most threads one batch uses.
const MAX_THREADS: usize = 8;

/// Batches smaller than this are decoded on the calling thread: starting threads would
/// cost more than they save.
const MIN_PARALLEL_BYTES: usize = 256 << 10;

/// A decoded record and, for a chunk, its switch events packed as [`SwitchLog`] keeps
/// them (merged as is when none of the events is dropped).
pub(super) struct Decoded {
    /// The record; `None` when it does not decode.
    pub record: Option<Record>,
    /// The chunk's switch events, packed.
    pub packed: Option<SwitchLog>,
}

/// A record's bytes, already charged (see `reader::charge`), decoded, with a chunk's switch columns
/// turned back into events; `None` when they do not decode.
pub(super) fn decode_charged(bytes: &[u8]) -> Option<Record> {
    let Ok(mut record) = Record::decode(bytes) else {
        return None;
    };
    if let Some(Kind::Chunk(chunk)) = &mut record.kind
        && let Some(columns) = chunk.switch_columns.take()
    {
        // Version 2: switch events as columns, after any written as messages.
        let Ok(events) = super::columns::from_columns(&columns) else {
            return None;
        };
        drop(columns);
        if chunk.switches.is_empty() {
            chunk.switches = events;
        } else {
            chunk.switches.extend(events);
        }
    }
    // Stored names are used as they are: checked here against their bounds.
    if let Some(Kind::Symbols(table)) = &record.kind
        && super::symbols::check(table).is_err()
    {
        return None;
    }
    // Run counts stay columns until merged; unpacked here only to be checked.
    if let Some(Kind::Chunk(chunk)) = &record.kind
        && let Some(counts) = &chunk.run_counts
        && super::run_counts::from_columns(counts).is_err()
    {
        return None;
    }
    Some(record)
}

/// Decodes one record already charged to the budget.
fn decode_one(bytes: &[u8]) -> Decoded {
    let record = decode_charged(bytes);
    let packed = match &record {
        Some(Record {
            kind: Some(Kind::Chunk(chunk)),
        }) if !chunk.switches.is_empty() => {
            let mut log = SwitchLog::default();
            log.push(&chunk.switches);
            Some(log)
        }
        _ => None,
    };
    Decoded { record, packed }
}

/// Threads to decode with: the CPUs this process may use, at most [`MAX_THREADS`].
pub(super) fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS))
}

/// Decodes `records` (each already charged to the budget) over up to `threads` threads;
/// the results are in the same order.
pub(super) fn decode_all(records: &[&[u8]], threads: usize) -> Vec<Decoded> {
    let bytes: usize = records.iter().map(|r| r.len()).sum();
    let threads = threads.min(records.len());
    if threads <= 1 || bytes < MIN_PARALLEL_BYTES {
        return records.iter().map(|r| decode_one(r)).collect();
    }
    // Records differ in size: each thread takes the next one left.
    let next = AtomicUsize::new(0);
    let work = || {
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(bytes) = records.get(i) else {
                return done;
            };
            done.push((i, decode_one(bytes)));
        }
    };
    let mut all: Vec<(usize, Decoded)> = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads).map(|_| s.spawn(work)).collect();
        let mut all = work();
        for h in helpers {
            // A thread that panicked leaves its records undecoded: decoded again below.
            all.extend(h.join().unwrap_or_default());
        }
        all
    });
    all.sort_unstable_by_key(|(i, _)| *i);
    let mut out = Vec::with_capacity(records.len());
    let mut decoded = all.into_iter().peekable();
    for (i, bytes) in records.iter().enumerate() {
        match decoded.next_if(|(at, _)| *at == i) {
            Some((_, d)) => out.push(d),
            None => out.push(decode_one(bytes)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::pb::v1::{Chunk, Sample, SwitchEvent, Trailer};

    #[test]
    fn any_number_of_threads_gives_the_records_of_one_in_order() {
        let mut records: Vec<Vec<u8>> = (0..23u64)
            .map(|i| {
                let switches: Vec<SwitchEvent> = (0..i * 5_000)
                    .map(|k| SwitchEvent {
                        ts_ns: 1_000 + k * 10,
                        cpu: (k % 3) as u32,
                        tid: (k % 7) as u32,
                        ..SwitchEvent::default()
                    })
                    .collect();
                let samples = vec![Sample {
                    ts_ns: i,
                    user_stack: vec![i, i + 1],
                    ..Sample::default()
                }];
                Record {
                    kind: Some(Kind::Chunk(Chunk {
                        switch_columns: Some(super::super::columns::to_columns(&switches)),
                        samples,
                        ..Chunk::default()
                    })),
                }
                .encode_to_vec()
            })
            .collect();
        records.push(b"\x12\x05not a chunk".to_vec());
        records.push(
            Record {
                kind: Some(Kind::Trailer(Trailer::default())),
            }
            .encode_to_vec(),
        );
        let slices: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        assert!(slices.iter().map(|r| r.len()).sum::<usize>() > MIN_PARALLEL_BYTES);
        let one = decode_all(&slices, 1);
        assert_eq!(one.len(), records.len());
        assert!(one[23].record.is_none(), "a damaged record does not decode");
        assert!(one[0].packed.is_none(), "no switches, nothing packed");
        for threads in [2, 3, 8, 64] {
            let many = decode_all(&slices, threads);
            assert_eq!(many.len(), one.len());
            for (a, b) in one.iter().zip(&many) {
                assert_eq!(a.record, b.record, "{threads} threads");
                assert_eq!(a.packed, b.packed, "{threads} threads");
            }
        }
        // The packed events are the decoded ones.
        let Some(Record {
            kind: Some(Kind::Chunk(chunk)),
        }) = &one[5].record
        else {
            panic!("chunk 5")
        };
        assert_eq!(
            one[5].packed.as_ref().map(SwitchLog::to_vec),
            Some(chunk.switches.clone())
        );
    }
}
