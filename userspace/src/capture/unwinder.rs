//! Keeps the sampler's unwind tables (docs/ARCHITECTURE.md, "Capture"): which processes have
//! them, and their rows in the BPF maps the table walker reads.
//!
//! Tables are loaded on demand. A sample of a process without tables says so
//! ([`unwind_stop::NO_PROCESS`]); the capture asks for that process once, and a thread of its
//! own reads `/proc/PID/maps`, compiles or fetches each file's table from the on-disk cache
//! (`unwind::UnwindCache`), writes new rows into the shared row array and then the
//! process's mapping entry, so the walker never sees a mapping before its rows. Until then
//! the process is walked by frame pointers, and the sample says that too.
//!
//! An `exec` drops the process's entry (the next sample asks again, by then with the new
//! program's libraries mapped); an exit drops it for good. A walk that meets a PC outside
//! every known mapping ([`energy_bpf_abi::unwind_flags::UNMAPPED_PC`]: `dlopen`, JIT code) has the session
//! re-read the process's mappings (backing off while they do not change); where it found
//! executable files mapped since, it asks for a reload ([`Unwinder::refresh`]), which
//! rewrites the entry only when the process's entries changed.
//!
//! Memory is bounded by the maps: [`UNWIND_ROWS`] rows (16 MiB) shared by every file, and
//! [`MAX_PROCESSES`] processes. When the rows run out, the arena is rebuilt with only the
//! files of processes still loaded; a process whose files alone do not fit keeps frame
//! pointers. Rows live once, in the kernel: userspace keeps only the index.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        mpsc::{self, Receiver, Sender},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, ProgramArray},
    programs::PerfEvent,
};
use energy_bpf_abi::{
    UNWIND_MAPPINGS, UNWIND_ROWS, UnwindMapping, UnwindProcess, UnwindRow, unwind_stop,
};

use crate::unwind::{
    UnwindCache,
    process::{MappingEntry, ProcessError, RowArena, process_entries},
};

/// Most processes with tables at once (the `UNWIND_PROCS` map's size).
pub const MAX_PROCESSES: usize = energy_bpf_abi::UNWIND_PROCESSES as usize;

/// How often processes that are gone without an exit event (the lifecycle ring buffer was
/// full) are forgotten on both sides, so lost exits never fill the tables for good.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Shortest time between two rebuilds of a full arena: when the files in use do not fit,
/// new processes keep frame pointers rather than the loader rewriting the arena again and
/// again.
const REBUILD_EVERY: Duration = Duration::from_secs(60);

/// What the tables cost and hold, for `sources`, the agent's metrics and the record summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Processes with tables loaded now.
    pub processes: u64,
    /// Files with rows in the arena.
    pub files: u64,
    /// Rows in the arena, and its capacity.
    pub rows: u64,
    /// Rows the arena can hold.
    pub row_capacity: u64,
    /// Times the arena was full and rebuilt.
    pub rebuilds: u64,
    /// Processes whose tables could not be loaded (gone, unreadable, or no room).
    pub failed: u64,
    /// Total time spent building and loading tables, in milliseconds.
    pub load_ms: u64,
}

impl UnwindStats {
    /// Kernel memory the row array takes (its full size: BPF arrays are preallocated).
    pub fn row_bytes(&self) -> u64 {
        self.row_capacity * std::mem::size_of::<UnwindRow>() as u64
    }

    /// One line for the end of a recording: what was loaded, in how much kernel memory.
    pub fn summary(&self) -> String {
        format!(
            "{} processes, {} files, {} of {} rows ({:.1} of {} MiB of kernel memory), {} \
             processes gone or unreadable before loading, {} ms spent loading",
            self.processes,
            self.files,
            self.rows,
            self.row_capacity,
            self.rows as f64 * std::mem::size_of::<UnwindRow>() as f64 / 1048576.0,
            self.row_bytes() >> 20,
            self.failed,
            self.load_ms
        )
    }
}

