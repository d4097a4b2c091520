//! The rollup: one window's attribution, timeline and samples into process and thread
//! [`ProcessRow`]s, and those into cgroup and command groups. The only place per-process
//! numbers are computed; every output reads its result.
//!
//! A pid reused within a window appears once per instance (told apart by the main thread's
//! exit events). Attribution keys threads by `(tgid, tid)`, so a reused pid's energy is
//! divided between its instances by their CPU time.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::rows::{ProcessRow, ThreadRow};
use crate::{
    attribute::{Attribution, PerDomain, ThreadEnergy, split::ThreadKey},
    pb::v1::{ProcessEvent, Sample, ThreadInfo, process_event::Kind},
    timeline::{IDLE_TID, Timeline, UNKNOWN_TID},
};

/// Maps keyed by ids and looked up once per run: foldhash (randomly seeded per map) rather
/// than SipHash, which cost a tenth of the pipeline at a million switches per second.
type FastMap<K, V> = foldhash::HashMap<K, V>;

/// What the rollup reads.
#[derive(Clone, Copy)]
pub struct RollupInput<'a> {
    /// The window's attribution.
    pub attribution: &'a Attribution,
    /// The window's timeline (its start and end are the window's).
    pub timeline: &'a Timeline,
    /// The window's samples, aligned with `attribution.sample_energy`.
    pub samples: &'a [Sample],
    /// The window's lifecycle events (main-thread exits separate PID instances).
    pub process_events: &'a [ProcessEvent],
    /// Latest known info per thread id.
    pub threads: &'a HashMap<u32, ThreadInfo>,
    /// cgroup id to the name shown (a path where one is known).
    pub cgroup_name: &'a dyn Fn(u64) -> String,
}

/// When a process id was given to a new process after its holder exited, to tell apart
/// processes that reused a pid. A new instance starts at the fork that creates a process
/// with that pid after the main thread's exit, not at the exit itself: an exiting task can
/// still be switched in and out after its exit event, and that is still the old process.
#[derive(Clone, Debug, Default)]
struct Lifetimes {
    births: FastMap<u32, Vec<u64>>,
}

impl Lifetimes {
    fn of(events: &[ProcessEvent]) -> Self {
        let mut sorted: Vec<&ProcessEvent> = events.iter().collect();
        sorted.sort_by_key(|e| e.ts_ns);
        let mut exited: HashSet<u32> = HashSet::new();
        let mut births: FastMap<u32, Vec<u64>> = FastMap::default();
        for e in sorted {
            match e.kind() {
                Kind::Exit if e.tid == e.tgid => {
                    exited.insert(e.tgid);
                }
                Kind::Fork if e.child_tid == e.child_tgid && exited.remove(&e.child_tgid) => {
                    births.entry(e.child_tgid).or_default().push(e.ts_ns);
                }
                _ => {}
            }
        }
        Self { births }
    }

    /// Whether `tgid` was given to a new process in the window.
    fn reused(&self, tgid: u32) -> bool {
        self.births.contains_key(&tgid)
    }

    /// Which instance of `tgid` was alive at `ts_ns` (0 = the first one seen).
    fn instance(&self, tgid: u32, ts_ns: u64) -> u32 {
        if self.births.is_empty() {
            return 0;
        }
        self.births
            .get(&tgid)
            .map_or(0, |v| v.partition_point(|&t| t <= ts_ns) as u32)
    }
}

#[derive(Default)]
struct ThreadFacts {
    cpu_ns: u64,
    samples: u64,
    cgroup_id: u64,
}

