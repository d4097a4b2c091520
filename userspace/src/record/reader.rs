//! Reading a recording back. A file cut short (killed recorder, full disk) reads up to its
//! last whole record and is marked truncated; garbage and unknown versions are clear errors.
//! In version 3 files a damaged record is skipped and counted, and reading resumes at the
//! next whole one ([`super::frame`]); in every version, timestamps that cannot be true are
//! dropped and counted ([`super::validate`]).

use std::{
    io::Read,
    path::{Path, PathBuf},
};

use super::{
    FORMAT_VERSION, MAGIC, MAX_CPUS, OLDEST_FORMAT_VERSION, Recording, SwitchLog,
    budget::{self, Budget},
    frame,
    validate::Window,
};
use crate::pb::v1::{Chunk, Header, Record, SymbolTable, Trailer, record::Kind};

/// Why a recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not start with the recording magic.
    #[error(
        "{path} is not an energy-bpf recording (bad magic); record one with `energy-bpf record -o FILE`"
    )]
    NotARecording {
        /// The file.
        path: PathBuf,
    },
    /// The header is missing or unreadable.
    #[error("{path} is damaged: {what}; nothing in it can be read")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// The file was written by an incompatible version.
    #[error(
        "{path} uses recording format version {found}, but this energy-bpf reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}; use a matching energy-bpf release"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
    },
    /// A directory of rotating recordings holds no file in the range asked for.
    #[error("{path} holds no recording {what}")]
    NoFiles {
        /// The directory.
        path: PathBuf,
        /// What was looked for, e.g. "files" or "between ... and ...".
        what: String,
    },
    /// `--from`/`--to` could not be read.
    #[error("{0}")]
    BadRange(String),
}

/// Reads a whole recording.
///
/// See `super::series::read_path` for a directory of rotating files or a time range.
pub fn read_file(path: &Path) -> Result<Recording, ReadError> {
    let file = std::fs::File::open(path).map_err(|source| ReadError::Io {
        path: path.into(),
        source,
    })?;
    read_from(file, path)
}

/// Reads a whole recording from any reader; `path` is only used in messages.
pub fn read_from(input: impl Read, path: &Path) -> Result<Recording, ReadError> {
    read_within(input, path, None)
}

/// [`read_file`], its decoded records drawing on `budget`, shared with other files.
pub(super) fn read_file_within(path: &Path, budget: &mut Budget) -> Result<Recording, ReadError> {
    let file = std::fs::File::open(path).map_err(|source| ReadError::Io {
        path: path.into(),
        source,
    })?;
    read_within(file, path, Some(budget))
}

/// Reads a whole recording; its decoded records draw on `shared`, or on the allowance of
/// a file its size.
fn read_within(
    mut input: impl Read,
    path: &Path,
    shared: Option<&mut Budget>,
) -> Result<Recording, ReadError> {
    let mut bytes = Vec::new();
    input
        .read_to_end(&mut bytes)
        .map_err(|source| ReadError::Io {
            path: path.into(),
            source,
        })?;
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(ReadError::NotARecording { path: path.into() });
    }
    let mut rest = &bytes[MAGIC.len()..];
    let mut own = Budget::for_input(bytes.len());
    let budget = shared.unwrap_or(&mut own);
    let header = read_header(&mut rest, budget, path)?;
    let framed = header.format_version >= 3;
    let reading = Reading {
        window: Window::new(&header),
        rec: Recording {
            end_ns: header.start_ns,
            header,
            ..Default::default()
        },
        gap_from: None,
        frames: frame::Resync::new(rest),
        budget,
    };
    if framed {
        return Ok(reading.framed(rest));
    }
    let mut reading = reading;
    loop {
        let before = rest.len();
        let next = reading.next_record(&mut rest);
        match next {
            Next::Record(Record {
                kind: Some(Kind::Chunk(chunk)),
            }) => reading.chunk(chunk, None),
            Next::Record(Record {
                kind: Some(Kind::Trailer(t)),
            }) => {
                reading.trailer(t);
                return Ok(reading.rec);
            }
            Next::Record(Record {
                kind: Some(Kind::Symbols(table)),
            }) => reading.symbols(table),
            // Kinds from a newer writer, or a second header: nothing to use.
            Next::Record(_) => {}
            Next::OverBudget => reading.oversized(),
            Next::End => break,
            Next::Cut | Next::Corrupt => {
                reading.rec.trailing_garbage_bytes = before as u64;
                break;
            }
        }
    }
    Ok(reading.unfinished())
}

