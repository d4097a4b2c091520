//! Where `top`'s snapshots come from: a live capture ([`live`]) or a recording played back
//! ([`replay`]). Both push events into the [`Pipeline`] and turn each closed window into a
//! [`Snapshot`]; neither computes a number of its own, so live and offline agree.
//!
//! Snapshots go to the display over a channel, so rendering never waits on collection.

use std::{
    collections::HashMap,
    sync::mpsc::{self, Receiver, Sender},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    attribute::{Options, domain_name},
    capture::{
        ActivityEvent, Probes,
        session::{Session, Targets},
    },
    clock,
    energy::{self, EnergyArgs, EnergyReader},
    pipeline::{self, Config, Pipeline, Window, source_label},
    record::Recording,
    tui::{DomainPower, Header, Snapshot},
};

/// What the live feed needs.
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
}

/// Starts capture on its own thread and returns the snapshot channel. Start-up errors
/// (permissions, no BTF, unreadable counters) are returned here, before any screen opens.
pub fn live(cfg: LiveConfig) -> anyhow::Result<Receiver<Snapshot>> {
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<anyhow::Result<()>>();
    thread::Builder::new()
        .name("energy-bpf-live".into())
        .spawn(move || match Live::start(&cfg) {
            Ok(mut live) => {
                let _ = ready_tx.send(Ok(()));
                live.run(&cfg, &tx);
            }
            Err(err) => {
                let _ = ready_tx.send(Err(err));
            }
        })
        .context("starting the capture thread")?;
    ready_rx
        .recv()
        .context("capture thread ended during start-up")??;
    Ok(rx)
}

struct Live {
    session: Session,
    energy: EnergyReader,
    pipeline: Pipeline,
    sample_hz: u32,
}

impl Live {
    fn start(cfg: &LiveConfig) -> anyhow::Result<Self> {
        let probes = Probes::start(cfg.sample_hz, cfg.activity).context("cannot start capture")?;
        let cpus = energy::topology::of(&cfg.energy.sysfs_root, probes.cpus());
        let energy = energy::start(&cfg.energy, &cpus).context("cannot start energy readings")?;
        let config = Config {
            cpus,
            sources: energy.sources(),
            options: cfg.attribute.clone(),
            activity_event: probes.activity_event().map(|e| e.name().to_owned()),
        };
        let names = std::cell::RefCell::new(CgroupNames::default());
        let mut pipeline = Pipeline::new(config, clock::monotonic_ns())
            .with_cgroup_names(move |id| names.borrow_mut().name(id));
        // The first readings open the first window of every counter.
        pipeline.push_readings(energy.drain());
        Ok(Self {
            session: Session::new(
                probes,
                Targets::default(),
                crate::symbolize::process_mappings,
            ),
            energy,
            pipeline,
            sample_hz: cfg.sample_hz as u32,
        })
    }

    fn run(&mut self, cfg: &LiveConfig, tx: &Sender<Snapshot>) {
        let mut next = Instant::now() + cfg.interval;
        loop {
            thread::sleep(next.saturating_duration_since(Instant::now()));
            next += cfg.interval;
            let Some(snapshot) = self.step() else {
                continue;
            };
            if tx.send(snapshot).is_err() {
                // The display is gone; dropping self detaches the probes.
                return;
            }
        }
    }

    fn step(&mut self) -> Option<Snapshot> {
        self.pipeline.push(self.session.poll());
        self.pipeline.push_readings(self.energy.drain());
        let now = clock::monotonic_ns();
        // Switch events wait in per-CPU batches in the kernel for up to one sampling period
        // (see `SwitchBatch`); end the window before anything could still be on its way.
        let in_flight_ns = 2_000_000_000 / u64::from(self.sample_hz.max(1));
        let limit = now.saturating_sub(in_flight_ns);
        if limit <= self.pipeline.window_start_ns() {
            return None;
        }
        // A counter with no reading since the window started (stalled, or slower than the
        // refresh) would hold the display forever: end the window anyway.
        let window = match self.pipeline.close(limit) {
            Some(w) => w,
            None => self.pipeline.close_at(limit),
        };
        Some(snapshot(&window, self.sample_hz))
    }
}

/// How a recording is played back.
#[derive(Clone, Copy, Debug)]
pub struct ReplayConfig {
    /// Recording time per frame.
    pub interval: Duration,
    /// Wait `interval` between frames (the interactive view); batch output goes as fast as
    /// it can.
    pub paced: bool,
}

/// Plays `rec` through the pipeline on its own thread, one snapshot per `interval` of
/// recording time. A paced replay keeps the channel open after the last frame, so the
/// view stays on it until the user quits; an unpaced one closes it.
pub fn replay(
    rec: Recording,
    options: Options,
    cfg: ReplayConfig,
) -> anyhow::Result<Receiver<Snapshot>> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("energy-bpf-replay".into())
        .spawn(move || {
            let sample_hz = rec.header.sample_hz;
            let config = Config {
                cpus: rec.header.cpus.clone(),
                sources: rec.sources.clone(),
                options,
                activity_event: crate::analysis::activity_event(&rec),
            };
            for window in pipeline::windows(&rec, config, cfg.interval) {
                if tx.send(snapshot(&window, sample_hz)).is_err() {
                    return;
                }
                if cfg.paced {
                    thread::sleep(cfg.interval);
                }
            }
            // A paced replay holds the last frame (keeps the channel open) until the view
            // quits, which ends the process.
            if cfg.paced {
                loop {
                    thread::park();
                }
            }
        })
        .context("starting the replay thread")?;
    Ok(rx)
}

/// The display's view of one window.
pub fn snapshot(w: &Window, sample_hz: u32) -> Snapshot {
    let secs = (w.totals.duration_ns as f64 / 1e9).max(1e-9);
    let attr = &w.analysis.attribution;
    let domains = attr
        .sources
        .iter()
        .map(|s| DomainPower {
            name: format!("{}-{}", domain_name(s.domain), s.package),
            watts: s.measured_uj * 1e-6 / secs,
        })
        .collect();
    let l = &w.losses;
    Snapshot {
        start_ns: w.start_ns(),
        ts_ns: w.end_ns(),
        interval_s: secs,
        header: Header {
            domains,
            idle_w: w.totals.idle_j / secs,
            total_w: w.totals.total_j / secs,
            source: source_label(&w.analysis.sources),
            estimated: w.totals.estimated,
            sample_hz,
            lost_events: l.switch_dropped + l.sample_dropped + l.process_dropped,
            cpus: w.analysis.timeline.cpus.len() as u32,
        },
        totals: w.totals.clone(),
        rows: w.processes.clone(),
    }
}

/// cgroup v2 id -> path, found by walking `/sys/fs/cgroup` (the id is the directory's
/// inode number). Re-walked at most once per unknown id.
#[derive(Default)]
struct CgroupNames {
    known: HashMap<u64, String>,
    missed: std::collections::HashSet<u64>,
}

impl CgroupNames {
    fn name(&mut self, id: u64) -> String {
        if let Some(name) = self.known.get(&id) {
            return name.clone();
        }
        if self.missed.insert(id) {
            walk_cgroups(
                std::path::Path::new("/sys/fs/cgroup"),
                "",
                0,
                &mut self.known,
            );
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
