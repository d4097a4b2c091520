//! Run counters (`record --activity-events`): up to three perf events per CPU that
//! `sched_switch` reads at every switch, like the activity counter
//! ([`super::activity`]), and the sampler at every tick, so the instructions, cycles and
//! LLC misses (or software events standing in for them) of each interval of a run, at most
//! a sampling period long, are known. They are opened here before the probes load
//! ([`OpenRunCounters`]), which fixes the probes' `RUN_COUNTERS_ON` constant, then stored in
//! the probes' `RUN_COUNTER_k` maps ([`OpenRunCounters::install`]), and their per-run counts
//! come back on the `RUN_COUNTS` ring buffer as [`CountedRun`]s.
//!
//! An event the machine cannot count (a VM without a hardware PMU) is not an error: it is
//! listed with why ([`RunCounterStatus::unavailable`]) and the others go on.

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
};

use aya::{
    Ebpf,
    maps::{MapData, PerCpuArray, RingBuf},
};
use energy_bpf_abi::{CountBatch, CountEvent, SWITCH_BATCH};

use super::activity::{map_update, perf_event_open};
use crate::{
    pb::v1 as pb,
    record::run_counts::{CountedRun, MAX_COUNTERS},
};

/// An event a run counter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunEvent {
    /// Retired instructions (hardware).
    Instructions,
    /// CPU cycles (hardware).
    Cycles,
    /// The kernel's generic cache-miss event, which it maps to last-level cache misses
    /// where the PMU has them (hardware).
    LlcMisses,
    /// Software task-clock, ns.
    TaskClock,
    /// Software cpu-clock, ns.
    CpuClock,
    /// Software page faults.
    PageFaults,
    /// Software context switches.
    ContextSwitches,
}

impl RunEvent {
    /// Every event, in the order `--help` lists them.
    pub const ALL: [Self; 7] = [
        Self::Instructions,
        Self::Cycles,
        Self::LlcMisses,
        Self::TaskClock,
        Self::CpuClock,
        Self::PageFaults,
        Self::ContextSwitches,
    ];

    /// The name options and recordings use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Instructions => "instructions",
            Self::Cycles => "cycles",
            Self::LlcMisses => "llc-misses",
            Self::TaskClock => "task-clock",
            Self::CpuClock => "cpu-clock",
            Self::PageFaults => "page-faults",
            Self::ContextSwitches => "context-switches",
        }
    }

    /// The event named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Whether it needs a hardware PMU.
    pub fn is_hardware(self) -> bool {
        self.perf_type_config().0 == 0
    }

    /// `(perf type, config)`: include/uapi/linux/perf_event.h, PERF_TYPE_HARDWARE = 0
    /// (CPU_CYCLES 0, INSTRUCTIONS 1, CACHE_MISSES 3), PERF_TYPE_SOFTWARE = 1 (CPU_CLOCK 0,
    /// TASK_CLOCK 1, PAGE_FAULTS 2, CONTEXT_SWITCHES 3).
    fn perf_type_config(self) -> (u32, u64) {
        match self {
            Self::Cycles => (0, 0),
            Self::Instructions => (0, 1),
            Self::LlcMisses => (0, 3),
            Self::CpuClock => (1, 0),
            Self::TaskClock => (1, 1),
            Self::PageFaults => (1, 2),
            Self::ContextSwitches => (1, 3),
        }
    }
}

/// Events named on the command line, in counter order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEvents(pub Vec<RunEvent>);

/// [`parse_events`] as a command-line value.
pub fn parse_run_events(text: &str) -> Result<RunEvents, String> {
    parse_events(text).map(RunEvents)
}

/// Parses `instructions,cycles,llc-misses`: at most three distinct events.
pub fn parse_events(text: &str) -> Result<Vec<RunEvent>, String> {
    let mut events = Vec::new();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let event = RunEvent::from_name(name).ok_or_else(|| {
            let known: Vec<&str> = RunEvent::ALL.iter().map(|e| e.name()).collect();
            format!("unknown event `{name}` (known: {})", known.join(", "))
        })?;
        if events.contains(&event) {
            return Err(format!("`{name}` is listed twice"));
        }
        events.push(event);
    }
    if events.is_empty() || events.len() > MAX_COUNTERS {
        return Err(format!("name 1 to {MAX_COUNTERS} events, comma-separated"));
    }
    Ok(events)
}

/// One asked-for counter and whether it counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunCounterStatus {
    /// The event.
    pub event: RunEvent,
    /// Why it could not be opened (`None`: it counts).
    pub unavailable: Option<String>,
}

impl RunCounterStatus {
    /// As a recording's header stores it.
    pub fn to_pb(&self) -> pb::RunCounter {
        pb::RunCounter {
            event: self.event.name().into(),
            unavailable: self.unavailable.clone().unwrap_or_default(),
        }
    }
}