/// The header record, checked: a known version, its checksum (version 3), a sane CPU count.
fn read_header(rest: &mut &[u8], budget: &mut Budget, path: &Path) -> Result<Header, ReadError> {
    let bad_header = |what: &str| ReadError::BadHeader {
        path: path.into(),
        what: what.into(),
    };
    let start = *rest;
    let header = match next_record(rest, budget) {
        Next::Record(Record {
            kind: Some(Kind::Header(h)),
        }) => h,
        Next::Record(_) => return Err(bad_header("first record is not a header")),
        Next::End | Next::Cut => return Err(bad_header("file ends inside the header")),
        Next::Corrupt => return Err(bad_header("header does not decode")),
        Next::OverBudget => {
            return Err(bad_header(
                "header would take more memory to decode than a file this size may",
            ));
        }
    };
    if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&header.format_version) {
        return Err(ReadError::Version {
            path: path.into(),
            found: header.format_version,
        });
    }
    if header.format_version >= 3 {
        // Version 3: the header record is followed by the CRC32C of its bytes.
        let record = &start[..start.len() - rest.len()];
        let Some(stored) = rest.get(..4) else {
            return Err(bad_header("file ends inside the header"));
        };
        let stored = u32::from_le_bytes([stored[0], stored[1], stored[2], stored[3]]);
        if crc32c::crc32c(record) != stored {
            return Err(bad_header("header checksum does not match"));
        }
        *rest = &rest[4..];
    }
    if header.cpus.len() > MAX_CPUS {
        return Err(bad_header(&format!(
            "header lists {} CPUs, more than Linux supports ({MAX_CPUS})",
            header.cpus.len()
        )));
    }
    Ok(header)
}

/// Records decoded at once per decoding thread: enough that threads rarely wait on one
/// another, few enough that a batch's decoded events stay a small part of the reading.
const BATCH_PER_THREAD: usize = 2;

/// The first byte of a `Record` holding a chunk (field 2, length-delimited).
const CHUNK_TAG: u8 = 0x12;

/// A version 3 frame as walked ahead of decoding ([`Reading::step`]).
enum Step<'b> {
    /// A whole frame's record, charged to the budget, to decode.
    Record(&'b [u8]),
    /// A whole frame whose record would decode past the memory bound: not decoded.
    OverBudget,
    /// A whole frame whose record does not even scan as protobuf: not decoded.
    Corrupt,
    /// Damage skipped up to the next whole frame: frames and bytes.
    Skipped(u64, usize),
    /// Damage up to the end of the file: frames and bytes.
    EndDamaged(u64, usize),
    /// A frame cut short by the end of the file: the bytes left.
    Cut(usize),
    /// The end of the file.
    End,
}

#[allow(
    clippy::large_enum_variant,
    reason = "one short-lived value at a time; boxing buys nothing"
)]
enum Next {
    Record(Record),
    /// A record that would decode to more than the memory bound allows; skipped.
    OverBudget,
    End,
    Cut,
    Corrupt,
}

/// A recording being read: what was read so far and what is known about the damage.
struct Reading<'a> {
    rec: Recording,
    window: Window,
    /// After damage, the latest timestamp before it: the data lost runs from there to the
    /// next timestamp read.
    gap_from: Option<u64>,
    /// The records after the header, for finding whole frames after damage (version 3).
    frames: frame::Resync<'a>,
    /// What decoded records may still allocate.
    budget: &'a mut Budget,
}

