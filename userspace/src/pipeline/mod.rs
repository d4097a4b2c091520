//! The streaming analysis core: capture or recording events in, closed windows out, each
//! with its attribution and its rows. Every output stands on it (see
//! `docs/ARCHITECTURE.md`, "Data flow"):
//! - `report` is one window covering the whole recording ([`analyze`] on all of it);
//! - `report --window SECS` and `top --replay` are consecutive windows of a recording;
//! - `top` closes a window at every refresh of a live capture;
//! - the agent closes one every interval, forever.
//!
//! Built from pure parts: the `window` cutter, attribution ([`crate::attribute`]) and the
//! [`rollup`] into the `mod@rows` every renderer reads. [`Pipeline`] holds the little state
//! that crosses windows: thread names, energy since start, loss counters.

pub(crate) mod fold;
#[cfg(test)]
mod fold_tests;
pub mod rollup;
pub(crate) mod rows;
mod totals;
pub(crate) mod window;

use std::collections::HashMap;

use crate::{
    attribute::{self, ActivityUsed, ActivityWeights, Attribution, Options},
    energy,
    pb::v1::{
        Chunk, Cpu, EnergyReading, EnergySource, LossCounters, ProcessEvent, Sample, SwitchEvent,
        ThreadInfo,
    },
    record::{self, Recording},
    timeline::{Switches, Timeline},
};

pub(crate) use rollup::{GroupBy, group};
pub use rows::{DomainJoules, ProcessRow, ThreadRow};
pub(crate) use totals::source_label;
pub use totals::{StaticPower, Totals};
pub(crate) use window::{WindowEvents, Windower};

/// What every window of one capture shares.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// CPU topology (package and core of each CPU).
    pub cpus: Vec<Cpu>,
    /// Energy sources in use (model parameters already applied).
    pub sources: Vec<EnergySource>,
    /// Attribution options.
    pub options: Options,
    /// The activity event the switch events count per run (`Header.activity_event`), if
    /// any: where runs carry counts, dynamic energy is split by them instead of time.
    pub activity_event: Option<String>,
}

impl Config {
    /// Ids of the sources whose readings are measured (not modelled): windows end on their
    /// readings.
    fn counter_ids(&self) -> Vec<u32> {
        self.sources
            .iter()
            .filter(|s| !energy::model::is_model(s))
            .map(|s| s.id)
            .collect()
    }
}

/// The events of one window, borrowed: a `WindowEvents`, or a whole recording.
#[derive(Clone, Copy, Debug)]
pub struct WindowInput<'a> {
    /// Window start, ns.
    pub start_ns: u64,
    /// Window end (exclusive), ns.
    pub end_ns: u64,
    /// Switch events (those before `start_ns` only say who was running at the start).
    pub switches: Switches<'a>,
    /// Stack samples; the attribution's per-sample energy is aligned with this slice.
    pub samples: &'a [Sample],
    /// Measured readings (modelled sources are recomputed from the timeline).
    pub readings: &'a [EnergyReading],
    /// Lifecycle events.
    pub process_events: &'a [ProcessEvent],
}

impl WindowEvents {
    /// These events, borrowed.
    pub fn input(&self) -> WindowInput<'_> {
        WindowInput {
            start_ns: self.start_ns,
            end_ns: self.end_ns,
            switches: Switches::Events(&self.switches),
            samples: &self.samples,
            readings: &self.readings,
            process_events: &self.process_events,
        }
    }
}

impl Recording {
    /// The whole recording as one window.
    pub fn window(&self) -> WindowInput<'_> {
        WindowInput {
            start_ns: self.start_ns(),
            end_ns: self.end_ns,
            switches: Switches::Log(&self.switches),
            samples: &self.samples,
            readings: &self.readings,
            process_events: &self.process_events,
        }
    }
}

/// One window analysed.
pub struct Analysis {
    /// Who ran where, when.
    pub timeline: Timeline,
    /// Sources used.
    pub sources: Vec<EnergySource>,
    /// Readings used (measured, or modelled from the timeline).
    pub readings: Vec<EnergyReading>,
    /// Energy per thread, process, sample.
    pub attribution: Attribution,
    /// The activity that weighted the split (or none: by time).
    pub activity: ActivityUsed,
}

