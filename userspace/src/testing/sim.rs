//! A machine simulator with known ground truth, for accuracy tests and the accuracy bench.
//!
//! It schedules classes (processes) of known dynamic power on CPUs grouped in packages —
//! including runs far shorter than the counter's 1 ms update — and produces exactly what a
//! recording holds: switch events (hence a [`Timeline`]), stack samples at F Hz, energy
//! sources and cumulative readings. The energy counter behaves like RAPL (seeds 000, 004):
//! it updates every ~1 ms with ±20 µs jitter, counts in 15.3 µJ units and carries noise;
//! readings see the value of the last update. Counter wraps are not simulated: readings are
//! the unwrapped values the energy layer hands to attribution. Deterministic per seed.

use std::collections::BTreeMap;

use rand::{RngExt, SeedableRng, rngs::ChaCha8Rng};

use crate::pb::v1::{
    Cpu, EnergyDomain, EnergyReading, EnergySource, Sample, SwitchEvent, ThreadInfo,
};
use crate::timeline::{IDLE_TID, Timeline};

/// A process of the simulated workload.
#[derive(Clone, Debug, PartialEq)]
pub struct SimClass {
    /// Command name.
    pub name: String,
    /// Process id; its threads are `tgid * 100 + k`.
    pub tgid: u32,
    /// Number of threads (thread k runs only on CPUs ≡ k mod threads, so it never runs on
    /// two CPUs at once).
    pub threads: u32,
    /// Dynamic power while on a CPU, W.
    pub watts: f64,
    /// Relative share of CPU time when competing.
    pub weight: f64,
    /// Mean run length, ns (exponential).
    pub mean_run_ns: u64,
    /// Relative time share of each function; function f's stack is `[function_addr(tgid, f)]`.
    pub functions: Vec<f64>,
    /// CPUs the class may run on (empty: any), like a CPU affinity mask.
    pub cpus: Vec<u32>,
    /// Clock while on a CPU, GHz = cycles per ns: each of its runs' switch events then
    /// carries `ghz × run ns` cycles, as the probe's activity counter would (0: no count,
    /// like a machine without hardware counters).
    pub ghz: f64,
}

/// Everything about a simulated machine and run.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// RNG seed.
    pub seed: u64,
    /// Packages, each with its own energy counter.
    pub packages: u32,
    /// CPUs per package.
    pub cpus_per_package: u32,
    /// Simulated time, ns.
    pub duration_ns: u64,
    /// Relative weight of idle when a CPU picks what to run next.
    pub idle_weight: f64,
    /// Mean idle stretch, ns.
    pub mean_idle_ns: u64,
    /// Every phase the class weights are rescaled by U(0.2, 1.8), ns (0: no phases).
    pub phase_ns: u64,
    /// Static power per package, W.
    pub static_w: f64,
    /// Counter unit, µJ (RAPL: 15.3).
    pub counter_unit_uj: f64,
    /// Counter update period, ns (RAPL: ~1 ms).
    pub update_period_ns: u64,
    /// Update jitter, ± ns.
    pub update_jitter_ns: u64,
    /// Reading period, ns (± 5% jitter unless `reads_on_grid`).
    pub read_period_ns: u64,
    /// Reads at exact multiples of `read_period_ns`, as the energy reader times them.
    pub reads_on_grid: bool,
    /// Reads in step with the counter: each read comes this long after an update (a
    /// counter a driver or hypervisor updates as the reader wakes). `None`: reads fall at
    /// any moment between updates, as a reader's timer against RAPL's hardware clock.
    pub read_lag_ns: Option<u64>,
    /// Relative Gaussian noise on every counter increment.
    pub noise: f64,
    /// Stack sampling frequency per CPU, Hz.
    pub sample_hz: u32,
    /// Mean length of a function stretch inside a run, ns.
    pub mean_function_ns: u64,
    /// The workload.
    pub classes: Vec<SimClass>,
    /// CPUs that are never idle (a pinned process that never sleeps): idle weight 0 there.
    pub never_idle_cpus: Vec<u32>,
    /// Hardware threads per physical core (SMT); consecutive CPU ids share a core.
    pub threads_per_core: u32,
    /// Extra core power when k > 1 siblings are busy, as a fraction of one thread's power
    /// per extra sibling: each busy sibling then draws `(1 + extra·(k−1)) / k` of its watts.
    pub smt_extra: f64,
    /// CPUs whose load follows a busy/sleep duty cycle instead of random idle stretches.
    pub duty_cycles: Vec<DutyCycle>,
    /// Fair rotation instead of random picks: every CPU switches at the same slice
    /// boundaries (`slice_ns ± 20%`), and in slice k CPU c runs class `(k + c) mod n`, as a
    /// fair scheduler rotates n always-runnable processes over fewer CPUs: each gets the
    /// same share and a row's share differs from the mean by at most about one slice.
    pub rotation_slice_ns: u64,
    /// Processes that run only in their own busy stretches (a loop that works, then
    /// sleeps): between them the process is not runnable on any CPU.
    pub class_duty: Vec<ClassDuty>,
    /// How late a counter update comes when the package is busy: each update is written
    /// `U(0, update_delay_ns) × busy share of the package's CPUs` after it was due, and the
    /// next one is due a period after that (a writer thread that sleeps a period between
    /// writes and waits for a CPU when they are busy). The value still covers the energy
    /// up to the moment it is written. 0: updates on time (RAPL's hardware clock).
    pub update_delay_ns: u64,
}