impl Reading<'_> {
    /// Reads the version 3 frames in `rest` to the end: frames are walked a batch at a
    /// time ([`Self::step`]), the batch's records decoded on several threads
    /// ([`super::parallel`]) and the results admitted and merged in file order.
    fn framed(mut self, mut rest: &[u8]) -> Recording {
        let threads = super::parallel::threads();
        let batch = BATCH_PER_THREAD * threads;
        loop {
            let mut steps = Vec::with_capacity(batch);
            let mut records = Vec::with_capacity(batch);
            while records.len() < batch {
                let step = self.step(&mut rest);
                let go_on = match step {
                    // Past a record other than a chunk (a trailer ends the reading) the
                    // batch stops, so no frame after a trailer is charged to the budget.
                    Step::Record(bytes) => {
                        records.push(bytes);
                        bytes.first() == Some(&CHUNK_TAG)
                    }
                    Step::OverBudget | Step::Corrupt | Step::Skipped(..) => true,
                    Step::EndDamaged(..) | Step::Cut(_) | Step::End => false,
                };
                steps.push(step);
                if !go_on {
                    break;
                }
            }
            let mut decoded = super::parallel::decode_all(&records, threads).into_iter();
            for step in steps {
                match step {
                    Step::Record(_) => {
                        let Some(d) = decoded.next() else { continue };
                        match d.record {
                            Some(Record {
                                kind: Some(Kind::Chunk(chunk)),
                            }) => self.chunk(chunk, d.packed),
                            Some(Record {
                                kind: Some(Kind::Trailer(t)),
                            }) => {
                                self.trailer(t);
                                return self.rec;
                            }
                            Some(Record {
                                kind: Some(Kind::Symbols(table)),
                            }) => self.symbols(table),
                            // Kinds from a newer writer, or a second header: nothing to use.
                            Some(_) => {}
                            // The checksum holds but the contents do not: written damaged
                            // or crafted.
                            None => self.damaged(1, 0),
                        }
                    }
                    Step::OverBudget => self.oversized(),
                    Step::Corrupt => self.damaged(1, 0),
                    Step::Skipped(frames, bytes) => self.damaged(frames, bytes),
                    Step::EndDamaged(frames, bytes) => {
                        // Damaged up to the end: nothing after it to go on with.
                        self.damaged(frames, bytes);
                        self.rec.damage.end_damaged = true;
                        return self.unfinished();
                    }
                    Step::Cut(bytes) => {
                        self.rec.trailing_garbage_bytes = bytes as u64;
                        return self.unfinished();
                    }
                    Step::End => return self.unfinished(),
                }
            }
        }
    }

    /// The recording read so far, when no trailer ends it: the recorder did not finish.
    /// Everything read so far is kept.
    fn unfinished(mut self) -> Recording {
        let (end_ns, _) = self.window.end(None);
        self.rec.end_ns = self.rec.end_ns.max(end_ns);
        self.rec.truncated = true;
        self.rec
    }

    /// The next version 3 frame, not yet decoded: a whole frame's record is charged to the
    /// budget here, in file order. Damage is skipped up to the next whole frame; a frame
    /// cut by the end of the file (and nothing whole after it) is a truncated tail, unless
    /// what is there shows damage rather than a cut.
    fn step<'b>(&mut self, rest: &mut &'b [u8]) -> Step<'b> {
        if rest.is_empty() {
            return Step::End;
        }
        match frame::parse(rest) {
            frame::Frame::Whole { payload, len } => {
                *rest = &rest[len..];
                match charge(payload, self.budget) {
                    None => Step::Record(payload),
                    Some(Next::OverBudget) => Step::OverBudget,
                    Some(_) => Step::Corrupt,
                }
            }
            found => {
                let at = self.frames.input_len() - rest.len();
                match self.frames.next_after(at) {
                    (Some(next), frames) => {
                        let skip = next - at;
                        *rest = &rest[skip..];
                        Step::Skipped(frames, skip)
                    }
                    (None, _) if found == frame::Frame::Cut && frame::looks_cut(rest) => {
                        Step::Cut(rest.len())
                    }
                    (None, frames) => {
                        let len = rest.len();
                        *rest = &[];
                        Step::EndDamaged(frames, len)
                    }
                }
            }
        }
    }

    /// The next version 1 or 2 record (see [`next_record`]); one over the memory bound
    /// is skipped, as its length is known.
    fn next_record(&mut self, rest: &mut &[u8]) -> Next {
        next_record(rest, self.budget)
    }

    fn damaged(&mut self, records: u64, bytes: usize) {
        self.rec.damage.records_damaged += records;
        self.rec.damage.bytes_skipped += bytes as u64;
        self.gap_from.get_or_insert(self.window.frontier());
    }

    fn oversized(&mut self) {
        self.rec.damage.records_oversized += 1;
        self.gap_from.get_or_insert(self.window.frontier());
    }

    fn close_gap(&mut self, next_ns: u64) {
        if let Some(from) = self.gap_from.take() {
            self.rec.damage.lost_ns += next_ns.saturating_sub(from);
        }
    }

    /// Admits and merges a chunk; `packed` is its switch events already packed, used
    /// when none of them is dropped.
    fn chunk(&mut self, mut chunk: Chunk, packed: Option<SwitchLog>) {
        let switches = chunk.switches.len();
        self.rec.damage.events_dropped += self.window.admit(&mut chunk);
        let packed = packed.filter(|p| p.len() == switches && switches == chunk.switches.len());
        let earliest = [
            chunk.switches.iter().map(|s| s.ts_ns).min(),
            chunk.samples.iter().map(|s| s.ts_ns).min(),
            chunk.readings.iter().map(|r| r.ts_ns).min(),
        ];
        if let Some(next) = earliest.into_iter().flatten().min() {
            self.close_gap(next);
        }
        merge_chunk(&mut self.rec, chunk, packed);
        self.rec.end_ns = self.rec.end_ns.max(self.window.frontier());
    }

    /// Keeps a stored symbol table (checked when decoded); one past
    /// [`super::symbols::MAX_TABLES`] is counted as damage.
    fn symbols(&mut self, table: SymbolTable) {
        if self.rec.symbols.len() < super::symbols::MAX_TABLES {
            std::sync::Arc::make_mut(&mut self.rec.symbols).push(table);
        } else {
            self.rec.damage.records_damaged += 1;
        }
    }

    fn trailer(&mut self, t: Trailer) {
        let (end_ns, clamped) = self.window.end(Some(t.end_ns));
        self.close_gap(end_ns);
        self.rec.damage.end_clamped |= clamped;
        apply_trailer(&mut self.rec, Trailer { end_ns, ..t });
    }
}

