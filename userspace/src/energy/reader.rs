//! The energy reader thread: measures each counter's update period and read cost, then reads
//! each on its own schedule, off the capture path, and buffers unwrapped readings for the
//! recorder to [`EnergyReader::drain`]. The buffer lock is never held across a read.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, mpsc},
    thread::JoinHandle,
    time::Duration,
};

use super::{
    EnergyArgs, EnergyError, EnergySource, RawSample, SourceKind,
    counter::{MAX_PLAUSIBLE_W, Step, Unwrapper, wrap_period_ns},
    detect, model,
};
use crate::clock::monotonic_ns;
use crate::{pb::v1 as pb, timeline::Timeline};

/// How long start-up spends watching a CPU counter change, ns.
pub const MEASURE_WINDOW_NS: u64 = 50_000_000;
/// The same for NVML, which updates every 20–100 ms (docs/ARCHITECTURE.md, "Energy counters").
const MEASURE_WINDOW_NVML_NS: u64 = 300_000_000;
/// Changes to watch before the period is known well enough (3 gaps).
pub const MEASURE_CHANGES: usize = 4;
/// The read interval is at least this many update periods...
pub const INTERVAL_PERIODS: u64 = 5;
/// ...and at least this long, ns.
pub const MIN_INTERVAL_NS: u64 = 10_000_000;

/// What start-up measured about one counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measurement {
    /// Median time between value changes, ns; the window length when fewer than two changes
    /// were seen (then it is a lower bound).
    pub update_period_ns: u64,
    /// Whether `update_period_ns` is only a lower bound.
    pub period_is_lower_bound: bool,
    /// How many times the value changed while watched (at most [`MEASURE_CHANGES`]).
    pub changes: u32,
    /// Mean cost of one read, ns.
    pub read_cost_ns: u64,
    /// The period is the one the source stated ([`EnergySource::known_update_period_ns`]),
    /// not one watched.
    pub period_is_known: bool,
}

/// How long start-up keeps watching, under `--energy-source auto`, a counter that did not
/// change in its window and was read fewer than [`STARVED_READS`] times in it
/// ([`measure`]'s `patience_ns`), ns: a reader the scheduler kept off the CPU for most of
/// the window (or whose reads are slow, as in an emulated guest) has not yet seen a
/// counter that counts change, and would otherwise drop it.
pub const SILENT_WATCH_NS: u64 = 1_100_000_000;
/// Fewer reads than this in a counter's window mean the reader was starved: a counter read
/// this often and still silent, over 50 ms, updates slower than RAPL (about every 1 ms) by
/// far. One read thousands of times and still silent (a frozen `energy-psys`) is judged at
/// the window's end, at no cost to start-up.
pub const STARVED_READS: u64 = 8;
/// How often a counter is read while watched past its window, ns.
const WATCH_STEP_NS: u64 = 5_000_000;