/// The process rows of one window, largest share first.
pub fn processes(input: &RollupInput<'_>) -> Vec<ProcessRow> {
    let attr = input.attribution;
    let tl = input.timeline;
    let window_ns = tl.end_ns.saturating_sub(tl.start_ns).max(1);
    // Average power over the time the energy was measured (a slow counter's head and tail
    // are not in its energy), not over the window.
    let secs = attr.power_span_ns(window_ns) as f64 / 1e9;
    let total = attr.total_uj();
    let lifetimes = Lifetimes::of(input.process_events);

    // (tgid, instance, tid) -> facts, from the exact timeline and the samples.
    // Gathered in a hash map (one lookup per thread and CPU), ordered once at the end.
    let mut facts: FastMap<(u32, u32, u32), ThreadFacts> = FastMap::default();
    // On-CPU ns per process instance and CPU (by the CPU's index in the timeline): summed
    // per process as they come, not held per thread and CPU.
    let mut by_cpu: FastMap<(u32, u32), Vec<u64>> = FastMap::default();
    let ncpus = tl.cpus.len();
    // Threads are summed flat (see `timeline::sums`): the same integer sums, and the same
    // last non-zero cgroup id, as adding run by run. A reused pid's runs are walked one by
    // one, since which instance a run is of depends on its time.
    let mut apart = Vec::new();
    // Per process slot, flat: a window of many processes on many CPUs hashes once per
    // process, not once per process and CPU.
    let mut by_slot: Vec<(u32, Vec<u64>)> = Vec::new();
    let busy = tl.busy_by_thread(
        &|tgid| lifetimes.reused(tgid),
        &mut apart,
        Some(&mut |ci, slot, tgid, ns| {
            if slot >= by_slot.len() {
                by_slot.resize_with(slot + 1, || (0, Vec::new()));
            }
            let (of, per_cpu) = &mut by_slot[slot];
            if per_cpu.is_empty() {
                *of = tgid;
                per_cpu.resize(ncpus, 0);
            }
            per_cpu[ci] += ns;
        }),
    );
    by_cpu.extend(
        by_slot
            .into_iter()
            .filter(|(_, per_cpu)| !per_cpu.is_empty())
            .map(|(tgid, per_cpu)| ((tgid, 0), per_cpu)),
    );
    for ((tgid, tid), ns, cgroup_id) in busy {
        let f = facts.entry((tgid, 0, tid)).or_default();
        f.cpu_ns += ns;
        if cgroup_id != 0 {
            f.cgroup_id = cgroup_id;
        }
    }
    for (ci, run) in apart {
        let inst = lifetimes.instance(run.tgid, run.start_ns);
        let f = facts.entry((run.tgid, inst, run.tid)).or_default();
        f.cpu_ns += run.len_ns();
        if run.cgroup_id != 0 {
            f.cgroup_id = run.cgroup_id;
        }
        by_cpu
            .entry((run.tgid, inst))
            .or_insert_with(|| vec![0; ncpus])[ci] += run.len_ns();
    }
    for s in input.samples {
        if s.tid != IDLE_TID && s.tid != UNKNOWN_TID {
            let inst = lifetimes.instance(s.tgid, s.ts_ns);
            facts.entry((s.tgid, inst, s.tid)).or_default().samples += 1;
        }
    }
    let mut facts: BTreeMap<(u32, u32, u32), ThreadFacts> = facts.into_iter().collect();
    // Threads that got energy without running or being sampled here (a GPU's energy by
    // utilisation, say) still get a row, so the rows add up to the attributed energy.
    let seen: foldhash::HashSet<(u32, u32)> = facts.keys().map(|&(p, _, t)| (p, t)).collect();
    for t in &attr.threads {
        if !seen.contains(&(t.tgid, t.tid)) && attr.headline_uj(&t.energy) != 0.0 {
            facts.entry((t.tgid, 0, t.tid)).or_default().cgroup_id = t.cgroup_id;
        }
    }

    let energy: FastMap<ThreadKey, &ThreadEnergy> =
        attr.threads.iter().map(|t| ((t.tgid, t.tid), t)).collect();
    // A thread's energy is divided between the instances of its pid by its own CPU time in
    // each (all of it to the first instance it appears in when it never ran), so every
    // thread's energy is counted exactly once.
    let mut tid_cpu: FastMap<ThreadKey, u64> = FastMap::default();
    let mut tid_first: FastMap<ThreadKey, u32> = FastMap::default();
    for (&(tgid, inst, tid), f) in &facts {
        *tid_cpu.entry((tgid, tid)).or_default() += f.cpu_ns;
        tid_first.entry((tgid, tid)).or_insert(inst);
    }
    let part_of = |tgid: u32, inst: u32, tid: u32, cpu_ns: u64| -> f64 {
        match tid_cpu.get(&(tgid, tid)).copied().unwrap_or(0) {
            0 => f64::from(u8::from(tid_first.get(&(tgid, tid)) == Some(&inst))),
            all => cpu_ns as f64 / all as f64,
        }
    };
    let mut instances: BTreeMap<(u32, u32), Vec<(u32, ThreadFacts)>> = BTreeMap::new();
    for ((tgid, inst, tid), f) in facts {
        instances.entry((tgid, inst)).or_default().push((tid, f));
    }
    let cpu_ids: Vec<u32> = tl.cpus.iter().map(|c| c.cpu).collect();
    let name_of = |tid: u32, fallback: &str| -> String {
        input
            .threads
            .get(&tid)
            .map(|i| i.comm.clone())
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| fallback.to_string())
    };

    let mut rows: Vec<ProcessRow> = instances
        .into_iter()
        .map(|((pid, instance), threads)| {
            let mut e_proc = PerDomain::default();
            let mut sd_proc = PerDomain::default();
            let by_cpu = by_cpu
                .remove(&(pid, instance))
                .unwrap_or_else(|| vec![0; cpu_ids.len()]);
            let mut cgroup_id = 0;
            let mut thread_rows: Vec<ThreadRow> = threads
                .into_iter()
                .map(|(tid, f)| {
                    let te = energy.get(&(pid, tid));
                    let part = part_of(pid, instance, tid, f.cpu_ns);
                    let e = te.map(|t| scale(&t.energy, part)).unwrap_or_default();
                    e_proc.add_all(&e);
                    // Threads of one process share its class: their errors add up.
                    sd_proc.add_all(&te.map(|t| scale(&t.model_sd, part)).unwrap_or_default());
                    if cgroup_id == 0 || tid == pid {
                        cgroup_id = if f.cgroup_id != 0 {
                            f.cgroup_id
                        } else {
                            te.map_or(cgroup_id, |t| t.cgroup_id)
                        };
                    }
                    let uj = attr.headline_uj(&e);
                    ThreadRow {
                        tid,
                        comm: name_of(tid, te.map_or("", |t| t.comm.as_str())),
                        cpu_ns: f.cpu_ns,
                        cpu_pct: 100.0 * f.cpu_ns as f64 / window_ns as f64,
                        samples: f.samples,
                        energy_j: e.joules_by_name(),
                        power_w: uj * 1e-6 / secs,
                        share: if total > 0.0 { uj / total } else { 0.0 },
                        since_start_j: uj * 1e-6,
                        top_function: String::new(),
                    }
                })
                .collect();
            thread_rows.sort_by(|a, b| {
                b.power_w
                    .total_cmp(&a.power_w)
                    .then(b.cpu_ns.cmp(&a.cpu_ns))
                    .then(a.tid.cmp(&b.tid))
            });
            let headline = attr.headline_uj(&e_proc);
            let main = input.threads.get(&pid);
            let comm = main
                .map(|i| i.comm.clone())
                .filter(|c| !c.is_empty())
                .or_else(|| {
                    thread_rows
                        .iter()
                        .find(|t| t.tid == pid)
                        .or(thread_rows.first())
                        .map(|t| t.comm.clone())
                })
                .unwrap_or_default();
            let cpu_ns: u64 = thread_rows.iter().map(|t| t.cpu_ns).sum();
            let cgroup = if cgroup_id == 0 {
                String::new()
            } else {
                (input.cgroup_name)(cgroup_id)
            };
            let container = crate::container::parse(&cgroup);
            ProcessRow {
                pid,
                instance,
                // The command line is read once per process, with whichever of its
                // threads was seen first: not always the main one.
                cmdline: main
                    .map(|i| i.cmdline.clone())
                    .filter(|c| !c.is_empty())
                    .or_else(|| {
                        thread_rows.iter().find_map(|t| {
                            input
                                .threads
                                .get(&t.tid)
                                .filter(|i| i.tgid == pid && !i.cmdline.is_empty())
                                .map(|i| i.cmdline.clone())
                        })
                    })
                    .unwrap_or_default(),
                comm,
                container_id: container.container_id.unwrap_or_default(),
                pod_uid: container.pod_uid.unwrap_or_default(),
                cgroup,
                cpu_ns,
                cpu_pct: 100.0 * cpu_ns as f64 / window_ns as f64,
                samples: thread_rows.iter().map(|t| t.samples).sum(),
                energy_j: e_proc.joules_by_name(),
                power_w: headline * 1e-6 / secs,
                share: if total > 0.0 { headline / total } else { 0.0 },
                // Whole threads carry no sampling error (attribute::ci: a stratum that is
                // all in or all out of the group adds no variance), so neither do whole
                // processes; what they carry is the model's error (fitted per-class watts,
                // estimated static power: attribute::uncertainty), as a 95% interval.
                ci_j: {
                    let sd = 1.96 * attr.headline_uj(&sd_proc);
                    [(headline - sd).max(0.0) * 1e-6, (headline + sd) * 1e-6]
                },
                threads: thread_rows,
                top_function: String::new(),
                cpu_share: by_cpu
                    .iter()
                    .map(|&ns| ns as f64 / window_ns as f64)
                    .collect(),
                since_start_j: headline * 1e-6,
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.share
            .total_cmp(&a.share)
            .then(b.cpu_ns.cmp(&a.cpu_ns))
            .then(a.pid.cmp(&b.pid))
            .then(a.instance.cmp(&b.instance))
    });
    rows
}

