//! What decoding a record will allocate, found before decoding it.
//!
//! Protobuf lets a few bytes stand for a large value: an empty `EnergySource` is two bytes
//! on disk and over a hundred in memory, a one-byte varint in a packed column becomes eight,
//! and a switch column entry becomes a whole `SwitchEvent`. A crafted file of such records
//! would decode to some 40 times its size. [`cost`] walks a record's wire format tag by
//! tag, allocating nothing, and adds up what prost and the column decoder will allocate
//! for it; the reader ([`Budget`]) refuses records that would take reading past
//! [`BASE`] + [`PER_INPUT_BYTE`] × the file's size, counts them as damage and goes on.

use std::mem::size_of;

use crate::pb::v1::{
    CalibratedStatic, Cpu, EnergyReading, EnergySource, GpuProcessUsage, JitSymbol, Mapping,
    ProcessEvent, PythonFrame, PythonProcess, RunCounter, RunMarker, Sample, SwitchEvent,
    SymbolAddress, SymbolFile, SymbolFrame, ThreadInfo,
};

/// Decoded bytes any recording may use, whatever its size: room for the header and the
/// first chunks of a small file.
pub const BASE: u64 = 48 << 20;

/// Decoded bytes allowed per byte of the file. Real chunks decode to about 4–10 times their
/// size, and a context-switch storm to 18 (a 56-byte `SwitchEvent` from about 3 bytes of
/// columns): those must all read, whole. The reader keeps switch events packed once a
/// chunk is checked ([`super::SwitchLog`]), so that peak lasts one chunk, and every command
/// stays within 200 MiB + 20 × the file size, storms included (docs/how-it-works.md, "Reading is bounded").
pub const PER_INPUT_BYTE: u64 = 20;

/// Most decoded bytes per byte of one record (past [`RECORD_SLACK`]). Real records stay
/// under 20 (see [`PER_INPUT_BYTE`]); the crafted shapes that make protobuf balloon (empty
/// messages, empty switch entries) reach 40 to 60. Such a record is refused whatever the
/// allowance left, so a crafted file cannot spend the allowance at its densest.
pub const MAX_RECORD_RATIO: u64 = 24;

/// Decoded bytes any one record may take regardless of its size (a header, a small chunk).
const RECORD_SLACK: u64 = 1 << 20;

