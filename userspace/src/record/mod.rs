//! The recording stream: a versioned, length-delimited protobuf file (`proto/energy_bpf.proto`).
//!
//! [`Writer`] appends self-contained chunks and flushes each one, so a recorder killed at
//! any point leaves a file that [`read_file`] reads back up to its last whole record and
//! marks as truncated. From format version 3 every record carries a CRC32C: a damaged one
//! is skipped and counted ([`Damage`]) and reading goes on at the next whole record.
//! [`Recording`] is the in-memory form every report starts from.
//!
//! Reading is bounded: the file is read once into memory, every record is at most
//! `frame::MAX_RECORD_LEN` bytes, and timestamps that cannot be true are dropped
//! (`validate`), so no later stage can size work from a damaged number.

mod budget;
pub mod columns;
#[cfg(test)]
mod damage_tests;
pub(crate) mod early;
pub mod frame;
pub(crate) mod live;
mod parallel;
mod reader;
mod recorder;
pub(crate) mod rotate;
pub(crate) mod run_counts;
pub(crate) mod series;
mod switch_log;
pub mod symbols;
mod unwind_counts;
mod validate;
mod writer;

pub(crate) use live::LiveTables;
pub use reader::{ReadError, read_file, read_from};
pub use recorder::{Ended, Finished, RecordError, Recorder, Target};
pub(crate) use series::{TimeRange, files_in_range, read_files_in, read_path};
pub(crate) use switch_log::{CpuOrders, SwitchLog};
pub(crate) use unwind_counts::{UnwindCounts, stop_name};
pub(crate) use validate::{MAX_CPUS, MAX_RUNS, MAX_SOURCES};
pub use writer::{WriteError, Writer};

use std::collections::HashMap;

use crate::pb::v1::{
    EnergyReading, EnergySource, Header, JitSymbol, LossCounters, Mapping, ProcessEvent, Sample,
    ThreadInfo,
};

/// First bytes of every recording.
pub const MAGIC: &[u8; 8] = b"EBPFREC\n";

/// Version written in every header; readers refuse versions outside
/// `OLDEST_FORMAT_VERSION`..=[`FORMAT_VERSION`] with a clear error.
/// Version 2 stores switch events as columns (`SwitchColumns`) instead of messages;
/// version 3 frames every record after the header with a sync marker and a CRC32C
/// ([`frame`]).
pub const FORMAT_VERSION: u32 = 3;

/// The oldest version this reader still reads (version 1: switch events as messages).
pub(crate) const OLDEST_FORMAT_VERSION: u32 = 1;

/// Events the kernel lost (ring buffer full), all kinds: what every output reports.
pub fn lost_events(l: &LossCounters) -> u64 {
    l.switch_dropped + l.sample_dropped + l.process_dropped
}

/// Records newer facts about a thread, keeping the process start time and command line
/// from earlier sightings when the newer info lacks them (only a process's first sighting
/// reads /proc).
pub(crate) fn merge_thread(threads: &mut HashMap<u32, ThreadInfo>, new: ThreadInfo) {
    let tid = new.tid;
    if let Some(old) = threads.insert(tid, new)
        && let Some(entry) = threads.get_mut(&tid)
    {
        // A name read from /proc after the thread was gone is empty; keep the known one.
        if entry.comm.is_empty() {
            entry.comm = old.comm;
        }
        if entry.process_start_ns == 0 {
            entry.process_start_ns = old.process_start_ns;
        }
        if entry.cmdline.is_empty() {
            entry.cmdline = old.cmdline;
        }
        if entry.cgroup_path.is_empty() && entry.cgroup_id == old.cgroup_id {
            entry.cgroup_path = old.cgroup_path;
        }
    }
}

/// The names of a recording's Python frames, by id.
pub(crate) type PythonFrames = HashMap<u64, crate::pb::v1::PythonFrame>;

/// A whole recording, merged from all its chunks.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// The header (host, kernel, topology, sample rate, clock).
    pub header: Header,
    /// All switch events, in file order, packed (sort per CPU before use; the timeline
    /// does).
    pub switches: SwitchLog,
    /// All stack samples, in file order.
    pub samples: Vec<Sample>,
    /// Lifecycle events.
    pub process_events: Vec<ProcessEvent>,
    /// Runs of the recorded command (`record --repeat N`), in order; empty when none were
    /// marked.
    pub runs: Vec<crate::pb::v1::RunMarker>,
    /// What the run counters (`record --activity-events`, `Header.run_counters`) counted
    /// per run, in file order; empty when none were asked for.
    pub run_counts: Vec<run_counts::CountedRun>,
    /// Run-count intervals the kernel dropped (ring buffer full), the last cumulative value.
    pub run_counts_dropped: u64,
    /// Latest known info per thread id.
    pub threads: HashMap<u32, ThreadInfo>,
    /// Executable mappings per process id, in the order they were recorded.
    pub mappings: HashMap<u32, Vec<Mapping>>,
    /// What names each Python frame id of `samples` (see `Sample::python_stack`).
    pub python_frames: PythonFrames,
    /// CPython processes the recorder found or ruled out, in file order.
    pub python_processes: Vec<crate::pb::v1::PythonProcess>,
    /// Perf-map entries (JIT-compiled code) per process id, in the order they were
    /// recorded.
    pub jit_symbols: HashMap<u32, Vec<JitSymbol>>,
    /// Energy sources in use.
    pub sources: Vec<EnergySource>,
    /// Energy readings of every source, in file order.
    pub readings: Vec<EnergyReading>,
    /// Loss counters (the last, cumulative, values recorded).
    pub losses: LossCounters,
    /// The names the recorder stored for the samples' addresses when it finished
    /// (checked: [`symbols::check`]); empty for recordings made before it did, or cut short.
    /// Shared: every symbolizer of the recording indexes the same tables.
    pub symbols: std::sync::Arc<Vec<crate::pb::v1::SymbolTable>>,
    /// End of capture (from the trailer, or the latest timestamp seen when truncated).
    pub end_ns: u64,
    /// Why recording stopped, from the trailer.
    pub stop_reason: Option<String>,
    /// True when the file had no trailer: the recorder was killed or the disk filled.
    pub truncated: bool,
    /// Bytes at the end of a truncated file that did not form a whole record.
    pub trailing_garbage_bytes: u64,
    /// Damaged records skipped and impossible timestamps dropped while reading.
    pub damage: Damage,
}

