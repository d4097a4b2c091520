//! Virtual machines on the host as a [`Sink`]: each window, every running VM's energy per
//! zone (dynamic: its process's attributed energy, vCPU and emulator threads apart; static:
//! its share under `--vm-static`) goes to the metrics (`energy_bpf_vm_joules_total`) and,
//! unless `--vm-share none`, into its directory of the share ([`super::vm_dir`]).
//!
//! VMs are found at start by a walk of `/proc`, then as the capture names new processes
//! (a chunk's thread infos, a window's rows): only processes whose program is a
//! hypervisor's are read. A VM whose process exits loses its directory at the next poll
//! (its exit event) or window (its start time gone from `/proc`), whichever comes first.
//!
//! Counters survive agent restarts: a directory whose metadata names the same VM instance
//! (`pid:starttime`) is continued from, and the restart is counted as a gap with the time
//! it missed; a VM of the same name with another instance starts from zero.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::Arc,
    time::{Duration, SystemTime},
};

use super::{
    metrics::Metrics,
    sink::{Sink, SinkError},
    vm_dir::{self, Gap, Meta, ZONES, ZoneCounters},
};
use crate::{
    clock,
    pb::v1::{self as pb, process_event::Kind},
    pipeline::{ProcessRow, Window},
    vm::{
        Hypervisor, StaticPolicy, ThreadClass, VmEnergy, detect,
        energy::share_static,
        proc::{self, LiveVm},
    },
};

/// `--vm-share` and `--vm-static`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSettings {
    /// The share's root (`/run/energy-bpf/vms`), `None` for `--vm-share none`.
    pub share: Option<PathBuf>,
    /// How static energy is shared out.
    pub policy: StaticPolicy,
}

impl Default for VmSettings {
    fn default() -> Self {
        Self {
            share: Some(PathBuf::from(DEFAULT_SHARE)),
            policy: StaticPolicy::Vcpus,
        }
    }
}

/// Where VM directories go by default.
pub const DEFAULT_SHARE: &str = "/run/energy-bpf/vms";

/// A VM the sink follows.
struct Tracked {
    live: LiveVm,
    /// Its directory, when it holds its name in the share.
    dir: Option<PathBuf>,
    meta: Meta,
    /// Unrounded µJ per zone: (energy, static), and the thread classes' (vcpu, emulator,
    /// unsplit) of the package.
    energy: BTreeMap<&'static str, (f64, f64)>,
    threads: [f64; 3],
    /// Host time the counters cover, ns.
    counted_ns: u64,
    /// The files under the zones are still to be made.
    first: bool,
    /// An earlier run's last write, when this run continues its counters.
    resumed_from: Option<SystemTime>,
}

/// The VM sink.
pub struct VmSink {
    settings: VmSettings,
    interval: Duration,
    metrics: Arc<Metrics>,
    vms: HashMap<u32, Tracked>,
    host_cpus: usize,
}

impl VmSink {
    /// A sink with these settings, windows `interval` long, feeding `metrics`.
    pub fn new(settings: VmSettings, interval: Duration, metrics: Arc<Metrics>) -> Self {
        Self {
            settings,
            interval,
            metrics,
            vms: HashMap::new(),
            host_cpus: 1,
        }
    }

    /// Follows a VM process (once): claims its directory where its name is free.
    fn track(&mut self, live: LiveVm) {
        if self.vms.contains_key(&live.pid) {
            return;
        }
        tracing::info!(
            vm = live.name(),
            pid = live.pid,
            hypervisor = live.vm.hypervisor.name(),
            "virtual machine found"
        );
        let meta = Meta {
            format: 1,
            vm: live.name().to_owned(),
            instance: live.instance(),
            hypervisor: live.vm.hypervisor.name().to_owned(),
            ..Default::default()
        };
        let mut t = Tracked {
            live,
            dir: None,
            meta,
            energy: BTreeMap::new(),
            threads: [0.0; 3],
            counted_ns: 0,
            first: true,
            resumed_from: None,
        };
        self.claim(&mut t);
        self.vms.insert(t.live.pid, t);
    }