/// Spin-reads every counter (round robin) until each has changed [`MEASURE_CHANGES`] times
/// or its window is over, and returns per counter its measurement or its read error. A
/// counter that does not state its period and has not changed once by the end of its
/// window, having been read fewer than [`STARVED_READS`] times in it, is read every
/// [`WATCH_STEP_NS`] until it changes or `patience_ns` from the start has passed (none
/// without `patience_ns`); one that changes then is reported with one change and its
/// period as a lower bound: the time it sat still.
pub fn measure(
    counters: &mut [Box<dyn EnergySource>],
    patience_ns: Option<u64>,
) -> Vec<Result<Measurement, EnergyError>> {
    struct State {
        last: Option<u64>,
        changes: Vec<u64>,
        reads: u64,
        cost_ns: u64,
        window_ns: u64,
        /// When a counter watched past its window is read next.
        next_ns: u64,
        /// When it was last read.
        last_read_ns: u64,
        /// Whether it is watched past its window (decided when the window ends).
        watched: Option<bool>,
        error: Option<EnergyError>,
    }
    let start = monotonic_ns();
    let mut states: Vec<State> = counters
        .iter()
        .map(|c| State {
            last: None,
            changes: Vec::new(),
            reads: 0,
            cost_ns: 0,
            window_ns: if c.describe().kind == SourceKind::Nvml.as_str() {
                MEASURE_WINDOW_NVML_NS
            } else {
                MEASURE_WINDOW_NS
            },
            next_ns: 0,
            last_read_ns: start,
            watched: None,
            error: None,
        })
        .collect();
    let patience_ns = patience_ns.unwrap_or(0);
    loop {
        // The earliest next read of a counter watched past its window, when only such
        // counters are left.
        let mut wait_until: Option<u64> = None;
        let mut spinning = false;
        for (counter, st) in counters.iter_mut().zip(states.iter_mut()) {
            let now = monotonic_ns();
            let elapsed = now.saturating_sub(start);
            if st.error.is_some() || st.changes.len() >= MEASURE_CHANGES {
                continue;
            }
            if elapsed >= st.window_ns {
                // A source that states its period (a host's share) is never judged silent,
                // so never watched.
                let starved = *st.watched.get_or_insert_with(|| {
                    patience_ns > st.window_ns
                        && counter.known_update_period_ns().is_none()
                        && st.changes.is_empty()
                        && st.reads < STARVED_READS
                });
                if !starved || !st.changes.is_empty() || elapsed >= patience_ns {
                    continue;
                }
                let due = now >= st.next_ns;
                if due {
                    st.next_ns = now + WATCH_STEP_NS;
                }
                wait_until = Some(wait_until.map_or(st.next_ns, |w| w.min(st.next_ns)));
                if !due {
                    continue;
                }
            } else {
                spinning = true;
            }
            let t0 = monotonic_ns();
            let value = counter.read();
            let t1 = monotonic_ns();
            st.reads += 1;
            st.cost_ns += t1 - t0;
            st.last_read_ns = t1;
            match value {
                Ok(RawSample { count, .. }) => {
                    if st.last.is_some_and(|l| l != count) {
                        st.changes.push(t1);
                    }
                    st.last = Some(count);
                }
                Err(e) => st.error = Some(e),
            }
        }
        if spinning {
            // Slow counters (NVML) need no spinning at full speed.
            std::thread::sleep(Duration::from_micros(20));
        } else if let Some(at) = wait_until {
            std::thread::sleep(Duration::from_nanos(
                at.saturating_sub(monotonic_ns()).min(WATCH_STEP_NS),
            ));
        } else {
            break;
        }
    }
    states
        .into_iter()
        .zip(counters.iter())
        .map(|(st, counter)| {
            if let Some(e) = st.error {
                return Err(e);
            }
            let mut gaps: Vec<u64> = st.changes.windows(2).map(|w| w[1] - w[0]).collect();
            gaps.sort_unstable();
            let read_cost_ns = st.cost_ns / st.reads.max(1);
            let changes = st.changes.len() as u32;
            if let Some(period) = counter.known_update_period_ns() {
                return Ok(Measurement {
                    update_period_ns: period,
                    period_is_lower_bound: false,
                    read_cost_ns,
                    changes,
                    period_is_known: true,
                });
            }
            Ok(match gaps.get(gaps.len() / 2) {
                Some(&median) => Measurement {
                    update_period_ns: median,
                    period_is_lower_bound: false,
                    read_cost_ns,
                    changes,
                    period_is_known: false,
                },
                None => Measurement {
                    // It sat still from the first read until its one change, or its last
                    // read when it was watched past its window.
                    update_period_ns: match (st.changes.first(), st.watched) {
                        (Some(&t), _) => t,
                        (None, Some(true)) => st.last_read_ns,
                        (None, _) => start,
                    }
                    .saturating_sub(start)
                    .max(st.window_ns),
                    period_is_lower_bound: true,
                    read_cost_ns,
                    changes,
                    period_is_known: false,
                },
            })
        })
        .collect()
}

/// How long [`measure`] may watch a starved counter that sat still through its window:
/// under `--energy-source auto`, which drops a counter that never changes ([`silent`]),
/// [`SILENT_WATCH_NS`]; a counter asked for by name is used whatever it does.
pub fn patience_ns(args: &EnergyArgs) -> Option<u64> {
    (args.energy_source == SourceKind::Auto).then_some(SILENT_WATCH_NS)
}