/// A process's own busy/sleep loop: runnable for `on_ns ± jitter_ns`, then asleep for
/// `off_ns ± jitter_ns`, from a random phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassDuty {
    /// The process.
    pub tgid: u32,
    /// Runnable stretch, ns.
    pub on_ns: u64,
    /// Asleep stretch, ns.
    pub off_ns: u64,
    /// Uniform jitter of each stretch, ± ns.
    pub jitter_ns: u64,
}

/// A busy/sleep loop on one CPU (a process that spins `on_ns`, then sleeps `off_ns`): the
/// CPU's classes run for `on_ns ± jitter_ns`, then it idles `off_ns ± jitter_ns`, so the
/// phase drifts against the counter's reads as a real sleep's overshoot makes it drift.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DutyCycle {
    /// The CPU.
    pub cpu: u32,
    /// Busy stretch, ns.
    pub on_ns: u64,
    /// Idle stretch, ns.
    pub off_ns: u64,
    /// Uniform jitter of each stretch, ± ns.
    pub jitter_ns: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            packages: 1,
            cpus_per_package: 4,
            duration_ns: 10_000_000_000,
            idle_weight: 0.3,
            mean_idle_ns: 2_000_000,
            phase_ns: 1_000_000_000,
            static_w: 10.0,
            counter_unit_uj: 15.3,
            update_period_ns: 1_000_000,
            update_jitter_ns: 20_000,
            read_period_ns: 10_000_000,
            reads_on_grid: false,
            read_lag_ns: None,
            noise: 0.01,
            sample_hz: 99,
            mean_function_ns: 300_000,
            classes: Vec::new(),
            never_idle_cpus: Vec::new(),
            threads_per_core: 1,
            smt_extra: 0.2,
            duty_cycles: Vec::new(),
            rotation_slice_ns: 0,
            class_duty: Vec::new(),
            update_delay_ns: 0,
        }
    }
}

/// Ground truth of a simulation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Truth {
    /// Dynamic energy per process, µJ.
    pub class_uj: BTreeMap<u32, f64>,
    /// On-CPU time per process, ns.
    pub class_cpu_ns: BTreeMap<u32, u64>,
    /// Dynamic energy per function address, µJ (at the class's watts: SMT scaling is not
    /// applied per function).
    pub function_uj: BTreeMap<u64, f64>,
    /// Static energy of all packages, µJ.
    pub static_uj: f64,
}

/// What a simulation produces: the inputs of attribution plus the truth.
#[derive(Clone, Debug, PartialEq)]
pub struct SimOutput {
    /// Switch events, as the probe reports them.
    pub switches: Vec<SwitchEvent>,
    /// The timeline built from them.
    pub timeline: Timeline,
    /// Stack samples.
    pub samples: Vec<Sample>,
    /// One PACKAGE source per package (id = package).
    pub sources: Vec<EnergySource>,
    /// Cumulative readings.
    pub readings: Vec<EnergyReading>,
    /// Topology.
    pub cpus: Vec<Cpu>,
    /// Thread names.
    pub threads: Vec<ThreadInfo>,
    /// Ground truth.
    pub truth: Truth,
}

