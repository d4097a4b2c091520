//! Per-process and per-thread totals of a recording: on-CPU time from the switch timeline,
//! share of each CPU, sample counts. Pure: a function of the [`Recording`].

use std::collections::BTreeMap;

use serde::Serialize;

use crate::{record::Recording, timeline::Timeline};

/// One thread's totals.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ThreadSummary {
    /// Thread id.
    pub tid: u32,
    /// Command name.
    pub comm: String,
    /// On-CPU time over the recording, ns.
    pub cpu_ns: u64,
    /// Stack samples taken while it ran.
    pub samples: u64,
    /// On-CPU ns per CPU id.
    #[serde(skip)]
    pub cpu_ns_by_cpu: BTreeMap<u32, u64>,
}

/// One process's totals.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// Command name (of the main thread when known).
    pub comm: String,
    /// Command line, when known.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cmdline: String,
    /// On-CPU time of all its threads, ns.
    pub cpu_ns: u64,
    /// Stack samples of all its threads.
    pub samples: u64,
    /// Threads, busiest first.
    pub threads: Vec<ThreadSummary>,
    /// On-CPU ns per CPU id.
    #[serde(skip)]
    pub cpu_ns_by_cpu: BTreeMap<u32, u64>,
}

/// Totals of a whole recording.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Processes, busiest first.
    pub processes: Vec<ProcessSummary>,
    /// Capture length, ns.
    pub duration_ns: u64,
    /// Events lost in the kernel (ring buffer full), all kinds.
    pub lost_events: u64,
    /// Time on CPUs whose task was unknown, ns (should be ~0 with next-task tracking).
    pub unknown_ns: u64,
    /// CPU ids in the recording.
    pub cpus: Vec<u32>,
}

/// Summarises a recording over its timeline.
pub fn summarize(rec: &Recording, timeline: &Timeline) -> Summary {
    let mut threads: BTreeMap<(u32, u32), ThreadSummary> = BTreeMap::new();
    let mut unknown_ns = 0;
    for cpu in &timeline.cpus {
        for run in &cpu.runs {
            if run.tid == crate::timeline::UNKNOWN_TID {
                unknown_ns += run.len_ns();
            }
            if !run.is_busy() {
                continue;
            }
            let t = threads.entry((run.tgid, run.tid)).or_default();
            t.cpu_ns += run.len_ns();
            *t.cpu_ns_by_cpu.entry(cpu.cpu).or_default() += run.len_ns();
        }
    }
    for s in &rec.samples {
        threads.entry((s.tgid, s.tid)).or_default().samples += 1;
    }
    let mut processes: BTreeMap<u32, ProcessSummary> = BTreeMap::new();
    for ((tgid, tid), mut t) in threads {
        t.tid = tid;
        t.comm = rec
            .threads
            .get(&tid)
            .map(|i| i.comm.clone())
            .unwrap_or_default();
        let p = processes.entry(tgid).or_default();
        p.pid = tgid;
        p.cpu_ns += t.cpu_ns;
        p.samples += t.samples;
        for (&cpu, &ns) in &t.cpu_ns_by_cpu {
            *p.cpu_ns_by_cpu.entry(cpu).or_default() += ns;
        }
        p.threads.push(t);
    }
    let mut processes: Vec<ProcessSummary> = processes
        .into_values()
        .map(|mut p| {
            let main = rec.threads.get(&p.pid);
            p.comm = main
                .map(|i| i.comm.clone())
                .or_else(|| p.threads.first().map(|t| t.comm.clone()))
                .unwrap_or_default();
            p.cmdline = main.map(|i| i.cmdline.clone()).unwrap_or_default();
            p.threads
                .sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.tid.cmp(&b.tid)));
            p
        })
        .collect();
    processes.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.pid.cmp(&b.pid)));
    let l = &rec.losses;
    Summary {
        processes,
        duration_ns: timeline.end_ns.saturating_sub(timeline.start_ns),
        lost_events: l.switch_dropped + l.sample_dropped + l.process_dropped,
        unknown_ns,
        cpus: timeline.cpus.iter().map(|c| c.cpu).collect(),
    }
}