/// Why an automatically chosen counter that never changed while start-up watched it is not
/// used: it counts nothing. A hypervisor can expose the power PMU (`energy-psys` on
/// Firecracker) with counters that stay at one value; a real RAPL counter changes about every
/// millisecond and NVML every 20–100 ms, so one that sat still for the whole window (and,
/// when the reader was starved in it, the [`SILENT_WATCH_NS`] after it) is not counting
/// energy. One that changed once is counting, only too slowly (or read too rarely, on a
/// loaded machine) to time: it is used. `None` when the counter counts or was asked for by
/// name.
pub fn silent(args: &EnergyArgs, m: &Measurement) -> Option<String> {
    (args.energy_source == SourceKind::Auto && m.changes == 0 && !m.period_is_known).then(|| {
        format!(
            "did not change once in {} ms of reads: not counting energy (a hypervisor can expose \
             the PMU without counting); not used",
            m.update_period_ns / 1_000_000
        )
    })
}

/// The read interval of a counter before the wrap cap ([`read_interval`]):
/// `--energy-interval-ms` when given, else at least [`INTERVAL_PERIODS`] update periods and
/// [`MIN_INTERVAL_NS`]. Reading over several updates keeps the ±1 update quantisation of each
/// delta small (seed 004: RAPL updates about every 1 ms).
pub fn interval_ns(args: &EnergyArgs, update_period_ns: u64) -> u64 {
    match args.energy_interval_ms {
        Some(ms) => ms.max(1) * 1_000_000,
        None => update_period_ns
            .saturating_mul(INTERVAL_PERIODS)
            .max(MIN_INTERVAL_NS),
    }
}

/// A counter's read interval, and what the wrap cap did to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadInterval {
    /// Time between reads, ns.
    pub ns: u64,
    /// Time the counter takes to wrap once at [`MAX_PLAUSIBLE_W`], ns (`None`: no wrap).
    pub wrap_period_ns: Option<u64>,
    /// The interval [`interval_ns`] chose, when the wrap cap lowered it.
    pub uncapped_ns: Option<u64>,
}

/// The read interval of a counter that wraps every `wrap_period_ns` at the power bound:
/// [`interval_ns`], capped at half the wrap period so that every wrap is seen by two reads
/// even at the highest plausible power, but never below [`MIN_INTERVAL_NS`] (a counter that
/// can wrap faster than that gets ambiguous deltas flagged by [`Unwrapper`]). The cap also
/// applies to `--energy-interval-ms`.
pub fn read_interval(
    args: &EnergyArgs,
    update_period_ns: u64,
    wrap_period_ns: Option<u64>,
) -> ReadInterval {
    let base = interval_ns(args, update_period_ns);
    let cap = wrap_period_ns.map(|p| (p / 2).max(MIN_INTERVAL_NS));
    match cap {
        Some(cap) if cap < base => ReadInterval {
            ns: cap,
            wrap_period_ns,
            uncapped_ns: Some(base),
        },
        _ => ReadInterval {
            ns: base,
            wrap_period_ns,
            uncapped_ns: None,
        },
    }
}

/// [`read_interval`] for `counter`, its wrap period taken at [`MAX_PLAUSIBLE_W`], as start-up
/// measured it (`m`); a source that asks for a read interval
/// ([`EnergySource::default_read_interval_ns`], a host's share) gets it. A counter start-up
/// saw change at most once (its period only a lower bound: one updated about once a
/// second) is read as often as [`READ_COST_SHARE`] of a CPU allows at `m.read_cost_ns` a
/// read, between [`MIN_SHARE_READ_NS`] and what the rule of [`interval_ns`] gives: a read
/// that finds no new value writes nothing, and each one that finds one times the update
/// more closely (read every 250 ms, a once-a-second counter's updates reached the
/// recording up to 250 ms late). `--energy-interval-ms` overrides all of it.
pub fn read_interval_of(
    args: &EnergyArgs,
    m: &Measurement,
    counter: &dyn EnergySource,
) -> ReadInterval {
    let wrap = wrap_period_ns(counter.unit_uj(), counter.wrap_counts(), MAX_PLAUSIBLE_W);
    if args.energy_interval_ms.is_some() {
        return read_interval(args, m.update_period_ns, wrap);
    }
    match counter.default_read_interval_ns() {
        Some(ns) => ReadInterval {
            ns: ns.max(MIN_INTERVAL_NS),
            wrap_period_ns: wrap,
            uncapped_ns: None,
        },
        None if m.period_is_lower_bound => {
            let i = read_interval(args, m.update_period_ns, wrap);
            ReadInterval {
                ns: share_read_interval_ns(i.ns, m.read_cost_ns),
                ..i
            }
        }
        None => read_interval(args, m.update_period_ns, wrap),
    }
}

