//! A capture session: drains the probes on the caller's timer and turns events into
//! self-contained recording chunks, adding what userspace learns on the side (thread
//! names, command lines, process start times, executable mappings) the first time a thread
//! or process shows up, so reports work after the process is gone.

use std::collections::{HashMap, HashSet};

use super::backoff::{Backoff, Schedule};
use super::{Comm, DecodedSample, Event, Probes, comm_string, decode::DecodedProc, host};
use crate::pb::v1::{self as pb, process_event::Kind};

/// Reads the executable mappings of a process (build-ids included where available).
pub type MappingReader = fn(tgid: u32, ts_ns: u64) -> std::io::Result<Vec<pb::Mapping>>;

/// Which processes' stacks to keep. Switch events are always kept for every thread: the
/// energy split needs everyone's on-CPU time, not just the targets'.
#[derive(Clone, Debug, Default)]
pub struct Targets {
    pids: HashSet<u32>,
}

impl Targets {
    /// Restricts samples to these processes and their descendants (empty = everything).
    pub fn new(pids: impl IntoIterator<Item = u32>) -> Self {
        Self {
            pids: pids.into_iter().collect(),
        }
    }

    /// Whether samples are kept for some processes only (`-p`, a command).
    fn is_explicit(&self) -> bool {
        !self.pids.is_empty()
    }

    /// Whether samples of `tgid` are kept.
    pub fn contains(&self, tgid: u32) -> bool {
        self.pids.is_empty() || self.pids.contains(&tgid)
    }

    fn follow_fork(&mut self, parent_tgid: u32, child_tgid: u32) {
        if !self.pids.is_empty() && child_tgid != 0 && self.pids.contains(&parent_tgid) {
            self.pids.insert(child_tgid);
        }
    }

    /// Adds a process (e.g. the command `record` started).
    pub fn add(&mut self, tgid: u32) {
        self.pids.insert(tgid);
    }
}

/// Per-run state on top of [`Probes`].
pub struct Session {
    probes: Probes,
    targets: Targets,
    /// Name and cgroup id last reported per thread, and when the thread was first seen
    /// (looked up for every event: a fast hash, as the fold's; never iterated, so its order
    /// reaches no output).
    comms: foldhash::HashMap<u32, (Comm, u64, u64)>,
    /// Processes named so far, with their start (ns, 0 when unknown): an exec keeps it.
    processes: foldhash::HashMap<u32, u64>,
    /// cgroup ids whose path was already recorded.
    cgroups: foldhash::HashSet<u64>,
    /// Threads that exited during the previous poll and during this one, as (tid, tgid).
    /// Their names are kept one more poll: the exit event can be drained before the last
    /// switch-outs of the same thread, which must not look like a new, nameless thread.
    exited: [Vec<(u32, u32)>; 2],
    vanished: u64,
    read_mappings: MappingReader,
    /// Processes (per program: an exec starts again) whose mappings are read at their first
    /// sample, with when they were first seen: one never sampled (most short-lived
    /// processes) costs no read of its maps, and one sampled has its libraries mapped by
    /// then, where a read at the fork or exec event saw the parent's image or the loader's.
    unread: foldhash::HashMap<u32, u64>,
    /// Per process: when its mappings are next re-read, and the starts already recorded.
    remapped: HashMap<u32, (Backoff, HashSet<u64>)>,
    /// Perf maps of sampled processes (JIT code names).
    jit: super::jit::JitMaps,
    /// Switch events the last poll drained.
    switch_hint: usize,
}

impl Session {
    /// Wraps started probes.
    pub fn new(probes: Probes, targets: Targets, read_mappings: MappingReader) -> Self {
        Self {
            probes,
            targets,
            comms: foldhash::HashMap::default(),
            processes: foldhash::HashMap::default(),
            cgroups: foldhash::HashSet::default(),
            exited: [Vec::new(), Vec::new()],
            vanished: 0,
            read_mappings,
            unread: foldhash::HashMap::default(),
            remapped: HashMap::new(),
            jit: super::jit::JitMaps::default(),
            switch_hint: 0,
        }
    }

