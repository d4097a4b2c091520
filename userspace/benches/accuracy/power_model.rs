//! The power-model stability runs: two scenarios whose processes draw different watts per
//! CPU-second (mixed duty cycles at 15, 5 and 8 W; phases of 12 and 4 W with idle gaps)
//! and one of equal watts, each over ten seeds and three counters (RAPL's 1 ms; a 3 ms
//! writer that lags up to 5 ms more under load; a VM's counter updated once a second),
//! static power found from the recording. Every run's error is printed, not a mean.
//! `cargo bench -p energy-bpf --bench accuracy -- power-model` runs only these.
//!
//! `BENCH_POWER_MODEL_SECONDS=20,60,120` runs each scenario at those recording lengths (the
//! same workloads, longer), on the VM's counter unless `BENCH_POWER_MODEL_COUNTERS` says
//! otherwise (`rapl,lagging,vm`); `BENCH_POWER_MODEL_SCENARIOS` (`mixed,phased,equal`)
//! picks scenarios. Unset, every scenario runs 20 s on every counter.
//!
//! Without `BENCH_POWER_MODEL_SECONDS` every cell is also replayed as `top` and the agent
//! see it (two minutes in 5 s windows, judged over the second; `BENCH_POWER_MODEL_LIVE=0`
//! skips it). Static power is then found over the past windows, as `top` finds it without
//! a calibration; `BENCH_POWER_MODEL_LIVE_STATIC=1` gives it on every counter, as a
//! calibration, the agent's learned value or a host's share does.

use energy_bpf::attribute::{ClassLabel, Options, PowerModel, RegressionReport};
use energy_bpf::testing::scenarios::{self, Counter};
use energy_bpf::testing::sim::{SimConfig, SimOutput, live_replay, simulate};

use super::{Row, evaluate, verdict};

/// Each process's error against the energy it drew over the span the readings measured
/// (from the first kept interval's start to the last reading that saw an update: a counter
/// updated once a second leaves up to a second at each end unmeasured, as the recorder's
/// first and last reads do).
fn span_errors(
    cfg: &SimConfig,
    out: &SimOutput,
    (start_ns, end_ns): (u64, u64),
    rows: &[Row],
) -> Vec<f64> {
    cfg.classes
        .iter()
        .zip(rows)
        .map(|(c, r)| {
            let busy_ns = out.busy_ns(c.tgid, end_ns) - out.busy_ns(c.tgid, start_ns);
            let truth_j = c.watts * busy_ns as f64 * 1e-9;
            (r.ours_j - truth_j) / truth_j
        })
        .collect()
}

/// Seeds per scenario and counter.
const RUNS: u64 = 10;

/// A scenario: its title, how to build it from a seed, and whether its watts are equal.
type Scenario = (&'static str, fn(u64) -> SimConfig, bool);

/// One run's outcome.
struct Run {
    errors: Vec<f64>,
    uncertain: bool,
    /// The chance that every process is within 15% for an unbiased estimate with the
    /// least squares' own errors (none without a fit).
    unbiased_within: Option<f64>,
}

/// Where the rows stop being enough: the chance that an unbiased estimate of the classes'
/// watts, with the errors the least-squares fit has on this run's rows (Gauss–Markov: no
/// linear unbiased estimate has smaller ones), puts every process within `bound` of its
/// energy. Each process's relative error is its watts' errors carried through the shares
/// of the split, as the intervals carry them; processes are taken as independent.
fn unbiased_within(reg: &RegressionReport, cfg: &SimConfig, bound: f64) -> f64 {
    let n = reg.classes.len();
    let e: Vec<f64> = reg
        .classes
        .iter()
        .map(|c| (c.fit.watts * c.fit.occupancy).max(0.0))
        .collect();
    let total: f64 = e.iter().sum();
    if total <= 0.0 {
        return 0.0;
    }
    let share: Vec<f64> = e.iter().map(|x| x / total).collect();
    let rel = |k: usize| -> f64 {
        (0..n)
            .map(|j| {
                let c = &reg.classes[j].fit;
                let r = if c.watts > 0.0 { c.se_w / c.watts } else { 0.0 };
                let s = if j == k { 1.0 - share[j] } else { share[j] };
                (s * r).powi(2)
            })
            .sum::<f64>()
            .sqrt()
    };
    (0..n)
        .filter(|&k| {
            matches!(reg.classes[k].label, ClassLabel::Process(t)
                if cfg.classes.iter().any(|c| c.tgid == t))
        })
        .map(|k| match rel(k) {
            r if r > 0.0 => libm::erf(bound / (r * std::f64::consts::SQRT_2)),
            _ => 1.0,
        })
        .product()
}

/// A comma-separated environment list, `None` when unset or empty.
fn env_list(name: &str) -> Option<Vec<String>> {
    let v = std::env::var(name).ok()?;
    let items: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect();
    (!items.is_empty()).then_some(items)
}

/// Recording lengths, s: `BENCH_POWER_MODEL_SECONDS`, else the scenarios' own 20 s.
fn lengths_s() -> Option<Vec<u64>> {
    let items = env_list("BENCH_POWER_MODEL_SECONDS")?;
    let secs: Vec<u64> = items
        .iter()
        .map(|s| {
            s.parse()
                .unwrap_or_else(|_| panic!("BENCH_POWER_MODEL_SECONDS: {s:?} is not seconds"))
        })
        .collect();
    Some(secs)
}

fn counter_key(c: Counter) -> &'static str {
    match c {
        Counter::Rapl => "rapl",
        Counter::Lagging => "lagging",
        Counter::Vm => "vm",
    }
}

