//! The registry behind [`super::Metrics`]: every family registered with its help text, and the
//! energy families rebuilt from the ledger ([`State::publish`]) with Kepler's labels.

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::AtomicU64},
};

use hdrhistogram::Histogram;
use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::{
    CONTAINER_LINGER_WINDOWS, JoulesFamily, LINGER_WINDOWS, Labels, MetricsError, WattsFamily,
};
use crate::{
    agent::ledger::{Bucket, Ledger},
    container::ContainerRef,
    pb::v1 as pb,
};

/// Everything behind [`super::Metrics`]' lock: the registry, its families and the ledger they
/// are rebuilt from.
pub(super) struct State {
    pub(super) registry: Registry,
    pub(super) ledger: Ledger,
    pub(super) node: JoulesFamily,
    pub(super) process: JoulesFamily,
    pub(super) process_watts: WattsFamily,
    pub(super) container: JoulesFamily,
    pub(super) vm: JoulesFamily,
    pub(super) source_info: Family<Labels, Gauge>,
    pub(super) static_identified: Family<Labels, Gauge>,
    pub(super) power_model_uncertain: Family<Labels, Gauge>,
    pub(super) static_watts: WattsFamily,
    pub(super) static_learned: WattsFamily,
    pub(super) static_drift: WattsFamily,
    pub(super) series: Gauge,
    pub(super) events: Family<Labels, Counter>,
    pub(super) dropped: Family<Labels, Counter>,
    pub(super) losses: pb::LossCounters,
    pub(super) cpu: Counter<f64, AtomicU64>,
    pub(super) rss: Gauge,
    pub(super) peak_rss: Gauge,
    pub(super) processing: Histogram<u64>,
    pub(super) processing_quantiles: Family<Labels, Gauge<f64, AtomicU64>>,
    pub(super) processing_sum: Counter<f64, AtomicU64>,
    pub(super) windows: Counter,
    pub(super) queue_depth: Family<Labels, Gauge>,
    pub(super) sink_errors: Family<Labels, Counter>,
    pub(super) exported: Family<Labels, Counter>,
    pub(super) pending: Gauge,
    pub(super) poll_interval: Gauge<f64, AtomicU64>,
    pub(super) unwind_samples: Family<Labels, Counter>,
    pub(super) unwind_tables: Family<Labels, Gauge>,
    /// Pod names for `namespace`, `pod` and `container` labels, when configured.
    pub(super) names: Option<Arc<crate::kube::Resolver>>,
}

impl State {
    /// Empty metrics, registered; at most `max_series` processes get series of their own.
    pub(super) fn new(max_series: usize) -> Result<Self, MetricsError> {
        // 1 µs to 1 h at 3 significant digits: a fixed few tens of KiB.
        let processing = Histogram::new_with_bounds(1, 3_600_000_000, 3)
            .map_err(|e| MetricsError::Histogram(format!("{e:?}")))?;
        let mut registry = Registry::default();
        let node = JoulesFamily::default();
        let process = JoulesFamily::default();
        let process_watts = WattsFamily::default();
        let container = JoulesFamily::default();
        let vm = JoulesFamily::default();
        let source_info = Family::<Labels, Gauge>::default();
        let static_identified = Family::<Labels, Gauge>::default();
        let power_model_uncertain = Family::<Labels, Gauge>::default();
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
        let poll_interval = Gauge::<f64, AtomicU64>::default();
        let unwind_samples = Family::<Labels, Counter>::default();
        // Both methods' whole-stack series exist from the start, at 0 until a sample comes:
        // the family is there on an idle machine, and a rate over it starts from 0.
        for method in [pb::UnwindMethod::Dwarf, pb::UnwindMethod::FramePointer] {
            let _ = unwind_samples
                .get_or_create(&super::unwind_labels(method, pb::UnwindStop::EndOfStack));
        }
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
            "energy_bpf_vm_joules",
            "Energy of a virtual machine since the agent found it, by zone: part=\"dynamic\" is its process's measured energy (vCPU and emulator threads), part=\"static\" its share of static power under --vm-static",
            vm.clone(),
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
            "energy_bpf_power_model_uncertain",
            "1 when a process of a source may be more than 25% off for want of a power model that fits (the time and regression splits, or the regression's own 99% interval, reach that far), else 0; model is the split the last window used (time or regression)",
            power_model_uncertain.clone(),
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
        registry.register(
            "energy_bpf_poll_interval_seconds",
            "Time between the capture loop's drains of the probes: a second, less while a ring fills faster than a quarter of its size a second",
            poll_interval.clone(),
        );
        Ok(State {
            registry,
            ledger: Ledger::new(max_series, LINGER_WINDOWS, CONTAINER_LINGER_WINDOWS),
            node,
            process,
            process_watts,
            container,
            vm,
            source_info,
            static_identified,
            power_model_uncertain,
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
            poll_interval,
            unwind_samples,
            unwind_tables,
            names: None,
        })
    }

    /// Rebuilds the energy families from the ledger (cheap: a few thousand series at most).
    pub(super) fn publish(&mut self) {
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