/// The next version 1 or 2 record: a varint length and the record. One that would take
/// reading over its memory bound is skipped: its length says where the next one starts.
fn next_record(rest: &mut &[u8], budget: &mut Budget) -> Next {
    if rest.is_empty() {
        return Next::End;
    }
    let mut cursor = *rest;
    let Ok(len) = prost::decode_length_delimiter(&mut cursor) else {
        return Next::Cut;
    };
    if len > cursor.len() {
        return Next::Cut;
    }
    let next = decode(&cursor[..len], budget);
    if !matches!(next, Next::Corrupt) {
        *rest = &cursor[len..];
    }
    next
}

/// A record's bytes, with a chunk's switch columns turned back into events; decoded only
/// when what it allocates fits in `budget` ([`Next::OverBudget`] when not).
fn decode(bytes: &[u8], budget: &mut Budget) -> Next {
    if let Some(refused) = charge(bytes, budget) {
        return refused;
    }
    super::parallel::decode_charged(bytes).map_or(Next::Corrupt, Next::Record)
}

/// Charges what decoding a record will allocate to `budget`: `None` when it fits, else
/// why it is not to be decoded ([`Next::Corrupt`] or [`Next::OverBudget`]).
fn charge(bytes: &[u8], budget: &mut Budget) -> Option<Next> {
    let Ok(cost) = budget::cost(bytes) else {
        return Some(Next::Corrupt);
    };
    if !budget.take(cost, bytes.len()) {
        return Some(Next::OverBudget);
    }
    None
}

