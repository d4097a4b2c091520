//! The agent's carbon series, with `--carbon-*` flags: `energy_bpf_co2e_grams_total` per
//! process (`pid`, `comm`), container or pod (`container_id`, `pod_uid`) and for the node
//! (`mode`), and `energy_bpf_grid_intensity` (the intensity the last window used, its
//! `source` kind and `fallback`). Grams are computed once per window from the window's rows
//! (headline energy × intensity), never per event.
//!
//! A process keeps its series while it shows up; three windows after it last did, its grams
//! fold into `comm="[exited]"`, and beyond [`MAX_PROCESSES`] into `comm="[other]"`, so the
//! process series (with `mode="idle"` of the node) always sum to the node's grams.

use std::{
    collections::BTreeMap,
    sync::{Mutex, OnceLock, atomic::AtomicU64},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{carbon::Carbon, pipeline::Window};

type Labels = Vec<(&'static str, String)>;

/// Processes with a carbon series of their own.
const MAX_PROCESSES: usize = 500;
/// Windows an absent process keeps its series.
const LINGER_WINDOWS: u64 = 3;

/// The agent's intensity source, set once at start from the flags.
static SOURCE: OnceLock<Mutex<Carbon>> = OnceLock::new();

/// Sets the agent's intensity source (the first call wins).
pub fn set_source(c: Carbon) {
    let _ = SOURCE.set(Mutex::new(c));
}

/// The agent's intensity now, when it has a source (the OTLP sink's co2e profiles).
pub fn intensity_now() -> Option<crate::carbon::Intensity> {
    let source = SOURCE.get()?;
    Some(
        source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .now(),
    )
}

#[derive(Default)]
struct Process {
    comm: String,
    container_id: String,
    pod_uid: String,
    grams: f64,
    last_seen: u64,
}

/// Carbon state and families.
#[derive(Default)]
pub(super) struct CarbonMetrics {
    grams: Family<Labels, Counter<f64, AtomicU64>>,
    intensity: Family<Labels, Gauge<f64, AtomicU64>>,
    processes: BTreeMap<u32, Process>,
    folded: BTreeMap<&'static str, f64>,
    containers: BTreeMap<(String, String), f64>,
    node: BTreeMap<&'static str, f64>,
    windows: u64,
}

impl CarbonMetrics {
    /// Registers the families when the agent has an intensity source; `None` otherwise.
    pub(super) fn new(registry: &mut Registry) -> Option<Self> {
        SOURCE.get()?;
        let c = Self::default();
        registry.register(
            "energy_bpf_co2e_grams",
            "Grams of CO2e since the agent started: per process (pid, comm), container or pod (container_id, pod_uid), and for the node (mode=\"active\"|\"idle\"); the intensity used is energy_bpf_grid_intensity",
            c.grams.clone(),
        );
        registry.register(
            "energy_bpf_grid_intensity",
            "Grid intensity the last window used, gCO2e/kWh before PUE; source is its kind (fixed, yearly, series, live, fallback)",
            c.intensity.clone(),
        );
        Some(c)
    }

    /// Adds a window's grams and republishes.
    pub(super) fn window(&mut self, w: &Window) {
        let Some(source) = SOURCE.get() else {
            return;
        };
        let i = source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .now();
        self.windows += 1;
        let now = self.windows;
        let total = w.totals.total_j;
        let idle = w.totals.idle_j.max(0.0);
        *self.node.entry("active").or_default() += i.grams((total - idle).max(0.0));
        *self.node.entry("idle").or_default() += i.grams(idle);
        for p in &w.processes {
            let g = i.grams(p.share * total);
            *self
                .containers
                .entry((p.container_id.clone(), p.pod_uid.clone()))
                .or_default() += g;
            if let Some(t) = self.processes.get_mut(&p.pid) {
                t.grams += g;
                t.last_seen = now;
            } else if self.processes.len() < MAX_PROCESSES {
                self.processes.insert(
                    p.pid,
                    Process {
                        comm: p.comm.clone(),
                        container_id: p.container_id.clone(),
                        pod_uid: p.pod_uid.clone(),
                        grams: g,
                        last_seen: now,
                    },
                );
            } else {
                *self.folded.entry("[other]").or_default() += g;
            }
        }
        // What no process was given (unknown time) still counts towards the node.
        let given: f64 = w.processes.iter().map(|p| p.share).sum::<f64>() * total;
        let rest = (total - idle - given).max(0.0);
        if rest > 0.0 {
            *self.folded.entry("[unknown]").or_default() += i.grams(rest);
        }
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(_, t)| now - t.last_seen >= LINGER_WINDOWS)
            .map(|(&pid, _)| pid)
            .collect();
        for pid in gone {
            if let Some(t) = self.processes.remove(&pid) {
                *self.folded.entry("[exited]").or_default() += t.grams;
            }
        }
        self.publish(&i);
    }

    fn publish(&self, i: &crate::carbon::Intensity) {
        self.grams.clear();
        for (mode, g) in &self.node {
            self.grams
                .get_or_create(&vec![("mode", (*mode).into())])
                .inc_by(*g);
        }
        for (pid, t) in &self.processes {
            let mut labels = vec![("pid", pid.to_string()), ("comm", t.comm.clone())];
            if !t.container_id.is_empty() {
                labels.push(("container_id", t.container_id.clone()));
            }
            if !t.pod_uid.is_empty() {
                labels.push(("pod_uid", t.pod_uid.clone()));
            }
            self.grams.get_or_create(&labels).inc_by(t.grams);
        }
        for (comm, g) in &self.folded {
            self.grams
                .get_or_create(&vec![("comm", (*comm).into())])
                .inc_by(*g);
        }
        for ((id, pod), g) in &self.containers {
            if id.is_empty() && pod.is_empty() {
                continue;
            }
            let mut labels = Labels::new();
            if !id.is_empty() {
                labels.push(("container_id", id.clone()));
            }
            if !pod.is_empty() {
                labels.push(("pod_uid", pod.clone()));
            }
            self.grams.get_or_create(&labels).inc_by(*g);
        }
        self.intensity.clear();
        let kind = if i.fallback {
            "fallback"
        } else {
            i.source.split([' ', ',']).next().unwrap_or("fixed")
        };
        self.intensity
            .get_or_create(&vec![
                ("source", kind.to_string()),
                ("fallback", i.fallback.to_string()),
                ("pue", i.pue.to_string()),
            ])
            .set(i.g_per_kwh);
    }
}
