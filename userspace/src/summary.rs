//! Per-process and per-thread totals of a recording: on-CPU time from the switch timeline,
//! share of each CPU, sample counts. Pure: a function of the [`Recording`].

use std::collections::{BTreeMap, HashMap};

use crate::{pb::v1::process_event::Kind, record::Recording, timeline::Timeline};

/// One thread's totals.
#[derive(Clone, Debug, Default)]
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
    pub cpu_ns_by_cpu: BTreeMap<u32, u64>,
}

/// One process's totals.
#[derive(Clone, Debug, Default)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// 0 for the first process with this pid in the recording, 1 for the next one after the
    /// pid was freed and reused, and so on: a reused PID never merges two processes.
    pub instance: u32,
    /// Command name (of the main thread when known).
    pub comm: String,
    /// Command line, when known.
    pub cmdline: String,
    /// On-CPU time of all its threads, ns.
    pub cpu_ns: u64,
    /// Stack samples of all its threads.
    pub samples: u64,
    /// Threads, busiest first.
    pub threads: Vec<ThreadSummary>,
    /// On-CPU ns per CPU id.
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

/// When each process id's holder exited, to tell apart processes that reused a pid.
#[derive(Clone, Debug, Default)]
pub struct Lifetimes {
    exits: HashMap<u32, Vec<u64>>,
}

impl Lifetimes {
    /// Indexes the main-thread exits of a recording.
    pub fn of(rec: &Recording) -> Self {
        let mut exits: HashMap<u32, Vec<u64>> = HashMap::new();
        for e in &rec.process_events {
            if e.kind() == Kind::Exit && e.tid == e.tgid {
                exits.entry(e.tgid).or_default().push(e.ts_ns);
            }
        }
        for v in exits.values_mut() {
            v.sort_unstable();
        }
        Self { exits }
    }

    /// Which instance of `tgid` was alive at `ts_ns` (0 = the first one seen).
    pub fn instance(&self, tgid: u32, ts_ns: u64) -> u32 {
        self.exits
            .get(&tgid)
            .map_or(0, |v| v.partition_point(|&t| t < ts_ns) as u32)
    }
}

/// Summarises a recording over its timeline.
pub fn summarize(rec: &Recording, timeline: &Timeline) -> Summary {
    let lifetimes = Lifetimes::of(rec);
    let mut threads: BTreeMap<(u32, u32, u32), ThreadSummary> = BTreeMap::new();
    let mut unknown_ns = 0;
    for cpu in &timeline.cpus {
        for run in &cpu.runs {
            if run.tid == crate::timeline::UNKNOWN_TID {
                unknown_ns += run.len_ns();
            }
            if !run.is_busy() {
                continue;
            }
            let t = threads
                .entry((
                    run.tgid,
                    lifetimes.instance(run.tgid, run.start_ns),
                    run.tid,
                ))
                .or_default();
            t.cpu_ns += run.len_ns();
            *t.cpu_ns_by_cpu.entry(cpu.cpu).or_default() += run.len_ns();
        }
    }
    for s in &rec.samples {
        threads
            .entry((s.tgid, lifetimes.instance(s.tgid, s.ts_ns), s.tid))
            .or_default()
            .samples += 1;
    }
    let mut processes: BTreeMap<(u32, u32), ProcessSummary> = BTreeMap::new();
    for ((tgid, instance, tid), mut t) in threads {
        t.tid = tid;
        t.comm = rec
            .threads
            .get(&tid)
            .map(|i| i.comm.clone())
            .unwrap_or_default();
        let p = processes.entry((tgid, instance)).or_default();
        p.pid = tgid;
        p.instance = instance;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::{Header, ProcessEvent, SwitchEvent};

    #[test]
    fn a_reused_pid_is_two_processes() {
        // pid 50 runs on cpu 0, exits at 300, and a new process gets pid 50 at 400.
        let sw = |ts_ns, tid, next_tid| SwitchEvent {
            ts_ns,
            cpu: 0,
            tid,
            tgid: tid,
            next_known: true,
            next_tid,
            next_tgid: next_tid,
            ..Default::default()
        };
        let rec = Recording {
            header: Header {
                start_ns: 0,
                cpus: vec![crate::pb::v1::Cpu {
                    id: 0,
                    ..Default::default()
                }],
                ..Default::default()
            },
            switches: vec![
                sw(100, 0, 50),
                sw(300, 50, 0),
                sw(400, 0, 50),
                sw(450, 50, 0),
            ],
            process_events: vec![ProcessEvent {
                ts_ns: 299,
                kind: Kind::Exit as i32,
                tid: 50,
                tgid: 50,
                ..Default::default()
            }],
            end_ns: 500,
            ..Default::default()
        };
        let s = summarize(&rec, &rec.timeline());
        let fifty: Vec<(u32, u64)> = s
            .processes
            .iter()
            .filter(|p| p.pid == 50)
            .map(|p| (p.instance, p.cpu_ns))
            .collect();
        assert_eq!(fifty, vec![(0, 200), (1, 50)]);
    }
}