/// What reading found damaged and left out. Every command that reads a recording says so
/// ([`Damage::note`]) and goes on with the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Damage {
    /// Records skipped because their checksum failed or they did not decode.
    pub records_damaged: u64,
    /// Bytes skipped while looking for the next whole record.
    pub bytes_skipped: u64,
    /// Capture time with no data because of skipped records, ns: from the latest
    /// timestamp before the damage to the earliest one after it.
    pub lost_ns: u64,
    /// Events and readings dropped because their timestamp cannot be true: before the
    /// capture started, after a silence longer than `MAX_QUIET_NS`, or on a CPU the
    /// header does not list; energy sources listed twice or past `MAX_SOURCES`.
    pub events_dropped: u64,
    /// Whether the trailer's end time was impossible and was clamped to the data.
    pub end_clamped: bool,
    /// Records skipped whole because decoding them would have taken reading past its
    /// memory bound (200 MiB + 20 × the file's size for every command): a crafted file,
    /// or records far denser than any recorder writes.
    pub records_oversized: u64,
    /// Whether the file ends in damage rather than in a trailer or a record cut short, so
    /// nothing tells whether the recording finished.
    pub end_damaged: bool,
}

impl Damage {
    /// Whether anything was damaged.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// One line for users, e.g. "2 records damaged, 0.3 s of data lost"; `None` when the
    /// file was whole.
    pub fn note(&self) -> Option<String> {
        if self.is_empty() {
            return None;
        }
        let plural =
            |n: u64, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
        let mut parts = Vec::new();
        let mut lost = Vec::new();
        if self.records_damaged > 0 {
            lost.push(format!(
                "{} damaged",
                plural(self.records_damaged, "record", "records")
            ));
        }
        if self.records_oversized > 0 {
            lost.push(format!(
                "{} skipped as too large to decode within the memory bound",
                plural(self.records_oversized, "record", "records")
            ));
        }
        if !lost.is_empty() || self.lost_ns > 0 {
            lost.push(format!("{:.1} s of data lost", self.lost_ns as f64 / 1e9));
            parts.push(lost.join(", "));
        }
        if self.events_dropped > 0 {
            parts.push(format!(
                "{} with impossible timestamps, CPUs or sources dropped",
                plural(self.events_dropped, "event", "events")
            ));
        }
        if self.end_clamped {
            parts.push("end time clamped to the data".into());
        }
        if self.end_damaged {
            parts.push("its end is damaged (no trailer read)".into());
        }
        Some(parts.join("; "))
    }

    /// The counters as JSON, for reports (`lost_s` beside `lost_ns` for people).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "records_damaged": self.records_damaged,
            "bytes_skipped": self.bytes_skipped,
            "lost_ns": self.lost_ns,
            "lost_s": self.lost_ns as f64 / 1e9,
            "events_dropped": self.events_dropped,
            "end_clamped": self.end_clamped,
            "records_oversized": self.records_oversized,
            "end_damaged": self.end_damaged,
        })
    }
}

impl Recording {
    /// Capture start, ns (CLOCK_MONOTONIC).
    pub fn start_ns(&self) -> u64 {
        self.header.start_ns
    }

    /// Capture length, ns.
    pub fn duration_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.header.start_ns)
    }

    /// CPU ids in the header's topology.
    pub(crate) fn cpu_ids(&self) -> Vec<u32> {
        self.header.cpus.iter().map(|c| c.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(comm: &str, start: u64, cmdline: &str) -> ThreadInfo {
        ThreadInfo {
            tid: 7,
            tgid: 7,
            comm: comm.into(),
            process_start_ns: start,
            cmdline: cmdline.into(),
            ..ThreadInfo::default()
        }
    }

    #[test]
    fn later_sightings_keep_what_earlier_ones_knew() {
        let mut threads = HashMap::new();
        merge_thread(&mut threads, info("sh", 42, "sh -c true"));
        // Read from /proc after the thread had gone: no name, no start, no command line.
        merge_thread(&mut threads, info("", 0, ""));
        assert_eq!(threads[&7], info("sh", 42, "sh -c true"));
        // A rename (exec) wins.
        merge_thread(&mut threads, info("true", 0, ""));
        assert_eq!(threads[&7].comm, "true");
        assert_eq!(threads[&7].process_start_ns, 42);
    }
}
