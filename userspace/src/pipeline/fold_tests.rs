//! The folded path against the exact one on the same input: per-process joules within
//! 0.1%, conservation in every window, and the folded runs' per-interval sums equal to the
//! exact timeline's.

use std::collections::BTreeMap;

use super::fold::Folder;
use crate::{
    energy::{EnergyArgs, model},
    pb::v1::{
        Chunk, Cpu, EnergyDomain, EnergyReading, EnergySource, ProcessEvent, Sample, SwitchEvent,
        ThreadInfo, process_event::Kind,
    },
    pipeline::{Config, Pipeline, Window},
    timeline::Timeline,
};

const MS: u64 = 1_000_000;
const START: u64 = 1_000 * MS;

/// xorshift64: deterministic.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// A stream of `cpus` CPUs among 24 threads in 6 processes plus short-lived ones, cut into
/// 100 ms chunks; counted runs when `counted`; counter readings every 3–9 ms of `source`.
struct Stream {
    rng: Rng,
    now: u64,
    cpus: u32,
    running: Vec<(u32, u32)>,
    counted: bool,
    counter: Option<u32>,
    energy_uj: f64,
    next_pid: u32,
    next_reading: u64,
}

impl Stream {
    fn new(cpus: u32, counted: bool, counter: Option<u32>) -> Self {
        Self {
            rng: Rng(0x2545_f491_4f6c_dd1d),
            now: START,
            cpus,
            running: vec![(0, 0); cpus as usize],
            counted,
            counter,
            energy_uj: 0.0,
            next_pid: 900,
            next_reading: START,
        }
    }

    fn chunk(&mut self) -> Chunk {
        let mut chunk = Chunk::default();
        let (t0, t1) = (self.now, self.now + 100 * MS);
        if self.now == START {
            for i in 0..24u32 {
                chunk.threads.push(ThreadInfo {
                    tid: 100 + i,
                    tgid: 100 + i - i % 4,
                    comm: format!("p{}", i / 4),
                    ts_ns: START,
                    ..Default::default()
                });
            }
        }
        // A short-lived process: fork, a few runs on CPU 0, exit.
        let pid = self.next_pid;
        self.next_pid += 1;
        let (born, dies) = (t0 + 20 * MS, t0 + 60 * MS);
        let mut fork = ProcessEvent {
            ts_ns: born,
            tid: 100,
            tgid: 100,
            child_tid: pid,
            child_tgid: pid,
            ..Default::default()
        };
        fork.set_kind(Kind::Fork);
        let mut exit = ProcessEvent {
            ts_ns: dies,
            tid: pid,
            tgid: pid,
            ..Default::default()
        };
        exit.set_kind(Kind::Exit);
        chunk.process_events.extend([fork, exit]);
        chunk.threads.push(ThreadInfo {
            tid: pid,
            tgid: pid,
            comm: "short".into(),
            ts_ns: born,
            ..Default::default()
        });
        for cpu in 0..self.cpus {
            let mut ts = t0;
            loop {
                ts += 50_000 + self.rng.below(900_000);
                if ts >= t1 {
                    break;
                }
                let prev = self.running[cpu as usize];
                let next = if cpu == 0 && ts > born && ts < dies && self.rng.below(3) == 0 {
                    (pid, pid)
                } else if self.rng.below(4) == 0 {
                    (0, 0)
                } else {
                    let i = self.rng.below(24) as u32;
                    (100 + i, 100 + i - i % 4)
                };
                // Threads of process 104 run "hot": three times the cycles per ns.
                let rate = if prev.1 == 104 { 3 } else { 1 };
                chunk.switches.push(SwitchEvent {
                    ts_ns: ts,
                    cpu,
                    tid: prev.0,
                    tgid: prev.1,
                    cgroup_id: u64::from(prev.1 % 3),
                    next_known: true,
                    next_tid: next.0,
                    next_tgid: next.1,
                    activity: self.counted.then(|| rate * 1_000 + self.rng.below(500)),
                    ..Default::default()
                });
                if prev.0 != 0 && self.rng.below(3) == 0 {
                    chunk.samples.push(Sample {
                        ts_ns: ts - 1,
                        cpu,
                        tid: prev.0,
                        tgid: prev.1,
                        ..Default::default()
                    });
                }
                self.running[cpu as usize] = next;
            }
        }
        if let Some(id) = self.counter {
            while self.next_reading < t1 {
                self.energy_uj += 200.0 + self.rng.below(800) as f64;
                chunk.readings.push(EnergyReading {
                    source_id: id,
                    ts_ns: self.next_reading,
                    energy_uj: self.energy_uj,
                    ..Default::default()
                });
                self.next_reading += 3 * MS + self.rng.below(6 * MS);
            }
        }
        self.now = t1;
        chunk
    }
}

