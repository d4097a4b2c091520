//! A live capture into the pipeline's windows: the probes, the session and the energy
//! reader ([`Live`]) feeding a folded [`Pipeline`], started the same way for `top` and the
//! agent. The caller drives it and decides what a closed [`Window`] becomes (a snapshot on
//! the screen, metrics, a recording).

use std::{collections::HashMap, time::Duration};

use super::{ActivityEvent, Live, LiveError, LiveOptions, host};
use crate::{
    attribute::{Learned, Options},
    clock,
    energy::EnergyArgs,
    pb::v1 as pb,
    pipeline::{Config, Pipeline, Window},
};

/// What a live capture into windows needs (`top` and the agent).
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// Stack sampling frequency, Hz.
    pub sample_hz: u64,
    /// Refresh interval.
    pub interval: Duration,
    /// Energy sources.
    pub energy: EnergyArgs,
    /// Attribution options.
    pub attribute: Options,
    /// The activity counter to weigh runs by.
    pub activity: ActivityEvent,
    /// How user stacks are walked.
    pub unwind: super::UnwindMode,
    /// Size of the stack-sample ring buffer (`None`: the probes' default).
    pub sample_ring_bytes: Option<u32>,
    /// Runs aggregated in the kernel per thread and poll (see [`LiveOptions::aggregated`]).
    pub aggregate: bool,
}

/// A running live capture: probes, session, energy reader and pipeline, started the same
/// way for `top` and the agent. The caller drives it: [`Capture::poll`] drains a chunk (the
/// raw events, as `record` would write them), [`Capture::push`] feeds it to the pipeline,
/// [`Capture::close_due`] closes a window once time allows.
pub struct Capture {
    live: Live,
    pipeline: Pipeline,
    sample_hz: u32,
    header: pb::Header,
    hot: crate::hot::HotFunctions,
}

impl Capture {
    /// Loads the probes, starts the energy reader and opens the first window now.
    pub fn start(cfg: &LiveConfig) -> Result<Self, LiveError> {
        let mut live = Live::start(
            LiveOptions::timeline(cfg.energy.clone())
                .stacks(cfg.sample_hz, cfg.unwind)
                .sample_redraw(super::sampler::REDRAW_ALWAYS_ON)
                .activity(cfg.activity)
                .sample_ring(cfg.sample_ring_bytes)
                .aggregated(cfg.aggregate),
        )?;
        // Our own process is sampled like any other, first at a moment nobody chooses (at
        // 49 Hz about 10 s in, an agent using 0.1% of a CPU): its tables, the largest
        // binary on most machines (60 ms to load here), are loaded now, with the start-up.
        live.load_unwind_tables(std::process::id());
        let cpus = live.cpus().to_vec();
        let header = host::header(cpus.clone(), cfg.sample_hz as u32, Vec::new());
        let config = Config {
            cpus,
            sources: live.sources(),
            options: cfg.attribute.clone(),
            activity_event: live.activity_event().map(|e| e.name().to_owned()),
        };
        let names = std::cell::RefCell::new(CgroupNames::default());
        // Switches are folded as they come (each CPU's arrive in time order: the session
        // delivers a CPU's batches oldest first), so a window holds one run per thread and
        // interval, not every switch.
        let mut pipeline = Pipeline::folded(config, clock::monotonic_ns())
            .with_cgroup_names(move |id| names.borrow_mut().name(id));
        // The first readings open the first window of every counter.
        pipeline.push_readings(live.drain_readings());
        Ok(Self {
            live,
            pipeline,
            sample_hz: cfg.sample_hz as u32,
            header,
            hot: crate::hot::HotFunctions::new(),
        })
    }

    /// What the unwind tables hold, when user stacks are walked with them.
    pub fn unwind_stats(&self) -> Option<super::unwinder::UnwindStats> {
        self.live.unwind_stats()
    }

    /// The largest fraction of a ring buffer drained since the last call (see
    /// [`Live::take_ring_fill`]).
    pub fn take_ring_fill(&mut self) -> f64 {
        self.live.take_ring_fill()
    }

    /// The recording header of this capture (topology, sample rate, start time).
    pub fn header(&self) -> &pb::Header {
        &self.header
    }

    /// Stack sampling frequency, Hz.
    pub fn sample_hz(&self) -> u32 {
        self.sample_hz
    }

    /// The pipeline (window start, pending events).
    pub fn pipeline(&self) -> &Pipeline {
        &self.pipeline
    }