/// Why the run counters could not be set up (an event that cannot be opened is not this:
/// see [`RunCounterStatus`]).
#[derive(Debug, thiserror::Error)]
pub enum RunCountsError {
    /// A probe map is missing from the object.
    #[error("the probes have no {0} map")]
    Map(&'static str),
    /// A map update was refused.
    #[error("cannot store the {event} counter of CPU {cpu} in the probes' map: {source}")]
    Store {
        /// Event name.
        event: &'static str,
        /// CPU.
        cpu: u32,
        /// The kernel's error.
        source: std::io::Error,
    },
}

/// Run counters installed in the probes: their descriptors (closing them stops counting),
/// the ring buffer and per-CPU batches their counts come back through.
pub struct RunCounters {
    statuses: Vec<RunCounterStatus>,
    _fds: Vec<OwnedFd>,
    ring: RingBuf<MapData>,
    batches: PerCpuArray<MapData, CountBatch>,
    /// Newest run end delivered per CPU (a batch read at the end may also have been sent).
    delivered: HashMap<u32, u64>,
}

const COUNTER_MAPS: [&str; MAX_COUNTERS] = ["RUN_COUNTER_0", "RUN_COUNTER_1", "RUN_COUNTER_2"];

/// Run counters opened on every CPU, not yet installed in the probes.
pub struct OpenRunCounters {
    statuses: Vec<RunCounterStatus>,
    /// Per counter index, the descriptor of each CPU (none for an event that did not open).
    fds: Vec<Vec<(u32, OwnedFd)>>,
}

impl OpenRunCounters {
    /// Opens `events` (at most three) on every CPU of `cpus`. Counter k counts `events[k]`.
    pub fn open(cpus: &[u32], events: &[RunEvent]) -> Self {
        let events = &events[..events.len().min(MAX_COUNTERS)];
        let mut statuses = Vec::new();
        let mut fds = Vec::new();
        for &event in events {
            let (kind, config) = event.perf_type_config();
            let opened: Result<Vec<(u32, OwnedFd)>, String> = cpus
                .iter()
                .map(|&cpu| {
                    perf_event_open(kind, config, cpu)
                        .map(|fd| (cpu, fd))
                        .map_err(|e| unavailable_reason(event, cpu, &e))
                })
                .collect();
            let (opened, unavailable) = match opened {
                Ok(opened) => (opened, None),
                Err(why) => (Vec::new(), Some(why)),
            };
            statuses.push(RunCounterStatus { event, unavailable });
            fds.push(opened);
        }
        Self { statuses, fds }
    }

    /// The probes' `RUN_COUNTERS_ON`: how many counter maps `sched_switch` reads; 0 when
    /// none opened, so the probes leave every read out.
    pub fn probe_counters(&self) -> u32 {
        if self.fds.iter().all(Vec::is_empty) {
            0
        } else {
            self.fds.len() as u32
        }
    }

    /// Stores the opened counters in `ebpf`'s maps (loaded with [`Self::probe_counters`])
    /// and takes the maps their counts come back through.
    pub fn install(self, ebpf: &mut Ebpf) -> Result<RunCounters, RunCountsError> {
        let mut fds = Vec::new();
        for ((k, opened), status) in self.fds.into_iter().enumerate().zip(&self.statuses) {
            if opened.is_empty() {
                continue;
            }
            let name = COUNTER_MAPS[k];
            let map_fd = match ebpf.map(name) {
                Some(aya::maps::Map::PerfEventArray(map)) => map.fd().as_fd().as_raw_fd(),
                _ => return Err(RunCountsError::Map(name)),
            };
            for (cpu, fd) in opened {
                map_update(map_fd, cpu, fd.as_raw_fd()).map_err(|source| {
                    RunCountsError::Store {
                        event: status.event.name(),
                        cpu,
                        source,
                    }
                })?;
                fds.push(fd);
            }
        }
        let ring = ebpf
            .take_map("RUN_COUNTS")
            .and_then(|m| RingBuf::try_from(m).ok())
            .ok_or(RunCountsError::Map("RUN_COUNTS"))?;
        let batches = ebpf
            .take_map("RUN_COUNT_BATCHES")
            .and_then(|m| PerCpuArray::try_from(m).ok())
            .ok_or(RunCountsError::Map("RUN_COUNT_BATCHES"))?;
        Ok(RunCounters {
            statuses: self.statuses,
            _fds: fds,
            ring,
            batches,
            delivered: HashMap::new(),
        })
    }
}

impl RunCounters {
    /// Every asked-for counter, in counter order, with whether it counts.
    pub fn statuses(&self) -> &[RunCounterStatus] {
        &self.statuses
    }