impl SimOutput {
    /// The output as a recording ending at `end_ns`, sampled at `hz`: what `report` and a
    /// replay through the live pipeline read.
    pub fn into_recording(self, end_ns: u64, hz: u32) -> crate::record::Recording {
        crate::record::Recording {
            header: crate::pb::v1::Header {
                format_version: crate::record::FORMAT_VERSION,
                hostname: "sim".into(),
                sample_hz: hz,
                cpus: self.cpus.clone(),
                ..Default::default()
            },
            switches: self.switches.into(),
            samples: self.samples,
            threads: self.threads.into_iter().map(|t| (t.tid, t)).collect(),
            sources: self.sources,
            readings: self.readings,
            end_ns,
            ..Default::default()
        }
    }

    /// Busy ns of process `tgid` over `[0, end_ns)`, from the timeline.
    pub fn busy_ns(&self, tgid: u32, end_ns: u64) -> u64 {
        self.timeline
            .cpus
            .iter()
            .flat_map(|ct| ct.runs_in(0, end_ns))
            .filter(|run| run.is_busy() && run.tgid == tgid)
            .map(|run| run.overlap_ns(0, end_ns))
            .sum()
    }
}

/// Address of function `f` of process `tgid` in simulated stacks.
pub fn function_addr(tgid: u32, f: usize) -> u64 {
    0x40_0000 + u64::from(tgid) * 0x1000 + f as u64 * 0x10
}

/// One stretch on one CPU: (start, end, class index or None for idle, tid).
#[derive(Clone, Copy)]
struct Seg {
    start: u64,
    end: u64,
    class: Option<usize>,
    tid: u32,
}

fn exp_ns(rng: &mut ChaCha8Rng, mean_ns: u64) -> u64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    ((-u.ln() * mean_ns as f64) as u64).max(10_000)
}

fn jittered(rng: &mut ChaCha8Rng, mean_ns: u64, jitter_ns: u64) -> u64 {
    (mean_ns + rng.random_range(0..=2 * jitter_ns))
        .saturating_sub(jitter_ns)
        .max(1)
}