fn merge_chunk(rec: &mut Recording, chunk: Chunk, packed: Option<SwitchLog>) {
    match packed {
        Some(log) => rec.switches.append(log),
        None => rec.switches.push(&chunk.switches),
    }
    rec.samples.extend(chunk.samples);
    rec.process_events.extend(chunk.process_events);
    rec.runs.extend(chunk.runs);
    if let Some(counts) = chunk.run_counts {
        rec.run_counts_dropped = rec.run_counts_dropped.max(counts.dropped);
        // Checked in `decode`.
        rec.run_counts
            .extend(super::run_counts::from_columns(&counts).unwrap_or_default());
    }
    for t in chunk.threads {
        super::merge_thread(&mut rec.threads, t);
    }
    for m in chunk.mappings {
        rec.mappings.entry(m.tgid).or_default().push(m);
    }
    for f in chunk.python_frames {
        rec.python_frames.insert(f.id, f);
    }
    rec.python_processes.extend(chunk.python_processes);
    for j in chunk.jit_symbols {
        rec.jit_symbols.entry(j.tgid).or_default().push(j);
    }
    rec.sources.extend(chunk.sources);
    rec.readings.extend(chunk.readings);
    if let Some(losses) = chunk.losses {
        rec.losses = losses;
    }
}

fn apply_trailer(rec: &mut Recording, t: Trailer) {
    rec.end_ns = rec.end_ns.max(t.end_ns);
    rec.stop_reason = Some(t.stop_reason);
    if let Some(losses) = t.losses {
        rec.losses = losses;
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;
    use crate::pb::v1::{Header, SwitchEvent};
    use crate::record::Writer;

    fn write_sample_file(dir: &Path, chunks: usize, finish: bool) -> PathBuf {
        let path = dir.join("x.ebpr");
        let header = Header {
            format_version: FORMAT_VERSION,
            start_ns: 1_000,
            ..Default::default()
        };
        let mut w = Writer::create(&path, &header).expect("create");
        for i in 0..chunks {
            let switches = vec![SwitchEvent {
                ts_ns: 2_000 + i as u64,
                tid: i as u32 + 1,
                ..Default::default()
            }];
            w.chunk(Chunk {
                switches,
                ..Default::default()
            })
            .expect("chunk");
        }
        if finish {
            w.finish(Trailer {
                end_ns: 9_000,
                stop_reason: "duration".into(),
                losses: None,
            })
            .expect("finish");
        }
        path
    }

    #[test]
    fn round_trip_with_trailer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rec = read_file(&write_sample_file(dir.path(), 3, true)).expect("read");
        assert!(!rec.truncated);
        assert_eq!(rec.switches.len(), 3);
        assert_eq!(rec.duration_ns(), 8_000);
        assert_eq!(rec.stop_reason.as_deref(), Some("duration"));
    }

    #[test]
    fn every_cut_point_reads_back_what_was_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_sample_file(dir.path(), 5, true);
        let full = std::fs::read(&path).expect("read");
        let mut last = 0;
        for cut in (MAGIC.len() + 20)..full.len() {
            match read_from(&full[..cut], &path) {
                Ok(rec) => {
                    assert!(rec.truncated, "cut at {cut} must be marked truncated");
                    assert!(
                        rec.switches.len() >= last,
                        "never fewer events for a longer prefix"
                    );
                    last = rec.switches.len();
                }
                Err(ReadError::BadHeader { .. }) => {
                    assert_eq!(last, 0, "header cut only at the start")
                }
                Err(e) => panic!("cut at {cut}: unexpected {e}"),
            }
        }
        assert_eq!(
            last, 5,
            "a file cut just before the trailer keeps all chunks"
        );
    }

    #[test]
    fn garbage_and_versions_are_clear_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let garbage = dir.path().join("garbage");
        std::fs::write(&garbage, b"\x7fELF this is not a recording").expect("write");
        let err = read_file(&garbage).expect_err("garbage");
        assert!(
            err.to_string().contains("not an energy-bpf recording"),
            "{err}"
        );

        let path = dir.path().join("v9.ebpr");
        let header = Header {
            format_version: 9,
            ..Default::default()
        };
        drop(Writer::create(&path, &header).expect("create"));
        let err = read_file(&path).expect_err("version");
        assert!(err.to_string().contains("format version 9"), "{err}");
        assert!(err.to_string().contains("reads versions 1 to 3"), "{err}");
        for version in [1, 2, 3] {
            let path = dir.path().join(format!("v{version}.ebpr"));
            let header = Header {
                format_version: version,
                ..Default::default()
            };
            drop(Writer::create(&path, &header).expect("create"));
            assert!(read_file(&path).expect("readable version").truncated);
        }

        let missing = read_file(&dir.path().join("missing")).expect_err("missing");
        assert!(missing.to_string().contains("cannot read"), "{missing}");
    }

    /// Switches as the recorder drains them: per-CPU batches that interleave, timestamps
    /// mostly rising per CPU but sometimes going back (the end-of-capture drain), a few
    /// tasks per CPU, now and then a cgroup id.
    fn random_switches(seed: u64, n: usize) -> Vec<SwitchEvent> {
        let mut x = seed | 1;
        let mut rand = move |below: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % below
        };
        let mut ts = [10_000_000u64; 6];
        let mut running = [0u32; 6];
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let cpu = rand(6) as usize;
            for _ in 0..=rand(40) {
                if rand(30) == 0 {
                    ts[cpu] -= rand(100_000);
                } else {
                    ts[cpu] += rand(50_000);
                }
                let tid = if rand(10) == 0 {
                    rand(5_000_000) as u32
                } else {
                    running[cpu]
                };
                let next_tid = [0, 100, 101, 2_000 + cpu as u32][rand(4) as usize];
                out.push(SwitchEvent {
                    ts_ns: ts[cpu],
                    cpu: cpu as u32,
                    tid,
                    tgid: if tid % 3 == 0 { tid } else { tid - tid % 3 },
                    cgroup_id: if rand(50) == 0 { rand(u64::MAX) } else { 0 },
                    preempted: rand(2) == 0,
                    next_known: rand(8) != 0,
                    next_tid,
                    next_tgid: next_tid,
                    activity: None,
                });
                running[cpu] = next_tid;
            }
        }
        out
    }

    #[test]
    fn switches_read_back_identical_and_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        for seed in 1..20 {
            let path = dir.path().join(format!("s{seed}.ebpr"));
            let header = Header {
                format_version: FORMAT_VERSION,
                ..Default::default()
            };
            let mut w = Writer::create(&path, &header).expect("create");
            let mut all = Vec::new();
            for chunk in 0..4 {
                let switches = random_switches(seed * 10 + chunk, 300 * chunk as usize);
                all.extend_from_slice(&switches);
                w.chunk(Chunk {
                    switches,
                    ..Default::default()
                })
                .expect("chunk");
            }
            w.finish(Trailer::default()).expect("finish");
            let rec = read_file(&path).expect("read");
            assert!(!rec.truncated);
            assert_eq!(rec.switches.to_vec(), all, "seed {seed}");
            let bytes = std::fs::metadata(&path).expect("stat").len();
            assert!(
                bytes < 16 * all.len() as u64,
                "{bytes} bytes for {}",
                all.len()
            );
        }
    }

    #[test]
    fn version_1_switch_messages_still_read() {
        let switches = random_switches(7, 500);
        let mut bytes = MAGIC.to_vec();
        let header = Header {
            format_version: 1,
            start_ns: 1_000,
            ..Default::default()
        };
        for kind in [
            Kind::Header(header),
            Kind::Chunk(Chunk {
                switches: switches.clone(),
                ..Default::default()
            }),
            Kind::Trailer(Trailer::default()),
        ] {
            Record { kind: Some(kind) }
                .encode_length_delimited(&mut bytes)
                .expect("encode");
        }
        let rec = read_from(bytes.as_slice(), Path::new("v1.ebpr")).expect("read");
        assert!(!rec.truncated);
        assert_eq!(rec.header.format_version, 1);
        assert_eq!(rec.switches.to_vec(), switches);
    }

    /// `write_sample_file` in the framing of version 2.
    fn version_2_file(dir: &Path, chunks: usize) -> (PathBuf, Vec<u8>) {
        let path = dir.join("v2.ebpr");
        let header = Header {
            format_version: 2,
            start_ns: 1_000,
            ..Default::default()
        };
        let mut w = Writer::create(&path, &header).expect("create");
        for i in 0..chunks {
            w.chunk(Chunk {
                switches: vec![SwitchEvent {
                    ts_ns: 2_000 + i as u64,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .expect("chunk");
        }
        let bytes = std::fs::read(&path).expect("read");
        (path, bytes)
    }

    fn inconsistent_columns_chunk() -> Record {
        let mut columns = super::super::columns::to_columns(&random_switches(3, 50));
        columns.flags.pop();
        Record {
            kind: Some(Kind::Chunk(Chunk {
                switch_columns: Some(columns),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn inconsistent_switch_columns_are_a_corrupt_tail_in_version_2() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (path, mut bytes) = version_2_file(dir.path(), 2);
        let bad = inconsistent_columns_chunk().encode_length_delimited_to_vec();
        bytes.extend_from_slice(&bad);
        let rec = read_from(bytes.as_slice(), &path).expect("read");
        assert!(rec.truncated);
        assert_eq!(rec.switches.len(), 2);
        assert_eq!(rec.trailing_garbage_bytes, bad.len() as u64);
    }

    #[test]
    fn inconsistent_switch_columns_are_a_damaged_record_in_version_3() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_sample_file(dir.path(), 2, false);
        let mut bytes = std::fs::read(&path).expect("read");
        // A whole frame, checksum and all, around contents that do not decode.
        frame::encode(&inconsistent_columns_chunk().encode_to_vec(), &mut bytes).expect("frame");
        let rec = read_from(bytes.as_slice(), &path).expect("read");
        assert!(rec.truncated);
        assert_eq!(rec.switches.len(), 2);
        assert_eq!(rec.damage.records_damaged, 1);
    }

    #[test]
    fn corrupt_tail_keeps_the_whole_chunks_before_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let garbage = [0x05, 0xff, 0xff, 0xff, 0xff, 0xff];
        let (path, mut bytes) = version_2_file(dir.path(), 2);
        bytes.extend_from_slice(&garbage);
        let rec = read_from(bytes.as_slice(), &path).expect("read");
        assert!(rec.truncated);
        assert_eq!(rec.switches.len(), 2);
        assert_eq!(rec.trailing_garbage_bytes, 6);
        // Version 3: bytes that cannot start a frame are damage, not a cut record.
        let path = write_sample_file(dir.path(), 2, false);
        let mut bytes = std::fs::read(&path).expect("read");
        bytes.extend_from_slice(&garbage);
        let rec = read_from(bytes.as_slice(), &path).expect("read");
        assert!(rec.truncated);
        assert_eq!(rec.switches.len(), 2);
        assert_eq!(rec.damage.records_damaged, 1);
        assert_eq!(rec.damage.bytes_skipped, 6);
    }
}