    /// The counts sent since the last drain; with `last`, also those still batched in the
    /// kernel (copied before the ring is drained, as `Probes::drain_final` does).
    pub fn drain(&mut self, last: bool) -> Vec<CountedRun> {
        let batches = if last {
            self.batches.get(&0, 0).ok()
        } else {
            None
        };
        let mut runs = Vec::new();
        while let Some(item) = self.ring.next() {
            if let Some((cpu, events)) = count_batch(&item) {
                deliver(&mut self.delivered, cpu, events, &mut runs);
            }
        }
        if let Some(per_cpu) = batches {
            for (cpu, batch) in per_cpu.iter().enumerate() {
                let events = &batch.events[..(batch.len as usize).min(SWITCH_BATCH)];
                deliver(
                    &mut self.delivered,
                    cpu as u32,
                    events.iter().copied(),
                    &mut runs,
                );
            }
        }
        runs
    }
}

/// One line for a counter that cannot be opened: which event, the errno, what to do.
fn unavailable_reason(event: RunEvent, cpu: u32, err: &std::io::Error) -> String {
    let errno = err.raw_os_error().unwrap_or(0);
    let hint = match (event.is_hardware(), errno) {
        (true, libc::ENOENT | libc::EOPNOTSUPP | libc::ENODEV) => {
            "this CPU has no hardware counter for it (a VM without a virtual PMU?): enable \
             the PMU for the guest, or run on bare metal"
        }
        (_, libc::EACCES | libc::EPERM) => {
            "not permitted: run as root or with CAP_PERFMON, or lower \
             kernel.perf_event_paranoid"
        }
        (_, libc::EBUSY) => "the counter is in use (another profiler or the NMI watchdog)",
        _ => "see perf_event_open(2)",
    };
    format!(
        "perf_event_open({}) on CPU {cpu} failed: {err} ({}); {hint}",
        event.name(),
        errno_name(errno)
    )
}

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::ENOENT => "ENOENT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENODEV => "ENODEV",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EBUSY => "EBUSY",
        libc::EINVAL => "EINVAL",
        _ => "errno",
    }
}

/// The CPU and events of one ring-buffer record of counts, `None` if malformed.
fn count_batch(bytes: &[u8]) -> Option<(u32, impl Iterator<Item = CountEvent> + '_)> {
    super::decode::batch(bytes)
}

/// Appends a CPU's count events, skipping any already delivered.
fn deliver(
    delivered: &mut HashMap<u32, u64>,
    cpu: u32,
    events: impl IntoIterator<Item = CountEvent>,
    out: &mut Vec<CountedRun>,
) {
    let newest = delivered.entry(cpu).or_insert(0);
    for e in events {
        if e.ts_ns > *newest {
            *newest = e.ts_ns;
            let mut counts = [None; MAX_COUNTERS];
            for (k, slot) in counts.iter_mut().enumerate() {
                if e.valid & (1 << k) != 0 {
                    *slot = Some(e.counts[k]);
                }
            }
            out.push(CountedRun {
                ts_ns: e.ts_ns,
                cpu,
                tid: e.tid,
                counts,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use energy_bpf_abi::SWITCH_BATCH_HEADER;

    #[test]
    fn event_lists_parse_and_names_are_stable() {
        assert_eq!(
            parse_events("instructions,cycles,llc-misses"),
            Ok(vec![
                RunEvent::Instructions,
                RunEvent::Cycles,
                RunEvent::LlcMisses
            ])
        );
        assert_eq!(
            parse_events(" page-faults , task-clock"),
            Ok(vec![RunEvent::PageFaults, RunEvent::TaskClock])
        );
        assert!(
            parse_events("flops")
                .expect_err("unknown")
                .contains("known:")
        );
        assert!(parse_events("cycles,cycles").is_err());
        assert!(parse_events("cycles,instructions,llc-misses,task-clock").is_err());
        assert!(parse_events("").is_err());
        for e in RunEvent::ALL {
            assert_eq!(RunEvent::from_name(e.name()), Some(e));
        }
    }

    #[test]
    fn a_missing_pmu_is_named_with_its_errno_and_a_remedy() {
        let err = std::io::Error::from_raw_os_error(libc::ENOENT);
        let text = unavailable_reason(RunEvent::Instructions, 0, &err);
        assert!(
            text.starts_with("perf_event_open(instructions) on CPU 0 failed"),
            "{text}"
        );
        assert!(text.contains("ENOENT") && text.contains("PMU"), "{text}");
    }

    #[test]
    fn batches_decode_and_duplicates_are_delivered_once() {
        let mut bytes = vec![0u8; SWITCH_BATCH_HEADER];
        bytes[..4].copy_from_slice(&2u32.to_ne_bytes());
        bytes[4..8].copy_from_slice(&1u32.to_ne_bytes());
        for (ts, valid) in [(10u64, 0b011u32), (20, 0b100)] {
            bytes.extend(ts.to_ne_bytes());
            bytes.extend(7u32.to_ne_bytes());
            bytes.extend(valid.to_ne_bytes());
            for c in [1u64, 2, 3] {
                bytes.extend((c * ts).to_ne_bytes());
            }
        }
        let (cpu, events) = count_batch(&bytes).expect("batch");
        assert_eq!(cpu, 1);
        let events: Vec<CountEvent> = events.collect();
        let mut delivered = HashMap::new();
        let mut out = Vec::new();
        deliver(&mut delivered, cpu, events.iter().copied(), &mut out);
        deliver(&mut delivered, cpu, events.iter().copied(), &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].counts, [Some(10), Some(20), None]);
        assert_eq!(out[1].counts, [None, None, Some(60)]);
        assert!(count_batch(&bytes[..bytes.len() - 1]).is_none());
    }
}
