//! The loaded probes: load, attach, drain, count losses. What the drained bytes mean is
//! [`super::decode`]'s.

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray},
    programs::{BtfTracePoint, PerfEvent},
};
use energy_bpf_abi::{ProcEvent, SWITCH_BATCH, SampleEvent, SwitchBatch, counter};

use super::{
    activity::{ActivityCounters, ActivityError, ActivityEvent},
    btf,
    decode::{Event, decode_proc, decode_sample, deliver, read, switch_batch},
    host,
    ring::Ring,
    sampler::{Sampler, SamplerError},
    unwinder::{UnwindStats, Unwinder},
};
use crate::pb::v1 as pb;

const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Privilege, BTF or kernel-version problem found before loading.
    #[error(transparent)]
    Preflight(#[from] host::PreflightError),
    /// The kernel rejected the object (the verifier log is in the source).
    #[error("loading eBPF probes failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program could not be loaded or attached.
    #[error("attaching probe {program} failed: {source}")]
    Attach {
        /// Program name.
        program: &'static str,
        /// aya's error (carries the verifier log when the verifier refused it).
        source: Box<aya::programs::ProgramError>,
    },
    /// A map the object must contain was missing or of the wrong type.
    #[error("eBPF map {0} missing or of the wrong type")]
    Map(&'static str),
    /// Kernel BTF could not be read.
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
    /// Listing online CPUs failed.
    #[error("cannot list online CPUs: {0}")]
    Cpus(#[source] std::io::Error),
    /// The activity counter asked for could not be opened or installed.
    #[error(transparent)]
    Activity(#[from] ActivityError),
    /// The run counters of `--activity-events` could not be installed in the probes.
    #[error("cannot set up the run counters of --activity-events: {0}")]
    RunCounts(#[from] super::run_counts::RunCountsError),
    /// `--unwind dwarf` was asked for and the table walker could not be set up.
    #[error(
        "the eBPF table walker for --unwind dwarf could not be set up: {0}; \
         use --unwind fp (frame pointers) or --unwind auto (falls back to them)"
    )]
    Unwind(String),
    /// The stack sampler could not be started on a CPU.
    #[error(transparent)]
    Sampler(#[from] SamplerError),
}

/// How user stacks are walked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnwindMode {
    /// Frame pointers only, by the kernel (`bpf_get_stack`).
    Fp,
    /// Unwind tables from `.eh_frame` where a process has them, frame pointers elsewhere;
    /// an error when the kernel refuses the table walker.
    Dwarf,
    /// [`UnwindMode::Dwarf`] where the kernel takes the table walker, else
    /// [`UnwindMode::Fp`] with a warning.
    #[default]
    Auto,
}

impl UnwindMode {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            UnwindMode::Fp => "fp",
            UnwindMode::Dwarf => "dwarf",
            UnwindMode::Auto => "auto",
        }
    }
}

/// Loaded and attached probes. Dropping detaches everything.
pub struct Probes {
    _ebpf: Ebpf,
    /// The stack sampler's events, whose rates [`Self::drain`] draws anew.
    sampler: Sampler,
    switches: Ring,
    samples: Ring,
    procs: Ring,
    counters: PerCpuArray<MapData, u64>,
    batches: PerCpuArray<MapData, SwitchBatch>,
    /// Newest switch timestamp delivered per CPU: events at or before it are duplicates
    /// (a batch read from the map at the end may also have reached the ring buffer).
    delivered: HashMap<u32, u64>,
    cpus: Vec<u32>,
    /// The per-CPU activity counters `sched_switch` reads (kept open while capturing).
    activity: Option<ActivityCounters>,
    /// The table walker's loader, when user stacks are walked with unwind tables.
    unwinder: Option<Unwinder>,
    /// The CPython frame walker's process map and namer, when it is loaded.
    python: Option<super::python::PythonWalker>,
    /// Run counters (`record --activity-events`), when asked for.
    run_counts: Option<super::run_counts::RunCounters>,
    /// The probes' log reader, with `--debug-probes`.
    log: Option<super::probe_log::Logger>,
    /// The aggregating mode's maps, when the probes aggregate (see `super::aggregate`).
    aggregate: Option<super::aggregate::Aggregator>,
    /// Whether aggregated slots were delivered yet (the first read opens each CPU).
    aggregated_once: bool,
}