/// The share of one CPU a slow counter's reads may take ([`read_interval_of`]): 0.2%.
pub const READ_COST_SHARE: f64 = 0.002;
/// The shortest read interval of a slow counter, ns.
pub const MIN_SHARE_READ_NS: u64 = 20_000_000;

/// See [`read_interval_of`]: `longest_ns` is what the rule of [`interval_ns`] gives.
fn share_read_interval_ns(longest_ns: u64, read_cost_ns: u64) -> u64 {
    let affordable = (read_cost_ns as f64 / READ_COST_SHARE) as u64;
    affordable
        .max(MIN_SHARE_READ_NS)
        .min(longest_ns)
        .max(MIN_INTERVAL_NS)
}

/// When a counter read every `interval_ns` is read next after `now_ns`: at the next
/// multiple of the interval on CLOCK_MONOTONIC, so every counter with the same interval is
/// read at the same moments, and readings fall on the edges of the probes' aggregation
/// slots (`energy_bpf_abi::AGG_SLOT_NS`, of which the default intervals are multiples):
/// the energy between two readings is then split by busy times the probes cut at exactly
/// those moments.
fn next_read_ns(now_ns: u64, interval_ns: u64) -> u64 {
    let interval = interval_ns.max(1);
    (now_ns / interval + 1) * interval
}

/// Reads timed to the updates of a counter whose period the source states (a host's share):
/// after a read that saw an update, the next comes `guard_ns` before the next update is
/// due, and reads follow every `step_ns` until one sees it. Each update is then timed
/// within a step, at about `guard_ns / step_ns` reads per update; read every fifth of a
/// period instead, each reached the guest up to 200 ms late on a once-a-second share, and a
/// simulated 20 s split of processes at 15, 5 and 8 W moved by up to 20%
/// (docs/accuracy.md). A host that misses its slot by more than two guards loses the lock;
/// the plain interval takes over until an update is seen again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PhaseLock {
    period_ns: u64,
    step_ns: u64,
    guard_ns: u64,
    /// When the next update is due, once one was seen.
    due_ns: Option<u64>,
}

/// The shortest step of a [`PhaseLock`], ns.
const LOCK_MIN_STEP_NS: u64 = 2_000_000;
/// A step is at least this many reads' cost (a TCG guest's 13–25 ms reads step 130–250 ms).
const LOCK_STEP_READS: u64 = 10;
/// The shortest guard, ns: a host agent's timer and its write come a few ms late.
const LOCK_MIN_GUARD_NS: u64 = 20_000_000;

impl PhaseLock {
    /// The lock of a counter updated every `period_ns`, each read costing `read_cost_ns`;
    /// `None` when steps that long would not time the updates better than the plain
    /// interval `plain_ns`.
    fn new(period_ns: u64, read_cost_ns: u64, plain_ns: u64) -> Option<Self> {
        let step_ns = read_cost_ns
            .saturating_mul(LOCK_STEP_READS)
            .max(LOCK_MIN_STEP_NS);
        let guard_ns = (4 * step_ns).max(LOCK_MIN_GUARD_NS);
        (step_ns < plain_ns && 2 * guard_ns < period_ns).then_some(Self {
            period_ns,
            step_ns,
            guard_ns,
            due_ns: None,
        })
    }