pub fn power_model_runs() -> bool {
    let mut ok = true;
    let scenarios: [(&str, Scenario); 3] = [
        (
            "mixed",
            (
                "mixed duty cycles, 15 / 5 / 8 W",
                scenarios::mixed_duty,
                false,
            ),
        ),
        (
            "phased",
            ("phased 12 / 4 W with idle gaps", scenarios::phased, false),
        ),
        (
            "equal",
            (
                "mixed duty cycles, equal 10 W",
                |seed| scenarios::mixed_duty_watts(seed, [10.0, 10.0, 10.0]),
                true,
            ),
        ),
    ];
    let lengths = lengths_s();
    let counters: Vec<Counter> = match (env_list("BENCH_POWER_MODEL_COUNTERS"), &lengths) {
        (Some(keys), _) => Counter::ALL
            .into_iter()
            .filter(|c| keys.iter().any(|k| k == counter_key(*c)))
            .collect(),
        (None, Some(_)) => vec![Counter::Vm],
        (None, None) => Counter::ALL.to_vec(),
    };
    let picked = env_list("BENCH_POWER_MODEL_SCENARIOS");
    let mut summary = Vec::new();
    for (key, (title, make, equal)) in scenarios {
        if picked.as_ref().is_some_and(|p| !p.iter().any(|k| k == key)) {
            continue;
        }
        for &counter in &counters {
            for secs in lengths.clone().unwrap_or_else(|| vec![0]) {
                let (ok_here, line) = scenario_runs(title, make, equal, counter, secs);
                ok &= ok_here;
                summary.push(line);
            }
        }
    }
    if lengths.is_none() && std::env::var("BENCH_POWER_MODEL_LIVE").as_deref() != Ok("0") {
        let mut live = Vec::new();
        for (key, (title, make, equal)) in scenarios {
            if picked.as_ref().is_some_and(|p| !p.iter().any(|k| k == key)) {
                continue;
            }
            for &counter in &counters {
                let (ok_here, line) = live_runs(title, make, equal, counter);
                ok &= ok_here;
                live.push(line);
            }
        }
        println!("\n## live views (5 s windows, the second of two minutes)\n");
        for line in live {
            println!("{line}");
        }
    }
    if lengths.is_some() {
        println!("\n## by recording length\n");
        for line in summary {
            println!("{line}");
        }
    }
    ok
}

