//! The one row model every output reads: a window's processes and their threads, with CPU
//! time, samples, energy per domain, power, share and confidence interval. `report`
//! (table, JSON, CSV), the `top` screen and batch frames, and the agent's metrics all
//! render these rows; none of them computes a per-process number of its own.
//!
//! The serialized form is the `processes[]` of `report --format json` and of every
//! `top --batch --format json` frame.

use std::collections::BTreeMap;

use serde::Serialize;

/// Energy per domain name (`package`, `dram`, `gpu`, ...), J.
pub type DomainJoules = BTreeMap<&'static str, f64>;

/// One thread of a process, over one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThreadRow {
    /// Thread id.
    pub tid: u32,
    /// Thread name (`comm`).
    pub comm: String,
    /// On-CPU time in the window, ns.
    pub cpu_ns: u64,
    /// CPU use over the window in percent of one CPU (like top: up to 100 × CPUs).
    pub cpu_pct: f64,
    /// Stack samples taken while it ran.
    pub samples: u64,
    /// Energy per domain, J.
    pub energy_j: DomainJoules,
    /// Average power over the window (headline domains), W.
    pub power_w: f64,
    /// Share of the window's measured headline energy, 0..=1.
    pub share: f64,
    /// Headline energy since the pipeline started, J (`top`'s energy column).
    #[serde(skip)]
    pub since_start_j: f64,
    /// The function most of its samples ran (`py:f (file.py:12)`, a JIT name, or a native
    /// symbol); empty where not named (`report`, or no samples).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub top_function: String,
}

/// One process over one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessRow {
    /// Process id (tgid).
    pub pid: u32,
    /// 0 for the first process with this pid in the window, 1 for the next one after the
    /// pid was freed and reused, and so on: a reused PID never merges two processes.
    #[serde(skip_serializing_if = "is_zero")]
    pub instance: u32,
    /// Short name (`comm` of the main thread when known).
    pub comm: String,
    /// Full command line; empty for kernel threads and when unknown.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cmdline: String,
    /// cgroup v2 path (or id when no path is known); empty when unknown.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cgroup: String,
    /// Container id the cgroup path names (docker, containerd, CRI-O, podman); empty when
    /// it names none.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    /// Kubernetes pod UID the cgroup path names; empty when it names none.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pod_uid: String,
    /// On-CPU time of all its threads, ns.
    pub cpu_ns: u64,
    /// CPU use over the window in percent of one CPU.
    pub cpu_pct: f64,
    /// Stack samples of all its threads.
    pub samples: u64,
    /// Energy per domain, J.
    pub energy_j: DomainJoules,
    /// Average power over the window (headline domains), W.
    pub power_w: f64,
    /// Share of the window's measured headline energy, 0..=1.
    pub share: f64,
    /// 95% confidence interval of the headline energy, J, from the stack samples (ALEA).
    pub ci_j: [f64; 2],
    /// Threads, busiest first.
    pub threads: Vec<ThreadRow>,
    /// Busy share of each CPU of the window, 0..=1, in CPU id order.
    #[serde(skip)]
    pub cpu_share: Vec<f64>,
    /// Headline energy since the pipeline started, J (`top`'s energy column).
    #[serde(skip)]
    pub since_start_j: f64,
    /// The function most of its threads' samples ran (see [`ThreadRow::top_function`]).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub top_function: String,
}

impl ProcessRow {
    /// The container and pod the rollup read from the row's cgroup (`container_id`,
    /// `pod_uid`), without parsing the path again; the runtime is not kept.
    pub fn container(&self) -> crate::container::ContainerRef {
        crate::container::ContainerRef {
            container_id: (!self.container_id.is_empty()).then(|| self.container_id.clone()),
            pod_uid: (!self.pod_uid.is_empty()).then(|| self.pod_uid.clone()),
            runtime: None,
        }
    }
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}
