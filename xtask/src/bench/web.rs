//! `cargo xtask bench web [ROUNDS]`: what the web view costs the agent, chiefly the recent
//! windows' stacks it keeps in memory for flamegraphs. Paired, alternating rounds (at least
//! 15): the release agent at its defaults, and with `--no-web`, each started afresh, 8 s of
//! warm-up, then its CPU over 20 s, beside two busy shells that keep the sampler's stacks
//! coming (one spinning, one in short bursts). Reports each round, the median CPU of each
//! side, and the median paired difference with its 95% bootstrap interval.
use std::{process::Command, thread, time::Duration};

use crate::util::Result;

/// Warm-up before measuring: the first windows allocate what later ones reuse.
const WARM: Duration = Duration::from_secs(8);
/// Measured span per run.
const MEASURED: Duration = Duration::from_secs(20);

/// Runs the benchmark.
pub fn run(rounds: usize) -> Result {
    let rounds = rounds.max(15);
    let bin = super::release_bin()?;
    let load = [
        "while :; do :; done",
        "while :; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.001; done",
    ]
    .map(|script| Command::new("sh").args(["-c", script]).spawn());
    let result = rounds_of(&bin, rounds);
    for mut shell in load.into_iter().flatten() {
        let _ = shell.kill();
        let _ = shell.wait();
    }
    result
}

fn rounds_of(bin: &std::path::Path, rounds: usize) -> Result {
    println!(
        "# bench web: {rounds} paired rounds, alternating; `energy-bpf agent` with its web view (the default) and with --no-web, each {} s warm-up then {} s measured beside two busy shells; agent CPU in % of one CPU",
        WARM.as_secs(),
        MEASURED.as_secs()
    );
    let (mut web, mut bare, mut diff) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut pair = [0.0; 2];
        for k in 0..2 {
            let side = (round + k) % 2;
            pair[side] = one_run(bin, side == 1)?;
        }
        println!(
            "round {round:>2}  web {:.3}%  --no-web {:.3}%",
            pair[0], pair[1]
        );
        web.push(pair[0]);
        bare.push(pair[1]);
        diff.push(pair[0] - pair[1]);
    }
    let (lo, hi) = super::server::median_interval(&diff);
    println!(
        "median: web {:.3}%, --no-web {:.3}% of one CPU; paired difference {:+.3} points, 95% interval [{lo:+.3}, {hi:+.3}]",
        super::median(&web),
        super::median(&bare),
        super::median(&diff)
    );
    Ok(())
}

/// The agent's CPU over [`MEASURED`], in % of one CPU.
fn one_run(bin: &std::path::Path, no_web: bool) -> Result<f64> {
    let agent = super::BenchAgent::start(bin, if no_web { &["--no-web"] } else { &[] })?;
    thread::sleep(WARM);
    let before = super::agent::cpu_seconds(agent.pid())?;
    thread::sleep(MEASURED);
    let after = super::agent::cpu_seconds(agent.pid())?;
    Ok((after - before) / MEASURED.as_secs_f64() * 100.0)
}