/// How a field is stored once decoded.
#[derive(Clone, Copy)]
enum Field {
    /// A number or bool: inline, nothing on the heap.
    Scalar,
    /// A string or bytes: its length on the heap.
    Bytes,
    /// Repeated numbers of this many bytes each, packed or not.
    Numbers(u64),
    /// Repeated strings.
    Strings,
    /// A message, inline; prost merges every occurrence into one.
    One(&'static Msg),
    /// Repeated messages.
    Many(&'static Msg),
}

/// A message type: its size inline and its fields by number.
struct Msg {
    size: u64,
    fields: &'static [(u32, Field)],
}

impl Msg {
    fn field(&self, number: u32) -> Field {
        self.fields
            .iter()
            .find(|(n, _)| *n == number)
            .map_or(Field::Scalar, |(_, f)| *f)
    }
}

const fn size<T>() -> u64 {
    size_of::<T>() as u64
}

// The schema of `proto/energy_bpf.proto`, as far as the heap is concerned: fields not
// listed are numbers (or unknown, which prost skips).
static CPU: Msg = Msg {
    size: size::<Cpu>(),
    fields: &[],
};
static CALIBRATED: Msg = Msg {
    size: size::<CalibratedStatic>(),
    fields: &[(1, Field::Bytes), (3, Field::Bytes)],
};
static HEADER: Msg = Msg {
    size: 0,
    fields: &[
        (2, Field::Bytes),
        (3, Field::Bytes),
        (4, Field::Many(&CPU)),
        (6, Field::Bytes),
        (9, Field::Bytes),
        (10, Field::Strings),
        (11, Field::Numbers(4)),
        (12, Field::Many(&CALIBRATED)),
        (13, Field::Bytes),
        (14, Field::Many(&RUN_COUNTER)),
    ],
};
static RUN_COUNTER: Msg = Msg {
    size: size::<RunCounter>(),
    fields: &[(1, Field::Bytes), (2, Field::Bytes)],
};
/// `RunCounts`; field 2 (`ts_delta_ns`) has one entry per run.
static RUN_COUNTS: Msg = Msg {
    size: 0,
    fields: &[
        (1, Field::Numbers(4)),
        (2, Field::Numbers(8)),
        (3, Field::Numbers(4)),
        (4, Field::Numbers(4)),
        (5, Field::Numbers(8)),
    ],
};
const RUN_COUNTS_RUNS: usize = 2;
static SWITCH: Msg = Msg {
    size: size::<SwitchEvent>(),
    fields: &[],
};
/// `SwitchColumns`; field 3 (`ts_delta_ns`) has one entry per event.
static COLUMNS: Msg = Msg {
    size: 0,
    fields: &[
        (1, Field::Numbers(4)),
        (2, Field::Numbers(4)),
        (3, Field::Numbers(8)),
        (4, Field::Numbers(4)),
        (5, Field::Numbers(4)),
        (6, Field::Numbers(4)),
        (7, Field::Numbers(4)),
        (8, Field::Numbers(4)),
        (9, Field::Numbers(4)),
        (10, Field::Numbers(8)),
        (11, Field::Numbers(8)),
    ],
};
const COLUMNS_EVENTS: usize = 3;
static SAMPLE: Msg = Msg {
    size: size::<Sample>(),
    fields: &[
        (6, Field::Numbers(8)),
        (7, Field::Numbers(8)),
        (10, Field::Numbers(8)),
        (11, Field::Numbers(4)),
    ],
};
static PYTHON_FRAME: Msg = Msg {
    size: size::<PythonFrame>(),
    fields: &[(2, Field::Bytes), (3, Field::Bytes)],
};
static PYTHON_PROCESS: Msg = Msg {
    size: size::<PythonProcess>(),
    fields: &[(2, Field::Bytes), (3, Field::Bytes)],
};
static PROCESS_EVENT: Msg = Msg {
    size: size::<ProcessEvent>(),
    fields: &[(7, Field::Bytes)],
};
static THREAD: Msg = Msg {
    size: size::<ThreadInfo>(),
    fields: &[(3, Field::Bytes), (5, Field::Bytes), (8, Field::Bytes)],
};
static MAPPING: Msg = Msg {
    size: size::<Mapping>(),
    fields: &[(5, Field::Bytes), (6, Field::Bytes)],
};
static JIT_SYMBOL: Msg = Msg {
    size: size::<JitSymbol>(),
    fields: &[(4, Field::Bytes)],
};
static LOSSES: Msg = Msg {
    size: 0,
    fields: &[],
};
static GPU_USAGE: Msg = Msg {
    size: size::<GpuProcessUsage>(),
    fields: &[],
};
static READING: Msg = Msg {
    size: size::<EnergyReading>(),
    fields: &[(4, Field::Bytes), (5, Field::Many(&GPU_USAGE))],
};
static SOURCE: Msg = Msg {
    size: size::<EnergySource>(),
    fields: &[(2, Field::Bytes), (5, Field::Bytes), (11, Field::Bytes)],
};
static RUN: Msg = Msg {
    size: size::<RunMarker>(),
    fields: &[],
};
static CHUNK: Msg = Msg {
    size: 0,
    fields: &[
        (1, Field::Many(&SWITCH)),
        (2, Field::Many(&SAMPLE)),
        (3, Field::Many(&PROCESS_EVENT)),
        (4, Field::Many(&THREAD)),
        (5, Field::Many(&MAPPING)),
        (6, Field::One(&LOSSES)),
        (7, Field::Many(&READING)),
        (8, Field::Many(&SOURCE)),
        (9, Field::One(&COLUMNS)),
        (10, Field::Many(&JIT_SYMBOL)),
        (11, Field::Many(&PYTHON_FRAME)),
        (12, Field::Many(&PYTHON_PROCESS)),
        (13, Field::Many(&RUN)),
        (14, Field::One(&RUN_COUNTS)),
    ],
};
static TRAILER: Msg = Msg {
    size: 0,
    fields: &[(2, Field::Bytes), (3, Field::One(&LOSSES))],
};
static SYMBOL_FRAME: Msg = Msg {
    size: size::<SymbolFrame>(),
    fields: &[],
};
static SYMBOL_ADDRESS: Msg = Msg {
    size: size::<SymbolAddress>(),
    fields: &[(2, Field::Many(&SYMBOL_FRAME))],
};
static SYMBOL_FILE: Msg = Msg {
    size: size::<SymbolFile>(),
    fields: &[
        (1, Field::Bytes),
        (2, Field::Bytes),
        (3, Field::Many(&SYMBOL_ADDRESS)),
    ],
};
static SYMBOL_TABLE: Msg = Msg {
    size: 0,
    fields: &[
        (1, Field::Strings),
        (2, Field::Many(&SYMBOL_FILE)),
        (3, Field::Many(&SYMBOL_ADDRESS)),
    ],
};
static RECORD: Msg = Msg {
    size: 0,
    fields: &[
        (1, Field::One(&HEADER)),
        (2, Field::One(&CHUNK)),
        (3, Field::One(&TRAILER)),
        (4, Field::One(&SYMBOL_TABLE)),
    ],
};

/// What decoding one record allocates, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// What stays in the recording: the decoded record less its switch columns, plus the
    /// events the columns turn into.
    pub kept: u64,
    /// The most held at once while decoding: `kept`, the switch columns, and the list of
    /// timestamps that validation sorts.
    pub peak: u64,
}

/// The wire format does not parse; prost would refuse it too.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

/// What reading one file may still allocate for decoded records.
pub(super) struct Budget {
    left: u64,
}

impl Budget {
    /// The allowance for a file of `len` bytes.
    pub(super) fn for_input(len: usize) -> Self {
        Self {
            left: BASE.saturating_add(PER_INPUT_BYTE.saturating_mul(len as u64)),
        }
    }

