//! The Prometheus exposition: the [`Ledger`]'s series and the agent's own figures in a
//! `prometheus-client` registry, encoded as the Prometheus text format on each scrape.
//!
//! Names and labels mirror Kepler's (`*_joules_total`, `zone`, `mode`), so its dashboards
//! port. The energy families are rebuilt from the ledger under one lock after every window,
//! and a scrape encodes under the same lock: a scrape never sees half a window, so the
//! per-zone sum rule holds at every scrape, not just eventually.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, atomic::AtomicU64},
    time::Duration,
};

use hdrhistogram::Histogram;
use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{
    ledger::{Bucket, Ledger, WindowEnergy},
    selfstat,
    sink::{Sink, SinkError},
};
use crate::{
    attribute::domain_name,
    container::ContainerRef,
    energy::model,
    pb::v1::{self as pb, process_event::Kind},
    pipeline::Window,
};

/// Label pairs of one series (absent labels are left out rather than empty).
type Labels = Vec<(&'static str, String)>;
type JoulesFamily = Family<Labels, Counter<f64, AtomicU64>>;
type WattsFamily = Family<Labels, Gauge<f64, AtomicU64>>;

/// Windows an exited process keeps its series (the issue asks for "a few").
const LINGER_WINDOWS: u64 = 3;
/// Windows a container with nothing running keeps its series: an hour at the default 5 s.
const CONTAINER_LINGER_WINDOWS: u64 = 720;
/// Quantiles of the window processing time.
const QUANTILES: [f64; 4] = [0.5, 0.9, 0.99, 1.0];

/// Why the metrics could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The processing-time histogram refused its bounds.
    #[error("window processing histogram: {0}")]
    Histogram(String),
}

/// The agent's metrics, shared by the capture thread (updates) and the HTTP server
/// (scrapes).
pub struct Metrics {
    state: Mutex<State>,
}

struct State {
    registry: Registry,
    ledger: Ledger,
    node: JoulesFamily,
    process: JoulesFamily,
    process_watts: WattsFamily,
    container: JoulesFamily,
    source_info: Family<Labels, Gauge>,
    static_identified: Family<Labels, Gauge>,
    static_watts: WattsFamily,
    static_learned: WattsFamily,
    static_drift: WattsFamily,
    series: Gauge,
    events: Family<Labels, Counter>,
    dropped: Family<Labels, Counter>,
    losses: pb::LossCounters,
    cpu: Counter<f64, AtomicU64>,
    rss: Gauge,
    peak_rss: Gauge,
    processing: Histogram<u64>,
    processing_quantiles: Family<Labels, Gauge<f64, AtomicU64>>,
    processing_sum: Counter<f64, AtomicU64>,
    windows: Counter,
    queue_depth: Family<Labels, Gauge>,
    sink_errors: Family<Labels, Counter>,
    exported: Family<Labels, Counter>,
    pending: Gauge,
    unwind_samples: Family<Labels, Counter>,
    unwind_tables: Family<Labels, Gauge>,
    /// Pod names for `namespace`, `pod` and `container` labels, when configured.
    names: Option<Arc<crate::kube::Resolver>>,
}