fn config(cpus: &[Cpu], counter: bool, counted: bool) -> Config {
    let sources = if counter {
        vec![EnergySource {
            id: 1,
            kind: "powercap".into(),
            domain: EnergyDomain::Package as i32,
            name: "package-0".into(),
            update_period_ns: MS,
            ..Default::default()
        }]
    } else {
        model::sources(&EnergyArgs::default(), cpus, 0).expect("model sources")
    };
    Config {
        cpus: cpus.to_vec(),
        sources,
        options: crate::attribute::Options::default(),
        activity_event: counted.then(|| "cycles".into()),
    }
}

/// Joules per pid over every window, and the windows' (start, end).
fn run(pipeline: &mut Pipeline, stream: &mut Stream, secs: u64) -> (BTreeMap<u32, f64>, usize) {
    let mut joules: BTreeMap<u32, f64> = BTreeMap::new();
    let mut windows = 0;
    let mut take = |w: Window| {
        let t = &w.totals;
        let rows: f64 = w.processes.iter().flat_map(|p| p.energy_j.values()).sum();
        let measured: f64 = t.energy_j.values().sum();
        let idle: f64 = t.idle_by_domain_j.values().sum();
        let unknown = w
            .analysis
            .attribution
            .unknown
            .joules_by_name()
            .values()
            .sum::<f64>();
        assert!(
            (rows + idle + unknown - measured).abs() <= measured.abs() * 1e-9 + 1e-12,
            "conservation: {rows} + {idle} + {unknown} != {measured}"
        );
        for p in &w.processes {
            *joules.entry(p.pid).or_default() += p.energy_j.values().sum::<f64>();
        }
        windows += 1;
    };
    for _ in 0..secs * 10 {
        pipeline.push(stream.chunk());
        // A window every second, ending 30 ms behind the input, on the 10 ms grid.
        let limit = stream.now - 30 * MS;
        if limit >= pipeline.window_start_ns() + 1_000 * MS {
            match pipeline.close(limit) {
                Some(w) => take(w),
                None => take(pipeline.close_at(limit)),
            }
        }
    }
    take(pipeline.close_at(stream.now));
    (joules, windows)
}

fn agree(cpus: &[Cpu], counter: bool, counted: bool) {
    let n = cpus.len() as u32;
    let id = counter.then_some(1);
    let cfg = config(cpus, counter, counted);
    let (want, n_exact) = run(
        &mut Pipeline::new(cfg.clone(), START),
        &mut Stream::new(n, counted, id),
        4,
    );
    let (got, n_folded) = run(
        &mut Pipeline::folded(cfg, START),
        &mut Stream::new(n, counted, id),
        4,
    );
    assert_eq!(n_exact, n_folded, "same windows");
    let total: f64 = want.values().sum();
    assert!(total > 0.0 && want.len() >= 8, "{want:?}");
    for (pid, &w) in &want {
        let g = got.get(pid).copied().unwrap_or(0.0);
        assert!(
            (g - w).abs() <= (w.abs() * 1e-3).max(total * 1e-6),
            "pid {pid}: folded {g} J, exact {w} J (counter {counter}, counted {counted})"
        );
    }
    assert_eq!(want.len(), got.len(), "{want:?}\n{got:?}");
}

fn cpus(n: u32, smt: bool) -> Vec<Cpu> {
    (0..n)
        .map(|id| Cpu {
            id,
            package: 0,
            core: if smt { id / 2 } else { id },
        })
        .collect()
}

#[test]
fn folded_and_exact_agree_per_process_with_the_model() {
    agree(&cpus(4, false), false, false);
}

#[test]
fn folded_and_exact_agree_per_process_cut_at_counter_readings() {
    agree(&cpus(4, false), true, false);
    agree(&cpus(4, false), true, true);
}

#[test]
fn folded_and_exact_agree_per_process_with_smt_siblings() {
    agree(&cpus(4, true), true, true);
}

