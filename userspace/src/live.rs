//! The live pipeline behind `top`: capture, energy readings and attribution over rolling
//! windows, turned into one [`Snapshot`] per refresh and sent to the display over a
//! channel, so rendering never waits on collection.
//!
//! Each window ends at the newest energy reading (or now, for the estimated model) and
//! starts where the previous one ended. Switch events after the window end wait for the
//! next window; the last switch on each CPU is carried over so the task running across
//! the boundary is known.

use std::{
    collections::{BTreeMap, HashMap},
    sync::mpsc::{self, Receiver, Sender},
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    analysis,
    attribute::{self, Options},
    capture::{
        Probes, host,
        session::{Session, Targets},
    },
    energy::{self, EnergyArgs, EnergyReader},
    pb::v1::{Cpu, EnergyReading, Sample, SwitchEvent, ThreadInfo},
    timeline::Timeline,
    tui::{DomainPower, Header, ProcessRow, Snapshot, ThreadRow},
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
}

/// Starts capture on its own thread and returns the snapshot channel. Start-up errors
/// (permissions, no BTF, unreadable counters) are returned here, before any screen opens.
pub fn start(cfg: LiveConfig) -> anyhow::Result<Receiver<Snapshot>> {
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
    cpus: Vec<Cpu>,
    sample_hz: u32,
    sources: Vec<crate::pb::v1::EnergySource>,
    window_start: u64,
    carry: BTreeMap<u32, SwitchEvent>,
    pending_switches: Vec<SwitchEvent>,
    pending_samples: Vec<Sample>,
    pending_readings: Vec<EnergyReading>,
    last_reading: HashMap<u32, EnergyReading>,
    threads: HashMap<u32, ThreadInfo>,
    totals_uj: HashMap<(u32, u32), f64>,
    cgroups: CgroupNames,
    lost: u64,
}

impl Live {
    fn start(cfg: &LiveConfig) -> anyhow::Result<Self> {
        let probes = Probes::start(cfg.sample_hz).context("cannot start capture")?;
        let cpus = energy::topology::of(&cfg.energy.sysfs_root, probes.cpus());
        let energy = energy::start(&cfg.energy, &cpus).context("cannot start energy readings")?;
        let sources = energy.sources();
        let last_reading = energy
            .drain()
            .into_iter()
            .map(|r| (r.source_id, r))
            .collect();
        Ok(Self {
            session: Session::new(
                probes,
                Targets::default(),
                crate::symbolize::process_mappings,
            ),
            energy,
            cpus,
            sample_hz: cfg.sample_hz as u32,
            sources,
            window_start: host::monotonic_ns(),
            carry: BTreeMap::new(),
            pending_switches: Vec::new(),
            pending_samples: Vec::new(),
            pending_readings: Vec::new(),
            last_reading,
            threads: HashMap::new(),
            totals_uj: HashMap::new(),
            cgroups: CgroupNames::default(),
            lost: 0,
        })
    }

    fn run(&mut self, cfg: &LiveConfig, tx: &Sender<Snapshot>) {
        let mut next = Instant::now() + cfg.interval;
        loop {
            thread::sleep(next.saturating_duration_since(Instant::now()));
            next += cfg.interval;
            let snapshot = self.step(&cfg.attribute);
            if tx.send(snapshot).is_err() {
                // The display is gone; dropping self detaches the probes.
                return;
            }
        }
    }

