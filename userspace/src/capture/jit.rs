//! JIT code names at capture time: for each sampled process that writes a perf map
//! (`/tmp/perf-PID.map`), reads the map as it grows and records the entries the samples
//! hit (`Chunk.jit_symbols`), so reports name that code after the process and its map
//! are gone. Addresses no entry held yet are kept (bounded) and looked up again when the
//! process exits and when recording ends: runtimes append to the map as they compile, and
//! some (Java `-XX:+DumpPerfMapAtExit`) write it only at exit. Only processes that have a
//! map, or whose name is a known runtime's (`node`, `java`, ...), keep addresses: native
//! code's addresses all miss, and a system-wide recording samples every process.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::backoff::{Backoff, Schedule};
use crate::pb::v1::JitSymbol;
use std::path::PathBuf;

use crate::symbolize::JitRuntime;
use crate::symbolize::perf_map::{JitTable, PerfMapError, PerfMapFile, live_path};

/// How often a missing map is looked for again, and a grown one re-read, per process: a
/// runtime's, or one that has a map, every 250 ms.
const RETRY: Schedule = Schedule {
    first: Duration::from_millis(250),
    most: Duration::from_millis(250),
};
/// Native code's addresses all miss, and most processes never write a map: a process that
/// is no known runtime and has none is looked at less often each time, up to every 16 s.
const RETRY_NATIVE: Schedule = Schedule {
    first: Duration::from_millis(250),
    most: Duration::from_secs(16),
};
/// Most addresses kept per process for a later look-up.
const MAX_PENDING: usize = 1 << 14;
/// Most addresses kept for a later look-up over all processes (native code's addresses
/// miss too, and every sampled process is followed).
const MAX_PENDING_TOTAL: usize = 1 << 18;
/// Most processes followed at once.
const MAX_PROCESSES: usize = 4096;
/// Most entries a process's table holds (entries of code nobody sampled are cheap, but a
/// map file can list millions).
const MAX_ENTRIES: usize = 1_000_000;

/// Who the process is, for finding and trusting its map.
#[derive(Clone, Copy)]
struct Owner {
    uid: u32,
    ns_pid: u32,
}

struct Process {
    /// Whether the process's name is a known runtime's (it may write its map late).
    runtime: bool,
    owner: Option<Owner>,
    /// When the process was first sampled: a map file in our `/tmp` older than this is
    /// an earlier process's.
    first_seen: std::time::SystemTime,
    file: Option<PerfMapFile>,
    retry: Option<Backoff>,
    table: JitTable,
    /// Starts of entries already recorded.
    recorded: HashSet<u64>,
    /// Sampled user addresses that no entry held when looked up.
    pending: HashSet<u64>,
}

impl Default for Process {
    fn default() -> Self {
        Self {
            runtime: false,
            owner: None,
            first_seen: std::time::SystemTime::now(),
            file: None,
            retry: None,
            table: JitTable::default(),
            recorded: HashSet::new(),
            pending: HashSet::new(),
        }
    }
}

/// Follows the perf maps of sampled processes.
#[derive(Default)]
pub struct JitMaps {
    procs: HashMap<u32, Process>,
    /// Addresses pending over all processes.
    pending: usize,
}

impl JitMaps {
    /// Looks up a sample's user addresses; entries hit for the first time go to `out`.
    pub fn observe(
        &mut self,
        tgid: u32,
        comm: &super::Comm,
        user_stack: &[u64],
        ts_ns: u64,
        out: &mut Vec<JitSymbol>,
    ) {
        if user_stack.is_empty() {
            return;
        }
        if !self.procs.contains_key(&tgid) && self.procs.len() >= MAX_PROCESSES {
            return;
        }
        let p = self.procs.entry(tgid).or_insert_with(|| Process {
            runtime: is_runtime(&super::comm_string(comm))
                || super::host::thread_comm(tgid, tgid).is_some_and(|c| is_runtime(&c)),
            ..Process::default()
        });
        let before = p.pending.len();
        let mut room = if p.runtime || p.file.is_some() {
            MAX_PENDING_TOTAL.saturating_sub(self.pending)
        } else {
            0
        };
        let mut missed = false;
        for &addr in user_stack {
            if !p.lookup(tgid, addr, ts_ns, out, &mut room) {
                missed = true;
            }
        }
        if missed && p.due() {
            p.refresh(tgid);
            for &addr in user_stack {
                if p.lookup(tgid, addr, ts_ns, out, &mut 0) {
                    p.pending.remove(&addr);
                }
            }
        }
        self.pending = (self.pending + p.pending.len()).saturating_sub(before);
    }

