//! OTLP out of the agent: the sink here, the gRPC transport in [`transport`]; the request
//! itself is encoded by [`crate::output::otlp`], shared with `flamegraph --format otlp`.
//!
//! Energy profiles out of the agent: every `--profile-interval`, the windows since the last
//! export become one OTLP request (a CPU profile and an energy profile per zone, see
//! [`crate::output::otlp`]), symbolized here, and go to the [`Exporter`]'s bounded queue.
//!
//! The sink keeps what profiles need between windows, and no more: the tables of live
//! processes ([`StackTables`]) and the samples and their energy since the last export. Symbolizing and encoding happen on a thread of their own
//! (it owns the symbolizer's caches), fed through a channel of two profiles: capture never
//! waits on them, and a backlog is dropped and counted like a full export queue.

pub(crate) mod transport;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::sink::{Sink, SinkError};
use super::stacks::{self, Batch, StackTables};
use crate::{
    container::ContainerRef,
    output::otlp::{self, Origin},
    pb::v1 as pb,
    pipeline::Window,
    profile::{self, Filter},
    symbolize::Symbolizer,
};
use transport::Exporter;

/// One profile's worth of windows, on its way to the encoding thread.
struct Job {
    batch: Batch,
    attributed_uj: BTreeMap<&'static str, f64>,
    /// Nanograms of CO2e per µJ of each zone over the windows (their energy-weighted
    /// intensity), with `--carbon-*` flags.
    co2e_ng_per_uj: BTreeMap<&'static str, f64>,
    container_attrs: HashMap<u64, otlp::ContainerAttrs>,
}

/// The OTLP sink.
pub struct OtlpSink {
    jobs: std::sync::mpsc::SyncSender<Job>,
    stats: std::sync::Arc<transport::ExportStats>,
    interval_ns: u64,
    tables: StackTables,
    pending: Option<Batch>,
    /// Energy the windows since the last export gave threads, µJ per zone: what the
    /// exported profiles must add up to.
    attributed_uj: BTreeMap<&'static str, f64>,
    /// That energy's CO2e at each window's intensity, ng per zone, with `--carbon-*` flags.
    co2e_ng: BTreeMap<&'static str, f64>,
    /// Container and pod of each cgroup id seen, from its path.
    containers: HashMap<u64, ContainerRef>,
    /// Kubernetes names, when the agent has them.
    names: Option<Arc<crate::kube::Resolver>>,
}

impl OtlpSink {
    /// Exports through `exporter` every `interval`.
    pub fn new(exporter: Exporter, interval: Duration) -> std::io::Result<Self> {
        let (kernel, host_name) = crate::capture::host::uname();
        let host_id = std::fs::read_to_string("/etc/machine-id")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let origin = Origin {
            host_name,
            host_id,
            kernel,
        };
        let stats = std::sync::Arc::clone(exporter.stats());
        let (jobs, rx) = std::sync::mpsc::sync_channel::<Job>(2);
        std::thread::Builder::new()
            .name("energy-bpf-otlp".into())
            .spawn(move || {
                for job in rx {
                    // The symbolizer caches every binary it opens: one per profile bounds
                    // the agent's memory by what a single profile's binaries need, on a
                    // machine whose processes come and go for months (keeping one for six
                    // profiles let RSS climb by ~100 MiB where binaries carry large debug
                    // info), at the price of reopening them every --profile-interval.
                    let mut symbolizer = Symbolizer::with_kallsyms(Some("/proc/kallsyms".into()));
                    let mut profile = profile::build(
                        job.batch.stacks(),
                        &job.batch.weights,
                        &mut symbolizer,
                        &Filter::default(),
                    );
                    // A co2e profile beside each energy one, as `flamegraph --unit co2e`.
                    let energy: Vec<String> = profile
                        .value_types
                        .iter()
                        .map(|v| v.name.clone())
                        .filter(|n| n.starts_with("energy_"))
                        .collect();
                    for name in energy {
                        let zone = name.trim_start_matches("energy_");
                        if let Some(&rate) = job.co2e_ng_per_uj.get(zone) {
                            profile.add_co2e(&name, rate);
                        }
                    }
                    let attrs = job.container_attrs;
                    let mut request = otlp::request(&profile, &origin, &|cgroup| {
                        attrs.get(&cgroup).cloned().unwrap_or_default()
                    });
                    otlp::add_attributed(&mut request, &job.attributed_uj);
                    exporter.push(request);
                }
            })?;
        Ok(Self {
            jobs,
            stats,
            interval_ns: u64::try_from(interval.as_nanos())
                .unwrap_or(u64::MAX)
                .max(1),
            tables: StackTables::default(),
            pending: None,
            attributed_uj: BTreeMap::new(),
            co2e_ng: BTreeMap::new(),
            containers: HashMap::new(),
            names: None,
        })
    }