/// Loads the table walker, links it for its tail calls, and starts the loader of its
/// tables. The sampler is not attached yet, so no sample reaches a half-set-up walker.
pub(super) fn start_walker(ebpf: &mut aya::Ebpf) -> Result<Unwinder, String> {
    let cache_dir = crate::unwind::UnwindCache::default_dir()
        .ok_or("no cache directory for unwind tables (set XDG_CACHE_HOME)")?;
    let cache = crate::unwind::UnwindCache::open(cache_dir).map_err(|e| e.to_string())?;
    let prog: &mut PerfEvent = ebpf
        .program_mut("walk_user")
        .ok_or("program walk_user missing")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    prog.load()
        .map_err(|e| format!("the verifier refused it: {e}"))?;
    let fd = prog
        .fd()
        .and_then(|fd| fd.try_clone().map_err(Into::into))
        .map_err(|e| e.to_string())?;
    let mut progs = ebpf
        .map_mut("WALK_PROGS")
        .and_then(|m| ProgramArray::try_from(m).ok())
        .ok_or("map WALK_PROGS missing")?;
    progs.set(0, &fd, 0).map_err(|e| e.to_string())?;
    let rows = match ebpf.take_map("UNWIND_ROWS") {
        Some(aya::maps::Map::Array(data)) => data,
        _ => return Err("map UNWIND_ROWS missing".into()),
    };
    let procs: BpfHashMap<MapData, u32, energy_bpf_abi::UnwindProcess> = ebpf
        .take_map("UNWIND_PROCS")
        .and_then(|m| BpfHashMap::try_from(m).ok())
        .ok_or("map UNWIND_PROCS missing")?;
    Ok(Unwinder::start(rows, procs, cache))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Request {
    Load(u32),
    Refresh(u32),
    Drop(u32),
    /// Drop every process that no longer exists.
    Prune,
}

/// Whether process `tgid` still exists.
fn alive(tgid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{tgid}")).exists()
}

/// Which samples and lifecycle events turn into loader work: each process is asked for
/// once until it is dropped. Pure, so it is tested without a kernel.
#[derive(Default)]
struct Policy {
    /// Processes asked for and not dropped since, and when (monotonic ns): the loader
    /// reads the process after that, so an exec before it does not make the tables stale.
    requested: HashMap<u32, u64>,
}

impl Policy {
    /// `now_ns` (monotonic) is read only when a request is made: most samples make none.
    fn on_sample(
        &mut self,
        tgid: u32,
        unwind: u32,
        now_ns: impl FnOnce() -> u64,
    ) -> Option<Request> {
        let stop = (unwind >> 8) & 0xff;
        if stop != unwind_stop::NO_PROCESS {
            return None;
        }
        // Bounded: past this many live requests, new processes keep frame pointers.
        if self.requested.contains_key(&tgid) || self.requested.len() >= 4 * MAX_PROCESSES {
            return None;
        }
        self.requested.insert(tgid, now_ns());
        Some(Request::Load(tgid))
    }

    fn forget(&mut self, tgid: u32) -> Request {
        self.requested.remove(&tgid);
        Request::Drop(tgid)
    }

    fn exec(&mut self, tgid: u32, now_ns: u64) -> [Request; 2] {
        let drop = self.forget(tgid);
        self.requested.insert(tgid, now_ns);
        [drop, Request::Load(tgid)]
    }

    /// An exec event at `exec_ns`, drained after the fact: tables asked for at or after it
    /// already describe the new program and stay; older ones are dropped, and reloaded now
    /// when `reload`.
    fn on_exec(&mut self, tgid: u32, exec_ns: u64, reload: bool, now_ns: u64) -> Vec<Request> {
        if self.requested.get(&tgid).is_some_and(|&at| at >= exec_ns) {
            return Vec::new();
        }
        if reload {
            self.exec(tgid, now_ns).to_vec()
        } else {
            vec![self.forget(tgid)]
        }
    }

    /// Forgets processes for which `alive` says no.
    fn prune(&mut self, alive: impl Fn(u32) -> bool) {
        self.requested.retain(|&t, _| alive(t));
    }
}

/// The capture side: decides which processes need tables and hands the work to the loader
/// thread, so draining the ring buffers never waits on ELF parsing.
pub struct Unwinder {
    tx: Option<Sender<Request>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<UnwindStats>>,
    policy: Policy,
    pruned: Instant,
    /// Tells the loader to leave queued work: the capture is ending.
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Unwinder {
    /// Starts the loader thread on the walker's maps.
    pub fn start(
        rows: MapData,
        procs: BpfHashMap<MapData, u32, UnwindProcess>,
        cache: UnwindCache,
    ) -> Self {
        let stats = Arc::new(Mutex::new(UnwindStats {
            row_capacity: u64::from(UNWIND_ROWS),
            ..UnwindStats::default()
        }));
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let loader = Loader {
            stop: Arc::clone(&stop),
            rows,
            procs,
            cache,
            arena: RowArena::new(UNWIND_ROWS as usize),
            loaded: HashMap::new(),
            stats: Arc::clone(&stats),
            last_rebuild: None,
        };
        let thread = std::thread::Builder::new()
            .name("unwind-tables".into())
            .spawn(move || loader.run(rx))
            .ok();
        Self {
            tx: Some(tx),
            thread,
            stats,
            policy: Policy::default(),
            pruned: Instant::now(),
            stop,
        }
    }

    /// Looks at one sample's `unwind` word: asks for the tables of a process sampled without
    /// them.
    pub fn observe(&mut self, tgid: u32, unwind: u32) {
        let now = Instant::now();
        if let Some(request) = self
            .policy
            .on_sample(tgid, unwind, crate::clock::monotonic_ns)
        {
            self.send(request);
        }
        if now.duration_since(self.pruned) >= PRUNE_EVERY {
            self.pruned = now;
            self.policy.prune(alive);
            self.send(Request::Prune);
        }
    }

    /// Process `tgid` mapped executable files since its tables were loaded (the session
    /// re-read its mappings for a walk that met unmapped code): reloads them, if it has
    /// tables.
    pub fn refresh(&mut self, tgid: u32) {
        self.send(Request::Refresh(tgid));
    }

    /// A process exec'd and is worth tables before its first sample (an explicit target):
    /// drops the old program's and loads the new one's now. The request reaches the loader
    /// after the next drain, by when the dynamic loader has usually mapped the libraries.
    pub fn exec(&mut self, tgid: u32) {
        for request in self.policy.exec(tgid, crate::clock::monotonic_ns()) {
            self.send(request);
        }
    }

    /// Process `tgid` exec'd at `exec_ns` (the event, drained later): tables asked for
    /// since stay; older ones are dropped, and the new program's loaded now when `reload`
    /// (an explicit target).
    pub fn on_exec(&mut self, tgid: u32, exec_ns: u64, reload: bool) {
        let now_ns = crate::clock::monotonic_ns();
        for request in self.policy.on_exec(tgid, exec_ns, reload, now_ns) {
            self.send(request);
        }
    }

    /// A process exec'd (its tables describe the old program) or exited.
    pub fn forget(&mut self, tgid: u32) {
        let request = self.policy.forget(tgid);
        self.send(request);
    }

    /// What the tables hold now.
    pub fn stats(&self) -> UnwindStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    fn send(&self, request: Request) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(request);
        }
    }
}