fn gauss(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn pick(rng: &mut ChaCha8Rng, weights: &[f64]) -> usize {
    let total: f64 = weights.iter().sum();
    let mut x = rng.random_range(0.0..total);
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    weights.len() - 1
}

/// Runs a simulation.
pub fn simulate(cfg: &SimConfig) -> SimOutput {
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let n_cpus = cfg.packages * cfg.cpus_per_package;
    let cpus: Vec<Cpu> = (0..n_cpus)
        .map(|id| Cpu {
            id,
            package: id / cfg.cpus_per_package,
            core: core_of(cfg, id),
        })
        .collect();
    let n_phases = if cfg.phase_ns > 0 {
        cfg.duration_ns.div_ceil(cfg.phase_ns) as usize
    } else {
        1
    };
    let phase_factor: Vec<Vec<f64>> = (0..n_phases)
        .map(|_| {
            cfg.classes
                .iter()
                .map(|_| rng.random_range(0.2..1.8))
                .collect()
        })
        .collect();
    let mut truth = Truth::default();
    let mut per_cpu: Vec<Vec<Seg>> = Vec::with_capacity(n_cpus as usize);
    let mut functions: Vec<Vec<(u64, u64, u64)>> = Vec::with_capacity(n_cpus as usize);
    for cpu in 0..n_cpus {
        let (segs, funcs) = schedule_cpu(cfg, cpu, &phase_factor, &mut rng, &mut truth);
        per_cpu.push(segs);
        functions.push(funcs);
    }
    truth.static_uj = cfg.static_w * f64::from(cfg.packages) * cfg.duration_ns as f64 * 1e-3;
    let power: Vec<Vec<Piece>> = (0..cfg.packages)
        .map(|p| package_power(cfg, p, &per_cpu, &mut truth))
        .collect();
    let switches = switches_of(cfg, &per_cpu);
    let cpu_ids: Vec<u32> = (0..n_cpus).collect();
    let timeline = Timeline::build(0, cfg.duration_ns, &cpu_ids, &switches);
    let samples = samples_of(cfg, &per_cpu, &functions, &mut rng);
    let (sources, readings) = counters(cfg, &power, &per_cpu, &mut rng);
    let threads = cfg
        .classes
        .iter()
        .flat_map(|c| {
            (0..c.threads).map(move |k| ThreadInfo {
                tid: c.tgid * 100 + k,
                tgid: c.tgid,
                comm: c.name.clone(),
                cgroup_id: u64::from(c.tgid),
                ..Default::default()
            })
        })
        .collect();
    SimOutput {
        switches,
        timeline,
        samples,
        sources,
        readings,
        cpus,
        threads,
        truth,
    }
}

/// One CPU's schedule and its function stretches `(start, end, addr)`.
fn schedule_cpu(
    cfg: &SimConfig,
    cpu: u32,
    phase_factor: &[Vec<f64>],
    rng: &mut ChaCha8Rng,
    truth: &mut Truth,
) -> (Vec<Seg>, Vec<(u64, u64, u64)>) {
    if cfg.rotation_slice_ns > 0 && !cfg.classes.is_empty() {
        return rotate_cpu(cfg, cpu, rng, truth);
    }
    let mut segs = Vec::new();
    let mut funcs = Vec::new();
    let mut t = 0u64;
    let duty = cfg.duty_cycles.iter().find(|d| d.cpu == cpu).copied();
    // End of the current busy stretch of a duty cycle: runs stop there, then the CPU idles.
    let mut on_until = duty.map(|d| t + jittered(rng, d.on_ns, d.jitter_ns));
    let awake = class_windows(cfg);
    while t < cfg.duration_ns {
        if let (Some(d), Some(until)) = (duty, on_until)
            && t >= until
        {
            let end = (t + jittered(rng, d.off_ns, d.jitter_ns)).min(cfg.duration_ns);
            segs.push(Seg {
                start: t,
                end,
                class: None,
                tid: IDLE_TID,
            });
            t = end;
            on_until = Some(t + jittered(rng, d.on_ns, d.jitter_ns));
            continue;
        }
        let phase = t.checked_div(cfg.phase_ns).unwrap_or(0) as usize;
        let mut weights: Vec<f64> = cfg
            .classes
            .iter()
            .zip(&phase_factor[phase])
            .zip(&awake)
            .map(|((c, f), w)| {
                if (c.cpus.is_empty() || c.cpus.contains(&cpu)) && window_at(w, t).is_some() {
                    c.weight * f
                } else {
                    0.0
                }
            })
            .collect();
        weights.push(if duty.is_some() || cfg.never_idle_cpus.contains(&cpu) {
            0.0
        } else {
            cfg.idle_weight
        });
        let choice = if weights.iter().sum::<f64>() > 0.0 {
            pick(rng, &weights)
        } else if let Some(next) = awake.iter().filter_map(|w| next_start(w, t)).min() {
            // Every process asleep and the CPU never idles by choice: idle until one wakes.
            segs.push(Seg {
                start: t,
                end: next.min(cfg.duration_ns),
                class: None,
                tid: IDLE_TID,
            });
            t = next.min(cfg.duration_ns);
            continue;
        } else {
            cfg.classes.len() // nothing may run here: idle
        };
        let Some(class) = cfg.classes.get(choice) else {
            let end = (t + exp_ns(rng, cfg.mean_idle_ns)).min(cfg.duration_ns);
            segs.push(Seg {
                start: t,
                end,
                class: None,
                tid: IDLE_TID,
            });
            t = end;
            continue;
        };
        let end = (t + exp_ns(rng, class.mean_run_ns))
            .min(cfg.duration_ns)
            .min(window_at(&awake[choice], t).unwrap_or(u64::MAX))
            .min(on_until.unwrap_or(u64::MAX));
        let tid = class.tgid * 100 + cpu % class.threads.max(1);
        segs.push(Seg {
            start: t,
            end,
            class: Some(choice),
            tid,
        });
        *truth.class_cpu_ns.entry(class.tgid).or_insert(0) += end - t;
        let mut f_start = t;
        while f_start < end {
            let f_end = (f_start + exp_ns(rng, cfg.mean_function_ns)).min(end);
            let f = if class.functions.is_empty() {
                0
            } else {
                pick(rng, &class.functions)
            };
            let addr = function_addr(class.tgid, f);
            funcs.push((f_start, f_end, addr));
            *truth.function_uj.entry(addr).or_insert(0.0) +=
                class.watts * (f_end - f_start) as f64 * 1e-3;
            f_start = f_end;
        }
        t = end;
    }
    (segs, funcs)
}

/// Each class's runnable windows `[start, end)`, sorted; a class without a
/// [`ClassDuty`] has one window over the whole run. Drawn from their own generator per
/// process, so every CPU sees the same windows.
fn class_windows(cfg: &SimConfig) -> Vec<Vec<(u64, u64)>> {
    cfg.classes
        .iter()
        .map(|c| {
            let Some(d) = cfg.class_duty.iter().find(|d| d.tgid == c.tgid) else {
                return vec![(0, u64::MAX)];
            };
            let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ (u64::from(c.tgid) << 32));
            let cycle = d.on_ns + d.off_ns;
            let mut t = rng.random_range(0..cycle.max(1));
            let mut out = Vec::new();
            // A window may have started before 0.
            if t > d.off_ns {
                out.push((0, t - d.off_ns));
            }
            while t < cfg.duration_ns {
                let end = t + jittered(&mut rng, d.on_ns, d.jitter_ns);
                out.push((t, end));
                t = end + jittered(&mut rng, d.off_ns, d.jitter_ns);
            }
            out
        })
        .collect()
}