    /// When to read next after a read at `now_ns` that saw an update (`updated`) or not;
    /// `plain_ns` is the plain interval's next read.
    fn next_ns(&mut self, now_ns: u64, updated: bool, plain_ns: u64) -> u64 {
        if updated {
            let due = now_ns + self.period_ns;
            self.due_ns = Some(due);
            return due - self.guard_ns;
        }
        match self.due_ns {
            Some(due) if now_ns + self.step_ns < due - self.guard_ns => due - self.guard_ns,
            Some(due) if now_ns < due + 2 * self.guard_ns => now_ns + self.step_ns,
            _ => {
                self.due_ns = None;
                plain_ns
            }
        }
    }
}

struct Live {
    counter: Box<dyn EnergySource>,
    id: u32,
    label: String,
    unwrap: Unwrapper,
    interval_ns: u64,
    next_ns: u64,
    lock: Option<PhaseLock>,
    pending_gpu: BTreeMap<u32, pb::GpuProcessUsage>,
    /// What the source said that the user must see ([`EnergySource::take_notice`], gaps).
    notices: Vec<String>,
}

#[derive(Default)]
struct Shared {
    readings: Vec<pb::EnergyReading>,
    faults: Vec<String>,
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    // A panic elsewhere must not lose the readings already taken.
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Timed read: the timestamp is the middle of the read.
fn timed_read(counter: &mut dyn EnergySource) -> (u64, Result<RawSample, EnergyError>) {
    let t0 = monotonic_ns();
    let result = counter.read();
    let t1 = monotonic_ns();
    (t0 + (t1 - t0) / 2, result)
}

impl Live {
    /// Reads once; returns a reading unless merged, or the fault text.
    fn step(&mut self) -> Result<Option<pb::EnergyReading>, String> {
        let (ts_ns, result) = timed_read(self.counter.as_mut());
        let sample = result.map_err(|e| {
            format!(
                "{}: {e}; no longer read, the other sources continue",
                self.label
            )
        })?;
        for p in sample.gpu_processes {
            let e = self
                .pending_gpu
                .entry(p.pid)
                .or_insert(pb::GpuProcessUsage {
                    pid: p.pid,
                    ..Default::default()
                });
            e.sm_util = e.sm_util.max(p.sm_util);
            e.used_memory_bytes = e.used_memory_bytes.max(p.used_memory_bytes);
        }
        if let Some(notice) = self.counter.take_notice() {
            tracing::warn!("{notice}");
            self.notices.push(notice);
        }
        if let Some(gap) = self.counter.take_gap() {
            // Counting goes on from the value just read; the interval ending here is dropped.
            let energy_uj = self.unwrap.restart(sample.count, ts_ns);
            tracing::warn!("{}: {gap}; the interval ending here is dropped", self.label);
            self.notices.push(format!("{}: {gap}", self.label));
            return Ok(Some(pb::EnergyReading {
                source_id: self.id,
                ts_ns,
                energy_uj,
                flag: gap,
                gpu_processes: Vec::new(),
            }));
        }
        let (energy_uj, flag) = match self.unwrap.update(sample.count, ts_ns) {
            Step::Unchanged => return Ok(None),
            Step::Advanced { energy_uj } => (energy_uj, String::new()),
            Step::Flagged { energy_uj, flag } => (energy_uj, flag),
        };
        let gpu_processes = std::mem::take(&mut self.pending_gpu)
            .into_values()
            .collect();
        Ok(Some(pb::EnergyReading {
            source_id: self.id,
            ts_ns,
            energy_uj,
            flag,
            gpu_processes,
        }))
    }
}

fn run(mut live: Vec<Live>, shared: Arc<Mutex<Shared>>, stop: mpsc::Receiver<()>) {
    loop {
        let now = monotonic_ns();
        let next = live
            .iter()
            .map(|l| l.next_ns)
            .min()
            .unwrap_or(now + MIN_INTERVAL_NS);
        let stopping = !matches!(
            stop.recv_timeout(Duration::from_nanos(next.saturating_sub(now))),
            Err(mpsc::RecvTimeoutError::Timeout)
        );
        let now = monotonic_ns();
        let mut readings = Vec::new();
        let mut faults = Vec::new();
        live.retain_mut(|l| {
            if !stopping && l.next_ns > now {
                return true;
            }
            l.next_ns = next_read_ns(now, l.interval_ns);
            let step = l.step();
            faults.append(&mut l.notices);
            match step {
                Ok(reading) => {
                    if let Some(lock) = &mut l.lock {
                        l.next_ns = lock.next_ns(now, reading.is_some(), l.next_ns);
                    }
                    readings.extend(reading);
                    true
                }
                Err(fault) => {
                    faults.push(fault);
                    false
                }
            }
        });
        if !readings.is_empty() || !faults.is_empty() {
            let mut s = lock(&shared);
            s.readings.append(&mut readings);
            s.faults.append(&mut faults);
        }
        if stopping {
            return;
        }
    }
}

/// The running reader (or, with no counter, the model's description).
pub struct EnergyReader {
    sources: Vec<pb::EnergySource>,
    shared: Arc<Mutex<Shared>>,
    stop_tx: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Detects and measures the sources (see `detect`) and starts the reader thread. The first
/// reading of each counter (energy 0) is taken before this returns. With no hardware
/// counter the reader only describes the model sources and reads nothing: consumers compute
/// modelled readings from the timeline ([`readings_for`]).
pub fn start(args: &EnergyArgs, cpus: &[pb::Cpu]) -> Result<EnergyReader, EnergyError> {
    let mut plan = detect::plan(args, cpus, false)?;
    let mut counters = plan.take_used();
    let measured = measure(&mut counters, patience_ns(args));
    let mut shared = Shared::default();
    let (counters, measured): (Vec<_>, Vec<_>) = counters
        .into_iter()
        .zip(measured)
        .filter(|(counter, m)| {
            let Some(why) = m.as_ref().ok().and_then(|m| silent(args, m)) else {
                return true;
            };
            let d = counter.describe();
            tracing::warn!("{} {}: {why}", d.kind, d.name);
            shared.faults.push(format!("{} {}: {why}", d.kind, d.name));
            false
        })
        .unzip();
    let package_counted = counters
        .iter()
        .any(|c| detect::is_cpu_package(&c.describe()));
    plan.cover_packages(args, cpus, package_counted)?;
    let mut sources = plan.model.clone();
    let mut live = Vec::new();
    for (counter, m) in counters.into_iter().zip(measured) {
        let mut desc = counter.describe();
        let label = format!("{} {}", desc.kind, desc.name);
        let m = match m {
            Ok(m) => m,
            Err(e) => {
                shared.faults.push(format!("{label}: {e}; not used"));
                continue;
            }
        };
        desc.id = sources.len() as u32 + 1;
        desc.update_period_ns = m.update_period_ns;
        desc.read_cost_ns = m.read_cost_ns;
        let interval_ns = read_interval_of(args, &m, counter.as_ref()).ns;
        let lock = counter
            .known_update_period_ns()
            .filter(|_| args.energy_interval_ms.is_none())
            .and_then(|period| PhaseLock::new(period, m.read_cost_ns, interval_ns));
        // What times each update: the lock's step, else the interval.
        desc.read_interval_ns = lock.map_or(interval_ns, |l| l.step_ns);
        let mut counter = counter;
        let (ts_ns, first) = timed_read(counter.as_mut());
        let sample = match first {
            Ok(sample) => sample,
            Err(e) => {
                shared.faults.push(format!("{label}: {e}; not used"));
                continue;
            }
        };
        let unwrap = Unwrapper::new(
            sample.count,
            ts_ns,
            counter.unit_uj(),
            counter.wrap_counts(),
            MAX_PLAUSIBLE_W,
        );
        shared.readings.push(pb::EnergyReading {
            source_id: desc.id,
            ts_ns,
            ..Default::default()
        });
        live.push(Live {
            counter,
            id: desc.id,
            label,
            unwrap,
            interval_ns,
            next_ns: next_read_ns(ts_ns, interval_ns),
            lock,
            pending_gpu: BTreeMap::new(),
            notices: Vec::new(),
        });
        sources.push(desc);
    }
    if sources.is_empty() {
        return Err(EnergyError::Unavailable {
            kind: args.energy_source,
            reason: fault_summary(&shared),
        });
    }
    let shared = Arc::new(Mutex::new(shared));
    let (stop_tx, stop_rx) = mpsc::channel();
    let thread = if live.is_empty() {
        None
    } else {
        let shared = shared.clone();
        Some(
            std::thread::Builder::new()
                .name("energy-reader".into())
                .spawn(move || run(live, shared, stop_rx))
                .map_err(EnergyError::Thread)?,
        )
    };
    Ok(EnergyReader {
        sources,
        shared,
        stop_tx: Some(stop_tx),
        thread,
    })
}

fn fault_summary(shared: &Shared) -> String {
    if shared.faults.is_empty() {
        "no counters".into()
    } else {
        shared.faults.join("; ")
    }
}

impl EnergyReader {
    /// Every source in use (model sources first), with ids, update period and read cost.
    pub fn sources(&self) -> Vec<pb::EnergySource> {
        self.sources.clone()
    }

