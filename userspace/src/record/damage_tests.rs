//! Damaged files: every flipped byte of a version 3 file is found and counted, reading
//! goes on after it, and impossible timestamps never reach the recording.

use std::path::Path;

use prost::Message as _;

use super::validate::MAX_QUIET_NS;
use super::*;
use crate::pb::v1::{
    Chunk, EnergySource, Header, Record, SwitchColumns, SwitchEvent, Trailer, record::Kind,
};

const MS: u64 = 1_000_000;
const START: u64 = 100_000_000_000;

/// A version 3 file of `chunks` chunks, chunk i holding switches at START + i·100 ms,
/// and the offsets where each chunk's frame starts.
fn recording(chunks: u64) -> (Vec<u8>, Vec<usize>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.ebpr");
    let header = Header {
        format_version: FORMAT_VERSION,
        start_ns: START,
        ..Default::default()
    };
    let mut w = Writer::create(&path, &header).expect("create");
    let mut offsets = Vec::new();
    for i in 0..chunks {
        offsets.push(w.bytes() as usize);
        let switches = (0..20)
            .map(|k| SwitchEvent {
                ts_ns: START + i * 100 * MS + k * MS,
                cpu: (k % 2) as u32,
                tid: 10 + k as u32,
                ..Default::default()
            })
            .collect();
        w.chunk(Chunk {
            switches,
            ..Default::default()
        })
        .expect("chunk");
    }
    offsets.push(w.bytes() as usize);
    w.finish(Trailer {
        end_ns: START + chunks * 100 * MS,
        stop_reason: "duration".into(),
        losses: None,
    })
    .expect("finish");
    (std::fs::read(&path).expect("read"), offsets)
}

fn read(bytes: &[u8]) -> Recording {
    read_from(bytes, Path::new("damaged.ebpr")).expect("a damaged file still reads")
}

#[test]
fn sixteen_flipped_bytes_in_a_chunk_lose_that_chunk_only() {
    let (mut bytes, offsets) = recording(10);
    let whole = read(&bytes);
    assert!(whole.damage.is_empty());
    assert_eq!(whole.damage.note(), None);
    let middle = (offsets[5] + offsets[6]) / 2;
    for b in &mut bytes[middle..middle + 16] {
        *b ^= 0xff;
    }
    let rec = read(&bytes);
    assert!(!rec.truncated, "the trailer after the damage is still read");
    assert_eq!(rec.switches.len(), 9 * 20);
    assert_eq!(rec.damage.records_damaged, 1);
    assert_eq!(rec.damage.bytes_skipped, (offsets[6] - offsets[5]) as u64);
    // From chunk 4's last switch (START + 419 ms) to chunk 6's first (START + 600 ms).
    assert_eq!(rec.damage.lost_ns, 181 * MS);
    assert_eq!(rec.duration_ns(), whole.duration_ns());
    assert_eq!(
        rec.damage.note().as_deref(),
        Some("1 record damaged, 0.2 s of data lost")
    );
}

#[test]
fn no_flipped_byte_goes_unnoticed() {
    let (bytes, offsets) = recording(4);
    // Every byte after the header: chunks and the trailer.
    for at in offsets[0]..bytes.len() {
        for bit in [0x01, 0x80] {
            let mut damaged = bytes.clone();
            damaged[at] ^= bit;
            let rec = read(&damaged);
            // The trailer's length too: a file cut short would not hold the whole frame.
            assert!(
                rec.damage.records_damaged >= 1,
                "flip {bit:#x} at byte {at} of {} went unnoticed",
                bytes.len()
            );
            assert!(
                rec.switches.len() >= 3 * 20,
                "flip at {at} lost more than its chunk"
            );
        }
    }
}

#[test]
fn a_damaged_header_is_a_clear_error() {
    let (mut bytes, offsets) = recording(1);
    bytes[offsets[0] - 6] ^= 0x40;
    let err = read_from(bytes.as_slice(), Path::new("h.ebpr")).expect_err("header");
    assert!(matches!(err, ReadError::BadHeader { .. }), "{err}");
}

#[test]
fn several_damaged_chunks_in_a_row_are_all_counted() {
    let (mut bytes, offsets) = recording(8);
    for c in 2..5 {
        bytes[offsets[c] + 20] ^= 1;
    }
    let rec = read(&bytes);
    assert_eq!(rec.damage.records_damaged, 3);
    assert_eq!(rec.switches.len(), 5 * 20);
    assert_eq!(rec.damage.lost_ns, (500 - 119) * MS);
}