    /// A process exited: reads its map one last time for the addresses still unnamed, and
    /// forgets it.
    pub fn exited(&mut self, tgid: u32, ts_ns: u64, out: &mut Vec<JitSymbol>) {
        if let Some(mut p) = self.procs.remove(&tgid) {
            self.pending = self.pending.saturating_sub(p.pending.len());
            p.settle(tgid, ts_ns, out);
        }
    }

    /// End of recording: reads every followed map once more for the addresses still
    /// unnamed.
    pub fn finish(&mut self, ts_ns: u64, out: &mut Vec<JitSymbol>) {
        for (tgid, mut p) in std::mem::take(&mut self.procs) {
            p.settle(tgid, ts_ns, out);
        }
        self.pending = 0;
    }
}

impl Process {
    fn due(&self) -> bool {
        self.retry.is_none_or(|r| r.due(Instant::now()))
    }

    fn schedule(&self) -> Schedule {
        if self.runtime || self.file.is_some() {
            RETRY
        } else {
            RETRY_NATIVE
        }
    }

    /// Looks `addr` up; records its entry the first time. False when no entry holds it
    /// (then it is kept for later, while `room` lasts).
    fn lookup(
        &mut self,
        tgid: u32,
        addr: u64,
        ts_ns: u64,
        out: &mut Vec<JitSymbol>,
        room: &mut usize,
    ) -> bool {
        match self.table.lookup(addr) {
            Some((start, end, name)) => {
                if self.recorded.insert(start) {
                    out.push(JitSymbol {
                        tgid,
                        start,
                        size: end - start,
                        name: name.to_string(),
                        ts_ns,
                    });
                }
                true
            }
            None => {
                if *room > 0 && self.pending.len() < MAX_PENDING && self.pending.insert(addr) {
                    *room -= 1;
                }
                false
            }
        }
    }

    /// Reads what the map gained since last time (opening it first if need be).
    fn refresh(&mut self, tgid: u32) {
        let now = Instant::now();
        let had_file = self.file.is_some();
        if self.owner.is_none() {
            self.owner = owner_of(tgid);
        }
        if self.file.is_none()
            && let Some(o) = self.owner
        {
            self.file = self.open(tgid, o);
        }
        let schedule = self.schedule();
        let found = self.file.is_some() && !had_file;
        match &mut self.retry {
            Some(r) => r.looked(now, found, schedule),
            None => self.retry = Some(Backoff::new(now, schedule)),
        }
        let Some(file) = self.file.as_mut() else {
            return;
        };
        let table = &mut self.table;
        let read = file.read_new(|l| {
            if table.len() < MAX_ENTRIES {
                table.insert(l.start, l.size, l.name);
            }
        });
        if let Err(e) = read {
            tracing::debug!("{e}");
            self.file = None;
        }
    }