    fn step(&mut self, opts: &Options) -> Snapshot {
        let chunk = self.session.poll();
        for t in chunk.threads {
            crate::record::merge_thread(&mut self.threads, t);
        }
        if let Some(l) = chunk.losses {
            self.lost = l.switch_dropped + l.sample_dropped + l.process_dropped;
        }
        self.pending_switches.extend(chunk.switches);
        self.pending_samples.extend(chunk.samples);
        self.pending_readings.extend(self.energy.drain());
        let now = host::monotonic_ns();
        let counters = self.sources.iter().any(|s| !energy::model::is_model(s));
        let end = if !counters {
            now
        } else {
            // The window ends at the oldest of the sources' newest readings, so every counter
            // covers it (or at `now` when no counter has a new reading yet).
            let newest: HashMap<u32, u64> =
                self.pending_readings
                    .iter()
                    .fold(HashMap::new(), |mut m, r| {
                        let e = m.entry(r.source_id).or_insert(0);
                        *e = (*e).max(r.ts_ns);
                        m
                    });
            newest.values().copied().min().unwrap_or(now)
        };
        // Switch events wait in per-CPU batches in the kernel for up to one sampling period
        // (see `SwitchBatch`); end the window before anything could still be on its way.
        let in_flight_ns = 2_000_000_000 / u64::from(self.sample_hz.max(1));
        let end = end
            .min(now.saturating_sub(in_flight_ns))
            .max(self.window_start + 1);
        let start = self.window_start;

        let (in_window, later): (Vec<SwitchEvent>, Vec<SwitchEvent>) =
            std::mem::take(&mut self.pending_switches)
                .into_iter()
                .partition(|s| s.ts_ns < end);
        self.pending_switches = later;
        let mut events: Vec<SwitchEvent> = self.carry.values().copied().collect();
        for s in &in_window {
            if self.carry.get(&s.cpu).is_none_or(|c| c.ts_ns <= s.ts_ns) {
                self.carry.insert(s.cpu, *s);
            }
        }
        events.extend(in_window);
        let cpu_ids: Vec<u32> = self.cpus.iter().map(|c| c.id).collect();
        let timeline = Timeline::build(start, end, &cpu_ids, &events);
        let (samples, later): (Vec<Sample>, Vec<Sample>) =
            std::mem::take(&mut self.pending_samples)
                .into_iter()
                .partition(|s| s.ts_ns < end);
        self.pending_samples = later;

        let mut readings = energy::model::readings(
            &timeline,
            &self.cpus,
            &self.sources,
            end.saturating_sub(start).max(1),
        );
        {
            let (now_r, later): (Vec<EnergyReading>, Vec<EnergyReading>) =
                std::mem::take(&mut self.pending_readings)
                    .into_iter()
                    .partition(|r| r.ts_ns <= end);
            self.pending_readings = later;
            let mut rs: Vec<EnergyReading> = self.last_reading.values().cloned().collect();
            rs.extend(now_r.iter().cloned());
            for r in now_r {
                self.last_reading.insert(r.source_id, r);
            }
            readings.extend(rs);
        }
        let threads: Vec<ThreadInfo> = self.threads.values().cloned().collect();
        let attr = attribute::attribute(
            &attribute::Input {
                timeline: &timeline,
                samples: &samples,
                sources: &self.sources,
                readings: &readings,
                cpus: &self.cpus,
                threads: &threads,
                activity: None,
            },
            opts,
        );
        self.window_start = end;
        self.snapshot(&attr, end, end.saturating_sub(start))
    }

    fn snapshot(&mut self, attr: &attribute::Attribution, ts_ns: u64, window_ns: u64) -> Snapshot {
        let secs = (window_ns as f64 / 1e9).max(1e-9);
        let total_w = attr.total_uj() * 1e-6 / secs;
        let mut by_pid: BTreeMap<u32, ProcessRow> = BTreeMap::new();
        for t in &attr.threads {
            let uj = attr.headline_uj(&t.energy);
            let total = self.totals_uj.entry((t.tgid, t.tid)).or_insert(0.0);
            *total += uj;
            if t.cpu_ns == 0 && uj <= 0.0 {
                continue;
            }
            let info = self.threads.get(&t.tid);
            let row = ThreadRow {
                tid: t.tid,
                comm: info
                    .map(|i| i.comm.clone())
                    .unwrap_or_else(|| t.comm.clone()),
                power_w: uj * 1e-6 / secs,
                energy_j: *total * 1e-6,
                cpu_pct: 100.0 * t.cpu_ns as f64 / window_ns.max(1) as f64,
                share: if total_w > 0.0 {
                    uj * 1e-6 / secs / total_w
                } else {
                    0.0
                },
            };
            let p = by_pid.entry(t.tgid).or_insert_with(|| ProcessRow {
                pid: t.tgid,
                ..Default::default()
            });
            p.power_w += row.power_w;
            p.cpu_pct += row.cpu_pct;
            p.share += row.share;
            if p.cgroup.is_empty() && t.cgroup_id != 0 {
                p.cgroup = self.cgroups.name(t.cgroup_id);
            }
            p.threads.push(row);
        }
        let rows = by_pid
            .into_values()
            .map(|mut p| {
                let main = self.threads.get(&p.pid);
                p.comm = main
                    .map(|i| i.comm.clone())
                    .or_else(|| p.threads.first().map(|t| t.comm.clone()))
                    .unwrap_or_default();
                p.cmdline = main
                    .map(|i| i.cmdline.clone())
                    .filter(|c| !c.is_empty())
                    .unwrap_or_else(|| p.comm.clone());
                p.energy_j = p.threads.iter().map(|t| t.energy_j).sum();
                p
            })
            .collect();
        let domains = attr
            .sources
            .iter()
            .map(|s| DomainPower {
                name: format!("{}-{}", attribute::domain_name(s.domain), s.package),
                watts: s.measured_uj * 1e-6 / secs,
            })
            .collect();
        Snapshot {
            ts_ns,
            interval_s: secs,
            header: Header {
                domains,
                idle_w: attr.headline_uj(&attr.idle) * 1e-6 / secs,
                total_w,
                source: analysis::source_label(&self.sources),
                estimated: attr.estimated,
                sample_hz: self.sample_hz,
                lost_events: self.lost,
                cpus: self.cpus.len() as u32,
            },
            rows,
        }
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