    /// The probes (for CPU list and sweeps).
    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    /// The largest fraction of a ring buffer drained since the last call
    /// ([`Probes::take_ring_fill`]).
    pub fn take_ring_fill(&mut self) -> f64 {
        self.probes.take_ring_fill()
    }

    /// Loads the unwind tables of a process that just exec'd now, rather than after the
    /// next drain (for the command `record` started).
    pub fn load_unwind_tables(&mut self, tgid: u32) {
        self.probes.exec_unwind(tgid);
    }

    /// Looks for a CPython interpreter in a process that just exec'd now, rather than at
    /// its first sample (for the command `record` started).
    pub fn load_python(&mut self, tgid: u32) {
        if let Some(p) = self.probes.python_mut() {
            p.look(tgid, crate::clock::monotonic_ns(), None);
        }
    }

    /// Mutable access to the sample filter (e.g. to add a spawned command).
    pub fn targets_mut(&mut self) -> &mut Targets {
        &mut self.targets
    }

    /// Drains the probes into one chunk (readings are the caller's to add).
    pub fn poll(&mut self) -> pb::Chunk {
        self.collect(false)
    }

    /// The last chunk: visits every CPU so each timeline ends on a known task, then drains
    /// everything, including switch events still batched in the kernel.
    pub fn finish(&mut self) -> pb::Chunk {
        self.probes.sweep_cpus();
        self.collect(true)
    }

    fn collect(&mut self, last: bool) -> pb::Chunk {
        let mut chunk = pb::Chunk::default();
        for (tid, tgid) in std::mem::take(&mut self.exited[0]) {
            self.forget(tid, tgid);
        }
        self.exited.swap(0, 1);
        // Switches go straight into the chunk; the rarer events wait beside them, each with
        // the number of switches drained before it, so every event is still observed in
        // drain order.
        let mut others: Vec<(usize, Event)> = Vec::new();
        // Room for a poll like the last one and a quarter more, taken at once.
        let mut switches = Vec::with_capacity(self.switch_hint + self.switch_hint / 4);
        let sink = |e| match e {
            Event::Switch(s) => switches.push(s),
            other => others.push((switches.len(), other)),
        };
        if last {
            self.probes.drain_final(sink);
        } else {
            self.probes.drain(sink);
        }
        self.switch_hint = switches.len();
        let mut observed = 0;
        for (before, event) in others {
            self.observe_switches(&mut chunk, &switches[observed..before]);
            observed = before;
            match event {
                Event::Switch(_) => unreachable!("switches are not held beside"),
                Event::Sample(decoded) => {
                    let DecodedSample {
                        sample: mut s,
                        comm,
                        unwind,
                        python: py,
                    } = *decoded;
                    let seen = Sighting {
                        cgroup_id: s.cgroup_id,
                        comm: Some(comm),
                        ..Sighting::new(s.tid, s.tgid, s.ts_ns)
                    };
                    self.observe(&mut chunk, seen);
                    if self.targets.contains(s.tgid) {
                        // Mappings and unwind tables are for user frames: a sample without
                        // any (a kernel thread's) reads neither. The session's read comes
                        // first, so the tables' read is never older than it and a re-read
                        // that finds nothing new has nothing to reload.
                        if !s.user_stack.is_empty() {
                            self.first_sample(&mut chunk, s.tgid);
                            self.probes.observe_unwind(s.tgid, unwind);
                            if unwind & energy_bpf_abi::unwind_flags::UNMAPPED_PC != 0 {
                                self.remap(&mut chunk, s.tgid, s.ts_ns);
                            }
                        }
                        if let Some(p) = self.probes.python_mut() {
                            p.on_sample(&py, &mut s, &mut chunk.python_frames);
                        }
                        self.jit.observe(
                            s.tgid,
                            &comm,
                            &s.user_stack,
                            s.ts_ns,
                            &mut chunk.jit_symbols,
                        );
                        chunk.samples.push(s);
                    }
                }
                Event::Process(p) => {
                    let DecodedProc { event, cgroup_id } = *p;
                    self.on_lifecycle(&mut chunk, &event, cgroup_id);
                    chunk.process_events.push(event);
                }
            }
        }
        self.observe_switches(&mut chunk, &switches[observed..]);
        chunk.switches = switches;
        if let Some(p) = self.probes.python_mut() {
            chunk.python_processes = p.take_found();
        }
        if let Some((runs, dropped)) = self.probes.drain_run_counts(last) {
            chunk.run_counts = Some(crate::record::run_counts::to_columns(&runs, dropped));
        }
        if last {
            self.jit
                .finish(crate::clock::monotonic_ns(), &mut chunk.jit_symbols);
        }
        let mut losses = self.probes.losses();
        losses.vanished_processes = self.vanished;
        chunk.losses = Some(losses);
        chunk
    }

