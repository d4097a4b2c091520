//! The power-model stability runs: two scenarios whose processes draw different watts per
//! CPU-second (mixed duty cycles at 15, 5 and 8 W; phases of 12 and 4 W with idle gaps)
//! and one of equal watts, each over ten seeds and three counters (RAPL's 1 ms; a 3 ms
//! writer that lags up to 5 ms more under load; a VM's counter updated once a second),
//! static power found from the recording. Every run's error is printed, not a mean.
//! `cargo bench -p energy-bpf --bench accuracy -- power-model` runs only these.

use energy_bpf::attribute::{Options, PowerModel};
use energy_bpf::testing::scenarios::{self, Counter};
use energy_bpf::testing::sim::{SimConfig, SimOutput, simulate};

use super::{Row, evaluate, verdict};

/// Each process's error against the energy it drew over the span the readings measured
/// (from the start to the last reading that saw an update: a counter updated once a second
/// leaves up to a second at the end unmeasured, as the recorder's last read does).
fn span_errors(cfg: &SimConfig, out: &SimOutput, end_ns: u64, rows: &[Row]) -> Vec<f64> {
    cfg.classes
        .iter()
        .zip(rows)
        .map(|(c, r)| {
            let busy_ns: u64 = out
                .timeline
                .cpus
                .iter()
                .flat_map(|ct| ct.runs_in(0, end_ns))
                .filter(|run| run.is_busy() && run.tgid == c.tgid)
                .map(|run| run.overlap_ns(0, end_ns))
                .sum();
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
}

pub fn power_model_runs() -> bool {
    let mut ok = true;
    let scenarios: [Scenario; 3] = [
        (
            "mixed duty cycles, 15 / 5 / 8 W",
            scenarios::mixed_duty,
            false,
        ),
        ("phased 12 / 4 W with idle gaps", scenarios::phased, false),
        (
            "mixed duty cycles, equal 10 W",
            |seed| scenarios::mixed_duty_watts(seed, [10.0, 10.0, 10.0]),
            true,
        ),
    ];
    for (title, make, equal) in scenarios {
        for counter in Counter::ALL {
            println!("\n## {title}; counter {} ({RUNS} seeds)", counter.name());
            println!(
                "| seed | model | uncertain | held-out SSE reg/time (weight) | fitted W (± se) | error per process (auto) | time | regression |"
            );
            println!("|---:|---|---|---:|---|---|---|---|");
            let mut runs = Vec::new();
            for seed in 1..=RUNS {
                let cfg = counter.apply(make(seed));
                // In a VM the host's share gives static power (the hypervisor source);
                // elsewhere it is found from the recording.
                let base = Options {
                    static_w: (counter == Counter::Vm).then_some(cfg.static_w),
                    ..Options::default()
                };
                let (rows, attr) = evaluate(&cfg, &base);
                let out = simulate(&cfg);
                let end_ns = attr.sources[0].intervals.last().map_or(0, |iv| iv.end_ns);
                let forced = |m: PowerModel| {
                    let (rows, _) = evaluate(
                        &cfg,
                        &Options {
                            power_model: m,
                            ..base.clone()
                        },
                    );
                    errs(&span_errors(&cfg, &out, end_ns, &rows))
                };
                let src = &attr.sources[0];
                let (ratio, fitted) =
                    src.regression
                        .as_ref()
                        .map_or((String::from("-"), String::from("-")), |r| {
                            (
                                format!(
                                    "{:.3} (w {:.2})",
                                    r.heldout_sse_regression / r.heldout_sse_time,
                                    r.regression_weight
                                ),
                                r.classes
                                    .iter()
                                    .map(|c| format!("{:.1}±{:.1}", c.fit.watts, c.fit.se_w))
                                    .collect::<Vec<_>>()
                                    .join(" "),
                            )
                        });
                let errors = span_errors(&cfg, &out, end_ns, &rows);
                let uncertain = src.power_model_uncertain.is_some();
                println!(
                    "| {seed} | {:?} | {} | {ratio} | {fitted} | {} | {} | {} |",
                    src.power_model,
                    if uncertain { "yes" } else { "no" },
                    errs(&errors),
                    forced(PowerModel::Time),
                    forced(PowerModel::Regression),
                );
                runs.push(Run { errors, uncertain });
            }
            ok &= judge(title, counter, equal, &runs);
        }
    }
    ok
}

fn errs(e: &[f64]) -> String {
    e.iter()
        .map(|x| format!("{:+.1}%", x * 100.0))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The targets: every process within 15% in at least 9 of 10 runs and never more than 25%
/// off without the uncertainty flag; equal watts within 5% in every run.
fn judge(title: &str, counter: Counter, equal: bool, runs: &[Run]) -> bool {
    let worst = |r: &Run| r.errors.iter().fold(0.0f64, |a, e| a.max(e.abs()));
    if equal {
        let w = runs.iter().map(worst).fold(0.0f64, f64::max);
        return verdict(
            &format!(
                "{title}, {}: every process within 5% in every run",
                counter.name()
            ),
            w <= 0.05,
            format!("worst {:.1}%", w * 100.0),
        );
    }
    let within = runs.iter().filter(|r| worst(r) <= 0.15).count();
    let unflagged = runs
        .iter()
        .filter(|r| worst(r) > 0.25 && !r.uncertain)
        .count();
    verdict(
        &format!(
            "{title}, {}: within 15% in ≥ 9 of {RUNS}, never > 25% unflagged",
            counter.name()
        ),
        within * 10 >= runs.len() * 9 && unflagged == 0,
        format!(
            "{within} of {} within 15%, {unflagged} over 25% without power_model_uncertain",
            runs.len()
        ),
    )
}
