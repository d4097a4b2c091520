//! The one live capture: probes, [`Session`], energy reader, sample targets and energy
//! faults, started, polled and finished the same way for `record`, `calibrate`, `top` and
//! the agent. Nothing outside this module calls [`Session::new`] or
//! [`crate::energy::start`], so a fix to start-up, draining or the last chunk reaches every
//! command.
//!
//! Single-threaded: the caller owns it and drives it on its own timer ([`Live::poll`]).
//! What is done with the chunks (a file, the pipeline, a calibration) is the caller's.

use super::{
    ActivityEvent, CaptureError, Probes, UnwindMode,
    session::{MappingReader, Session, Targets},
    unwinder::UnwindStats,
};
use crate::{
    energy::{self, EnergyArgs, EnergyError, EnergyReader},
    pb::v1 as pb,
};

/// What a live capture is started with.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    /// Stack sampling frequency per CPU, Hz.
    pub sample_hz: u64,
    /// How often each CPU's sampling rate is drawn anew (see `super::sampler`).
    pub sample_redraw: std::time::Duration,
    /// The per-run activity counter.
    pub activity: ActivityEvent,
    /// How user stacks are walked.
    pub unwind: UnwindMode,
    /// Size of the stack-sample ring buffer (`None`: the probes' default).
    pub sample_ring_bytes: Option<u32>,
    /// Run counters (`record --activity-events`; empty: none).
    pub run_events: Vec<super::run_counts::RunEvent>,
    /// Energy sources.
    pub energy: EnergyArgs,
    /// Whose stacks are kept.
    pub targets: Targets,
    /// How a new target's executable mappings are read.
    pub read_mappings: MappingReader,
    /// Whether the probes aggregate runs per thread and interval instead of sending every
    /// switch (see `super::aggregate`).
    pub aggregate: bool,
}

impl LiveOptions {
    /// The switch timeline and the energy counters only: stacks sampled at 1 Hz with frame
    /// pointers, no activity counter, no run counters, no targets, no mappings read (what
    /// `calibrate` and `calibrate --roofline` measure with). The other methods add to it.
    pub fn timeline(energy: EnergyArgs) -> Self {
        Self {
            sample_hz: 1,
            sample_redraw: super::sampler::REDRAW,
            activity: ActivityEvent::None,
            unwind: UnwindMode::Fp,
            sample_ring_bytes: None,
            run_events: Vec::new(),
            energy,
            targets: Targets::default(),
            read_mappings: |_, _| Ok(Vec::new()),
            aggregate: false,
        }
    }

    /// Stacks sampled at `hz` per CPU, user stacks walked as `unwind`, each new target's
    /// executable mappings (with build-ids) read so its stacks can be named.
    pub fn stacks(mut self, hz: u64, unwind: UnwindMode) -> Self {
        self.sample_hz = hz;
        self.unwind = unwind;
        self.read_mappings = crate::symbolize::process_mappings;
        self
    }

    /// Each CPU's sampling rate drawn anew every `every`, not every
    /// `super::sampler::REDRAW`: for the captures that always run.
    pub fn sample_redraw(mut self, every: std::time::Duration) -> Self {
        self.sample_redraw = every;
        self
    }

    /// Runs weighed by this activity counter.
    pub fn activity(mut self, activity: ActivityEvent) -> Self {
        self.activity = activity;
        self
    }

    /// Only these processes' stacks are kept (scheduling is always system-wide).
    pub fn targets(mut self, targets: Targets) -> Self {
        self.targets = targets;
        self
    }

    /// Run counters (`record --activity-events`).
    pub fn run_events(mut self, events: Vec<super::run_counts::RunEvent>) -> Self {
        self.run_events = events;
        self
    }

    /// The stack-sample ring buffer's size (`None`: the probes' default).
    pub fn sample_ring(mut self, bytes: Option<u32>) -> Self {
        self.sample_ring_bytes = bytes;
        self
    }

    /// Runs aggregated per thread, CPU and poll in the kernel, not sent switch by switch:
    /// each poll's switch events are laid out from them (see `super::aggregate`). What the
    /// agent and `top` need; `record` keeps the exact stream.
    pub fn aggregated(mut self, on: bool) -> Self {
        self.aggregate = on;
        self
    }
}