impl Metrics {
    /// Empty metrics; at most `max_series` processes get series of their own.
    pub fn new(max_series: usize) -> Result<Arc<Self>, MetricsError> {
        // 1 µs to 1 h at 3 significant digits: a fixed few tens of KiB.
        let processing = Histogram::new_with_bounds(1, 3_600_000_000, 3)
            .map_err(|e| MetricsError::Histogram(format!("{e:?}")))?;
        let mut registry = Registry::default();
        let node = JoulesFamily::default();
        let process = JoulesFamily::default();
        let process_watts = WattsFamily::default();
        let container = JoulesFamily::default();
        let source_info = Family::<Labels, Gauge>::default();
        let static_identified = Family::<Labels, Gauge>::default();
        let static_watts = WattsFamily::default();
        let static_learned = WattsFamily::default();
        let static_drift = WattsFamily::default();
        let series = Gauge::default();
        let events = Family::<Labels, Counter>::default();
        let dropped = Family::<Labels, Counter>::default();
        let cpu = Counter::<f64, AtomicU64>::default();
        let rss = Gauge::default();
        let peak_rss = Gauge::default();
        let processing_quantiles = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let processing_sum = Counter::<f64, AtomicU64>::default();
        let windows = Counter::default();
        let queue_depth = Family::<Labels, Gauge>::default();
        let sink_errors = Family::<Labels, Counter>::default();
        let exported = Family::<Labels, Counter>::default();
        let pending = Gauge::default();
        let unwind_samples = Family::<Labels, Counter>::default();
        let unwind_tables = Family::<Labels, Gauge>::default();
        registry.register(
            "energy_bpf_samples_unwound",
            "Stack samples by how the user stack was walked (method=\"dwarf\": unwind tables, \"frame_pointer\") and why the walk ended",
            unwind_samples.clone(),
        );
        registry.register(
            "energy_bpf_unwind_tables",
            "What the table walker holds: processes with tables, files and rows loaded, row capacity (16 bytes a row of kernel memory)",
            unwind_tables.clone(),
        );
        registry.register(
            "energy_bpf_node_joules",
            "Energy of the node since the agent started, by zone; mode=\"idle\" is static power, mode=\"active\" the rest",
            node.clone(),
        );
        registry.register(
            "energy_bpf_process_joules",
            "Energy of a process since it got its series, by zone; comm=\"[unknown]\", \"[other]\" and \"[exited]\" make the process series sum to the node's active energy",
            process.clone(),
        );
        registry.register(
            "energy_bpf_process_watts",
            "Power of a process over the last window, by zone",
            process_watts.clone(),
        );
        registry.register(
            "energy_bpf_container_joules",
            "Energy of the processes of a container or pod since the agent started, by zone",
            container.clone(),
        );
        registry.register(
            "energy_bpf_source_info",
            "Energy sources in use; estimated=\"true\" marks modelled energy",
            source_info.clone(),
        );
        registry.register(
            "energy_bpf_static_identified",
            "1 when a source's static power is known (given, calibrated, modelled or measured), 0 when it could not be identified: then process series include static power; run `energy-bpf calibrate` or pass --static-power-w",
            static_identified.clone(),
        );
        registry.register(
            "energy_bpf_static_watts",
            "Static power the last window used, per source, with where it came from (origin: given, calibrated, learned, model, online_idle, extrapolated, online, unidentified)",
            static_watts.clone(),
        );
        registry.register(
            "energy_bpf_static_learned_watts",
            "Static power the agent learned from the quietest intervals it kept (persisted in --state-dir), per source; absent until they identify it",
            static_learned.clone(),
        );
        registry.register(
            "energy_bpf_static_drift_ratio",
            "Learned static power over calibrated static power, minus 1, per source; only where both exist",
            static_drift.clone(),
        );
        registry.register(
            "energy_bpf_process_series",
            "Processes with a series of their own (at most --max-process-series)",
            series.clone(),
        );
        registry.register(
            "energy_bpf_events",
            "Events drained from the probes, by kind",
            events.clone(),
        );
        registry.register(
            "energy_bpf_dropped_events",
            "Events lost (ring buffer full, failed stack walks, processes gone before they were named), by kind",
            dropped.clone(),
        );
        registry.register(
            "energy_bpf_agent_cpu_seconds",
            "CPU time of the agent (user + system)",
            cpu.clone(),
        );
        registry.register(
            "energy_bpf_agent_resident_memory_bytes",
            "Resident memory of the agent",
            rss.clone(),
        );
        registry.register(
            "energy_bpf_agent_peak_resident_memory_bytes",
            "Peak resident memory of the agent",
            peak_rss.clone(),
        );
        registry.register(
            "energy_bpf_window_processing_seconds",
            "Time to close, analyse and export one window: quantiles since start (an HDR histogram; prometheus-client has no summary type, so sum and count are the two counters below)",
            processing_quantiles.clone(),
        );
        registry.register(
            "energy_bpf_window_processing_seconds",
            "Summed window processing time (the summary's sum)",
            processing_sum.clone(),
        );
        registry.register(
            "energy_bpf_windows",
            "Windows closed (the summary's count)",
            windows.clone(),
        );
        registry.register(
            "energy_bpf_export_queue_depth",
            "Items waiting in an exporter's queue, by sink",
            queue_depth.clone(),
        );
        registry.register(
            "energy_bpf_export_errors",
            "Chunks or windows an exporter failed to take, by sink",
            sink_errors.clone(),
        );
        registry.register(
            "energy_bpf_export",
            "What an exporter did with its items (profiles), by sink and outcome: sent, dropped (queue full, oldest first) or failed (a call that will be retried)",
            exported.clone(),
        );
        registry.register(
            "energy_bpf_pipeline_pending_events",
            "Events waiting for their window",
            pending.clone(),
        );
        Ok(Arc::new(Self {
            state: Mutex::new(State {
                registry,
                ledger: Ledger::new(max_series, LINGER_WINDOWS, CONTAINER_LINGER_WINDOWS),
                node,
                process,
                process_watts,
                container,
                source_info,
                static_identified,
                static_watts,
                static_learned,
                static_drift,
                series,
                events,
                dropped,
                losses: pb::LossCounters::default(),
                cpu,
                rss,
                peak_rss,
                processing,
                processing_quantiles,
                processing_sum,
                windows,
                queue_depth,
                sink_errors,
                exported,
                pending,
                unwind_samples,
                unwind_tables,
                names: None,
            }),
        }))
    }