/// A stack-sample ring buffer that holds `margin` of samples at `sample_hz` on `cpus` CPUs:
/// a power of two (the kernel's rule for ring buffers), between 1 and 16 MiB. Each sample
/// carries two stacks of up to 127 frames and up to 64 Python frames, about 3.1 KiB. The ring is mapped twice (its data
/// pages wrap), so it counts double in RSS: the agent sizes it to what it drains.
pub fn sample_ring_bytes(sample_hz: u64, cpus: usize, margin: std::time::Duration) -> u32 {
    let per_sample = std::mem::size_of::<SampleEvent>() as f64 + 16.0;
    let want = sample_hz as f64 * cpus.max(1) as f64 * per_sample * margin.as_secs_f64();
    let want = want.clamp(1.0, f64::from(16u32 << 20)) as u32;
    want.next_power_of_two().clamp(1 << 20, 16 << 20)
}

impl Probes {
    /// Loads and attaches every probe; samples stacks at `sample_hz` on each online CPU and
    /// counts `activity` per run (see [`ActivityEvent`]), with the stack-sample ring buffer
    /// resized to `sample_ring_bytes`
    /// (see [`sample_ring_bytes`]; `None` keeps the probes' 16 MiB, sized for `record`'s
    /// high rates on large machines), and run counters for `run_events` (`record
    /// --activity-events`, at most three; see `super::run_counts`): an event this machine
    /// cannot count is listed as unavailable ([`Self::run_counters`]), not an error. With
    /// `aggregate`, `sched_switch` adds runs to per-thread rows instead of sending events
    /// (see `super::aggregate`); [`Self::drain`] then delivers the rows of each complete
    /// slot as switch events.
    pub fn start_sized(
        sample_hz: u64,
        activity: ActivityEvent,
        unwind: UnwindMode,
        sample_ring_bytes: Option<u32>,
        run_events: &[super::run_counts::RunEvent],
        aggregate: bool,
    ) -> Result<Self, CaptureError> {
        host::preflight(Path::new(VMLINUX_BTF))?;
        let (pid_off, tgid_off) = match btf::task_pid_offsets(Path::new(VMLINUX_BTF)) {
            Ok(offsets) => offsets,
            Err(err) => {
                tracing::warn!("{err}; fork children and the last run on each CPU will be unknown");
                (0, 0)
            }
        };
        let fsbase_off = if super::python::wanted() {
            btf::task_fsbase_offset(Path::new(VMLINUX_BTF)).unwrap_or_else(|err| {
                tracing::warn!("{err}; Python frames are not walked");
                0
            })
        } else {
            0
        };
        let py_on = u32::from(fsbase_off != 0);
        let cpus = aya::util::online_cpus().map_err(|(_, err)| CaptureError::Cpus(err))?;
        // Opened before loading: whether there is a counter is frozen into the probe.
        let activity = ActivityCounters::open(activity, &cpus)?;
        let activity_on = u32::from(activity.is_some());
        // Likewise how many run counters there are: none leaves their reads out of the probe.
        let run_counters = (!run_events.is_empty())
            .then(|| super::run_counts::OpenRunCounters::open(&cpus, run_events));
        let run_counters_on = run_counters
            .as_ref()
            .map_or(0, super::run_counts::OpenRunCounters::probe_counters);
        // bpf_task_pt_regs: user registers for samples taken in kernel mode.
        let task_regs_on = u32::from(host::kernel_at_least(&host::uname().0, (5, 15)));
        let (debug_on, log_level) = (
            u32::from(super::probe_log::enabled()),
            super::probe_log::level(),
        );
        let agg_on = u32::from(aggregate);
        let load = |unwind_on: u32| {
            let mut loader = EbpfLoader::new();
            loader
                .override_global("TASK_PID_OFFSET", &pid_off, true)
                .override_global("TASK_TGID_OFFSET", &tgid_off, true)
                .override_global("ACTIVITY_ON", &activity_on, true)
                .override_global("RUN_COUNTERS_ON", &run_counters_on, true)
                .override_global("UNWIND_ON", &unwind_on, true)
                .override_global("TASK_REGS_ON", &task_regs_on, true)
                .override_global("TASK_FSBASE_OFFSET", &fsbase_off, true)
                .override_global("PY_ON", &py_on, true)
                .override_global("PROBE_DEBUG", &debug_on, true)
                .override_global("AGG_ON", &agg_on, true)
                .override_global(aya_log::LEVEL, &log_level, true);
            if let Some(bytes) = sample_ring_bytes {
                loader.map_max_entries("SAMPLES", bytes);
            }
            // Each mode's unused ring at its smallest (4 KiB, as built): aggregating sends no
            // switch events, streaming no slot tables.
            loader.map_max_entries(if aggregate { "SWITCHES" } else { "AGG_SLOTS" }, 4096);
            loader
                .load(super::PROBES_OBJECT)
                .map_err(|e| CaptureError::Load(Box::new(e)))
        };
        let mut ebpf = load(u32::from(unwind != UnwindMode::Fp))?;
        let mut unwinder = None;
        if unwind != UnwindMode::Fp {
            match super::unwinder::start_walker(&mut ebpf) {
                Ok(u) => unwinder = Some(u),
                Err(err) if unwind == UnwindMode::Auto => {
                    tracing::warn!(
                        "unwind tables are off, user stacks use frame pointers: {err} \
                         (--unwind fp silences this)"
                    );
                    // The sampler was built to hand samples to the walker: load it without.
                    drop(ebpf);
                    ebpf = load(0)?;
                }
                Err(err) => return Err(CaptureError::Unwind(err)),
            }
        }
        let mut python = None;
        if py_on != 0 {
            // Without it, the process map stays empty and no sample is handed to it.
            match super::python::start(&mut ebpf) {
                Ok(p) => python = Some(p),
                Err(err) => tracing::warn!("Python frames are not walked: {err}"),
            }
        }
        if let Some(counters) = &activity {
            match ebpf.map("ACTIVITY") {
                Some(aya::maps::Map::PerfEventArray(map)) => counters.install(map)?,
                _ => return Err(CaptureError::Map("ACTIVITY")),
            }
        }
        let run_counts = run_counters
            .map(|counters| counters.install(&mut ebpf))
            .transpose()?;
        let kernel_btf = Btf::from_sys_fs().map_err(|e| CaptureError::Load(Box::new(e.into())))?;
        for (program, tracepoint) in [
            ("sched_switch", "sched_switch"),
            ("sched_process_exec", "sched_process_exec"),
            ("sched_process_fork", "sched_process_fork"),
            ("sched_process_exit", "sched_process_exit"),
        ] {
            let attach = |ebpf: &mut Ebpf| -> Result<(), aya::programs::ProgramError> {
                let prog: &mut BtfTracePoint = ebpf
                    .program_mut(program)
                    .ok_or(aya::programs::ProgramError::NotLoaded)?
                    .try_into()?;
                prog.load(tracepoint, &kernel_btf)?;
                prog.attach()?;
                Ok(())
            };
            attach(&mut ebpf).map_err(|e| CaptureError::Attach {
                program,
                source: Box::new(e),
            })?;
        }
        let sampler = {
            let err = |e| CaptureError::Attach {
                program: "sample_stack",
                source: Box::new(e),
            };
            let prog: &mut PerfEvent = ebpf
                .program_mut("sample_stack")
                .ok_or(aya::programs::ProgramError::NotLoaded)
                .and_then(TryInto::try_into)
                .map_err(err)?;
            prog.load().map_err(err)?;
            let prog_fd = prog.fd().map_err(err)?;
            Sampler::attach(prog_fd.as_fd().as_raw_fd(), &cpus, sample_hz)?
        };
        let mut ring =
            |name: &'static str| Ring::take(&mut ebpf, name).ok_or(CaptureError::Map(name));
        let (switches, samples, procs) = (ring("SWITCHES")?, ring("SAMPLES")?, ring("PROCS")?);
        let counters = ebpf
            .take_map("COUNTERS")
            .and_then(|m| PerCpuArray::try_from(m).ok())
            .ok_or(CaptureError::Map("COUNTERS"))?;
        let batches = ebpf
            .take_map("SWITCH_BATCHES")
            .and_then(|m| PerCpuArray::try_from(m).ok())
            .ok_or(CaptureError::Map("SWITCH_BATCHES"))?;
        let log = super::probe_log::start(&mut ebpf);
        let aggregate = if aggregate {
            let agg =
                super::aggregate::Aggregator::start(&mut ebpf, &cpus, energy_bpf_abi::AGG_SLOT_NS)
                    .map_err(CaptureError::Map)?;
            Some(agg)
        } else {
            None
        };
        let probes = Self {
            _ebpf: ebpf,
            sampler,
            switches,
            samples,
            procs,
            counters,
            batches,
            delivered: HashMap::new(),
            cpus,
            activity,
            unwinder,
            python,
            run_counts,
            log,
            aggregate,
            aggregated_once: false,
        };
        probes.sweep_cpus();
        Ok(probes)
    }