fn scale(e: &PerDomain, k: f64) -> PerDomain {
    let mut out = *e;
    for v in &mut out.0 {
        *v *= k;
    }
    out
}

/// What process rows are grouped by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupBy {
    /// The cgroup (container, service).
    Cgroup,
    /// The command name.
    Command,
    /// The container (or Kubernetes pod, or `[host]` outside both).
    Container,
}

/// Sums process rows into one row per cgroup or command (the key in `comm`, `pid` 0, the
/// member processes' threads in `threads`); largest share first. Confidence intervals add
/// as if the members' errors were independent and of the same sign, which is conservative.
pub(crate) fn group<'a>(
    rows: impl IntoIterator<Item = &'a ProcessRow>,
    by: GroupBy,
) -> Vec<ProcessRow> {
    let mut groups: BTreeMap<String, ProcessRow> = BTreeMap::new();
    for p in rows {
        let key = group_key(p, by);
        let g = groups.entry(key.clone()).or_insert_with(|| ProcessRow {
            comm: key.clone(),
            container_id: p.container_id.clone(),
            pod_uid: p.pod_uid.clone(),
            cgroup: if by == GroupBy::Cgroup {
                key
            } else {
                String::new()
            },
            cpu_share: vec![0.0; p.cpu_share.len()],
            ..ProcessRow::default()
        });
        g.cpu_ns += p.cpu_ns;
        g.cpu_pct += p.cpu_pct;
        g.samples += p.samples;
        for (d, j) in &p.energy_j {
            *g.energy_j.entry(d).or_default() += j;
        }
        g.power_w += p.power_w;
        g.share += p.share;
        g.ci_j[0] += p.ci_j[0];
        g.ci_j[1] += p.ci_j[1];
        g.since_start_j += p.since_start_j;
        for (a, b) in g.cpu_share.iter_mut().zip(&p.cpu_share) {
            *a += b;
        }
        g.threads.extend(p.threads.iter().cloned());
    }
    let mut out: Vec<ProcessRow> = groups.into_values().collect();
    out.sort_by(|a, b| b.share.total_cmp(&a.share).then(a.comm.cmp(&b.comm)));
    out
}

