//! Accuracy of attribution against simulated ground truth, beside the CPU-time-share
//! baseline of Kepler and Scaphandre (each process's share of CPU time over 5-second
//! windows). Run: `cargo bench -p energy-bpf --bench accuracy` (or `cargo xtask bench
//! accuracy`). Prints one table per scenario and whether each target is met.

use std::collections::BTreeMap;
use std::time::Instant;

use energy_bpf::attribute::{
    self, ActivityWeights, Attribution, Calibrated, Input, Options, PowerModel, estimate_samples,
};
use energy_bpf::pipeline;
use energy_bpf::testing::{
    scenarios,
    sim::{SimClass, SimConfig, SimOutput, simulate},
};

#[path = "accuracy/power_model.rs"]
mod power_model;

const WINDOW_NS: u64 = 5_000_000_000;

fn class(name: &str, tgid: u32, watts: f64, weight: f64, mean_run_ns: u64) -> SimClass {
    SimClass {
        name: name.into(),
        tgid,
        threads: 4,
        watts,
        weight,
        mean_run_ns,
        functions: vec![2.0, 1.0],
        cpus: Vec::new(),
        ghz: 0.0,
    }
}

fn input(out: &SimOutput) -> Input<'_> {
    Input {
        timeline: &out.timeline,
        samples: &out.samples,
        sources: &out.sources,
        readings: &out.readings,
        cpus: &out.cpus,
        threads: &out.threads,
        activity: None,
    }
}

/// Kepler/Scaphandre-style baseline: per package and 5 s window, dynamic energy (measured
/// minus the same static power we are given) split by each process's CPU-time share.
fn baseline(out: &SimOutput, static_w: f64) -> BTreeMap<u32, f64> {
    let mut per_proc = BTreeMap::new();
    for src in &out.sources {
        let mut rs: Vec<_> = out
            .readings
            .iter()
            .filter(|r| r.source_id == src.id)
            .collect();
        rs.sort_by_key(|r| r.ts_ns);
        let cpus: Vec<u32> = out
            .cpus
            .iter()
            .filter(|c| c.package == src.package)
            .map(|c| c.id)
            .collect();
        let mut w_start = 0;
        while w_start < out.timeline.end_ns {
            let w_end = w_start + WINDOW_NS;
            let at = |t: u64| rs[rs.partition_point(|r| r.ts_ns <= t).saturating_sub(1)];
            let (a, b) = (at(w_start), at(w_end.min(out.timeline.end_ns)));
            let dynamic =
                (b.energy_uj - a.energy_uj) - static_w * (b.ts_ns - a.ts_ns) as f64 * 1e-3;
            let mut busy: BTreeMap<u32, f64> = BTreeMap::new();
            for &c in &cpus {
                if let Some(ct) = out.timeline.cpu(c) {
                    for run in ct.runs_in(a.ts_ns, b.ts_ns).filter(|r| r.is_busy()) {
                        *busy.entry(run.tgid).or_insert(0.0) +=
                            run.overlap_ns(a.ts_ns, b.ts_ns) as f64;
                    }
                }
            }
            let total: f64 = busy.values().sum();
            for (tgid, ns) in busy {
                *per_proc.entry(tgid).or_insert(0.0) += dynamic.max(0.0) * ns / total;
            }
            w_start = w_end;
        }
    }
    per_proc
}

struct Row {
    name: String,
    occupancy: f64,
    watts: f64,
    truth_j: f64,
    ours_j: f64,
    ours_err: f64,
    base_err: f64,
}

fn evaluate(cfg: &SimConfig, opts: &Options) -> (Vec<Row>, Attribution) {
    evaluate_weighted(cfg, opts, false)
}