/// End of the window holding `t`, if one does.
fn window_at(windows: &[(u64, u64)], t: u64) -> Option<u64> {
    let i = windows.partition_point(|w| w.1 <= t);
    windows.get(i).filter(|w| w.0 <= t).map(|w| w.1)
}

/// Start of the first window after `t`.
fn next_start(windows: &[(u64, u64)], t: u64) -> Option<u64> {
    let i = windows.partition_point(|w| w.0 <= t);
    windows.get(i).map(|w| w.0)
}

/// Busy share of a package's CPUs at `t`.
fn busy_share(cfg: &SimConfig, per_cpu: &[Vec<Seg>], p: u32, t: u64) -> f64 {
    let first = (p * cfg.cpus_per_package) as usize;
    let cpus = &per_cpu[first..first + cfg.cpus_per_package as usize];
    let busy = cpus
        .iter()
        .filter(|segs| {
            let i = segs.partition_point(|s| s.end <= t);
            segs.get(i)
                .is_some_and(|s| s.start <= t && s.class.is_some())
        })
        .count();
    busy as f64 / cpus.len().max(1) as f64
}

/// One CPU's schedule under [`SimConfig::rotation_slice_ns`]. The slice boundaries come
/// from their own generator seeded by the run's seed, so every CPU switches at the same
/// times; `rng` only draws the function stretches.
fn rotate_cpu(
    cfg: &SimConfig,
    cpu: u32,
    rng: &mut ChaCha8Rng,
    truth: &mut Truth,
) -> (Vec<Seg>, Vec<(u64, u64, u64)>) {
    let mut slices = ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x0051_1ce5);
    let slice = cfg.rotation_slice_ns;
    let n = cfg.classes.len() as u64;
    let (mut segs, mut funcs) = (Vec::new(), Vec::new());
    let (mut t, mut k) = (0u64, 0u64);
    while t < cfg.duration_ns {
        let end = (t + jittered(&mut slices, slice, slice / 5)).min(cfg.duration_ns);
        let choice = ((k + u64::from(cpu)) % n) as usize;
        let class = &cfg.classes[choice];
        segs.push(Seg {
            start: t,
            end,
            class: Some(choice),
            tid: class.tgid * 100 + cpu % class.threads.max(1),
        });
        *truth.class_cpu_ns.entry(class.tgid).or_insert(0) += end - t;
        let addr = function_addr(class.tgid, 0);
        funcs.push((t, end, addr));
        *truth.function_uj.entry(addr).or_insert(0.0) += class.watts * (end - t) as f64 * 1e-3;
        let _ = rng;
        t = end;
        k += 1;
    }
    (segs, funcs)
}

fn switches_of(cfg: &SimConfig, per_cpu: &[Vec<Seg>]) -> Vec<SwitchEvent> {
    let tgid_of = |s: &Seg| s.class.map_or(0, |c| cfg.classes[c].tgid);
    // A halted idle CPU counts no cycles; a class without a clock has no counter.
    let counting = cfg.classes.iter().any(|c| c.ghz > 0.0);
    let cycles = |s: &Seg| match s.class.map(|c| cfg.classes[c].ghz) {
        Some(ghz) if ghz > 0.0 => Some((ghz * (s.end - s.start) as f64).round() as u64),
        None if counting => Some(0),
        _ => None,
    };
    let mut out = Vec::new();
    for (cpu, segs) in per_cpu.iter().enumerate() {
        for pair in segs.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            out.push(SwitchEvent {
                ts_ns: a.end,
                cpu: cpu as u32,
                tid: a.tid,
                tgid: tgid_of(a),
                cgroup_id: u64::from(tgid_of(a)),
                preempted: b.class.is_some(),
                next_known: true,
                next_tid: b.tid,
                next_tgid: tgid_of(b),
                activity: cycles(a),
            });
        }
    }
    out
}