    /// Static power the agent learned, per source key: used from the next window on where
    /// nothing given or calibrated wins.
    pub fn set_learned_static(&mut self, learned: std::collections::BTreeMap<String, Learned>) {
        self.pipeline.options_mut().learned = learned;
    }

    /// Drains the probes and the energy reader into one chunk, shaped as `record` writes
    /// it: the first one carries the energy sources.
    pub fn poll(&mut self) -> pb::Chunk {
        self.live.poll()
    }

    /// Ends the capture: drains the last chunk (every CPU visited so each timeline ends on
    /// a known task, switch batches still in the kernel included, the energy reader
    /// stopped), shows it to `on_chunk`, and closes the last window where the capture ends.
    pub fn finish(mut self, on_chunk: impl FnOnce(&pb::Chunk)) -> Window {
        let (chunk, _) = self.live.finish();
        on_chunk(&chunk);
        self.hot.observe(&chunk);
        self.pipeline.push(chunk);
        let end = clock::monotonic_ns().max(self.pipeline.window_start_ns() + 1);
        let mut window = self.pipeline.close_at(end);
        self.hot
            .annotate(&window.events.samples, &mut window.processes);
        window
    }

    /// Energy sources that failed since the last call (the others go on).
    pub fn new_faults(&mut self) -> Vec<String> {
        self.live.new_faults()
    }

    /// Feeds a chunk from [`Self::poll`] to the pipeline.
    pub fn push(&mut self, chunk: pb::Chunk) {
        self.hot.observe(&chunk);
        self.pipeline.push(chunk);
    }

    /// Closes the next window once at least `min_len_ns` of it is safely behind us, or
    /// `None` when it is too early.
    pub fn close_due(&mut self, min_len_ns: u64) -> Option<Window> {
        let now = clock::monotonic_ns();
        // Switch events wait in per-CPU batches in the kernel for up to one sampling period
        // (see `SwitchBatch`); end the window before anything could still be on its way.
        let in_flight_ns = 2_000_000_000 / u64::from(self.sample_hz.max(1));
        // Aggregated switches cover whole slots: up to the last one read, exactly.
        let limit = match self.live.covered_ns() {
            Some(covered) => covered.min(now),
            None => now.saturating_sub(in_flight_ns),
        };
        if limit <= self.pipeline.window_start_ns().saturating_add(min_len_ns) {
            return None;
        }
        // A counter with no reading since the window started (stalled, or slower than the
        // interval) would hold the window open forever: end it anyway.
        let mut window = match self.pipeline.close(limit) {
            Some(w) => w,
            None => self.pipeline.close_at(limit),
        };
        // Rows name their hot function (top's rows and the agent's snapshot stream).
        self.hot
            .annotate(&window.events.samples, &mut window.processes);
        Some(window)
    }
}

/// cgroup v2 id -> path, found by walking `/sys/fs/cgroup` (the id is the directory's
/// inode number). Re-walked at most once per unknown id; each walk replaces the map, so
/// cgroups removed since (containers come and go) are forgotten.
#[derive(Default)]
struct CgroupNames {
    known: HashMap<u64, String>,
    missed: std::collections::HashSet<u64>,
}

/// Ids looked for in vain before they may trigger a walk again: bounds the memory of a
/// capture that runs for months among short-lived cgroups.
const MAX_MISSED_CGROUPS: usize = 4096;

impl CgroupNames {
    fn name(&mut self, id: u64) -> String {
        if let Some(name) = self.known.get(&id) {
            return name.clone();
        }
        if self.missed.len() >= MAX_MISSED_CGROUPS {
            self.missed.clear();
        }
        if self.missed.insert(id) {
            let mut fresh = HashMap::with_capacity(self.known.len());
            walk_cgroups(
                std::path::Path::new(host::cgroup2_mount()),
                "",
                0,
                &mut fresh,
            );
            self.known = fresh;
        }
        self.known.get(&id).cloned().unwrap_or_default()
    }
}

fn walk_cgroups(dir: &std::path::Path, rel: &str, depth: usize, out: &mut HashMap<u64, String>) {
    use std::os::unix::fs::MetadataExt as _;
    if depth > 8 {
        return;
    }
    if let Ok(meta) = std::fs::metadata(dir) {
        out.insert(
            meta.ino(),
            if rel.is_empty() {
                "/".into()
            } else {
                rel.into()
            },
        );
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let name = entry.file_name();
            let child = format!("{rel}/{}", name.to_string_lossy());
            walk_cgroups(&entry.path(), &child, depth + 1, out);
        }
    }
}