    /// A lifecycle event; `cgroup_id` is the probe's (the task's, for a fork its parent's),
    /// so a new process costs no `/proc` read for it.
    fn on_lifecycle(&mut self, chunk: &mut pb::Chunk, p: &pb::ProcessEvent, cgroup_id: u64) {
        match p.kind() {
            Kind::Exec => {
                // New program image: new name, new mappings, same pid and start.
                let started = self.processes.remove(&p.tgid);
                // The old program's re-reads and their back-off do not apply to the new one.
                self.remapped.remove(&p.tgid);
                // The event is drained after the fact: tables and an interpreter looked
                // up since (the command `record` started, or samples of the new program
                // drained before this event) are the new program's and stay.
                if let Some(py) = self.probes.python_mut() {
                    py.on_exec(p.tgid, p.ts_ns);
                }
                let reload = self.targets.is_explicit() && self.targets.contains(p.tgid);
                self.probes.exec_event_unwind(p.tgid, p.ts_ns, reload);
                self.comms.remove(&p.tid);
                let seen = Sighting {
                    comm: Some(raw_comm(&p.comm)),
                    cgroup_id,
                    started: started.filter(|&ns| ns != 0),
                    ..Sighting::new(p.tid, p.tgid, p.ts_ns)
                };
                self.observe(chunk, seen);
            }
            Kind::Fork => {
                // A new task: whatever was known under this id belonged to an earlier one,
                // unless it was seen after the fork: the child's own switches, drained
                // before this event, named the same task (from /proc) already.
                let named_since = self.comms.get(&p.child_tid).is_some_and(|k| k.2 >= p.ts_ns);
                if p.child_tid != 0 && !named_since {
                    self.forget(p.child_tid, p.child_tgid);
                    // The child starts with its parent's name (the event's comm), which is
                    // all a short-lived child that never execs will ever have; a new
                    // process started at the fork.
                    let seen = Sighting {
                        comm: Some(raw_comm(&p.comm)),
                        cgroup_id,
                        forked_at: (p.child_tgid != p.tgid).then_some(p.ts_ns),
                        ..Sighting::new(p.child_tid, p.child_tgid, p.ts_ns)
                    };
                    self.observe(chunk, seen);
                }
                self.targets.follow_fork(p.tgid, p.child_tgid);
            }
            // The pid may be reused; forget it once its last switch-outs are drained.
            Kind::Exit => {
                if p.tid == p.tgid {
                    self.probes.forget_unwind(p.tgid);
                    if let Some(py) = self.probes.python_mut() {
                        py.forget(p.tgid);
                    }
                    self.jit.exited(p.tgid, p.ts_ns, &mut chunk.jit_symbols);
                }
                self.exited[1].push((p.tid, p.tgid));
            }
            Kind::Unspecified => {}
        }
    }