    /// Gives `t` its directory unless another running VM holds the name.
    fn claim(&self, t: &mut Tracked) {
        let Some(root) = &self.settings.share else {
            return;
        };
        let name = t.live.name();
        if let Some(holder) = self
            .vms
            .values()
            .find(|o| o.dir.is_some() && o.live.name() == name)
        {
            tracing::warn!(
                vm = name,
                pid = t.live.pid,
                holder = holder.live.pid,
                "another running VM has this name: no directory for this one"
            );
            return;
        }
        let dir = root.join(name);
        match vm_dir::open(&dir, t.live.gid) {
            Ok(Some(prev)) if prev.meta.instance == t.meta.instance => {
                // The same VM, still running: go on from its counters.
                for (zone, c) in &prev.meta.zones {
                    if let Some((_, z, _)) = ZONES.iter().find(|(_, z, _)| z == zone) {
                        t.energy.insert(z, (c.energy_uj as f64, c.static_uj as f64));
                    }
                }
                let p = prev.meta.threads;
                t.threads = [p.vcpu_uj as f64, p.emulator_uj as f64, p.unsplit_uj as f64];
                t.counted_ns = prev.meta.counted_us.saturating_mul(1000);
                t.meta.seq = prev.meta.seq;
                t.meta.gaps = prev.meta.gaps;
                t.meta.last_gap = prev.meta.last_gap;
                t.resumed_from = Some(prev.written);
                tracing::info!(vm = name, seq = t.meta.seq, "continuing its counters");
            }
            Ok(Some(_)) => vm_dir::clear(&dir), // an earlier VM of this name: start clean
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(vm = name, "cannot share its energy: {err}");
                return;
            }
        }
        t.dir = Some(dir);
    }

    /// Stops following VM process `pid` and removes its directory.
    fn forget(&mut self, pid: u32) {
        let Some(t) = self.vms.remove(&pid) else {
            return;
        };
        tracing::info!(vm = t.live.name(), pid, "virtual machine exited");
        self.metrics.vm_gone(t.live.name());
        if let Some(dir) = &t.dir
            && let Err(err) = vm_dir::remove(dir)
        {
            tracing::warn!(vm = t.live.name(), "{err}");
        }
        // A VM of the same name that waited for it takes the directory, clean.
        let waiting: Vec<u32> = self
            .vms
            .values()
            .filter(|o| o.dir.is_none() && o.live.name() == t.live.name())
            .map(|o| o.live.pid)
            .collect();
        for pid in waiting.into_iter().take(1) {
            if let Some(mut o) = self.vms.remove(&pid) {
                self.claim(&mut o);
                self.vms.insert(pid, o);
            }
        }
    }

    /// Removes directories of the share that hold metadata of no running VM (left by an
    /// agent that stopped before its VMs did). Directories without metadata are a
    /// launcher's, made ahead of its VM: they stay.
    fn sweep_share(&self) {
        let Some(root) = &self.settings.share else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(root) else {
            return;
        };
        for e in entries.filter_map(Result::ok) {
            let dir = e.path();
            let held = self
                .vms
                .values()
                .any(|t| t.dir.as_deref() == Some(dir.as_path()));
            if !held && dir.join("energy-bpf.json").is_file() {
                tracing::info!("removing {}: its VM no longer runs", dir.display());
                if let Err(err) = vm_dir::remove(&dir) {
                    tracing::warn!("{err}");
                }
            }
        }
    }

    /// Follows hypervisor processes a window's rows name that are not followed yet.
    fn discover(&mut self, rows: &[ProcessRow]) {
        for row in rows {
            if self.vms.contains_key(&row.pid) || Hypervisor::of_program(&row.comm).is_none() {
                continue;
            }
            let cgroup = (!row.cgroup.is_empty()).then_some(row.cgroup.as_str());
            if let Some(live) = proc::read(row.pid, cgroup) {
                self.track(live);
            }
        }
    }

    /// Each followed VM's energy in `w`.
    fn energies(&self, w: &Window) -> Vec<(u32, VmEnergy)> {
        let rows: HashMap<u32, &ProcessRow> = w.processes.iter().map(|r| (r.pid, r)).collect();
        let mut out: Vec<(u32, VmEnergy)> = self
            .vms
            .values()
            .map(|t| {
                let classes = proc::threads(t.live.pid, &t.live.vm);
                let named = t.live.vm.named_threads
                    || classes.values().any(|c| matches!(c, ThreadClass::Vcpu(_)));
                let counted = classes
                    .values()
                    .filter(|c| matches!(c, ThreadClass::Vcpu(_)))
                    .count();
                let vcpus = t
                    .live
                    .vm
                    .vcpus
                    .unwrap_or(u32::try_from(counted).unwrap_or(u32::MAX));
                let hypervisor = t.live.vm.hypervisor;
                let mut e = VmEnergy::dynamic(
                    t.live.name(),
                    t.live.pid,
                    vcpus,
                    named,
                    rows.get(&t.live.pid).copied(),
                    |th| {
                        classes
                            .get(&th.tid)
                            .copied()
                            .unwrap_or_else(|| detect::classify(hypervisor, &th.comm, named))
                    },
                );
                e.hypervisor = Some(hypervisor);
                (t.live.pid, e)
            })
            .collect();
        let busy_ns: u64 = w.processes.iter().map(|r| r.cpu_ns).sum();
        let mut energies: Vec<VmEnergy> = out.iter().map(|(_, e)| e.clone()).collect();
        share_static(
            &mut energies,
            &w.totals.idle_by_domain_j,
            self.host_cpus,
            busy_ns,
            self.settings.policy,
        );
        for ((_, e), shared) in out.iter_mut().zip(energies) {
            *e = shared;
        }
        out
    }
}