/// Analyses one window: its timeline, its readings (modelled ones recomputed from the
/// timeline), and the attribution of every source's energy.
pub fn analyze(input: &WindowInput<'_>, cfg: &Config, threads: &[ThreadInfo]) -> Analysis {
    let cpu_ids: Vec<u32> = cfg.cpus.iter().map(|c| c.id).collect();
    let timeline = Timeline::build_from(input.start_ns, input.end_ns, &cpu_ids, input.switches);
    analyze_timeline(timeline, input, cfg, threads)
}

/// [`analyze`] on a timeline already built (the folded path's, see `fold`); the
/// input's switches are not read.
pub(crate) fn analyze_timeline(
    timeline: Timeline,
    input: &WindowInput<'_>,
    cfg: &Config,
    threads: &[ThreadInfo],
) -> Analysis {
    let readings = energy::readings_for(&cfg.sources, input.readings, &timeline, &cfg.cpus);
    let weights = ActivityWeights::from_timeline(&timeline);
    let attribution = attribute::attribute(
        &attribute::Input {
            timeline: &timeline,
            samples: input.samples,
            sources: &cfg.sources,
            readings: &readings,
            cpus: &cfg.cpus,
            threads,
            activity: weights.as_ref(),
        },
        &cfg.options,
    );
    Analysis {
        timeline,
        sources: cfg.sources.clone(),
        readings,
        attribution,
        activity: ActivityUsed::of(cfg.activity_event.as_deref(), weights.as_ref()),
    }
}

/// Runs (12 bytes each, see `timeline::store`) above which [`Window::release`] hands a
/// window's memory back to the system: 24 MiB.
const RELEASE_RUNS: usize = 2 << 20;

/// A closed window: its events, analysis, totals and rows.
pub struct Window {
    /// The events it covered.
    pub events: WindowEvents,
    /// Timeline, readings, attribution.
    pub analysis: Analysis,
    /// Machine-wide figures.
    pub totals: Totals,
    /// Process rows (with threads), largest share first; `since_start_j` counts from the
    /// pipeline's start.
    pub processes: Vec<ProcessRow>,
    /// Loss counters since the pipeline started (cumulative, as the kernel counts them).
    pub losses: LossCounters,
}