/// Ten seeds of one scenario on one counter, `secs` long (0: the scenario's own length):
/// whether the target is met, and a one-line summary.
fn scenario_runs(
    title: &str,
    make: fn(u64) -> SimConfig,
    equal: bool,
    counter: Counter,
    secs: u64,
) -> (bool, String) {
    {
        {
            let length = if secs > 0 {
                format!(", {secs} s")
            } else {
                String::new()
            };
            println!(
                "\n## {title}; counter {}{length} ({RUNS} seeds)",
                counter.name()
            );
            println!(
                "| seed | model | uncertain | held-out SSE reg/time (weight, counter lag) | fitted W (± se) | error per process (auto) | time | regression |"
            );
            println!("|---:|---|---|---:|---|---|---|---|");
            let mut runs = Vec::new();
            for seed in 1..=RUNS {
                let mut cfg = counter.apply(make(seed));
                if secs > 0 {
                    cfg.duration_ns = secs * 1_000_000_000;
                }
                // In a VM the host's share gives static power (the hypervisor source);
                // elsewhere it is found from the recording.
                let base = Options {
                    static_w: (counter == Counter::Vm).then_some(cfg.static_w),
                    ..Options::default()
                };
                let (rows, attr) = evaluate(&cfg, &base);
                let out = simulate(&cfg);
                let ivs = &attr.sources[0].intervals;
                let span = (
                    ivs.first().map_or(0, |iv| iv.start_ns),
                    ivs.last().map_or(0, |iv| iv.end_ns),
                );
                let forced = |m: PowerModel| {
                    let (rows, _) = evaluate(
                        &cfg,
                        &Options {
                            power_model: m,
                            ..base.clone()
                        },
                    );
                    errs(&span_errors(&cfg, &out, span, &rows))
                };
                let src = &attr.sources[0];
                let (ratio, fitted) =
                    src.regression
                        .as_ref()
                        .map_or((String::from("-"), String::from("-")), |r| {
                            (
                                format!(
                                    "{:.3} (w {:.2}, lag {:.2} ms)",
                                    r.heldout_sse_regression / r.heldout_sse_time,
                                    r.regression_weight,
                                    r.lag_ns as f64 * 1e-6
                                ),
                                r.classes
                                    .iter()
                                    .map(|c| format!("{:.1}±{:.1}", c.fit.watts, c.fit.se_w))
                                    .collect::<Vec<_>>()
                                    .join(" "),
                            )
                        });
                let errors = span_errors(&cfg, &out, span, &rows);
                let uncertain = src.power_model_uncertain.is_some();
                println!(
                    "| {seed} | {:?} | {} | {ratio} | {fitted} | {} | {} | {} |",
                    src.power_model,
                    if uncertain { "yes" } else { "no" },
                    errs(&errors),
                    forced(PowerModel::Time),
                    forced(PowerModel::Regression),
                );
                runs.push(Run {
                    errors,
                    uncertain,
                    unbiased_within: src
                        .regression
                        .as_ref()
                        .map(|r| unbiased_within(r, &cfg, 0.15)),
                });
            }
            let title = format!("{title}{length}");
            judge(&title, counter, equal, &runs)
        }
    }
}