/// [`evaluate`], with the runs' activity counts (the simulator's cycles) as weights when
/// `by_activity`.
fn evaluate_weighted(
    cfg: &SimConfig,
    opts: &Options,
    by_activity: bool,
) -> (Vec<Row>, Attribution) {
    let out = simulate(cfg);
    let weights = by_activity
        .then(|| ActivityWeights::from_timeline(&out.timeline))
        .flatten();
    let attr = attribute::attribute(
        &Input {
            activity: weights.as_ref(),
            ..input(&out)
        },
        opts,
    );
    let base = baseline(&out, cfg.static_w);
    let threads = std::collections::HashMap::new();
    let procs = pipeline::rollup::processes(&pipeline::rollup::RollupInput {
        attribution: &attr,
        timeline: &out.timeline,
        samples: &out.samples,
        process_events: &[],
        threads: &threads,
        cgroup_name: &|_| String::new(),
    });
    let cpu_total = (cfg.packages * cfg.cpus_per_package) as f64 * cfg.duration_ns as f64;
    let rows = cfg
        .classes
        .iter()
        .map(|c| {
            let truth = out.truth.class_uj[&c.tgid];
            // The rows every output reads: the pipeline's rollup.
            let ours = procs
                .iter()
                .filter(|p| p.pid == c.tgid)
                .map(|p| p.energy_j.values().sum::<f64>() * 1e6)
                .sum::<f64>();
            let theirs = base.get(&c.tgid).copied().unwrap_or(0.0);
            Row {
                name: c.name.clone(),
                occupancy: out.truth.class_cpu_ns[&c.tgid] as f64 / cpu_total,
                watts: c.watts,
                truth_j: truth * 1e-6,
                ours_j: ours * 1e-6,
                ours_err: (ours - truth) / truth,
                base_err: (theirs - truth) / truth,
            }
        })
        .collect();
    (rows, attr)
}

fn print_table(title: &str, rows: &[Row], attr: &Attribution) {
    println!("\n## {title}");
    let src = &attr.sources[0];
    println!(
        "power model used: {:?}{}",
        src.power_model,
        src.power_model_note
            .as_deref()
            .map(|n| format!(" ({n})"))
            .unwrap_or_default()
    );
    println!(
        "static power: {:.2} W ({})",
        src.static_w,
        src.static_origin.kind()
    );
    if let Some(w) = src.static_origin.warning() {
        println!("{w}");
    }
    println!(
        "| class | occupancy | true W | truth J | ours J | ours err | CPU-share baseline err |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.1}% | {:.1} | {:.2} | {:.2} | {:+.2}% | {:+.2}% |",
            r.name,
            r.occupancy * 100.0,
            r.watts,
            r.truth_j,
            r.ours_j,
            r.ours_err * 100.0,
            r.base_err * 100.0
        );
    }
    if let Some(reg) = &src.regression {
        let fitted: Vec<String> = reg
            .classes
            .iter()
            .map(|c| {
                let flag = c
                    .fit
                    .not_identifiable
                    .map(|f| format!(" [{f:?}]"))
                    .unwrap_or_default();
                format!(
                    "{:?}: {:.2}±{:.2} W{flag}",
                    c.label, c.fit.watts, c.fit.se_w
                )
            })
            .collect();
        println!("regression (package 0, whole run): {}", fitted.join(", "));
    }
}

fn verdict(name: &str, ok: bool, detail: String) -> bool {
    println!(
        "target {name}: {} — {detail}",
        if ok { "MET" } else { "MISSED" }
    );
    ok
}

fn max_err(rows: &[Row], min_occupancy: f64, pick: impl Fn(&Row) -> f64) -> f64 {
    rows.iter()
        .filter(|r| r.occupancy >= min_occupancy)
        .map(|r| pick(r).abs())
        .fold(0.0, f64::max)
}

fn base_config(seed: u64, classes: Vec<SimClass>) -> SimConfig {
    SimConfig {
        seed,
        packages: 2,
        cpus_per_package: 4,
        duration_ns: 60_000_000_000,
        classes,
        ..SimConfig::default()
    }
}