impl Window {
    /// Drops the window and, when its runs took more than 24 MiB (2 Mi runs; a big, busy
    /// machine's window: 5 million runs at 256 CPUs switching a million times a second),
    /// hands the memory back to the system: the allocator would otherwise keep that
    /// footprint as the process's for good. Smaller windows keep theirs for the next one,
    /// which saves faulting it in again. An always-on process calls this once it is done
    /// with each window.
    pub fn release(self) {
        let runs: usize = self
            .analysis
            .timeline
            .cpus
            .iter()
            .map(|c| c.store().len())
            .sum();
        drop(self);
        if runs > RELEASE_RUNS {
            // SAFETY: malloc_trim has no preconditions.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    /// Window start, ns.
    pub fn start_ns(&self) -> u64 {
        self.events.start_ns
    }

    /// Window end (exclusive), ns.
    pub fn end_ns(&self) -> u64 {
        self.events.end_ns
    }
}

/// Names cgroups by the paths a recording holds (`ThreadInfo.cgroup_path`), else by id.
pub(crate) fn recorded_cgroup_names(rec: &Recording) -> impl Fn(u64) -> String + use<> {
    let paths: HashMap<u64, String> = rec
        .threads
        .values()
        .filter(|t| t.cgroup_id != 0 && !t.cgroup_path.is_empty())
        .map(|t| (t.cgroup_id, t.cgroup_path.clone()))
        .collect();
    move |id| paths.get(&id).cloned().unwrap_or_else(|| id.to_string())
}

/// Rolls an analysed window up into process rows (see [`rollup`]).
pub fn rows(
    input: &WindowInput<'_>,
    analysis: &Analysis,
    threads: &HashMap<u32, ThreadInfo>,
    cgroup_name: &dyn Fn(u64) -> String,
) -> Vec<ProcessRow> {
    rollup::processes(&rollup::RollupInput {
        attribution: &analysis.attribution,
        timeline: &analysis.timeline,
        samples: input.samples,
        process_events: input.process_events,
        threads,
        cgroup_name,
    })
}

/// The streaming pipeline: push events as they come, close windows as time allows.
pub struct Pipeline {
    cfg: Config,
    windower: Windower,
    threads: HashMap<u32, ThreadInfo>,
    since_start: HashMap<(u32, u32), f64>,
    /// Threads that exited in the last closed window, as (tgid, tid, exit time): forgotten
    /// once the next window is closed too (late switch-outs of an exited thread land one
    /// window later), so a pipeline that runs for months holds only live threads.
    exited: Vec<(u32, u32, u64)>,
    losses: LossCounters,
    /// cgroup paths the capture recorded (`ThreadInfo.cgroup_path`).
    cgroup_paths: HashMap<u64, String>,
    cgroup_name: Box<dyn Fn(u64) -> String + Send>,
    /// Folds switches as they come (`top`, the agent) instead of holding them per window.
    folder: Option<fold::Folder>,
}

impl Pipeline {
    /// A pipeline whose first window starts at `start_ns`. cgroups are named by the paths
    /// the capture recorded, else by id until `Self::with_cgroup_names` says how.
    pub fn new(cfg: Config, start_ns: u64) -> Self {
        let windower = Windower::new(start_ns, cfg.counter_ids());
        Self {
            cfg,
            windower,
            threads: HashMap::new(),
            since_start: HashMap::new(),
            exited: Vec::new(),
            losses: LossCounters::default(),
            cgroup_paths: HashMap::new(),
            cgroup_name: Box::new(|id| id.to_string()),
            folder: None,
        }
    }

    /// A pipeline that folds switch events into per-interval, per-CPU runs as they are
    /// pushed (`fold`): what live `top`, the agent and `top --replay` run. Without
    /// counters its windows end on the modelled readings' grid.
    pub fn folded(cfg: Config, start_ns: u64) -> Self {
        let modelled = cfg.sources.iter().any(energy::model::is_model);
        let counters: Vec<(u32, u64)> = cfg
            .sources
            .iter()
            .filter(|s| !energy::model::is_model(s))
            .map(|s| (s.id, s.update_period_ns))
            .collect();
        let folder = fold::Folder::new(start_ns, &cfg.cpus, &counters, modelled);
        Self {
            folder: Some(folder),
            ..Self::new(cfg, start_ns)
        }
    }

    /// Names cgroups with `f` (e.g. their path under `/sys/fs/cgroup`).
    pub(crate) fn with_cgroup_names(mut self, f: impl Fn(u64) -> String + Send + 'static) -> Self {
        self.cgroup_name = Box::new(f);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The attribution options of the next windows (the agent sets learned static power).
    pub(crate) fn options_mut(&mut self) -> &mut Options {
        &mut self.cfg.options
    }

    /// Latest known info per thread.
    pub fn threads(&self) -> &HashMap<u32, ThreadInfo> {
        &self.threads
    }

    /// Start of the next window.
    pub fn window_start_ns(&self) -> u64 {
        self.windower.start_ns()
    }

    /// Events waiting for their window.
    pub(crate) fn pending(&self) -> usize {
        self.windower.pending() + self.folder.as_ref().map_or(0, fold::Folder::pending)
    }

    /// Adds a chunk of events (from a capture session, or a recording's chunk). Readings
    /// may come in the chunk or through `Self::push_readings`.
    pub fn push(&mut self, chunk: Chunk) {
        for t in chunk.threads {
            self.learn_cgroup(&t);
            record::merge_thread(&mut self.threads, t);
        }
        if let Some(l) = chunk.losses {
            self.losses = l;
        }
        match &mut self.folder {
            Some(f) => {
                // Readings first: their times cut the runs the switches make.
                f.push_readings(&chunk.readings);
                f.push_switches(chunk.switches);
            }
            None => self.windower.push_switches(chunk.switches),
        }
        self.windower.push_samples(chunk.samples);
        self.windower.push_process_events(chunk.process_events);
        self.windower.push_readings(chunk.readings);
    }

    /// Adds energy readings.
    pub(crate) fn push_readings(&mut self, readings: impl IntoIterator<Item = EnergyReading>) {
        match &mut self.folder {
            Some(f) => {
                let readings: Vec<EnergyReading> = readings.into_iter().collect();
                f.push_readings(&readings);
                self.windower.push_readings(readings);
            }
            None => self.windower.push_readings(readings),
        }
    }

    /// Adds a whole recording (its events, names and loss counters).
    fn push_recording(&mut self, rec: &Recording) {
        for t in rec.threads.values() {
            self.learn_cgroup(t);
            record::merge_thread(&mut self.threads, t.clone());
        }
        self.losses = rec.losses;
        if let Some(f) = &mut self.folder {
            f.push_readings(&rec.readings);
            // The folder takes each CPU's switches in time order. A recording keeps them
            // so as a rule: then they go in as they are, in batches that are folded as
            // they come, so a replay holds no copy of the recording's events.
            if per_cpu_in_order(rec.switches.iter()) {
                let mut it = rec.switches.iter().peekable();
                while it.peek().is_some() {
                    f.push_switches(it.by_ref().take(REPLAY_BATCH));
                }
            } else {
                let mut switches: Vec<SwitchEvent> = rec.switches.iter().collect();
                // Stable: each CPU's events keep their order among equal timestamps.
                switches.sort_by_key(|s| s.ts_ns);
                f.push_switches(switches);
            }
        } else {
            self.windower.reserve_switches(rec.switches.len());
            self.windower.push_switches(rec.switches.iter());
        }
        self.windower.push_samples(rec.samples.iter().cloned());
        self.windower
            .push_process_events(rec.process_events.iter().cloned());
        self.windower.push_readings(rec.readings.iter().cloned());
    }

    fn learn_cgroup(&mut self, t: &ThreadInfo) {
        if t.cgroup_id != 0 && !t.cgroup_path.is_empty() {
            if self.cgroup_paths.len() > 65_536 {
                self.cgroup_paths.clear(); // bounded; the capture sends paths again
            }
            self.cgroup_paths.insert(t.cgroup_id, t.cgroup_path.clone());
        }
    }

    /// Closes the next window if one can end by `limit_ns` (see `Windower::boundary`).
    pub fn close(&mut self, limit_ns: u64) -> Option<Window> {
        if let Some(f) = &self.folder
            && self.cfg.counter_ids().is_empty()
        {
            let end = f.model_end(limit_ns)?;
            return Some(self.close_at(end));
        }
        let events = self.windower.close(limit_ns)?;
        Some(self.finish(events))
    }

    /// Closes the next window at exactly `end_ns` (the end of a capture).
    pub fn close_at(&mut self, end_ns: u64) -> Window {
        let events = self.windower.close_at(end_ns);
        self.finish(events)
    }

    fn finish(&mut self, events: WindowEvents) -> Window {
        let threads: Vec<ThreadInfo> = self.threads.values().cloned().collect();
        let input = events.input();
        let analysis = match &mut self.folder {
            Some(f) => analyze_timeline(f.close(events.end_ns), &input, &self.cfg, &threads),
            None => analyze(&input, &self.cfg, &threads),
        };
        let paths = &self.cgroup_paths;
        let fallback = &self.cgroup_name;
        let name = |id: u64| paths.get(&id).cloned().unwrap_or_else(|| fallback(id));
        let mut processes = rows(&input, &analysis, &self.threads, &name);
        for p in &mut processes {
            p.since_start_j = 0.0;
            for t in &mut p.threads {
                let acc = self.since_start.entry((p.pid, t.tid)).or_default();
                *acc += t.since_start_j;
                t.since_start_j = *acc;
                p.since_start_j += *acc;
            }
        }
        self.forget_exited(&events.process_events);
        let totals = analysis.totals();
        Window {
            events,
            analysis,
            totals,
            processes,
            losses: self.losses,
        }
    }
}

impl Pipeline {
    /// Drops the names and running totals of threads that exited before the window just
    /// closed; this window's exits wait for the next one. A tid reused by a thread named
    /// after the exit keeps the new thread's name.
    fn forget_exited(&mut self, events: &[ProcessEvent]) {
        let now: Vec<(u32, u32, u64)> = events
            .iter()
            .filter(|e| e.kind() == crate::pb::v1::process_event::Kind::Exit)
            .map(|e| (e.tgid, e.tid, e.ts_ns))
            .collect();
        let gone = std::mem::replace(&mut self.exited, now);
        if gone.is_empty() {
            return;
        }
        let by_tid: HashMap<u32, u64> = gone.iter().map(|&(_, tid, ts)| (tid, ts)).collect();
        self.threads
            .retain(|tid, info| by_tid.get(tid).is_none_or(|&exit| info.ts_ns > exit));
        let keys: std::collections::HashSet<(u32, u32)> =
            gone.iter().map(|&(tgid, tid, _)| (tgid, tid)).collect();
        self.since_start.retain(|key, _| !keys.contains(key));
    }
}

/// The consecutive windows of a recording, `interval` of recording time each (the last one
/// ends where the recording ends). With counters, a window ends on a reading, so it can be
/// a little shorter; one with no reading of its own grows by whole intervals until it has.
pub fn windows(
    rec: &Recording,
    cfg: Config,
    interval: std::time::Duration,
) -> impl Iterator<Item = Window> + '_ {
    windows_of(rec, Pipeline::new(cfg, rec.start_ns()), interval)
}

/// Switch events a replay hands the folder at a time.
const REPLAY_BATCH: usize = 1 << 16;

/// Whether each CPU's events come in time order.
fn per_cpu_in_order(events: impl Iterator<Item = SwitchEvent>) -> bool {
    let mut last: HashMap<u32, u64> = HashMap::new();
    events.into_iter().all(|s| {
        let prev = last.insert(s.cpu, s.ts_ns);
        prev.is_none_or(|p| p <= s.ts_ns)
    })
}

/// [`windows`] through the folded path `top` and the agent run live
/// ([`Pipeline::folded`]): what `top --replay` shows.
pub(crate) fn folded_windows(
    rec: &Recording,
    cfg: Config,
    interval: std::time::Duration,
) -> impl Iterator<Item = Window> + '_ {
    windows_of(rec, Pipeline::folded(cfg, rec.start_ns()), interval)
}

fn windows_of(
    rec: &Recording,
    mut pipeline: Pipeline,
    interval: std::time::Duration,
) -> impl Iterator<Item = Window> + '_ {
    let step = u64::try_from(interval.as_nanos())
        .unwrap_or(u64::MAX)
        .max(1);
    pipeline.push_recording(rec);
    std::iter::from_fn(move || {
        let start = pipeline.window_start_ns();
        if start >= rec.end_ns {
            return None;
        }
        let mut limit = start.saturating_add(step);
        loop {
            if limit >= rec.end_ns {
                return Some(pipeline.close_at(rec.end_ns));
            }
            if let Some(w) = pipeline.close(limit) {
                return Some(w);
            }
            limit = limit.saturating_add(step);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::process_event::Kind;

    fn thread(tid: u32, ts_ns: u64) -> ThreadInfo {
        ThreadInfo {
            tid,
            tgid: tid,
            comm: format!("t{tid}"),
            ts_ns,
            ..Default::default()
        }
    }

    fn exit(tid: u32, ts_ns: u64) -> ProcessEvent {
        let mut e = ProcessEvent {
            tid,
            tgid: tid,
            ts_ns,
            ..Default::default()
        };
        e.set_kind(Kind::Exit);
        e
    }

    #[test]
    fn exited_threads_are_forgotten_one_window_later() {
        let mut p = Pipeline::new(Config::default(), 0);
        p.push(Chunk {
            threads: vec![thread(5, 10), thread(6, 10), thread(7, 10)],
            process_events: vec![exit(5, 50), exit(7, 60)],
            ..Default::default()
        });
        p.close_at(100);
        assert!(p.threads().contains_key(&5), "kept for late switch-outs");
        // tid 7 is reused by a new thread named after the exit: it keeps its name.
        p.push(Chunk {
            threads: vec![thread(7, 150)],
            ..Default::default()
        });
        p.close_at(200);
        let mut left: Vec<u32> = p.threads().keys().copied().collect();
        left.sort_unstable();
        assert_eq!(left, [6, 7]);
    }
}