#[test]
fn folded_cells_keep_the_exact_per_interval_sums() {
    let cpu_list = cpus(3, false);
    let mut stream = Stream::new(3, true, None);
    let chunks: Vec<Chunk> = (0..5).map(|_| stream.chunk()).collect();
    let end = stream.now - 7 * MS;
    let switches: Vec<SwitchEvent> = chunks.iter().flat_map(|c| c.switches.clone()).collect();
    let exact = Timeline::build(START, end, &[0, 1, 2], &switches);
    let mut folder = Folder::new(START, &cpu_list, &[], true);
    for c in chunks {
        folder.push_switches(c.switches);
    }
    let folded = folder.close(end);
    assert!(
        folded.cpus.iter().map(|c| c.runs().count()).sum::<usize>()
            < exact.cpus.iter().map(|c| c.runs().count()).sum::<usize>(),
        "folding keeps fewer runs"
    );
    // Each CPU's first run has no count (no switch began it); the exact timeline merges
    // it with a counted run of the same thread into an uncounted one: start a cell later.
    let mut a = START + 10 * MS;
    while a < end {
        let b = (a + 10 * MS).min(end);
        assert_eq!(folded.thread_ns(a, b), exact.thread_ns(a, b), "[{a}, {b})");
        for cpu in 0..3 {
            let (f, e) = (folded.cpu(cpu).expect("cpu"), exact.cpu(cpu).expect("cpu"));
            assert_eq!(f.busy_ns(a, b), e.busy_ns(a, b));
            // Activity over the cell, each run's count spread evenly over it.
            let count = |t: &crate::timeline::CpuTimeline| -> f64 {
                t.runs_in(a, b)
                    .filter_map(|r| {
                        Some(r.activity? as f64 * r.overlap_ns(a, b) as f64 / r.len_ns() as f64)
                    })
                    .sum()
            };
            // Counts of runs cut at a cell lose under one per cut part (integer shares).
            let (cf, ce) = (count(f), count(e));
            assert!(
                (cf - ce).abs() <= 64.0,
                "[{a}, {b}) cpu {cpu}: {cf} vs {ce}"
            );
        }
        a = b;
    }
    // Nothing of the window is left behind; the next window starts at its end.
    assert_eq!(folder.close(end + 5 * MS).start_ns, end);
}

#[test]
fn a_long_batch_folds_as_it_comes_to_the_same_cells() {
    // Three seconds of three CPUs (thousands of switches each): pushed in one batch, each
    // CPU's raw runs are folded every few hundred, with the same cells as 100 ms batches.
    let cpu_list = cpus(3, false);
    let mut stream = Stream::new(3, false, None);
    let chunks: Vec<Chunk> = (0..30).map(|_| stream.chunk()).collect();
    let end = stream.now - 7 * MS;
    let all: Vec<SwitchEvent> = chunks.iter().flat_map(|c| c.switches.clone()).collect();
    assert!(all.iter().filter(|s| s.cpu == 0).count() > 4 * 1024);
    let mut once = Folder::new(START, &cpu_list, &[], true);
    once.push_switches(all);
    let mut batched = Folder::new(START, &cpu_list, &[], true);
    for c in chunks {
        batched.push_switches(c.switches);
    }
    assert_eq!(once.close(end), batched.close(end));
}

/// The learner's load rows (`agent::learn`) of every window: (end, length, busy CPUs).
fn load_rows(pipeline: &mut Pipeline, stream: &mut Stream, cpus: &[Cpu]) -> Vec<(u64, u64, f64)> {
    let mut rows = Vec::new();
    let mut take = |w: Window| {
        let a = &w.analysis;
        let input = crate::attribute::Input {
            timeline: &a.timeline,
            samples: &[],
            sources: &a.sources,
            readings: &a.readings,
            cpus,
            threads: &[],
            activity: None,
        };
        for load in crate::attribute::load::load_rows(&input, 20 * MS) {
            rows.extend(load.rows.iter().map(|r| (r.end_ns, r.len_ns, r.busy_cpus)));
        }
    };
    for _ in 0..30 {
        pipeline.push(stream.chunk());
        let limit = stream.now - 30 * MS;
        if limit >= pipeline.window_start_ns() + 1_000 * MS {
            match pipeline.close(limit) {
                Some(w) => take(w),
                None => take(pipeline.close_at(limit)),
            }
        }
    }
    take(pipeline.close_at(stream.now));
    rows
}

#[test]
fn folded_and_exact_give_the_learner_the_same_load_rows() {
    // What the agent learns static power from: busy CPUs between counter readings, rows of
    // 20 ms here (1 s live) so that a shift of busy time between rows shows.
    let cpu_list = cpus(4, false);
    let cfg = config(&cpu_list, true, true);
    let want = load_rows(
        &mut Pipeline::new(cfg.clone(), START),
        &mut Stream::new(4, true, Some(1)),
        &cpu_list,
    );
    let got = load_rows(
        &mut Pipeline::folded(cfg, START),
        &mut Stream::new(4, true, Some(1)),
        &cpu_list,
    );
    assert!(want.len() >= 50, "{} rows", want.len());
    assert_eq!(want.len(), got.len(), "same rows");
    let spread = want.iter().map(|r| r.2).fold(f64::MAX, f64::min)
        < want.iter().map(|r| r.2).fold(0.0, f64::max) - 0.1;
    assert!(spread, "the stream's load varies: {want:?}");
    for (w, g) in want.iter().zip(&got) {
        assert_eq!((w.0, w.1), (g.0, g.1), "same spans");
        assert!(
            (w.2 - g.2).abs() <= 1e-9,
            "busy CPUs at {}: exact {} folded {}",
            w.0,
            w.2,
            g.2
        );
    }
}