/// A file in the old framing, with the given chunks and trailer end.
fn version_2(chunks: Vec<Chunk>, end_ns: u64) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    let header = Header {
        format_version: 2,
        start_ns: START,
        cpus: vec![crate::pb::v1::Cpu::default()],
        ..Default::default()
    };
    let records = std::iter::once(Kind::Header(header))
        .chain(chunks.into_iter().map(Kind::Chunk))
        .chain(std::iter::once(Kind::Trailer(Trailer {
            end_ns,
            ..Default::default()
        })));
    for kind in records {
        Record { kind: Some(kind) }
            .encode_length_delimited(&mut bytes)
            .expect("encode");
    }
    bytes
}

#[test]
fn impossible_timestamps_and_end_times_are_dropped_and_counted() {
    let switch = |ts_ns: u64, cpu: u32| SwitchEvent {
        ts_ns,
        cpu,
        ..Default::default()
    };
    let chunk = Chunk {
        switches: vec![
            switch(START + MS, 0),
            switch(u64::MAX / 2, 0),
            switch(START + 2 * MS, 3),
            switch(7, 0),
        ],
        ..Default::default()
    };
    // The damaged end time that once made the model generate readings for centuries.
    let rec = read(&version_2(vec![chunk], u64::MAX - 1));
    assert_eq!(rec.switches.len(), 1);
    assert_eq!(rec.damage.events_dropped, 3);
    assert!(rec.damage.end_clamped);
    assert!(
        rec.duration_ns() <= MAX_QUIET_NS + MS,
        "{}",
        rec.duration_ns()
    );
    let note = rec.damage.note().expect("a note");
    assert!(
        note.contains("3 events with impossible timestamps, CPUs or sources dropped"),
        "{note}"
    );
}

#[test]
fn too_many_cpus_in_the_header_is_a_clear_error() {
    let mut bytes = MAGIC.to_vec();
    let header = Header {
        format_version: 2,
        cpus: vec![crate::pb::v1::Cpu::default(); MAX_CPUS + 1],
        ..Default::default()
    };
    Record {
        kind: Some(Kind::Header(header)),
    }
    .encode_length_delimited(&mut bytes)
    .expect("encode");
    let err = read_from(bytes.as_slice(), Path::new("cpus.ebpr")).expect_err("cpus");
    assert!(err.to_string().contains("8193 CPUs"), "{err}");
}

#[test]
fn a_damaged_length_in_the_last_frame_is_damage_not_a_cut() {
    let (bytes, offsets) = recording(3);
    let trailer = offsets[3];
    // The trailer frame's length, made to run past the end of the file.
    for (byte, bit) in [(4, 0x40), (5, 0x01), (6, 0x10), (7, 0x80)] {
        let mut damaged = bytes.clone();
        damaged[trailer + byte] ^= bit;
        let rec = read(&damaged);
        assert_eq!(rec.damage.records_damaged, 1, "length byte {byte}");
        assert!(rec.damage.end_damaged, "length byte {byte}");
        assert_eq!(rec.switches.len(), 3 * 20);
        let note = rec.damage.note().expect("a note");
        assert!(note.contains("1 record damaged"), "{note}");
        assert!(note.contains("its end is damaged"), "{note}");
    }
    // A chunk cut by the end of the file is a cut, whatever length it says.
    for cut in [trailer - 1, trailer - 30, offsets[2] + 13, offsets[2] + 14] {
        let rec = read(&bytes[..cut]);
        assert!(rec.truncated, "cut at {cut}");
        assert!(rec.damage.is_empty(), "cut at {cut}: {:?}", rec.damage);
        assert_eq!(rec.trailing_garbage_bytes, (cut - offsets[2]) as u64);
    }
    // A length past the end over a payload that cannot start a record of that length.
    let mut damaged = bytes[..trailer].to_vec();
    let mut frame = Vec::new();
    frame::encode(b"\x12\x05hello", &mut frame).expect("frame");
    frame[4] = 200;
    damaged.extend_from_slice(&frame);
    let rec = read(&damaged);
    assert_eq!(rec.damage.records_damaged, 1);
    assert!(rec.damage.end_damaged);
}