impl Drop for Unwinder {
    fn drop(&mut self) {
        // Not joined: the loader may be in the middle of compiling a large file's table
        // (seconds, cold), and quitting `top` or stopping `record` must not wait for it. It
        // leaves queued work at once and ends with its current request.
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.tx = None;
        drop(self.thread.take());
    }
}

/// The loader thread's state.
struct Loader {
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The shared row array (`UNWIND_ROWS`), written in batches.
    rows: MapData,
    procs: BpfHashMap<MapData, u32, UnwindProcess>,
    cache: UnwindCache,
    arena: RowArena,
    /// Loaded processes and the executable mappings their entry was built from.
    loaded: HashMap<u32, Vec<MappingEntry>>,
    stats: Arc<Mutex<UnwindStats>>,
    last_rebuild: Option<Instant>,
}

impl Loader {
    fn run(mut self, rx: Receiver<Request>) {
        // Not niced: at nice 19 on a busy machine, tables came 0.8 s late instead of 20 ms,
        // and every sample meanwhile lost its stack. The work is short once files are
        // cached; a cold compile of a large file is a one-off per machine.
        while let Ok(request) = rx.recv() {
            if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            let started = Instant::now();
            match request {
                Request::Load(tgid) => {
                    if !self.loaded.contains_key(&tgid) {
                        self.load(tgid);
                    }
                }
                Request::Refresh(tgid) => {
                    if self.loaded.contains_key(&tgid) {
                        self.load(tgid);
                    }
                }
                Request::Drop(tgid) => self.drop_process(tgid),
                Request::Prune => {
                    let gone: Vec<u32> =
                        self.loaded.keys().copied().filter(|&t| !alive(t)).collect();
                    for tgid in gone {
                        self.drop_process(tgid);
                    }
                }
            }
            if let Ok(mut stats) = self.stats.lock() {
                stats.processes = self.loaded.len() as u64;
                stats.files = self.arena.files() as u64;
                stats.rows = self.arena.len() as u64;
                stats.load_ms += started.elapsed().as_millis() as u64;
            }
        }
    }

    fn drop_process(&mut self, tgid: u32) {
        if self.loaded.remove(&tgid).is_some() {
            let _ = self.procs.remove(&tgid);
        }
    }

