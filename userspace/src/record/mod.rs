//! The recording stream: a versioned, length-delimited protobuf file (`proto/energy_bpf.proto`).
//!
//! [`Writer`] appends self-contained chunks and flushes each one, so a recorder killed at
//! any point leaves a file that [`read_file`] reads back up to its last whole record and
//! marks as truncated. [`Recording`] is the in-memory form every report starts from.

mod columns;
mod reader;
pub mod rotate;
pub mod series;
mod writer;

pub use reader::{ReadError, read_file, read_from};
pub use series::{TimeRange, read_path};
pub use writer::{WriteError, Writer};

use std::collections::HashMap;

use crate::pb::v1::{
    EnergyReading, EnergySource, Header, LossCounters, Mapping, ProcessEvent, Sample, SwitchEvent,
    ThreadInfo,
};

/// First bytes of every recording.
pub const MAGIC: &[u8; 8] = b"EBPFREC\n";

/// Version written in every header; readers refuse versions outside
/// [`OLDEST_FORMAT_VERSION`]..=[`FORMAT_VERSION`] with a clear error.
/// Version 2 stores switch events as columns (`SwitchColumns`) instead of messages.
pub const FORMAT_VERSION: u32 = 2;

/// The oldest version this reader still reads (version 1: switch events as messages).
pub const OLDEST_FORMAT_VERSION: u32 = 1;

/// Records newer facts about a thread, keeping the process start time and command line
/// from earlier sightings when the newer info lacks them (only a process's first sighting
/// reads /proc).
pub fn merge_thread(threads: &mut HashMap<u32, ThreadInfo>, new: ThreadInfo) {
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
    }
}

/// A whole recording, merged from all its chunks.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    /// The header (host, kernel, topology, sample rate, clock).
    pub header: Header,
    /// All switch events, in file order (sort per CPU before use; `Timeline::build` does).
    pub switches: Vec<SwitchEvent>,
    /// All stack samples, in file order.
    pub samples: Vec<Sample>,
    /// Lifecycle events.
    pub process_events: Vec<ProcessEvent>,
    /// Latest known info per thread id.
    pub threads: HashMap<u32, ThreadInfo>,
    /// Executable mappings per process id, in the order they were recorded.
    pub mappings: HashMap<u32, Vec<Mapping>>,
    /// Energy sources in use.
    pub sources: Vec<EnergySource>,
    /// Energy readings of every source, in file order.
    pub readings: Vec<EnergyReading>,
    /// Loss counters (the last, cumulative, values recorded).
    pub losses: LossCounters,
    /// End of capture (from the trailer, or the latest timestamp seen when truncated).
    pub end_ns: u64,
    /// Why recording stopped, from the trailer.
    pub stop_reason: Option<String>,
    /// True when the file had no trailer: the recorder was killed or the disk filled.
    pub truncated: bool,
    /// Bytes at the end of a truncated file that did not form a whole record.
    pub trailing_garbage_bytes: u64,
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
    pub fn cpu_ids(&self) -> Vec<u32> {
        self.header.cpus.iter().map(|c| c.id).collect()
    }

    /// The timeline of every CPU over the capture window.
    pub fn timeline(&self) -> crate::timeline::Timeline {
        crate::timeline::Timeline::build(
            self.start_ns(),
            self.end_ns,
            &self.cpu_ids(),
            &self.switches,
        )
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