/// The group a process row sums into (the grouped row's `comm`).
pub(crate) fn group_key(p: &ProcessRow, by: GroupBy) -> String {
    match by {
        GroupBy::Cgroup => p.cgroup.clone(),
        GroupBy::Command => p.comm.clone(),
        GroupBy::Container => container_key(p),
    }
}

/// What `--by container` groups a process under: its container id, else its pod, else
/// `[host]`.
fn container_key(p: &ProcessRow) -> String {
    if !p.container_id.is_empty() {
        p.container_id.clone()
    } else if !p.pod_uid.is_empty() {
        format!("pod:{}", p.pod_uid)
    } else {
        "[host]".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sw;

    fn no_cgroups(_: u64) -> String {
        String::new()
    }

    /// A fork at `ts_ns` that creates process `pid`.
    fn fork_of(pid: u32, ts_ns: u64) -> ProcessEvent {
        ProcessEvent {
            ts_ns,
            kind: Kind::Fork as i32,
            tid: 1,
            tgid: 1,
            child_tid: pid,
            child_tgid: pid,
            ..Default::default()
        }
    }

    #[test]
    fn an_exiting_task_switched_in_after_its_exit_event_is_still_one_process() {
        // pid 60 exits at 150 but runs again 200-250 (the kernel's exit path can be
        // preempted): one row, not two instances.
        let tl = Timeline::build(
            0,
            300,
            &[0],
            &[
                sw(100, 0, 0, 60),
                sw(160, 0, 60, 0),
                sw(200, 0, 0, 60),
                sw(250, 0, 60, 0),
            ],
        );
        let exit = ProcessEvent {
            ts_ns: 150,
            kind: Kind::Exit as i32,
            tid: 60,
            tgid: 60,
            ..Default::default()
        };
        let attr = Attribution::default();
        let rows = processes(&RollupInput {
            attribution: &attr,
            timeline: &tl,
            samples: &[],
            process_events: &[exit],
            threads: &HashMap::new(),
            cgroup_name: &no_cgroups,
        });
        let sixty: Vec<&ProcessRow> = rows.iter().filter(|p| p.pid == 60).collect();
        assert_eq!(sixty.len(), 1, "{rows:?}");
        assert_eq!(sixty[0].cpu_ns, 110);
    }

    #[test]
    fn a_reused_pid_is_two_processes_sharing_its_energy_by_cpu_time() {
        // pid 50 runs 100-300 on cpu 0, exits at 299, and a new pid 50 runs 400-450.
        let tl = Timeline::build(
            0,
            500,
            &[0],
            &[
                sw(100, 0, 0, 50),
                sw(300, 0, 50, 0),
                sw(400, 0, 0, 50),
                sw(450, 0, 50, 0),
            ],
        );
        let mut attr = Attribution::default();
        let mut e = PerDomain::default();
        e.add(crate::pb::v1::EnergyDomain::Package, 1000.0);
        attr.threads.push(ThreadEnergy {
            tgid: 50,
            tid: 50,
            energy: e,
            ..Default::default()
        });
        attr.measured = e;
        attr.headline = vec![crate::pb::v1::EnergyDomain::Package];
        let exit = ProcessEvent {
            ts_ns: 299,
            kind: Kind::Exit as i32,
            tid: 50,
            tgid: 50,
            ..Default::default()
        };
        let events = [exit, fork_of(50, 350)];
        let rows = processes(&RollupInput {
            attribution: &attr,
            timeline: &tl,
            samples: &[],
            process_events: &events,
            threads: &HashMap::new(),
            cgroup_name: &no_cgroups,
        });
        let fifty: Vec<(u32, u64, f64)> = rows
            .iter()
            .filter(|p| p.pid == 50)
            .map(|p| (p.instance, p.cpu_ns, p.energy_j["package"] * 1e6))
            .collect();
        assert_eq!(fifty.len(), 2, "{rows:?}");
        assert_eq!((fifty[0].0, fifty[0].1), (0, 200));
        assert_eq!((fifty[1].0, fifty[1].1), (1, 50));
        assert!((fifty[0].2 - 800.0).abs() < 1e-9 && (fifty[1].2 - 200.0).abs() < 1e-9);
        assert!((rows.iter().map(|p| p.share).sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn every_threads_energy_is_counted_once_across_instances() {
        // Instance 0 of pid 50 has threads 50 and 51; instance 1 only thread 50. Thread
        // 51's energy must stay whole in instance 0 whatever the instances' CPU shares.
        let mut ev = vec![sw(100, 0, 0, 51), sw(200, 0, 51, 50), sw(300, 0, 50, 0)];
        ev.extend([sw(400, 0, 0, 50), sw(450, 0, 50, 0)]);
        for e in &mut ev {
            if e.tid == 51 {
                e.tgid = 50;
            }
            if e.next_tid == 51 {
                e.next_tgid = 50;
            }
        }
        let tl = Timeline::build(0, 500, &[0], &ev);
        let mut attr = Attribution {
            headline: vec![crate::pb::v1::EnergyDomain::Package],
            ..Default::default()
        };
        for (tid, uj) in [(50, 600.0), (51, 400.0)] {
            let mut e = PerDomain::default();
            e.add(crate::pb::v1::EnergyDomain::Package, uj);
            attr.measured.add_all(&e);
            attr.threads.push(ThreadEnergy {
                tgid: 50,
                tid,
                energy: e,
                ..Default::default()
            });
        }
        let exit = ProcessEvent {
            ts_ns: 299,
            kind: Kind::Exit as i32,
            tid: 50,
            tgid: 50,
            ..Default::default()
        };
        let rows = processes(&RollupInput {
            attribution: &attr,
            timeline: &tl,
            samples: &[],
            process_events: &[exit, fork_of(50, 350)],
            threads: &HashMap::new(),
            cgroup_name: &no_cgroups,
        });
        let total: f64 = rows.iter().map(|p| p.energy_j["package"] * 1e6).sum();
        assert!((total - 1000.0).abs() < 1e-9, "{rows:?}");
        let first = rows.iter().find(|p| p.instance == 0).expect("instance 0");
        let t51 = first
            .threads
            .iter()
            .find(|t| t.tid == 51)
            .expect("thread 51");
        assert!((t51.energy_j["package"] * 1e6 - 400.0).abs() < 1e-9);
        // Thread 50 ran 100 ns in instance 0 and 50 ns in instance 1.
        let second = rows.iter().find(|p| p.instance == 1).expect("instance 1");
        assert!((second.energy_j["package"] * 1e6 - 200.0).abs() < 1e-9);
    }

    #[test]
    fn groups_sum_their_members() {
        let row = |pid, comm: &str, cgroup: &str, j: f64| {
            let mut p = ProcessRow {
                pid,
                comm: comm.into(),
                cgroup: cgroup.into(),
                cpu_ns: 10,
                power_w: j,
                share: j / 10.0,
                cpu_share: vec![0.1],
                ..Default::default()
            };
            p.energy_j.insert("package", j);
            p
        };
        let rows = [
            row(1, "a", "/x", 1.0),
            row(2, "b", "/x", 2.0),
            row(3, "a", "/y", 4.0),
        ];
        let by_cg = group(&rows, GroupBy::Cgroup);
        assert_eq!(by_cg.len(), 2);
        assert_eq!(by_cg[0].comm, "/y");
        assert_eq!(by_cg[1].energy_j["package"], 3.0);
        assert_eq!(by_cg[1].cpu_ns, 20);
        let mut in_docker = row(4, "c", "/system.slice/docker-ab12.scope", 8.0);
        in_docker.container_id = "ab12".into();
        let by_container = group(&[rows[0].clone(), in_docker], GroupBy::Container);
        assert_eq!(by_container[0].comm, "ab12");
        assert_eq!(by_container[1].comm, "[host]");
        let by_comm = group(&rows, GroupBy::Command);
        assert_eq!(by_comm[0].comm, "a");
        assert_eq!(by_comm[0].energy_j["package"], 5.0);
        assert!((by_comm[0].cpu_share[0] - 0.2).abs() < 1e-12);
    }
}