    /// Takes what `cost` keeps, if its peak fits in what is left; `false` (nothing taken)
    /// when it does not.
    pub(super) fn take(&mut self, cost: Cost, record_len: usize) -> bool {
        let dense_limit =
            RECORD_SLACK.saturating_add(MAX_RECORD_RATIO.saturating_mul(record_len as u64));
        if cost.peak > self.left || cost.kept > dense_limit {
            return false;
        }
        self.left -= cost.kept.min(self.left);
        true
    }
}

/// What decoding `record` (a `Record`'s bytes) will allocate.
pub fn cost(record: &[u8]) -> Result<Cost, Malformed> {
    let mut tally = Tally::default();
    scan(record, &RECORD, &mut tally, 0)?;
    let chunk = tally.children[2].as_deref();
    let columns = chunk.and_then(|c| c.children[9].as_deref());
    let column_bytes = columns.map_or(0, |c| c.total(&COLUMNS));
    let from_columns = columns.map_or(0, |c| c.counts[COLUMNS_EVENTS]);
    let messages = chunk.map_or(0, |c| c.counts[1]);
    // The column decoder allocates its events exactly; appended to switches written as
    // messages, they are copied into a vector that holds both.
    let mut events_bytes = from_columns * size::<SwitchEvent>();
    if messages > 0 && from_columns > 0 {
        events_bytes += capacity(messages + from_columns, 56) * size::<SwitchEvent>();
    }
    // Run counts are unpacked twice, to check them and to merge them (one run at a time
    // each: the columns stay until merged).
    let runs = chunk
        .and_then(|c| c.children[14].as_deref())
        .map_or(0, |c| c.counts[RUN_COUNTS_RUNS]);
    let runs_bytes = runs * size::<super::run_counts::CountedRun>();
    let kept = tally.total(&RECORD) - column_bytes + events_bytes + runs_bytes;
    // Validation collects a timestamp per switch, sample, process event and reading.
    let timestamps =
        from_columns + chunk.map_or(0, |c| c.counts[1] + c.counts[2] + c.counts[3] + c.counts[7]);
    Ok(Cost {
        kept,
        peak: kept + column_bytes + runs_bytes + capacity(timestamps, 8) * 8,
    })
}

/// Counts for one message being decoded: entries per repeated field (by field number, all
/// below 16), heap bytes of its strings and of its finished repeated elements, and the
/// tallies of its inline messages (merged over their occurrences, as prost merges them).
#[derive(Default)]
struct Tally {
    counts: [u64; 16],
    heap: u64,
    children: [Option<Box<Tally>>; 16],
}

impl Tally {
    /// Heap bytes of this message once decoded: its vectors at the capacity one push at a
    /// time leaves them, its strings, its inline messages.
    fn total(&self, msg: &Msg) -> u64 {
        let mut bytes = self.heap;
        for (number, field) in msg.fields {
            let n = self.counts[*number as usize];
            bytes += match field {
                Field::Numbers(size) => capacity(n, *size) * size,
                Field::Strings => capacity(n, 24) * 24,
                Field::Many(m) => capacity(n, m.size) * m.size,
                Field::One(m) => self.children[*number as usize]
                    .as_deref()
                    .map_or(0, |c| c.total(m)),
                Field::Scalar | Field::Bytes => 0,
            };
        }
        bytes
    }
}

/// The capacity a vector has after `n` single pushes (`RawVec`'s growth: doubling, from a
/// minimum of 8 elements of one byte, 4 up to 1 KiB, else 1).
fn capacity(n: u64, size: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let min = match size {
        1 => 8,
        2..=1024 => 4,
        _ => 1,
    };
    n.next_power_of_two().max(min)
}

/// Nesting prost accepts (its recursion limit); our schema nests four deep.
const MAX_DEPTH: u32 = 100;

fn scan(mut bytes: &[u8], msg: &Msg, tally: &mut Tally, depth: u32) -> Result<(), Malformed> {
    if depth > MAX_DEPTH {
        return Err(Malformed);
    }
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let number = u32::try_from(key >> 3).map_err(|_| Malformed)?;
        let wire = key & 7;
        if number == 0 {
            return Err(Malformed);
        }
        let field = msg.field(number);
        match wire {
            0 => {
                varint(&mut bytes)?;
                if let Field::Numbers(_) = field {
                    tally.counts[number as usize] += 1;
                }
            }
            1 => bytes = bytes.get(8..).ok_or(Malformed)?,
            5 => bytes = bytes.get(4..).ok_or(Malformed)?,
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).map_err(|_| Malformed)?;
                let body = bytes.get(..len).ok_or(Malformed)?;
                bytes = &bytes[len..];
                let slot = number as usize;
                match field {
                    Field::Scalar => {}
                    Field::Bytes => tally.heap += len as u64,
                    Field::Strings => {
                        tally.counts[slot] += 1;
                        tally.heap += len as u64;
                    }
                    // Packed: one varint per byte below 0x80.
                    Field::Numbers(_) => {
                        tally.counts[slot] += body.iter().filter(|&&b| b < 0x80).count() as u64
                    }
                    Field::One(m) => {
                        let child = tally.children[slot].get_or_insert_with(Box::default);
                        scan(body, m, child, depth + 1)?;
                    }
                    Field::Many(m) => {
                        tally.counts[slot] += 1;
                        let mut element = Tally::default();
                        scan(body, m, &mut element, depth + 1)?;
                        tally.heap += element.total(m);
                    }
                }
            }
            3 => skip_group(&mut bytes, number, depth + 1)?,
            _ => return Err(Malformed),
        }
    }
    Ok(())
}

/// Skips a group (wire types 3 and 4, which no writer of ours uses but prost skips).
fn skip_group(bytes: &mut &[u8], number: u32, depth: u32) -> Result<(), Malformed> {
    if depth > MAX_DEPTH {
        return Err(Malformed);
    }
    loop {
        let key = varint(bytes)?;
        let inner = u32::try_from(key >> 3).map_err(|_| Malformed)?;
        match key & 7 {
            0 => {
                varint(bytes)?;
            }
            1 => *bytes = bytes.get(8..).ok_or(Malformed)?,
            5 => *bytes = bytes.get(4..).ok_or(Malformed)?,
            2 => {
                let len = usize::try_from(varint(bytes)?).map_err(|_| Malformed)?;
                *bytes = bytes.get(len..).ok_or(Malformed)?;
            }
            3 => skip_group(bytes, inner, depth + 1)?,
            4 if inner == number => return Ok(()),
            _ => return Err(Malformed),
        }
    }
}

pub(super) fn varint(bytes: &mut &[u8]) -> Result<u64, Malformed> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&b, rest) = bytes.split_first().ok_or(Malformed)?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(value);
        }
    }
    Err(Malformed)
}

#[cfg(test)]
#[path = "budget_tests.rs"]
mod tests;