/// A version 3 file of the given records after the header.
fn framed(records: &[Record]) -> Vec<u8> {
    let (bytes, offsets) = recording(0);
    let mut out = bytes[..offsets[0]].to_vec();
    for r in records {
        frame::encode(&r.encode_to_vec(), &mut out).expect("frame");
    }
    out
}

fn chunk(chunk: Chunk) -> Record {
    Record {
        kind: Some(Kind::Chunk(chunk)),
    }
}

#[test]
fn records_that_decode_past_the_memory_bound_are_skipped_and_counted() {
    let switches = |from: u64| Chunk {
        switches: (0..20)
            .map(|k| SwitchEvent {
                ts_ns: START + from + k * MS,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    // Four records of 2 and 4 MiB, each over 100 MiB decoded: empty energy sources (two
    // bytes each on disk) and switch columns of one-byte entries.
    let sources = chunk(Chunk {
        sources: vec![EnergySource::default(); 1 << 20],
        ..Default::default()
    });
    let n = 2 << 20;
    let columns = chunk(Chunk {
        switch_columns: Some(SwitchColumns {
            cpu: vec![0],
            cpu_run_length: vec![n],
            ts_delta_ns: vec![1; n as usize],
            flags: vec![12; n as usize],
            ..Default::default()
        }),
        ..Default::default()
    });
    let bytes = framed(&[
        chunk(switches(0)),
        sources.clone(),
        columns.clone(),
        sources,
        columns,
        chunk(switches(100 * MS)),
    ]);
    assert!(bytes.len() < 13 << 20, "{}", bytes.len());
    let rec = read(&bytes);
    // Each decodes to 28 to 50 times its bytes, past what any real record reaches
    // (budget::MAX_RECORD_RATIO): refused, though the file's allowance has room.
    assert_eq!(rec.damage.records_oversized, 4);
    assert_eq!(rec.damage.records_damaged, 0);
    assert_eq!(rec.switches.len(), 40, "the records around them are read");
    assert!(rec.sources.is_empty());
    let note = rec.damage.note().expect("a note");
    assert!(
        note.contains("4 records skipped as too large to decode within the memory bound"),
        "{note}"
    );
}

#[test]
fn an_energy_source_is_kept_once_and_thousands_are_dropped() {
    let source = |id| EnergySource {
        id,
        kind: "powercap".into(),
        ..Default::default()
    };
    let bytes = framed(&[
        chunk(Chunk {
            sources: (0..MAX_SOURCES as u32 + 10).map(source).collect(),
            ..Default::default()
        }),
        chunk(Chunk {
            sources: vec![source(0), source(1)],
            ..Default::default()
        }),
    ]);
    let rec = read(&bytes);
    assert_eq!(rec.sources.len(), MAX_SOURCES);
    assert_eq!(rec.damage.events_dropped, 12);
}

/// After damage the reader looks for the next whole frame. A file of frame headers every
/// 12 bytes, each claiming a length that runs to the end with a wrong checksum, once took
/// time in the square of its size (each candidate checksummed its whole claimed payload);
/// `frame::tests::resync_is_linear_in_the_input` counts the work, this reads the file.
#[test]
fn a_file_of_near_valid_frame_headers_reads_in_linear_time() {
    let (bytes, offsets) = recording(2);
    let mut crafted = bytes[..offsets[1]].to_vec();
    let size = 4 << 20;
    while crafted.len() < size {
        let len = (size + 100 - crafted.len()) as u32;
        crafted.extend_from_slice(&frame::SYNC);
        crafted.extend_from_slice(&len.to_le_bytes());
        crafted.extend_from_slice(&[0; 4]);
    }
    let headers = crafted.len() - offsets[1];
    crafted.extend_from_slice(&bytes[offsets[1]..]);
    let started = std::time::Instant::now();
    let rec = read(&crafted);
    let took = started.elapsed();
    assert!(
        !rec.truncated,
        "the chunk and trailer after the headers are read"
    );
    assert_eq!(rec.switches.len(), 2 * 20);
    assert_eq!(rec.damage.records_damaged, (headers / 12) as u64);
    assert_eq!(rec.damage.bytes_skipped, headers as u64);
    // About a second in a debug build; checking each header's claimed payload took hours.
    assert!(took < std::time::Duration::from_secs(30), "{took:?}");
}