/// Why a live capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The probes could not be loaded or attached.
    #[error("cannot start capture")]
    Probes(#[source] CaptureError),
    /// The energy reader could not start.
    #[error("cannot start energy readings")]
    Energy(#[source] EnergyError),
}

/// A running capture. Dropping it detaches the probes and stops the reader.
pub struct Live {
    session: Session,
    energy: EnergyReader,
    cpus: Vec<pb::Cpu>,
    /// Handed out with the first chunk only, as a recording stores them.
    sources: Option<Vec<pb::EnergySource>>,
    faults_seen: usize,
}

impl Live {
    /// Loads the probes, then starts the energy reader on their CPUs' topology (its first
    /// readings are taken now).
    pub fn start(opts: LiveOptions) -> Result<Self, LiveError> {
        let mut probes = Probes::start_sized(
            opts.sample_hz,
            opts.activity,
            opts.unwind,
            opts.sample_ring_bytes,
            &opts.run_events,
            opts.aggregate,
        )
        .map_err(LiveError::Probes)?;
        probes.set_sample_redraw(opts.sample_redraw);
        let cpus = energy::topology::of(&opts.energy.sysfs_root, probes.cpus());
        let energy = energy::start(&opts.energy, &cpus).map_err(LiveError::Energy)?;
        Ok(Self {
            session: Session::new(probes, opts.targets, opts.read_mappings),
            sources: Some(energy.sources()),
            energy,
            cpus,
            faults_seen: 0,
        })
    }

    /// The captured CPUs with their topology.
    pub fn cpus(&self) -> &[pb::Cpu] {
        &self.cpus
    }

    /// The captured CPUs' ids, as the probes attached to them.
    pub fn cpu_ids(&self) -> &[u32] {
        self.session.probes().cpus()
    }

    /// The energy sources being read.
    pub fn sources(&self) -> Vec<pb::EnergySource> {
        self.energy.sources()
    }

    /// Where the switch events polled so far end when the probes aggregate (they cover
    /// whole slots); `None` when they stream.
    pub fn covered_ns(&self) -> Option<u64> {
        self.session.probes().covered_ns()
    }

    /// The activity counter runs are weighed by, if one is counted.
    pub fn activity_event(&self) -> Option<ActivityEvent> {
        self.session.probes().activity_event()
    }

    /// Each run counter asked for (`record --activity-events`) with whether it counts on
    /// this machine (see `super::run_counts`); empty without run counters.
    pub fn run_counters(&self) -> &[super::run_counts::RunCounterStatus] {
        self.session.probes().run_counters()
    }

    /// What the unwind tables hold, when user stacks are walked with them.
    pub fn unwind_stats(&self) -> Option<UnwindStats> {
        self.session.probes().unwind_stats()
    }

    /// The largest fraction of a ring buffer drained since the last call: how close the
    /// probes' rings came to full between two polls.
    pub fn take_ring_fill(&mut self) -> f64 {
        self.session.take_ring_fill()
    }

    /// Mutable access to the sample filter (e.g. to add a spawned command).
    pub fn targets_mut(&mut self) -> &mut Targets {
        self.session.targets_mut()
    }

    /// Loads the unwind tables of a process that just exec'd, now rather than after the
    /// next drain.
    pub fn load_unwind_tables(&mut self, tgid: u32) {
        self.session.load_unwind_tables(tgid);
    }

    /// Whether CPython frames are walked.
    pub fn python_on(&self) -> bool {
        self.session.probes().python_on()
    }

    /// Finds the CPython interpreter of a process that just exec'd, now rather than at
    /// its first sample.
    pub fn load_python(&mut self, tgid: u32) {
        self.session.load_python(tgid);
    }

    /// Readings taken since the last poll, without draining the probes (e.g. the first
    /// readings, which open the first window of every counter).
    pub fn drain_readings(&mut self) -> Vec<pb::EnergyReading> {
        self.energy.drain()
    }

    /// Drains the probes, then the energy reader, into one chunk shaped as `record` writes
    /// it: the first one carries the energy sources.
    pub fn poll(&mut self) -> pb::Chunk {
        let mut chunk = self.session.poll();
        chunk.sources = self.sources.take().unwrap_or_default();
        chunk.readings = self.energy.drain();
        chunk
    }

    /// Polls every 100 ms for `how_long`, keeping only the switches and readings (what
    /// `calibrate` measures a quiet or loaded machine with).
    pub fn drain_for(
        &mut self,
        how_long: std::time::Duration,
        switches: &mut Vec<pb::SwitchEvent>,
        readings: &mut Vec<pb::EnergyReading>,
    ) {
        let until = std::time::Instant::now() + how_long;
        while std::time::Instant::now() < until {
            let left = until.saturating_duration_since(std::time::Instant::now());
            std::thread::sleep(std::time::Duration::from_millis(100).min(left));
            let chunk = self.poll();
            switches.extend(chunk.switches);
            readings.extend(chunk.readings);
        }
    }

    /// Energy sources that failed since the last call (the others go on).
    pub fn new_faults(&mut self) -> Vec<String> {
        let faults = self.energy.faults();
        let seen = self.faults_seen.min(faults.len());
        self.faults_seen = faults.len();
        faults.into_iter().skip(seen).collect()
    }

    /// Ends the capture: every CPU visited so each timeline ends on a known task, the
    /// probes drained (switch batches still in the kernel included), then the energy
    /// reader stopped, all in the last chunk; with what the unwind tables held at the end.
    pub fn finish(mut self) -> (pb::Chunk, Option<UnwindStats>) {
        let mut chunk = self.session.finish();
        let unwind = self.unwind_stats();
        let Self {
            energy, sources, ..
        } = self;
        chunk.sources = sources.unwrap_or_default();
        chunk.readings = energy.stop();
        (chunk, unwind)
    }
}