    /// Labels process and container series with Kubernetes names from `names`.
    pub fn set_names(&self, names: Arc<crate::kube::Resolver>) {
        let mut s = self.lock();
        s.names = Some(names);
        s.publish();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain numbers behind: still worth serving.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Changes `--max-process-series` (a reload).
    pub fn set_max_series(&self, n: usize) {
        let mut s = self.lock();
        s.ledger.set_max_series(n);
        s.publish();
    }

    /// Counts a drained chunk's events and takes its loss counters.
    pub fn chunk(&self, chunk: &pb::Chunk) {
        let mut s = self.lock();
        for (kind, n) in [
            ("switch", chunk.switches.len()),
            ("sample", chunk.samples.len()),
            ("process", chunk.process_events.len()),
            ("reading", chunk.readings.len()),
        ] {
            s.events
                .get_or_create(&vec![("kind", kind.into())])
                .inc_by(n as u64);
        }
        for sample in &chunk.samples {
            let method = match sample.unwind_method() {
                pb::UnwindMethod::Dwarf => "dwarf",
                pb::UnwindMethod::FramePointer => "frame_pointer",
            };
            let stop = crate::record::stop_name(sample.unwind_stop());
            s.unwind_samples
                .get_or_create(&vec![("method", method.into()), ("stop", stop.into())])
                .inc();
        }
        let Some(now) = chunk.losses else {
            return;
        };
        // The kernel's counters are cumulative; export them as they grow.
        let before = std::mem::replace(&mut s.losses, now);
        for (kind, now, before) in [
            ("switch", now.switch_dropped, before.switch_dropped),
            ("sample", now.sample_dropped, before.sample_dropped),
            ("process", now.process_dropped, before.process_dropped),
            ("stack_error", now.stack_errors, before.stack_errors),
            (
                "vanished_process",
                now.vanished_processes,
                before.vanished_processes,
            ),
        ] {
            s.dropped
                .get_or_create(&vec![("kind", kind.into())])
                .inc_by(now.saturating_sub(before));
        }
    }

    /// What the unwind tables hold now.
    pub fn unwind_tables(&self, u: &crate::capture::unwinder::UnwindStats) {
        let s = self.lock();
        for (what, n) in [
            ("processes", u.processes),
            ("files", u.files),
            ("rows", u.rows),
            ("row_capacity", u.row_capacity),
        ] {
            s.unwind_tables
                .get_or_create(&vec![("what", what.into())])
                .set(n as i64);
        }
    }

    /// Adds a closed window to the ledger and republishes the energy series.
    pub fn window(&self, w: &Window, alive: &dyn Fn(u32) -> bool) {
        let unknown = w.analysis.attribution.unknown.joules_by_name();
        let exited: Vec<u32> = w
            .events
            .process_events
            .iter()
            .filter(|e| e.kind() == Kind::Exit && e.tid == e.tgid)
            .map(|e| e.tgid)
            .collect();
        let mut s = self.lock();
        s.ledger.apply(
            &WindowEnergy {
                secs: w.totals.duration_ns as f64 / 1e9,
                measured: &w.totals.energy_j,
                idle: &w.totals.idle_by_domain_j,
                unknown: &unknown,
                rows: &w.processes,
                exited: &exited,
            },
            alive,
        );
        s.source_info.clear();
        s.static_identified.clear();
        s.static_watts.clear();
        for src in &w.analysis.attribution.sources {
            s.static_watts
                .get_or_create(&vec![
                    ("source", src.name.clone()),
                    ("origin", src.static_origin.kind().to_owned()),
                ])
                .set(src.static_w);
            let unknown = matches!(
                src.static_origin,
                crate::attribute::StaticOrigin::Unidentified { .. }
            );
            s.static_identified
                .get_or_create(&vec![("source", src.name.clone())])
                .set(i64::from(!unknown));
        }
        let packages = |d: i32| w.analysis.sources.iter().filter(|s| s.domain == d).count();
        for src in &w.analysis.sources {
            let zone = domain_name(src.domain());
            let zone = if packages(src.domain) > 1 {
                format!("{zone}-{}", src.package)
            } else {
                zone.to_string()
            };
            s.source_info
                .get_or_create(&vec![
                    ("source", src.kind.clone()),
                    ("zone", zone),
                    ("estimated", model::is_model(src).to_string()),
                ])
                .set(1);
        }
        s.publish();
    }

    /// The learned static power of every source, and its drift from the calibrated value
    /// where both exist.
    pub fn set_learned(
        &self,
        learned: &[super::learn::SourceLearned],
        calibrated: &BTreeMap<String, crate::attribute::Calibrated>,
    ) {
        let s = self.lock();
        s.static_learned.clear();
        s.static_drift.clear();
        for src in learned {
            let Some(l) = &src.learned else {
                continue;
            };
            let labels = vec![("source", src.name.clone())];
            s.static_learned.get_or_create(&labels).set(l.watts);
            if let Some(c) = calibrated.get(&src.key).filter(|c| c.watts > 0.0) {
                s.static_drift
                    .get_or_create(&labels)
                    .set(l.watts / c.watts - 1.0);
            }
        }
    }

    /// Records how long a window took from close to export.
    pub fn observe_processing(&self, took: Duration, pending_events: usize) {
        let mut s = self.lock();
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        s.processing.saturating_record(us);
        s.processing_sum.inc_by(took.as_secs_f64());
        s.windows.inc();
        s.pending
            .set(i64::try_from(pending_events).unwrap_or(i64::MAX));
        for q in QUANTILES {
            let secs = s.processing.value_at_quantile(q) as f64 / 1e6;
            s.processing_quantiles
                .get_or_create(&vec![("quantile", q.to_string())])
                .set(secs);
        }
    }

    /// A sink's backlog.
    pub fn set_queue_depth(&self, sink: &'static str, depth: usize) {
        self.lock()
            .queue_depth
            .get_or_create(&vec![("sink", sink.into())])
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// An exporter's running totals; the counters follow them (never down).
    pub fn set_export_counts(&self, sink: &'static str, sent: u64, dropped: u64, failed: u64) {
        let s = self.lock();
        for (outcome, total) in [("sent", sent), ("dropped", dropped), ("failed", failed)] {
            let c = s
                .exported
                .get_or_create(&vec![("sink", sink.into()), ("outcome", outcome.into())]);
            let now = c.get();
            if total > now {
                c.inc_by(total - now);
            }
        }
    }

    /// A sink failed to take a chunk or window.
    pub fn sink_error(&self, sink: &'static str) {
        self.lock()
            .sink_errors
            .get_or_create(&vec![("sink", sink.into())])
            .inc();
    }

    /// The Prometheus text exposition (format 0.0.4), with the agent's CPU and memory as
    /// of now.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let s = self.lock();
        let usage = selfstat::now();
        let cpu = usage.cpu_seconds - s.cpu.get();
        if cpu > 0.0 {
            s.cpu.inc_by(cpu);
        }
        s.rss
            .set(i64::try_from(usage.rss_bytes).unwrap_or(i64::MAX));
        s.peak_rss
            .set(i64::try_from(usage.peak_rss_bytes).unwrap_or(i64::MAX));
        let mut out = String::with_capacity(64 * 1024);
        prometheus_client::encoding::prometheus_text::encode(&mut out, &s.registry)?;
        Ok(out)
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

impl State {
    /// Rebuilds the energy families from the ledger (cheap: a few thousand series at most).
    fn publish(&mut self) {
        let l = &self.ledger;
        self.node.clear();
        for (mode, zones) in [("active", &l.active), ("idle", &l.idle)] {
            for (&zone, &j) in zones {
                self.node
                    .get_or_create(&vec![("zone", zone.into()), ("mode", mode.into())])
                    .inc_by(j);
            }
        }
        self.process.clear();
        self.process_watts.clear();
        let names = |c: &ContainerRef| self.names.as_ref().and_then(|r| r.names(c));
        for (pid, t) in &l.processes {
            let mut base = process_labels(Some(*pid), &t.comm, &t.container);
            kube_labels(&mut base, names(&t.container));
            put(
                &self.process,
                &self.process_watts,
                &base,
                &t.joules,
                &t.watts,
            );
        }
        let none = BTreeMap::new();
        for b in Bucket::ALL {
            if let Some(j) = l.buckets.get(&b) {
                let base = process_labels(None, b.comm(), &ContainerRef::default());
                let w = l.bucket_watts.get(&b).unwrap_or(&none);
                put(&self.process, &self.process_watts, &base, j, w);
            }
        }
        self.container.clear();
        for ((id, pod), c) in &l.containers {
            let mut base = Labels::new();
            if !id.is_empty() {
                base.push(("container_id", id.clone()));
            }
            if !pod.is_empty() {
                base.push(("pod_uid", pod.clone()));
            }
            let key = ContainerRef {
                container_id: (!id.is_empty()).then(|| id.clone()),
                pod_uid: (!pod.is_empty()).then(|| pod.clone()),
                runtime: None,
            };
            kube_labels(&mut base, names(&key));
            for (&zone, &j) in &c.joules {
                let mut labels = base.clone();
                labels.push(("zone", zone.into()));
                self.container.get_or_create(&labels).inc_by(j);
            }
        }
        self.series
            .set(i64::try_from(l.processes.len()).unwrap_or(i64::MAX));
    }
}

fn process_labels(pid: Option<u32>, comm: &str, c: &ContainerRef) -> Labels {
    let mut labels = Labels::new();
    if let Some(pid) = pid {
        labels.push(("pid", pid.to_string()));
    }
    labels.push(("comm", comm.to_string()));
    if let Some(id) = &c.container_id {
        labels.push(("container_id", id.clone()));
    }
    if let Some(uid) = &c.pod_uid {
        labels.push(("pod_uid", uid.clone()));
    }
    labels
}

/// `namespace`, `pod` and `container` (the last only for a container's cgroup).
fn kube_labels(labels: &mut Labels, names: Option<crate::kube::PodNames>) {
    if let Some(n) = names {
        labels.push(("namespace", n.namespace));
        labels.push(("pod", n.pod));
        if !n.container.is_empty() {
            labels.push(("container", n.container));
        }
    }
}

fn put(
    joules: &JoulesFamily,
    watts: &WattsFamily,
    base: &Labels,
    j: &BTreeMap<&'static str, f64>,
    w: &BTreeMap<&'static str, f64>,
) {
    for (&zone, &v) in j {
        let mut labels = base.clone();
        labels.push(("zone", zone.into()));
        joules.get_or_create(&labels).inc_by(v);
        watts
            .get_or_create(&labels)
            .set(w.get(zone).copied().unwrap_or(0.0));
    }
}

/// The metrics as a [`Sink`] of the capture loop.
pub struct MetricsSink {
    metrics: Arc<Metrics>,
}

impl MetricsSink {
    /// Feeds `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

impl Sink for MetricsSink {
    fn name(&self) -> &'static str {
        "metrics"
    }

    fn chunk(&mut self, chunk: &pb::Chunk) -> Result<(), SinkError> {
        self.metrics.chunk(chunk);
        Ok(())
    }

    fn window(&mut self, window: &Window, _header: &pb::Header) -> Result<(), SinkError> {
        self.metrics.window(window, &selfstat::pid_alive);
        Ok(())
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