    /// Each run counter asked for at start, in counter order, with whether it counts; empty
    /// without run counters.
    pub fn run_counters(&self) -> &[super::run_counts::RunCounterStatus] {
        self.run_counts
            .as_ref()
            .map_or(&[], super::run_counts::RunCounters::statuses)
    }

    /// The run counts sent since the last call (with `last`, those still batched in the
    /// kernel too) and the count events dropped so far; `None` without run counters.
    pub fn drain_run_counts(
        &mut self,
        last: bool,
    ) -> Option<(Vec<crate::record::run_counts::CountedRun>, u64)> {
        let runs = self.run_counts.as_mut()?.drain(last);
        let dropped = self
            .counters
            .get(&counter::COUNT_DROPPED, 0)
            .map(|values| values.iter().sum::<u64>())
            .unwrap_or(0);
        Some((runs, dropped))
    }

    /// The activity event counted per run, or `None` (split by time).
    pub fn activity_event(&self) -> Option<ActivityEvent> {
        self.activity.as_ref().map(ActivityCounters::event)
    }

    /// What the unwind tables hold, when user stacks are walked with them.
    pub fn unwind_stats(&self) -> Option<UnwindStats> {
        self.unwinder.as_ref().map(Unwinder::stats)
    }

    /// Looks at a kept sample's `unwind` word: loads the tables of a process sampled without
    /// them (see `Unwinder::observe`).
    pub fn observe_unwind(&mut self, tgid: u32, unwind: u32) {
        if let Some(u) = &mut self.unwinder {
            u.observe(tgid, unwind);
        }
    }

