//! The Prometheus exposition: the [`Ledger`](super::ledger::Ledger)'s series and the agent's own figures in a
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

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use super::{
    ledger::WindowEnergy,
    selfstat,
    sink::{Sink, SinkError},
};
use crate::{
    attribute::domain_name,
    energy::model,
    pb::v1::{self as pb, process_event::Kind},
    pipeline::Window,
};

pub(crate) mod carbon;
mod state;

use state::State;

/// Label pairs of one series (absent labels are left out rather than empty).
type Labels = Vec<(&'static str, String)>;
/// The labels of `energy_bpf_samples_unwound_total`: how the stack was walked, why it ended.
fn unwind_labels(method: pb::UnwindMethod, stop: pb::UnwindStop) -> Labels {
    let method = match method {
        pb::UnwindMethod::Dwarf => "dwarf",
        pb::UnwindMethod::FramePointer => "frame_pointer",
    };
    vec![
        ("method", method.into()),
        ("stop", crate::record::stop_name(stop).into()),
    ]
}

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
    /// Grams of CO2e, with `--carbon-*` flags.
    carbon: Mutex<Option<carbon::CarbonMetrics>>,
}

impl Metrics {
    /// Empty metrics; at most `max_series` processes get series of their own.
    pub fn new(max_series: usize) -> Result<Arc<Self>, MetricsError> {
        let mut state = State::new(max_series)?;
        let carbon = carbon::CarbonMetrics::new(&mut state.registry);
        Ok(Arc::new(Self {
            state: Mutex::new(state),
            carbon: Mutex::new(carbon),
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
        // Counted per (method, stop) first: one label set per kind a poll saw, not per sample.
        let mut kinds: Vec<((pb::UnwindMethod, pb::UnwindStop), u64)> = Vec::new();
        for sample in &chunk.samples {
            let kind = (sample.unwind_method(), sample.unwind_stop());
            match kinds.iter_mut().find(|(k, _)| *k == kind) {
                Some((_, n)) => *n += 1,
                None => kinds.push((kind, 1)),
            }
        }
        for ((method, stop), n) in kinds {
            s.unwind_samples
                .get_or_create(&unwind_labels(method, stop))
                .inc_by(n);
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
        s.power_model_uncertain.clear();
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
            s.power_model_uncertain
                .get_or_create(&vec![
                    ("source", src.name.clone()),
                    ("model", src.power_model.name().to_owned()),
                ])
                .set(i64::from(src.power_model_uncertain.is_some()));
        }
        let packages = |d: i32| w.analysis.sources.iter().filter(|s| s.domain == d).count();
        for src in &w.analysis.sources {
            let zone = domain_name(src.domain());
            let zone = if packages(src.domain) > 1 {
                format!("{zone}-{}", src.package)
            } else {
                zone.to_string()
            };
            let mut labels = vec![
                ("source", src.kind.clone()),
                ("zone", zone),
                ("estimated", model::is_model(src).to_string()),
            ];
            // The power-table row behind a modelled source, and its error (docs/estimated-energy.md).
            if model::is_model(src) && !src.model_row.is_empty() {
                labels.push(("model_row", src.model_row.clone()));
                labels.push(("model_error", format!("{:.1}", src.model_error_pct)));
            }
            s.source_info.get_or_create(&labels).set(1);
        }
        s.publish();
        // Under the state's lock: a scrape sees the window's grams with its joules.
        if let Some(c) = self
            .carbon
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            c.window(w);
        }
    }

    /// Adds each running VM's window energy to `energy_bpf_vm_joules_total`, per zone,
    /// dynamic and static apart.
    pub fn vm_window<'a>(&self, vms: impl IntoIterator<Item = &'a crate::vm::VmEnergy>) {
        let s = self.lock();
        for vm in vms {
            for (part, zones) in [("dynamic", &vm.dynamic_j), ("static", &vm.static_j)] {
                for (&zone, &j) in zones {
                    s.vm.get_or_create(&vec![
                        ("vm", vm.name.clone()),
                        ("zone", zone.into()),
                        ("part", part.into()),
                    ])
                    .inc_by(j.max(0.0));
                }
            }
        }
    }

    /// Drops the series of a VM that exited.
    pub fn vm_gone(&self, name: &str) {
        let s = self.lock();
        let gone: Vec<Labels> = ["package", "cores", "dram", "uncore", "psys", "gpu", "other"]
            .into_iter()
            .flat_map(|zone| {
                ["dynamic", "static"].map(|part| {
                    vec![
                        ("vm", name.to_owned()),
                        ("zone", zone.to_owned()),
                        ("part", part.to_owned()),
                    ]
                })
            })
            .collect();
        for labels in gone {
            s.vm.remove(&labels);
        }
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

    /// The capture loop's time between polls, as it now stands.
    pub fn set_poll_interval(&self, interval: Duration) {
        self.lock().poll_interval.set(interval.as_secs_f64());
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