fn given_static(cfg: &SimConfig) -> Options {
    Options {
        static_w: Some(cfg.static_w),
        ..Options::default()
    }
}

fn main() {
    let started = Instant::now();
    if std::env::args().any(|a| a == "power-model") {
        let ok = power_model::power_model_runs();
        println!(
            "\nall targets met: {ok}; bench time {:.1} s",
            started.elapsed().as_secs_f64()
        );
        return;
    }
    let mut all_ok = true;

    let equal = base_config(
        11,
        vec![
            class("web", 1, 12.0, 1.0, 2_000_000),
            class("db", 2, 12.0, 0.6, 5_000_000),
            class("batch", 3, 12.0, 0.8, 800_000),
            class("cron", 4, 12.0, 0.15, 400_000),
        ],
    );
    let (rows, attr) = evaluate(&equal, &given_static(&equal));
    print_table(
        "Equal power (12 W per busy CPU for every class)",
        &rows,
        &attr,
    );
    let e = max_err(&rows, 0.0, |r| r.ours_err);
    all_ok &= verdict(
        "equal power ≤ 2% per process",
        e <= 0.02,
        format!("worst {:.2}%", e * 100.0),
    );

    let spread = base_config(
        12,
        vec![
            class("avx-loop", 1, 24.0, 1.0, 3_000_000),
            class("mem-stall", 2, 6.0, 1.0, 2_000_000),
            class("mixed", 3, 12.0, 0.8, 1_000_000),
            class("hot-small", 4, 18.0, 0.5, 600_000),
            class("rare", 5, 10.0, 0.05, 500_000),
        ],
    );
    let (rows, attr) = evaluate(&spread, &given_static(&spread));
    print_table("Power spread 4× (6–24 W), auto power model", &rows, &attr);
    let e = max_err(&rows, 0.05, |r| r.ours_err);
    let b = max_err(&rows, 0.05, |r| r.base_err);
    all_ok &= verdict(
        "2–4× spread ≤ 5% for classes ≥ 5% occupancy",
        e <= 0.05,
        format!("worst {:.2}% (baseline worst {:.1}%)", e * 100.0, b * 100.0),
    );

    // Not a target: the same input with the static power estimated online (5th percentile
    // of interval power) instead of given. On a machine that is never idle this mistakes
    // some dynamic power for static power (seed 002: constant power is not idle power).
    let online = Options {
        static_w: None,
        ..Options::default()
    };
    let (rows, attr) = evaluate(&spread, &online);
    let e = max_err(&rows, 0.05, |r| r.ours_err);
    println!(
        "same input, static power estimated online ({:.2} W, {}, vs true {:.2} W per package): worst error {:.1}% for classes ≥ 5%",
        attr.sources[0].static_w,
        serde_json::to_string(&attr.sources[0].static_origin).unwrap_or_default(),
        spread.static_w,
        e * 100.0
    );

    let bursts = base_config(
        13,
        vec![
            class("burst-150us", 1, 20.0, 8.0, 150_000),
            class("burst-400us", 2, 8.0, 3.0, 400_000),
            class("steady", 3, 12.0, 1.0, 5_000_000),
        ],
    );
    let (rows, attr) = evaluate(&bursts, &given_static(&bursts));
    print_table(
        "Sub-millisecond bursts (150 µs and 400 µs runs vs a 1 ms counter)",
        &rows,
        &attr,
    );
    let e = max_err(&rows, 0.0, |r| r.ours_err);
    all_ok &= verdict(
        "sub-ms bursts within 10%",
        e <= 0.10,
        format!("worst {:.2}%", e * 100.0),
    );

    all_ok &= busy_machines();

    all_ok &= never_idle();

    all_ok &= ci_coverage();

    all_ok &= power_model::power_model_runs();

    println!(
        "\nall targets met: {all_ok}; bench time {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Static power on busy machines and SMT (absolute per-process joules; the baseline is
/// given the true static power, which on a busy machine nobody has without calibration).
fn busy_machines() -> bool {
    let mut ok = true;
    let one = scenarios::one_cpu_always_busy(21);
    let (rows, attr) = evaluate(&one, &Options::default());
    print_table(
        "One CPU always busy (6 W static, 10 W per busy CPU), no calibration",
        &rows,
        &attr,
    );
    let e = max_err(&rows, 0.0, |r| r.ours_err);
    ok &= verdict(
        "one CPU always busy ≤ 5% per process without calibration",
        e <= 0.05,
        format!("worst {:.2}%", e * 100.0),
    );

    let all = scenarios::all_cpus_always_busy(22);
    let (rows, attr) = evaluate(&all, &Options::default());
    print_table(
        "Every CPU always busy (15 W and 5 W processes), no calibration",
        &rows,
        &attr,
    );
    ok &= verdict(
        "every CPU busy without calibration is flagged unidentified",
        !attr.sources[0].static_origin.identified(),
        attr.sources[0].static_origin.kind().to_string(),
    );
    let calibrated = Options {
        calibrated: [(
            attribute::source_key(&simulate(&all).sources[0]),
            Calibrated {
                watts: all.static_w,
                date: "bench".into(),
                file: String::new(),
            },
        )]
        .into(),
        ..Options::default()
    };
    let (rows, attr) = evaluate(&all, &calibrated);
    print_table(
        "Every CPU always busy (15 W and 5 W processes), calibrated",
        &rows,
        &attr,
    );
    let e = max_err(&rows, 0.0, |r| r.ours_err);
    ok &= verdict(
        "every CPU busy ≤ 5% per process with calibration",
        e <= 0.05,
        format!("worst {:.2}%", e * 100.0),
    );

    ok &= dvfs();

    let smt = scenarios::smt_siblings(23);
    let time = Options {
        static_w: Some(smt.static_w),
        power_model: PowerModel::Time,
        ..Options::default()
    };
    let (rows, attr) = evaluate(&smt, &time);
    print_table(
        "SMT siblings (second busy sibling adds 25%), per core first",
        &rows,
        &attr,
    );
    let e = max_err(&rows, 0.0, |r| r.ours_err);
    ok &= verdict(
        "SMT ≤ 5% per process",
        e <= 0.05,
        format!("worst {:.2}%", e * 100.0),
    );
    ok
}

/// DVFS classes (1.2–3.6 GHz, power ∝ frequency): time weights against the probe's cycles
/// weights, both with the busy-time split (`--power-model time`) and the true static power.
fn dvfs() -> bool {
    let cfg = scenarios::dvfs_classes(24);
    let opts = Options {
        static_w: Some(cfg.static_w),
        power_model: PowerModel::Time,
        ..Options::default()
    };
    let (rows, attr) = evaluate_weighted(&cfg, &opts, false);
    print_table(
        "DVFS classes (1.2–3.6 GHz, 5 W per GHz), time weights (no counter)",
        &rows,
        &attr,
    );
    let time = max_err(&rows, 0.0, |r| r.ours_err);
    let (rows, attr) = evaluate_weighted(&cfg, &opts, true);
    print_table(
        "DVFS classes (1.2–3.6 GHz, 5 W per GHz), cycles weights",
        &rows,
        &attr,
    );
    let cycles = max_err(&rows, 0.0, |r| r.ours_err);
    verdict(
        "DVFS: cycles weights ≤ 5% where time weights are off by > 20%",
        cycles <= 0.05 && time > 0.20,
        format!(
            "cycles worst {:.2}%, time worst {:.1}%",
            cycles * 100.0,
            time * 100.0
        ),
    )
}

/// Coverage of the 95% intervals of function energies over many short simulated runs.
fn ci_coverage() -> bool {
    let trials = 150;
    let (mut inside, mut total) = (0u32, 0u32);
    for seed in 0..trials {
        let cfg = SimConfig {
            seed: 1000 + seed,
            packages: 1,
            cpus_per_package: 4,
            duration_ns: 5_000_000_000,
            classes: vec![
                SimClass {
                    functions: vec![3.0, 1.0, 0.3],
                    ..class("app", 1, 12.0, 1.0, 2_000_000)
                },
                SimClass {
                    functions: vec![1.0, 1.0],
                    ..class("other", 2, 12.0, 0.7, 1_000_000)
                },
            ],
            ..SimConfig::default()
        };
        let out = simulate(&cfg);
        let opts = Options {
            power_model: PowerModel::Time,
            ..given_static(&cfg)
        };
        let attr = attribute::attribute(&input(&out), &opts);
        for (&addr, &truth) in &out.truth.function_uj {
            let est = estimate_samples(&attr, &attr.headline, |i| {
                out.samples[i].user_stack.first() == Some(&addr)
            });
            // Energy no sample carries is known per thread, not per function: share it by
            // the function's sampled fraction so the estimate targets the function's total.
            let residual: f64 = attr
                .threads
                .iter()
                .filter(|t| t.tgid == addr_tgid(addr))
                .map(|t| attr.headline_uj(&t.no_stack))
                .sum();
            let sampled: f64 = attr
                .sample_energy
                .iter()
                .zip(&attr.sample_thread)
                .filter(|(_, k)| k.0 == addr_tgid(addr))
                .map(|(e, _)| attr.headline_uj(e))
                .sum();
            let scale = if sampled > 0.0 {
                1.0 + residual / sampled
            } else {
                1.0
            };
            let (lo, hi) = (est.lo_uj * scale, est.hi_uj * scale);
            total += 1;
            if lo <= truth && truth <= hi {
                inside += 1;
            }
        }
    }
    let coverage = f64::from(inside) / f64::from(total);
    println!(
        "\n## 95% confidence intervals of function energy ({trials} runs of 5 s, 99 Hz, {total} intervals)"
    );
    println!("coverage: {:.1}% ({inside}/{total})", coverage * 100.0);
    verdict(
        "CI coverage 90–98%",
        (0.90..=0.98).contains(&coverage),
        format!("{:.1}%", coverage * 100.0),
    )
}

/// The simulator lays out function addresses per process (see `sim::function_addr`).
fn addr_tgid(addr: u64) -> u32 {
    ((addr - 0x40_0000) / 0x1000) as u32
}

/// Median and worst of a list.
fn median_worst(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let median = if v.is_empty() { 0.0 } else { v[v.len() / 2] };
    (median, v.last().copied().unwrap_or(0.0))
}

/// Never-idle machines, 10 seeds each, absolute joules per process: a 10 ms duty
/// cycle beside a pinned spinner with no calibration (1 ms and 3 ms counters), and three
/// always-runnable classes of 15, 5 and 10 W on 2 CPUs with static power calibrated at
/// 6.2 W (true 6 W). The 95% intervals of per-process joules (`ci_j`) are checked too.
fn never_idle() -> bool {
    let mut ok = true;
    let rollup = |out: &SimOutput, attr: &Attribution| {
        let threads = std::collections::HashMap::new();
        pipeline::rollup::processes(&pipeline::rollup::RollupInput {
            attribution: attr,
            timeline: &out.timeline,
            samples: &out.samples,
            process_events: &[],
            threads: &threads,
            cgroup_name: &|_| String::new(),
        })
    };
    // (worst per-process |error|, processes whose interval holds the truth, processes)
    let score = |out: &SimOutput, attr: &Attribution| {
        let procs = rollup(out, attr);
        let (mut worst, mut inside, mut n) = (0.0f64, 0, 0);
        for (&tgid, &truth_uj) in &out.truth.class_uj {
            let truth = truth_uj * 1e-6;
            let Some(p) = procs.iter().find(|p| p.pid == tgid) else {
                continue;
            };
            let j: f64 = p.energy_j.values().sum();
            worst = worst.max(((j - truth) / truth).abs());
            inside += usize::from(p.ci_j[0] <= truth && truth <= p.ci_j[1]);
            n += 1;
        }
        (worst, inside, n)
    };
    // (counter period, reads in step with its updates, seeds static must be within 15%)
    for (period_ms, in_step, static_min) in [(1u64, false, 10usize), (3, false, 9), (1, true, 10)] {
        let (mut static_errs, mut proc_errs) = (Vec::new(), Vec::new());
        let (mut identified, mut inside, mut n) = (0, 0, 0);
        for seed in 1..=10 {
            let cfg = if in_step {
                scenarios::duty_cycle_reads_in_step(seed)
            } else {
                scenarios::duty_cycle_beside_spinner(seed, period_ms * 1_000_000)
            };
            let out = simulate(&cfg);
            let attr = attribute::attribute(&input(&out), &Options::default());
            let s = &attr.sources[0];
            identified += usize::from(s.static_origin.identified());
            static_errs.push(((s.static_w - cfg.static_w) / cfg.static_w).abs());
            let (w, i, k) = score(&out, &attr);
            proc_errs.push(w);
            (inside, n) = (inside + i, n + k);
        }
        let (sm, sw) = median_worst(static_errs.clone());
        let (pm, pw) = median_worst(proc_errs.clone());
        let static_ok = static_errs.iter().filter(|e| **e < 0.15).count();
        let reads = if in_step {
            ", read 100 µs after each update"
        } else {
            ""
        };
        println!(
            "\n## 10 ms duty cycle beside a pinned spinner, {period_ms} ms counter{reads}, no calibration (10 seeds)"
        );
        println!(
            "static identified in {identified}/10; static error median {:.1}%, worst {:.1}%; per-process joules error median {:.1}%, worst {:.1}%; 95% intervals hold the truth for {inside}/{n} processes",
            sm * 100.0,
            sw * 100.0,
            pm * 100.0,
            pw * 100.0
        );
        ok &= verdict(
            &format!(
                "{period_ms} ms counter{reads}: static within 15% in >= {static_min}/10, per-process joules within 10% in 10/10"
            ),
            static_ok >= static_min && pw < 0.10,
            format!(
                "static {static_ok}/10, per-process worst {:.1}%",
                pw * 100.0
            ),
        );
    }
    let mut errs = Vec::new();
    let (mut inside, mut n) = (0, 0);
    for seed in 1..=10 {
        let cfg = scenarios::three_always_runnable(seed);
        let out = simulate(&cfg);
        let opts = Options {
            calibrated: [(
                attribute::source_key(&out.sources[0]),
                Calibrated {
                    watts: 6.2,
                    date: "bench".into(),
                    file: String::new(),
                },
            )]
            .into(),
            ..Options::default()
        };
        let attr = attribute::attribute(&input(&out), &opts);
        let (w, i, k) = score(&out, &attr);
        errs.push(w);
        (inside, n) = (inside + i, n + k);
    }
    let within = errs.iter().filter(|e| **e < 0.10).count();
    let (m, w) = median_worst(errs);
    println!(
        "\n## Three always-runnable classes (15, 5, 10 W) on 2 CPUs, calibrated 6.2 W (true 6), 10 s (10 seeds)"
    );
    println!(
        "per-process joules worst error per run: median {:.1}%, worst {:.1}%; within 10% in {within}/10 runs; 95% intervals hold the truth for {inside}/{n} processes",
        m * 100.0,
        w * 100.0
    );
    ok &= verdict(
        "three always-runnable classes within 10% in >= 9/10 runs, intervals cover >= 90%",
        within >= 9 && inside * 10 >= n * 9,
        format!("{within}/10 runs, coverage {inside}/{n}"),
    );
    ok
}