    /// Process `tgid` mapped executable files since its tables were loaded
    /// (`Unwinder::refresh`).
    pub fn refresh_unwind(&mut self, tgid: u32) {
        if let Some(u) = &mut self.unwinder {
            u.refresh(tgid);
        }
    }

    /// An explicit target exec'd: its new program's tables are loaded now
    /// (`Unwinder::exec`).
    pub fn exec_unwind(&mut self, tgid: u32) {
        if let Some(u) = &mut self.unwinder {
            u.exec(tgid);
        }
    }

    /// Process `tgid` exec'd at `exec_ns` (`Unwinder::on_exec`): tables asked for since
    /// stay; older ones are dropped, and reloaded at once when `reload`.
    pub fn exec_event_unwind(&mut self, tgid: u32, exec_ns: u64, reload: bool) {
        if let Some(u) = &mut self.unwinder {
            u.on_exec(tgid, exec_ns, reload);
        }
    }

    /// A process exited: its tables no longer apply.
    pub fn forget_unwind(&mut self, tgid: u32) {
        if let Some(u) = &mut self.unwinder {
            u.forget(tgid);
        }
    }

    /// Whether the CPython frame walker is loaded.
    pub fn python_on(&self) -> bool {
        self.python.is_some()
    }

    /// The CPython frame walker, when loaded.
    pub fn python_mut(&mut self) -> Option<&mut super::python::PythonWalker> {
        self.python.as_mut()
    }

    /// Draws the sampler's rates anew every `every` (see `super::sampler`).
    pub fn set_sample_redraw(&mut self, every: Duration) {
        self.sampler.set_redraw(every);
    }