fn samples_of(
    cfg: &SimConfig,
    per_cpu: &[Vec<Seg>],
    functions: &[Vec<(u64, u64, u64)>],
    rng: &mut ChaCha8Rng,
) -> Vec<Sample> {
    let period = 1_000_000_000 / u64::from(cfg.sample_hz.max(1));
    let jitter = period / 20;
    let mut out = Vec::new();
    for (cpu, (segs, funcs)) in per_cpu.iter().zip(functions).enumerate() {
        let mut t = rng.random_range(0..period);
        while t < cfg.duration_ns {
            let ts = (t + rng.random_range(0..=2 * jitter)).saturating_sub(jitter);
            let seg = &segs[segs.partition_point(|s| s.end <= ts).min(segs.len() - 1)];
            if let Some(c) = seg.class {
                let f = funcs.partition_point(|f| f.1 <= ts);
                let addr = funcs.get(f).filter(|f| f.0 <= ts).map_or(0, |f| f.2);
                let tgid = cfg.classes[c].tgid;
                out.push(Sample {
                    ts_ns: ts,
                    cpu: cpu as u32,
                    tid: seg.tid,
                    tgid,
                    cgroup_id: u64::from(tgid),
                    user_stack: vec![addr],
                    ..Default::default()
                });
            }
            t += period;
        }
    }
    out
}

/// Physical core of a CPU within its package: consecutive CPU ids are SMT siblings.
fn core_of(cfg: &SimConfig, cpu: u32) -> u32 {
    (cpu % cfg.cpus_per_package) / cfg.threads_per_core.max(1)
}

/// A stretch of constant dynamic power of one package: `[start, end)`, W.
#[derive(Clone, Copy)]
struct Piece {
    start: u64,
    end: u64,
    watts: f64,
}

/// The package's dynamic power over time, and each class's true dynamic energy: a busy
/// CPU draws its class's watts, scaled by `(1 + smt_extra·(k−1)) / k` while k SMT siblings
/// of its core are busy (two hardware threads do not draw twice the core's power).
fn package_power(cfg: &SimConfig, p: u32, per_cpu: &[Vec<Seg>], truth: &mut Truth) -> Vec<Piece> {
    let first = (p * cfg.cpus_per_package) as usize;
    let cpus = &per_cpu[first..first + cfg.cpus_per_package as usize];
    let mut bounds: Vec<u64> = cpus
        .iter()
        .flat_map(|segs| segs.iter().flat_map(|s| [s.start, s.end]))
        .collect();
    bounds.sort_unstable();
    bounds.dedup();
    let tpc = cfg.threads_per_core.max(1) as usize;
    let mut cursor = vec![0usize; cpus.len()];
    let mut pieces = Vec::with_capacity(bounds.len());
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        let mut busy: Vec<Option<&SimClass>> = Vec::with_capacity(cpus.len());
        for (c, segs) in cpus.iter().enumerate() {
            while cursor[c] < segs.len() && segs[cursor[c]].end <= a {
                cursor[c] += 1;
            }
            busy.push(
                segs.get(cursor[c])
                    .filter(|s| s.start <= a)
                    .and_then(|s| s.class)
                    .map(|k| &cfg.classes[k]),
            );
        }
        let mut watts = 0.0;
        for core in busy.chunks(tpc) {
            let k = core.iter().flatten().count();
            let scale = if k > 1 {
                (1.0 + cfg.smt_extra * (k - 1) as f64) / k as f64
            } else {
                1.0
            };
            for class in core.iter().flatten() {
                let w = class.watts * scale;
                watts += w;
                *truth.class_uj.entry(class.tgid).or_insert(0.0) += w * (b - a) as f64 * 1e-3;
            }
        }
        pieces.push(Piece {
            start: a,
            end: b,
            watts,
        });
    }
    pieces
}