    /// Readings taken since the last drain, in time order per source.
    pub fn drain(&self) -> Vec<pb::EnergyReading> {
        std::mem::take(&mut lock(&self.shared).readings)
    }

    /// Sources that failed (vanished, permission lost), one line each, since start.
    pub fn faults(&self) -> Vec<String> {
        lock(&self.shared).faults.clone()
    }

    /// Whether the model (estimated) covers the CPU packages.
    pub fn is_model(&self) -> bool {
        self.sources.iter().any(model::is_model)
    }

    /// Takes a final reading of every counter, stops the thread and returns the readings
    /// not yet drained.
    pub fn stop(mut self) -> Vec<pb::EnergyReading> {
        self.halt();
        self.drain()
    }

    fn halt(&mut self) {
        drop(self.stop_tx.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            lock(&self.shared)
                .faults
                .push("energy reader thread panicked".into());
        }
    }
}

impl Drop for EnergyReader {
    fn drop(&mut self) {
        self.halt();
    }
}

/// The readings every consumer should use for a recording: the recorded readings of
/// hardware sources, plus modelled readings (every [`model::DEFAULT_INTERVAL_NS`]) for
/// model sources, computed from the timeline. Sorted by time, then source id.
pub fn readings_for(
    recording_sources: &[pb::EnergySource],
    recorded_readings: &[pb::EnergyReading],
    timeline: &Timeline,
    cpus: &[pb::Cpu],
) -> Vec<pb::EnergyReading> {
    let model_ids: Vec<u32> = recording_sources
        .iter()
        .filter(|s| model::is_model(s))
        .map(|s| s.id)
        .collect();
    let mut out: Vec<pb::EnergyReading> = recorded_readings
        .iter()
        .filter(|r| !model_ids.contains(&r.source_id))
        .cloned()
        .collect();
    if !model_ids.is_empty() {
        out.extend(model::readings(
            timeline,
            cpus,
            recording_sources,
            model::DEFAULT_INTERVAL_NS,
        ));
    }
    out.sort_by_key(|r| (r.ts_ns, r.source_id));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn args(interval_ms: Option<u64>) -> EnergyArgs {
        EnergyArgs {
            energy_interval_ms: interval_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_phase_lock_reads_just_before_each_update_until_it_sees_it() {
        let second = 1_000 * MS;
        // A cheap share (50 µs a read) updated once a second, plain interval 200 ms.
        let mut lock = PhaseLock::new(second, 50_000, 200 * MS).expect("lock");
        assert_eq!((lock.step_ns, lock.guard_ns), (2 * MS, 20 * MS));
        // Unlocked: the plain schedule.
        assert_eq!(lock.next_ns(100 * MS, false, 200 * MS), 200 * MS);
        // An update seen at 0.2 s: the next read is due 20 ms before 1.2 s...
        assert_eq!(lock.next_ns(200 * MS, true, 400 * MS), 1_180 * MS);
        // ...then one every 2 ms until one sees the update.
        assert_eq!(lock.next_ns(1_180 * MS, false, 1_200 * MS), 1_182 * MS);
        assert_eq!(lock.next_ns(1_203 * MS, false, 1_400 * MS), 1_205 * MS);
        assert_eq!(lock.next_ns(1_205 * MS, true, 1_400 * MS), 2_185 * MS);
        // Reads per update here: (1,205 - 1,180) / 2 + 1 = 13, against 5 at 200 ms.
        // A host more than two guards late: the lock lets go, the plain schedule resumes.
        assert_eq!(lock.next_ns(2_246 * MS, false, 2_400 * MS), 2_400 * MS);
        assert_eq!(lock.due_ns, None);
        // A TCG guest's 13 ms reads: steps of 130 ms and guards of 520 ms do not fit a
        // second; five plain reads per update it is.
        assert_eq!(PhaseLock::new(second, 13 * MS, 200 * MS), None);
    }

    #[test]
    fn a_slow_counter_is_read_as_often_as_its_read_cost_allows() {
        // The rule gives 250 ms (a period bounded at 50 ms).
        assert_eq!(
            share_read_interval_ns(200 * MS, 10_000),
            20 * MS,
            "cheap: the floor"
        );
        assert_eq!(
            share_read_interval_ns(200 * MS, 100_000),
            50 * MS,
            "0.2% of a CPU"
        );
        // A TCG guest, where the two file reads take about 25 ms: what the source asks.
        assert_eq!(share_read_interval_ns(200 * MS, 25 * MS), 200 * MS);
        // A host interval shorter than the floor: never slower than asked.
        assert_eq!(share_read_interval_ns(15 * MS, 0), 15 * MS);
    }

    #[test]
    fn small_wrap_range_shortens_the_interval() {
        // An idle counter at start: the 50 ms window is a lower bound, 250 ms interval. A
        // 200 J powercap range wraps in 100 ms at 2000 W: read every 50 ms instead.
        let wrap = wrap_period_ns(1.0, Some(200_000_001), MAX_PLAUSIBLE_W);
        assert_eq!(interval_ns(&args(None), MEASURE_WINDOW_NS), 250 * MS);
        assert_eq!(
            read_interval(&args(None), MEASURE_WINDOW_NS, wrap),
            ReadInterval {
                ns: 50 * MS,
                wrap_period_ns: Some(100 * MS),
                uncapped_ns: Some(250 * MS),
            }
        );
        // `--energy-interval-ms` is capped too.
        assert_eq!(read_interval(&args(Some(1000)), MS, wrap).ns, 50 * MS);
    }

    #[test]
    fn normal_wrap_range_leaves_the_interval_alone() {
        // 32-bit MSR at 15.26 µJ: 32.8 s per wrap at 2000 W, far above 250 ms.
        let msr = wrap_period_ns(1e6 / 65536.0, Some(1 << 32), MAX_PLAUSIBLE_W);
        assert_eq!(
            read_interval(&args(None), MEASURE_WINDOW_NS, msr),
            ReadInterval {
                ns: 250 * MS,
                wrap_period_ns: Some(32_768 * MS),
                uncapped_ns: None,
            }
        );
        // No wrap point (perf, hwmon, NVML): nothing to cap, even at a minute.
        assert_eq!(
            read_interval(&args(Some(60_000)), MS, None),
            ReadInterval {
                ns: 60_000 * MS,
                wrap_period_ns: None,
                uncapped_ns: None,
            }
        );
        // But a minute would miss MSR wraps: half of 32.768 s.
        assert_eq!(read_interval(&args(Some(60_000)), MS, msr).ns, 16_384 * MS);
    }

    #[test]
    fn cap_never_goes_below_the_minimum_nor_raises_an_interval() {
        // 8 J range: 4 ms per wrap at 2000 W; half is 2 ms, below the 10 ms minimum.
        let tiny = wrap_period_ns(1.0, Some(8_000_001), MAX_PLAUSIBLE_W);
        assert_eq!(tiny, Some(4 * MS));
        let i = read_interval(&args(None), MEASURE_WINDOW_NS, tiny);
        assert_eq!((i.ns, i.uncapped_ns), (MIN_INTERVAL_NS, Some(250 * MS)));
        // An interval already under the cap (1 ms asked for) stays as it is.
        let i = read_interval(&args(Some(1)), MS, tiny);
        assert_eq!((i.ns, i.uncapped_ns), (MS, None));
    }
}