    /// Online CPUs the sampler is attached to.
    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Forces a context switch on every CPU by running a short pinned thread there, so each
    /// CPU's timeline has a known task from this moment on even if one thread never yields.
    pub fn sweep_cpus(&self) {
        let handles: Vec<_> = self
            .cpus
            .iter()
            .map(|&cpu| {
                thread::spawn(move || {
                    // SAFETY: cpu_set_t is plain data; sched_setaffinity on the calling thread.
                    unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(cpu as usize, &mut set);
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    }
                    thread::sleep(Duration::from_micros(200));
                })
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
    }

    /// Where the switch events delivered so far end, in the aggregating mode (they cover
    /// whole slots); `None` when streaming.
    pub fn covered_ns(&self) -> Option<u64> {
        self.aggregate
            .as_ref()
            .map(super::aggregate::Aggregator::covered_ns)
    }

    /// The aggregating mode: delivers the rows of the slots every CPU has left as switch
    /// events. Returns the number of events.
    fn drain_slots(&mut self, sink: &mut impl FnMut(Event)) -> usize {
        let Some(agg) = &mut self.aggregate else {
            return 0;
        };
        let Some(slots) = agg.read() else {
            return 0;
        };
        let events = super::aggregate::synthesize(&slots, &self.cpus, !self.aggregated_once);
        self.aggregated_once = true;
        let n = events.len();
        for e in events {
            sink(Event::Switch(e));
        }
        n
    }

    /// Drains every ring buffer into `sink`, drawing the sampler's rates anew when due
    /// (see `super::sampler`). Returns the number of events; [`Self::take_ring_fill`] says
    /// how full the rings got.
    pub fn drain(&mut self, mut sink: impl FnMut(Event)) -> usize {
        self.sampler.redraw_if_due(Instant::now());
        if let Some(log) = &mut self.log {
            log.flush();
        }
        let mut n = self.drain_slots(&mut sink);
        while let Some(item) = self.switches.next() {
            if let Some((cpu, events)) = switch_batch(&item) {
                n += deliver(&mut self.delivered, cpu, events, &mut sink);
            }
        }
        while let Some(item) = self.samples.next() {
            if let Some(e) = read::<SampleEvent>(&item) {
                sink(decode_sample(&e));
                n += 1;
            }
        }
        while let Some(item) = self.procs.next() {
            if let Some(e) = read::<ProcEvent>(&item) {
                sink(Event::Process(decode_proc(&e)));
                n += 1;
            }
        }
        n
    }

    /// The largest fraction of a ring buffer drained since the last call: how close the
    /// rings came to full between drains (the agent paces its polls by it).
    pub fn take_ring_fill(&mut self) -> f64 {
        let slots = self.aggregate.as_mut().map_or(0.0, |a| a.take_ring_fill());
        [&mut self.switches, &mut self.samples, &mut self.procs]
            .into_iter()
            .map(Ring::take_fill)
            .fold(slots, f64::max)
    }

    /// [`Probes::drain`], plus the switch events still waiting in the kernel's per-CPU
    /// batches: for the end of a capture. Returns the number of events.
    ///
    /// The batches are copied *before* the ring buffers are drained: a batch the kernel sends
    /// after the copy is then in the drain, and one it sent before is not in the copy, so no
    /// event falls between the two (events in both are delivered once, see `deliver`).
    pub fn drain_final(&mut self, mut sink: impl FnMut(Event)) -> usize {
        let batches = self.batches.get(&0, 0);
        let mut n = self.drain(&mut sink);
        let Ok(per_cpu) = batches else {
            return n;
        };
        for (cpu, batch) in per_cpu.iter().enumerate() {
            let events = &batch.events[..(batch.len as usize).min(SWITCH_BATCH)];
            n += deliver(
                &mut self.delivered,
                cpu as u32,
                events.iter().copied(),
                &mut sink,
            );
        }
        n
    }

    /// The in-kernel loss counters, summed over CPUs.
    pub fn losses(&self) -> pb::LossCounters {
        let get = |index: u32| {
            self.counters
                .get(&index, 0)
                .map(|values| values.iter().sum::<u64>())
                .unwrap_or(0)
        };
        pb::LossCounters {
            // Aggregated rows the ring could not take count as lost switches.
            switch_dropped: get(counter::SWITCH_DROPPED) + get(counter::AGG_DROPPED),
            sample_dropped: get(counter::SAMPLE_DROPPED),
            process_dropped: get(counter::PROC_DROPPED),
            stack_errors: get(counter::STACK_ERRORS),
            idle_samples: get(counter::IDLE_SAMPLES),
            vanished_processes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_ring_sizes() {
        let s = |hz, cpus, secs| sample_ring_bytes(hz, cpus, std::time::Duration::from_secs(secs));
        // The agent on a 2-CPU VM: 49 Hz, 8 s of margin. A sample carries 64 Python frames
        // (1 KiB) besides its two stacks since the CPython walker, about 3.1 KiB in all:
        // 2.4 MiB wanted, one power of two up from the 2 MiB it took before.
        assert!(s(49, 2, 8) <= 4 << 20, "{}", s(49, 2, 8));
        // Large machines hit the probes' own 16 MiB.
        assert_eq!(s(999, 128, 8), 16 << 20);
        for (hz, cpus) in [(1, 1), (49, 8), (99, 64)] {
            assert!(s(hz, cpus, 8).is_power_of_two());
        }
    }
}