/// Energy sources and readings: a RAPL-like counter per package.
fn counters(
    cfg: &SimConfig,
    power: &[Vec<Piece>],
    per_cpu: &[Vec<Seg>],
    rng: &mut ChaCha8Rng,
) -> (Vec<EnergySource>, Vec<EnergyReading>) {
    let mut sources = Vec::new();
    let mut readings = Vec::new();
    for (p, pieces) in (0u32..).zip(power) {
        sources.push(EnergySource {
            id: p,
            kind: "sim".into(),
            domain: EnergyDomain::Package as i32,
            package: p,
            name: format!("sim package-{p}"),
            update_period_ns: cfg.update_period_ns,
            read_interval_ns: cfg.read_period_ns,
            ..Default::default()
        });
        // True cumulative energy (µJ) at time t, with a monotonic cursor over the pieces.
        let (mut cursor, mut done_uj) = (0usize, 0.0f64);
        let mut energy_at = |t: u64| -> f64 {
            while cursor < pieces.len() && pieces[cursor].end <= t {
                let s = &pieces[cursor];
                done_uj += s.watts * (s.end - s.start) as f64 * 1e-3;
                cursor += 1;
            }
            let partial = pieces
                .get(cursor)
                .filter(|s| s.start < t)
                .map_or(0.0, |s| s.watts * (t - s.start) as f64 * 1e-3);
            cfg.static_w * t as f64 * 1e-3 + done_uj + partial
        };
        // Counter updates: (time, quantised cumulative µJ).
        let mut updates: Vec<(u64, f64)> = vec![(0, 0.0)];
        let (mut measured, mut last_true) = (0.0f64, 0.0f64);
        let mut k = 1u64;
        let mut written = 0u64;
        loop {
            let nominal = if cfg.update_delay_ns > 0 {
                written + cfg.update_period_ns
            } else {
                k * cfg.update_period_ns
            };
            if nominal > cfg.duration_ns + cfg.update_period_ns {
                break;
            }
            let j = cfg.update_jitter_ns;
            let late = if cfg.update_delay_ns > 0 {
                let share = busy_share(cfg, per_cpu, p, nominal.min(cfg.duration_ns));
                (rng.random_range(0.0..1.0) * share * cfg.update_delay_ns as f64) as u64
            } else {
                0
            };
            let t = (nominal + late + rng.random_range(0..=2 * j))
                .saturating_sub(j)
                .min(cfg.duration_ns);
            if cfg.update_delay_ns > 0 && t >= cfg.duration_ns && written >= cfg.duration_ns {
                break;
            }
            written = t;
            let now_true = energy_at(t);
            measured += (now_true - last_true) * (1.0 + cfg.noise * gauss(rng));
            last_true = now_true;
            let q = (measured / cfg.counter_unit_uj).floor() * cfg.counter_unit_uj;
            updates.push((t, q));
            k += 1;
        }
        let mut r = 0u64;
        let mut last_read: Option<f64> = None;
        while r <= cfg.duration_ns {
            let idx = updates.partition_point(|u| u.0 <= r).saturating_sub(1);
            // As the recorder does, a read that saw no change is not written.
            if last_read != Some(updates[idx].1) {
                last_read = Some(updates[idx].1);
                readings.push(EnergyReading {
                    source_id: p,
                    ts_ns: cfg.read_lag_ns.map_or(r, |lag| updates[idx].0 + lag),
                    energy_uj: updates[idx].1,
                    ..Default::default()
                });
            }
            if cfg.reads_on_grid {
                r += cfg.read_period_ns.max(1);
                continue;
            }
            let j = cfg.read_period_ns / 20;
            r += (cfg.read_period_ns + rng.random_range(0..=2 * j)).saturating_sub(j);
        }
    }
    (sources, readings)
}

/// What a live replay of a simulated machine gave ([`live_replay`]).
#[derive(Clone, Debug, PartialEq)]
pub struct LiveReplay {
    /// Each process's relative error over the windows judged, as (tgid, error).
    pub errors: Vec<(u32, f64)>,
    /// Windows judged.
    pub windows: usize,
    /// Of those, the windows split by regression.
    pub by_regression: usize,
    /// Of those, the windows that said `power_model_uncertain`.
    pub uncertain: usize,
}