    /// Notes the threads `switches` switched out (new ones named into `chunk`).
    fn observe_switches(&mut self, chunk: &mut pb::Chunk, switches: &[pb::SwitchEvent]) {
        for s in switches {
            self.observe(chunk, Sighting::new(s.tid, s.tgid, s.ts_ns));
        }
    }

    /// Drops what is known about a thread, so its id's next sighting is a new thread.
    fn forget(&mut self, tid: u32, tgid: u32) {
        self.comms.remove(&tid);
        if tid == tgid {
            self.processes.remove(&tgid);
            self.unread.remove(&tgid);
            self.remapped.remove(&tgid);
        }
    }

    /// A sample of target `tgid`: records its mappings if this is its program's first.
    fn first_sample(&mut self, chunk: &mut pb::Chunk, tgid: u32) {
        let Some(seen_ns) = self.unread.remove(&tgid) else {
            return;
        };
        match (self.read_mappings)(tgid, seen_ns) {
            Ok(maps) => {
                // What a re-read finds new is new since this read, and the first re-read
                // waits its turn: a walk that meets a stray PC at once does not have the
                // same maps read again, nor the tables reloaded.
                let known = maps.iter().map(|m| m.start).collect();
                let backoff = Backoff::new(std::time::Instant::now(), REMAP);
                self.bound_remapped();
                self.remapped.insert(tgid, (backoff, known));
                chunk.mappings.extend(maps);
            }
            Err(err) => tracing::debug!("mappings of {tgid}: {err}"),
        }
    }

    /// Keeps the re-read schedules bounded when exit events were lost (a full ring).
    fn bound_remapped(&mut self) {
        if self.remapped.len() > 65_536 {
            self.remapped.clear();
        }
    }

    /// A stack walk met code outside the mappings known when the process was first seen
    /// (`dlopen`): records the executable mappings added since, so those frames symbolize
    /// too, and has the unwind tables reloaded when there are any. Re-read [`REMAP`]
    /// apart per process, twice as far apart after each re-read that found nothing new: a
    /// walk that lost its way meets an unmapped PC however often the maps are read.
    fn remap(&mut self, chunk: &mut pb::Chunk, tgid: u32, ts_ns: u64) {
        let now = std::time::Instant::now();
        if self.remapped.get(&tgid).is_some_and(|(b, _)| !b.due(now)) {
            return;
        }
        let Ok(maps) = (self.read_mappings)(tgid, ts_ns) else {
            return;
        };
        self.bound_remapped();
        let (backoff, known) = self
            .remapped
            .entry(tgid)
            .or_insert_with(|| (Backoff::new(now, REMAP), HashSet::new()));
        // Only what is new since the first sample's read (or the last re-read) is recorded.
        let before = chunk.mappings.len();
        for m in maps {
            if known.insert(m.start) {
                chunk.mappings.push(m);
            }
        }
        let found = chunk.mappings.len() > before;
        backoff.looked(now, found, REMAP);
        if found {
            self.probes.refresh_unwind(tgid);
        }
    }