    /// Builds (or rebuilds) `tgid`'s entry; on a full arena, rebuilds the arena once (at
    /// most every [`REBUILD_EVERY`]) with `tgid` first. Whatever does not fit falls back to
    /// frame pointers: a process whose files alone exceed the arena (a PyTorch process's
    /// CUDA libraries do) still walks the files that fit.
    fn load(&mut self, tgid: u32) {
        if !self.loaded.contains_key(&tgid) && self.loaded.len() >= MAX_PROCESSES {
            self.failed();
            return;
        }
        let full = self.arena.full;
        let mut entries = match process_entries(tgid, &self.cache, &mut self.arena) {
            Ok(entries) => entries,
            Err(err) => {
                // Gone already, or not readable: frame pointers.
                tracing::debug!("unwind tables of {tgid}: {err}");
                self.failed();
                return;
            }
        };
        if self.arena.full != full
            && self
                .last_rebuild
                .is_none_or(|t| t.elapsed() >= REBUILD_EVERY)
        {
            self.last_rebuild = Some(Instant::now());
            match self.rebuild(tgid) {
                Ok(e) => entries = e,
                Err(err) => {
                    tracing::debug!("unwind tables of {tgid}: {err}");
                    self.failed();
                    return;
                }
            }
        }
        if entries.is_empty() {
            self.failed();
            return;
        }
        if self.loaded.get(&tgid) == Some(&entries) {
            return;
        }
        self.flush_rows();
        if self.install(tgid, &entries) {
            self.loaded.insert(tgid, entries);
        } else {
            tracing::debug!("unwind tables of {tgid}: the process map is full");
            self.failed();
        }
    }

    /// Empties the arena and builds `first`'s entries into it, then reloads every other
    /// process that was loaded, each with what still fits; their entries are removed first,
    /// so no walk reads rows being overwritten. Returns `first`'s entries, not yet installed.
    fn rebuild(&mut self, first: u32) -> Result<Vec<MappingEntry>, ProcessError> {
        let keep: Vec<u32> = self
            .loaded
            .keys()
            .copied()
            .filter(|&t| t != first)
            .collect();
        for tgid in self.loaded.keys() {
            let _ = self.procs.remove(tgid);
        }
        self.loaded.clear();
        self.arena.clear();
        if let Ok(mut stats) = self.stats.lock() {
            stats.rebuilds += 1;
        }
        let entries = process_entries(first, &self.cache, &mut self.arena);
        for tgid in keep {
            if let Ok(entries) = process_entries(tgid, &self.cache, &mut self.arena)
                && !entries.is_empty()
            {
                self.flush_rows();
                if self.install(tgid, &entries) {
                    self.loaded.insert(tgid, entries);
                }
            }
        }
        self.flush_rows();
        entries
    }

    /// Writes the rows added since the last flush into the row array.
    fn flush_rows(&mut self) {
        let (start, rows) = self.arena.take_new();
        if rows.is_empty() {
            return;
        }
        let fd = self.rows.fd().as_fd().as_raw_fd();
        if let Err(err) = write_rows(fd, start, &rows) {
            tracing::warn!("writing unwind rows: {err}; their processes use frame pointers");
        }
        drop(rows);
        // A large table passes through the heap once (tens of MiB for the largest files);
        // hand that back to the system instead of keeping it as the process's footprint.
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
    }

    fn install(&mut self, tgid: u32, entries: &[MappingEntry]) -> bool {
        let mut value = UnwindProcess {
            count: entries.len().min(UNWIND_MAPPINGS) as u32,
            _pad: 0,
            maps: [UnwindMapping::default(); UNWIND_MAPPINGS],
        };
        for (slot, e) in value.maps.iter_mut().zip(entries) {
            *slot = UnwindMapping {
                start: e.start,
                end: e.end,
                bias: e.bias,
                row_start: e.row_start,
                row_count: e.row_count,
            };
        }
        self.procs.insert(tgid, value, 0).is_ok()
    }

    fn failed(&self) {
        if let Ok(mut stats) = self.stats.lock() {
            stats.failed += 1;
        }
    }
}

/// Rows per `BPF_MAP_UPDATE_BATCH` call.
const BATCH_ROWS: usize = 1 << 16;

/// Writes `rows` at indices `start..` of the array map `fd`: batches of [`BATCH_ROWS`]
/// (Linux 5.6), one element per call where the kernel has no batch operations.
fn write_rows(fd: i32, start: usize, rows: &[UnwindRow]) -> std::io::Result<()> {
    use super::bpf_sys::{update_batch, update_elem};
    let too_far = || std::io::Error::other("row index past u32");
    let mut batch_ok = true;
    for (n, chunk) in rows.chunks(BATCH_ROWS).enumerate() {
        let first = u32::try_from(start + n * BATCH_ROWS).map_err(|_| too_far())?;
        let keys: Vec<u32> = (0..chunk.len() as u32).map(|i| first + i).collect();
        if batch_ok {
            match update_batch(fd, &keys, chunk) {
                Ok(()) => continue,
                Err(err) if err.raw_os_error() == Some(libc::EINVAL) => batch_ok = false,
                Err(err) => return Err(err),
            }
        }
        for (key, row) in keys.iter().zip(chunk) {
            update_elem(fd, key, row)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "unwinder_tests.rs"]
mod tests;