/// `cfg` simulated and replayed as `top` and the agent see it: cut into `interval` windows
/// through the folded live pipeline, attributed with `options`. Each process's energy is
/// summed over the windows that start at or after `from_ns`, against what it drew over
/// those windows' measured spans. Panics when a window does not conserve energy.
pub fn live_replay(
    cfg: &SimConfig,
    options: crate::attribute::Options,
    interval: std::time::Duration,
    from_ns: u64,
) -> LiveReplay {
    let out = simulate(cfg);
    let drawn = |tgid: u32, a: u64, b: u64| out.busy_ns(tgid, b) - out.busy_ns(tgid, a);
    let mut truth = vec![0.0; cfg.classes.len()];
    let mut got = vec![0.0; cfg.classes.len()];
    let mut replay = LiveReplay {
        errors: Vec::new(),
        windows: 0,
        by_regression: 0,
        uncertain: 0,
    };
    let rec = out.clone().into_recording(cfg.duration_ns, cfg.sample_hz);
    let pcfg = crate::pipeline::Config {
        cpus: rec.header.cpus.clone(),
        sources: rec.sources.clone(),
        options,
        activity_event: None,
    };
    for w in crate::pipeline::folded_windows(&rec, pcfg, interval) {
        let attr = &w.analysis.attribution;
        let src = &attr.sources[0];
        let parts = src.attributed_uj + src.idle_uj + src.unknown_uj;
        assert!(
            (src.measured_uj - parts).abs() <= 1e-6 * src.measured_uj.abs().max(1.0),
            "window not conserved: {src:?}"
        );
        let (Some(first), Some(last)) = (src.intervals.first(), src.intervals.last()) else {
            continue;
        };
        if first.start_ns < from_ns {
            continue;
        }
        replay.windows += 1;
        replay.by_regression +=
            usize::from(src.power_model == crate::attribute::PowerModelUsed::Regression);
        replay.uncertain += usize::from(src.power_model_uncertain.is_some());
        for (i, c) in cfg.classes.iter().enumerate() {
            truth[i] += c.watts * drawn(c.tgid, first.start_ns, last.end_ns) as f64 * 1e-3;
            got[i] += attr
                .threads
                .iter()
                .filter(|t| t.tgid == c.tgid)
                .map(|t| attr.headline_uj(&t.energy))
                .sum::<f64>();
        }
    }
    replay.errors = cfg
        .classes
        .iter()
        .enumerate()
        .map(|(i, c)| (c.tgid, (got[i] - truth[i]) / truth[i]))
        .collect();
    replay
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_classes() -> SimConfig {
        SimConfig {
            duration_ns: 2_000_000_000,
            classes: vec![
                SimClass {
                    name: "hot".into(),
                    tgid: 10,
                    threads: 2,
                    watts: 20.0,
                    weight: 1.0,
                    mean_run_ns: 2_000_000,
                    functions: vec![1.0, 1.0],
                    cpus: Vec::new(),
                    ghz: 0.0,
                },
                SimClass {
                    name: "cool".into(),
                    tgid: 11,
                    threads: 2,
                    watts: 5.0,
                    weight: 1.0,
                    mean_run_ns: 300_000,
                    functions: vec![1.0],
                    cpus: Vec::new(),
                    ghz: 0.0,
                },
            ],
            ..SimConfig::default()
        }
    }

    #[test]
    fn deterministic_per_seed() {
        let a = simulate(&two_classes());
        let b = simulate(&two_classes());
        assert_eq!(a, b);
        let c = simulate(&SimConfig {
            seed: 2,
            ..two_classes()
        });
        assert_ne!(a.truth, c.truth);
    }

    #[test]
    fn truth_matches_the_counter() {
        let out = simulate(&two_classes());
        let truth_total = out.truth.class_uj.values().sum::<f64>() + out.truth.static_uj;
        let last = out.readings.iter().map(|r| r.energy_uj).fold(0.0, f64::max);
        // The last reading misses at most ~1 ms of energy; 1% noise averages out.
        assert!(
            (last - truth_total).abs() / truth_total < 0.01,
            "{last} vs {truth_total}"
        );
        // Function truth adds up to class truth.
        let f_total: f64 = out.truth.function_uj.values().sum();
        let c_total: f64 = out.truth.class_uj.values().sum();
        assert!((f_total - c_total).abs() < 1e-6 * c_total);
    }

    #[test]
    fn timeline_agrees_with_truth_time() {
        let out = simulate(&two_classes());
        let per_thread = out.timeline.thread_ns(0, u64::MAX);
        for (tgid, ns) in &out.truth.class_cpu_ns {
            let tl: u64 = per_thread
                .iter()
                .filter(|((g, _), _)| g == tgid)
                .map(|(_, v)| v)
                .sum();
            assert_eq!(tl, *ns, "tgid {tgid}");
        }
        assert!(!out.samples.is_empty());
        assert!(
            out.readings
                .windows(2)
                .all(|w| w[1].energy_uj >= w[0].energy_uj)
        );
    }
}