    /// Adds `k8s.namespace.name`, `k8s.pod.name` and `k8s.container.name` to the samples
    /// of processes in pods `names` knows.
    pub fn with_names(mut self, names: Option<Arc<crate::kube::Resolver>>) -> Self {
        self.names = names;
        self
    }

    /// Sample attributes of every cgroup seen, names as of now.
    fn container_attrs(&self) -> HashMap<u64, otlp::ContainerAttrs> {
        self.containers
            .iter()
            .filter(|(_, c)| !c.is_empty())
            .map(|(&cgroup, c)| {
                let mut attrs = Vec::new();
                if let Some(id) = &c.container_id {
                    attrs.push(("container.id", id.clone()));
                }
                if let Some(n) = self.names.as_ref().and_then(|r| r.names(c)) {
                    attrs.push(("k8s.namespace.name", n.namespace));
                    attrs.push(("k8s.pod.name", n.pod));
                    if !n.container.is_empty() {
                        attrs.push(("k8s.container.name", n.container));
                    }
                }
                (cgroup, attrs)
            })
            .collect()
    }

    fn export(&mut self) {
        let Some(batch) = self.pending.take() else {
            return;
        };
        let co2e_ng = std::mem::take(&mut self.co2e_ng);
        // A zone without energy gets the intensity of now (its profile is empty anyway).
        let now = || crate::agent::metrics::carbon::intensity_now().map(|i| i.g_per_joule() * 1e3);
        let co2e_ng_per_uj = co2e_ng
            .iter()
            .filter_map(|(&zone, &ng)| {
                let uj = self.attributed_uj.get(zone).copied().unwrap_or(0.0);
                let rate = if uj > 0.0 { Some(ng / uj) } else { now() };
                Some((zone, rate?))
            })
            .collect();
        let job = Job {
            batch,
            co2e_ng_per_uj,
            attributed_uj: std::mem::take(&mut self.attributed_uj),
            container_attrs: self.container_attrs(),
        };
        if self.jobs.try_send(job).is_err() {
            // The encoder is behind (or gone): this profile is dropped and counted.
            self.stats
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Sink for OtlpSink {
    fn name(&self) -> &'static str {
        "otlp"
    }

    fn chunk(&mut self, chunk: &pb::Chunk) -> Result<(), SinkError> {
        self.tables.chunk(chunk);
        Ok(())
    }

    fn window(&mut self, window: &Window, header: &pb::Header) -> Result<(), SinkError> {
        // Container ids of the window's cgroups, as the pipeline's rollup read them.
        for p in &window.processes {
            if let Some(t) = window
                .analysis
                .attribution
                .threads
                .iter()
                .find(|t| t.tgid == p.pid)
                && t.cgroup_id != 0
            {
                self.containers
                    .entry(t.cgroup_id)
                    .or_insert_with(|| p.container());
            }
        }
        let start_unix_ns = header
            .start_unix_ns
            .saturating_add(window.start_ns().saturating_sub(header.start_ns));
        // The window's samples, resolved by the tables the sink keeps from chunks.
        let batch = self.tables.batch(window, header, start_unix_ns);
        let attr = &window.analysis.attribution;
        // Grams per window, never per sample: this window's energy at its intensity.
        let ng_per_uj =
            crate::agent::metrics::carbon::intensity_now().map(|i| i.g_per_joule() * 1e3);
        for s in &attr.sources {
            let name = crate::attribute::domain_name(s.domain);
            let uj: f64 = attr.threads.iter().map(|t| t.energy.get(s.domain)).sum();
            // Several sources of one domain (packages) share one zone profile.
            let zone = self.attributed_uj.entry(name).or_default();
            if !attr
                .sources
                .iter()
                .take_while(|o| o.source_id != s.source_id)
                .any(|o| o.domain == s.domain)
            {
                *zone += uj;
                if let Some(rate) = ng_per_uj {
                    *self.co2e_ng.entry(name).or_default() += uj * rate;
                }
            }
        }
        let rest = stacks::gather(&mut self.pending, batch);
        // The zones changed (a source came or went): send what was gathered first.
        if let Some(batch) = rest {
            self.export();
            self.pending = Some(batch);
        }
        if let Some(acc) = &mut self.pending {
            acc.sample_hz = header.sample_hz;
            if acc.end_ns.saturating_sub(acc.start_ns) >= self.interval_ns {
                self.export();
            }
        }
        // Forget processes that exited in this window (their batch holds what their last
        // samples need).
        self.tables.forget_exited(window);
        if self.containers.len() > 4096 {
            self.containers.clear();
        }
        Ok(())
    }

    fn queue_depth(&self) -> usize {
        self.stats
            .queue_depth
            .load(std::sync::atomic::Ordering::Relaxed) as usize
    }

    fn export_counts(&self) -> Option<(u64, u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = &self.stats;
        Some((
            s.sent.load(Relaxed),
            s.dropped.load(Relaxed),
            s.failed.load(Relaxed),
        ))
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.export();
        Ok(())
    }
}