impl Sink for VmSink {
    fn name(&self) -> &'static str {
        "vms"
    }

    fn start(&mut self, header: &pb::Header) -> Result<(), SinkError> {
        self.host_cpus = header.cpus.len().max(1);
        if let Some(root) = &self.settings.share {
            let made = std::fs::create_dir_all(root).and_then(|()| {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))
            });
            if let Err(err) = made {
                let msg = format!(
                    "cannot make the VM share {} ({err}); VM energy goes to the metrics only (choose another with --vm-share, or --vm-share none)",
                    root.display()
                );
                self.settings.share = None;
                return Err(SinkError::Failed(msg));
            }
        }
        for live in proc::scan() {
            self.track(live);
        }
        self.sweep_share();
        Ok(())
    }

    fn chunk(&mut self, chunk: &pb::Chunk) -> Result<(), SinkError> {
        for e in &chunk.process_events {
            if e.kind() == Kind::Exit && e.tid == e.tgid && self.vms.contains_key(&e.tgid) {
                self.forget(e.tgid);
            }
        }
        for t in &chunk.threads {
            let program = t.cmdline.split(' ').next().unwrap_or("");
            let hypervisor = Hypervisor::of_program(&t.comm)
                .or_else(|| Hypervisor::of_program(program))
                .is_some();
            if t.tid == t.tgid && hypervisor && !self.vms.contains_key(&t.tgid) {
                let cgroup = (!t.cgroup_path.is_empty()).then_some(t.cgroup_path.as_str());
                if let Some(live) = proc::read(t.tgid, cgroup) {
                    self.track(live);
                }
            }
        }
        Ok(())
    }

    fn window(&mut self, w: &Window, _header: &pb::Header) -> Result<(), SinkError> {
        let gone: Vec<u32> = self
            .vms
            .values()
            .filter(|t| !proc::alive(t.live.pid, t.live.start_ticks))
            .map(|t| t.live.pid)
            .collect();
        for pid in gone {
            self.forget(pid);
        }
        self.discover(&w.processes);
        let energies = self.energies(w);
        self.metrics.vm_window(energies.iter().map(|(_, e)| e));
        let offset = i128::from(clock::realtime_ns()) - i128::from(clock::monotonic_ns());
        let start_unix_ns = (i128::from(w.events.start_ns) + offset).max(0) as u128;
        let interval_ms = u64::try_from(self.interval.as_millis()).unwrap_or(u64::MAX);
        let host_zones: Vec<(&'static str, &'static str)> = ZONES
            .iter()
            .filter(|(d, _, _)| w.totals.energy_j.contains_key(d))
            .map(|(d, z, _)| (*d, *z))
            .collect();
        let mut failures = Vec::new();
        for (pid, e) in energies {
            let Some(t) = self.vms.get_mut(&pid) else {
                continue;
            };
            for &(domain, zone) in &host_zones {
                let acc = t.energy.entry(zone).or_default();
                acc.0 += e.total_j(domain).max(0.0) * 1e6;
                acc.1 += e.static_j.get(domain).copied().unwrap_or(0.0).max(0.0) * 1e6;
            }
            for (i, part) in [&e.vcpu_j, &e.emulator_j, &e.unsplit_j]
                .into_iter()
                .enumerate()
            {
                t.threads[i] += part.get("package").copied().unwrap_or(0.0).max(0.0) * 1e6;
            }
            t.counted_ns += w.events.end_ns.saturating_sub(w.events.start_ns);
            let Some(dir) = t.dir.clone() else {
                continue;
            };
            let m = &mut t.meta;
            m.seq += 1;
            if let Some(written) = t.resumed_from.take() {
                let written_ns = written
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos());
                m.gaps += 1;
                m.last_gap = Some(Gap {
                    seq: m.seq,
                    reason: "host agent restarted".into(),
                    missing_ms: u64::try_from(start_unix_ns.saturating_sub(written_ns) / 1_000_000)
                        .unwrap_or(u64::MAX),
                });
            }
            m.interval_ms = interval_ms;
            m.vcpus = e.vcpus;
            m.static_policy = self.settings.policy.as_str().to_owned();
            m.measured = !w.totals.estimated;
            m.host_source.clone_from(&w.totals.source);
            m.threads_named = e.threads_named;
            m.zones = t
                .energy
                .iter()
                .map(|(&z, &(energy, stat))| {
                    (
                        z.to_owned(),
                        ZoneCounters {
                            energy_uj: energy as u64,
                            static_uj: stat as u64,
                        },
                    )
                })
                .collect();
            m.threads = vm_dir::ThreadCounters {
                vcpu_uj: t.threads[0] as u64,
                emulator_uj: t.threads[1] as u64,
                unsplit_uj: t.threads[2] as u64,
            };
            m.counted_us = t.counted_ns / 1000;
            match vm_dir::write(&dir, t.live.gid, m, t.first) {
                Ok(()) => t.first = false,
                Err(err) => failures.push(format!("{}: {err}", t.live.name())),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Failed(failures.join("; ")))
        }
    }
}