fn errs(e: &[f64]) -> String {
    e.iter()
        .map(|x| format!("{:+.1}%", x * 100.0))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The targets: every process within 15% in at least 9 of 10 runs and never more than 25%
/// off without the uncertainty flag; equal watts within 5% in every run (and not flagged).
/// Also a summary line: title, counter, runs within 15% (5% for equal watts), runs flagged,
/// runs over 25% unflagged, the median and worst of each run's worst error, the verdict.
fn judge(title: &str, counter: Counter, equal: bool, runs: &[Run]) -> (bool, String) {
    let worst = |r: &Run| r.errors.iter().fold(0.0f64, |a, e| a.max(e.abs()));
    let mut worsts: Vec<f64> = runs.iter().map(worst).collect();
    worsts.sort_by(f64::total_cmp);
    let median = worsts.get(worsts.len() / 2).copied().unwrap_or(0.0);
    let w = worsts.last().copied().unwrap_or(0.0);
    let flagged = runs.iter().filter(|r| r.uncertain).count();
    let line = |within: usize, bound: u32, unflagged: usize, ok: bool| {
        format!(
            "| {title} | {} | {within}/{} within {bound}% | {flagged} flagged | {unflagged} over 25% unflagged | median {:.1}%, worst {:.1}% | {} |",
            counter.name(),
            runs.len(),
            median * 100.0,
            w * 100.0,
            if ok { "met" } else { "missed" }
        )
    };
    if equal {
        let within = runs.iter().filter(|r| worst(r) <= 0.05).count();
        let ok = verdict(
            &format!(
                "{title}, {}: every process within 5% in every run",
                counter.name()
            ),
            w <= 0.05,
            format!(
                "worst {:.1}%, {flagged} of {} flagged",
                w * 100.0,
                runs.len()
            ),
        );
        return (ok, line(within, 5, 0, ok));
    }
    let within = runs.iter().filter(|r| worst(r) <= 0.15).count();
    let unflagged = runs
        .iter()
        .filter(|r| worst(r) > 0.25 && !r.uncertain)
        .count();
    // What the rows allow: the runs an unbiased estimate would be expected to get within
    // 15%, from each run's least-squares errors. Below 9 the target asks more than the
    // rows hold.
    let allowed = runs
        .iter()
        .map(|r| r.unbiased_within)
        .sum::<Option<f64>>()
        .map_or(String::from("-"), |x| format!("{x:.1}"));
    let ok = verdict(
        &format!(
            "{title}, {}: within 15% in ≥ 9 of {RUNS}, never > 25% unflagged",
            counter.name()
        ),
        within * 10 >= runs.len() * 9 && unflagged == 0,
        format!(
            "{within} of {} within 15%, {unflagged} over 25% without power_model_uncertain; \
             the rows allow an unbiased estimate {allowed} of {} within 15%",
            runs.len(),
            runs.len()
        ),
    );
    (
        ok,
        format!("{} rows allow {allowed} |", line(within, 15, unflagged, ok)),
    )
}

/// Ten seeds of one scenario on one counter replayed as `top` and the agent see it: two
/// minutes cut into 5 s windows through the folded live pipeline, each window's regression
/// fitted on the windows before it (`Options::live`), judged over the second minute by the
/// same targets as whole recordings. A run counts as flagged when a window it was judged
/// on said `power_model_uncertain`.
fn live_runs(
    title: &str,
    make: fn(u64) -> SimConfig,
    equal: bool,
    counter: Counter,
) -> (bool, String) {
    const MINUTE_NS: u64 = 60_000_000_000;
    println!(
        "\n## {title}; counter {}; live, 5 s windows ({RUNS} seeds)",
        counter.name()
    );
    println!(
        "| seed | windows by regression | windows flagged | error per process (second minute) |"
    );
    println!("|---:|---:|---:|---|");
    let mut runs = Vec::new();
    let (mut with_history, mut time_only) = (Vec::new(), Vec::new());
    for seed in 1..=RUNS {
        let mut cfg = counter.apply(make(seed));
        cfg.duration_ns = 2 * MINUTE_NS;
        let options = Options {
            static_w: (counter == Counter::Vm
                || std::env::var_os("BENCH_POWER_MODEL_LIVE_STATIC").is_some())
            .then_some(cfg.static_w),
            ..Options::default()
        }
        .live();
        let five = std::time::Duration::from_secs(5);
        // The past windows' cost: the same replay with the time model, which keeps none.
        let time_options = Options {
            power_model: PowerModel::Time,
            ..options.clone()
        };
        let started = std::time::Instant::now();
        let r = live_replay(&cfg, options, five, MINUTE_NS);
        with_history.push(started.elapsed().as_secs_f64());
        let started = std::time::Instant::now();
        live_replay(&cfg, time_options, five, MINUTE_NS);
        time_only.push(started.elapsed().as_secs_f64());
        let errors: Vec<f64> = r.errors.iter().map(|&(_, e)| e).collect();
        println!(
            "| {seed} | {}/{} | {} | {} |",
            r.by_regression,
            r.windows,
            r.uncertain,
            errs(&errors)
        );
        runs.push(Run {
            errors,
            uncertain: r.uncertain > 0,
            unbiased_within: None,
        });
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "replay of 24 windows with their simulation, median: {:.0} ms with past windows, {:.0} ms with the time model",
        median(&mut with_history) * 1e3,
        median(&mut time_only) * 1e3
    );
    judge(&format!("{title}, live"), counter, equal, &runs)
}