    /// The process's map: under its root while it lives; else (a zombie's root is gone,
    /// and Java's `DumpPerfMapAtExit` writes at exit) in our `/tmp` when it shared our pid
    /// namespace and the file was written after we first saw the process.
    fn open(&self, tgid: u32, o: Owner) -> Option<PerfMapFile> {
        match PerfMapFile::open(&live_path(tgid, o.ns_pid), o.uid) {
            Ok(f) => return Some(f),
            Err(PerfMapError::Missing { .. }) => {}
            Err(e) => {
                tracing::debug!("{e}");
                return None;
            }
        }
        if o.ns_pid != tgid {
            return None;
        }
        let path = PathBuf::from(format!("/tmp/perf-{tgid}.map"));
        match PerfMapFile::open(&path, o.uid) {
            Ok(f) if f.modified().is_some_and(|m| m >= self.first_seen) => Some(f),
            Ok(_) => {
                tracing::debug!("{} predates process {tgid}: not its map", path.display());
                None
            }
            Err(PerfMapError::Missing { .. }) => None,
            Err(e) => {
                tracing::debug!("{e}");
                None
            }
        }
    }

    /// One last read and look-up of every pending address.
    fn settle(&mut self, tgid: u32, ts_ns: u64, out: &mut Vec<JitSymbol>) {
        if self.pending.is_empty() {
            return;
        }
        self.refresh(tgid);
        let pending: Vec<u64> = self.pending.drain().collect();
        for addr in pending {
            self.lookup(tgid, addr, ts_ns, out, &mut 0);
        }
        self.pending.clear();
    }
}

/// Whether a thread or process name is a known JIT runtime's (a JVM's compiler threads
/// have names of their own: the process's main thread is asked too).
fn is_runtime(name: &str) -> bool {
    JitRuntime::of_process(name) != JitRuntime::Other
}

/// The process's real uid and its pid in its own namespace, from `/proc/PID/status`.
fn owner_of(tgid: u32) -> Option<Owner> {
    let status = std::fs::read_to_string(format!("/proc/{tgid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::split_whitespace)
    };
    let uid = field("Uid:")?.next()?.parse().ok()?;
    let ns_pid = field("NSpid:")
        .and_then(|f| f.last())
        .and_then(|p| p.parse().ok())
        .unwrap_or(tgid);
    Some(Owner { uid, ns_pid })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm(name: &[u8]) -> crate::capture::Comm {
        let mut c = [0; energy_bpf_abi::COMM_LEN];
        c[..name.len()].copy_from_slice(name);
        c
    }

    #[test]
    fn own_process_has_an_owner() {
        let me = std::process::id();
        let o = owner_of(me).expect("own status");
        // SAFETY: getuid has no preconditions.
        assert_eq!(o.uid, unsafe { libc::getuid() });
        assert!(o.ns_pid > 0);
    }

    #[test]
    fn entries_hit_are_recorded_once_and_late_ones_at_the_end() {
        let me = std::process::id();
        let owner = owner_of(me).expect("own status");
        let path = live_path(me, owner.ns_pid);
        std::fs::write(&path, "1000 100 first\n").expect("write own perf map");
        let mut maps = JitMaps::default();
        let mut out = Vec::new();
        maps.observe(me, &comm(b"node"), &[0x1010, 0x1020, 0x5000], 1, &mut out);
        maps.observe(me, &comm(b"node"), &[0x1050], 2, &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(
            (out[0].start, out[0].size, out[0].name.as_str()),
            (0x1000, 0x100, "first")
        );
        // Compiled later, written after the sample: found at the end.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("append");
        std::io::Write::write_all(&mut f, b"5000 10 later\n").expect("write");
        out.clear();
        maps.finish(3, &mut out);
        let _ = std::fs::remove_file(&path);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].name, "later");
    }

    #[test]
    fn native_processes_without_a_map_keep_no_addresses() {
        let mut maps = JitMaps::default();
        let mut out = Vec::new();
        // No such process: no map, and `cc1` is no runtime.
        maps.observe(u32::MAX - 1, &comm(b"cc1"), &[0x1000, 0x2000], 1, &mut out);
        assert_eq!(maps.pending, 0);
        maps.observe(u32::MAX - 2, &comm(b"java"), &[0x1000, 0x2000], 1, &mut out);
        assert_eq!(maps.pending, 2, "a JVM may write its map at exit");
        maps.exited(u32::MAX - 2, 2, &mut out);
        assert_eq!(maps.pending, 0);
        assert!(out.is_empty());
    }
}