    /// Emits ThreadInfo the first time a thread is seen or when its name or cgroup changes
    /// (a new process's mappings wait for its first sample).
    fn observe(&mut self, chunk: &mut pb::Chunk, seen: Sighting) {
        let Sighting {
            tid,
            tgid,
            cgroup_id,
            ts_ns,
            comm,
            forked_at,
            started,
        } = seen;
        if tid == crate::timeline::IDLE_TID {
            return;
        }
        let known = self.comms.get(&tid).copied();
        // A thread whose name /proc no longer has is gone: nothing else is asked of /proc
        // for it (most short-lived threads are gone by the time their events are drained).
        let mut gone = false;
        let (comm, cgroup_id) = match (comm, known) {
            (None, Some(_)) => return,
            // Same name, and no new cgroup: nothing new.
            (Some(c), Some((k, kc, _))) if c == k && (cgroup_id == 0 || cgroup_id == kc) => {
                return;
            }
            (Some(c), Some((_, kc, _))) => (c, if cgroup_id == 0 { kc } else { cgroup_id }),
            (Some(c), None) if cgroup_id != 0 => (c, cgroup_id),
            // Switch events carry neither name nor cgroup (see the ABI): ask /proc once per
            // new thread.
            (c, None) => {
                let comm = c.or_else(|| host::thread_comm(tgid, tid).map(|c| raw_comm(&c)));
                gone = comm.is_none();
                let cgroup_id = if gone {
                    0
                } else {
                    host::cgroup_id(tgid, tid).unwrap_or(0)
                };
                (comm.unwrap_or([0; energy_bpf_abi::COMM_LEN]), cgroup_id)
            }
        };
        // The path of a cgroup not seen before, so reports can name containers offline.
        if self.cgroups.len() > 65_536 {
            // Bounded: a machine that made this many cgroups gets their paths again.
            self.cgroups.clear();
        }
        let cgroup_path = if cgroup_id != 0 && self.cgroups.insert(cgroup_id) {
            host::cgroup(tgid, tid)
                .filter(|(id, _)| *id == cgroup_id)
                .map(|(_, p)| p)
                .unwrap_or_default()
        } else {
            String::new()
        };
        let first_seen_ns = known.map_or(ts_ns, |k| k.2);
        self.comms.insert(tid, (comm, cgroup_id, first_seen_ns));
        let new_process = !self.processes.contains_key(&tgid);
        let (process_start_ns, cmdline) = if new_process {
            match started.or_else(|| (!gone).then(|| host::process_start_ns(tgid)).flatten()) {
                Some(start) => (start, host::cmdline(tgid)),
                None => {
                    self.vanished += 1;
                    (forked_at.unwrap_or(0), String::new())
                }
            }
        } else {
            (0, String::new())
        };
        if new_process {
            self.processes.insert(tgid, process_start_ns);
        }
        if new_process {
            self.unread.insert(tgid, ts_ns);
        }
        chunk.threads.push(pb::ThreadInfo {
            tid,
            tgid,
            comm: comm_string(&comm),
            process_start_ns,
            cmdline,
            cgroup_id,
            ts_ns,
            cgroup_path,
        });
    }
}

/// How often a process's mappings are re-read for unmapped PCs: twice a second while
/// re-reads find new mappings, backing off to every 16 s while they find none (a library
/// `dlopen`ed after that has its frames named and walked within 16 s).
const REMAP: Schedule = Schedule {
    first: std::time::Duration::from_millis(500),
    most: std::time::Duration::from_secs(16),
};

/// What one event tells about a thread.
struct Sighting {
    tid: u32,
    tgid: u32,
    /// 0 when the event does not say.
    cgroup_id: u64,
    ts_ns: u64,
    comm: Option<Comm>,
    /// For a process first seen at its fork: when it started.
    forked_at: Option<u64>,
    /// For an exec of a process named before: its start as then read (an exec keeps it).
    started: Option<u64>,
}

impl Sighting {
    fn new(tid: u32, tgid: u32, ts_ns: u64) -> Self {
        Self {
            tid,
            tgid,
            cgroup_id: 0,
            ts_ns,
            comm: None,
            forked_at: None,
            started: None,
        }
    }
}

/// A comm string back in the kernel's fixed-size form (truncated to 15 bytes + NUL).
fn raw_comm(comm: &str) -> Comm {
    let mut raw = [0u8; energy_bpf_abi::COMM_LEN];
    let bytes = comm.as_bytes();
    let n = bytes.len().min(energy_bpf_abi::COMM_LEN - 1);
    raw[..n].copy_from_slice(&bytes[..n]);
    raw
}
