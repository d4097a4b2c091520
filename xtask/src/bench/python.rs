//! `cargo xtask bench python [ROUNDS]`: the CPython frame walker's cost.

use std::{path::Path, process::Command, time::Instant};

use super::{median, quartiles, release_bin, start_recorder, stop_recorder};
use crate::util::{self, Result};

/// The CPython frame walker's cost: a CPU-bound pure-Python loop alone, under `record
/// --unwind fp -F 99` with the walker off (`ENERGY_BPF_PYTHON=0`), and with it on; rounds
/// rotate the order, slowdowns are against the same round's run alone.
pub(super) fn run(rounds: usize) -> Result {
    let recorder = release_bin()?;
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        return Err("bench python needs /usr/bin/python3".into());
    }
    let out = util::root().join("bench-out");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {}: {e}", out.display()))?;
    // About 1.5 s alone; nested calls so every sample has a few Python frames.
    let script = "def leaf(n):\n    t = 0\n    for i in range(n):\n        t += i * i % 7\n    return t\n\
                  def mid(n):\n    return leaf(n)\n\
                  def top(r):\n    for _ in range(r):\n        mid(100000)\n\
                  top(150)\n";
    let modes = ["alone", "fp, python walker off", "fp, python walker on"];
    let mut times: [Vec<f64>; 3] = Default::default();
    let mut cpu: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        for k in 0..modes.len() {
            let i = (k + round) % modes.len();
            let mut rec = match i {
                0 => None,
                _ => Some(start_recorder(
                    Command::new(&recorder)
                        .args(["record", "--unwind", "fp", "-F", "99", "-o"])
                        .arg(out.join(format!("py{round}-{i}.ebpr")))
                        .env("ENERGY_BPF_PYTHON", if i == 1 { "0" } else { "1" }),
                    Some("recording"),
                )?),
            };
            let started = Instant::now();
            let status = Command::new(python)
                .args(["-c", script])
                .status()
                .map_err(|e| format!("python3: {e}"))?;
            times[i].push(started.elapsed().as_secs_f64());
            if !status.success() {
                return Err(format!("python3 failed: {status}"));
            }
            if let Some(child) = rec.as_mut() {
                cpu[i].push(stop_recorder(child)?.cpu_s);
            }
        }
    }
    let slowdowns: Vec<Vec<f64>> = times
        .iter()
        .map(|t| t.iter().zip(&times[0]).map(|(t, a)| t / a - 1.0).collect())
        .collect();
    println!(
        "# bench python: {rounds} rounds, CPU-bound pure Python under record -F 99 --unwind fp;\n\
         # slowdown = median over rounds of (time / the same round's time alone) - 1, [quartiles]"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>17} {:>14}",
        "mode", "median s", "slowdown", "quartiles", "recorder CPU s"
    );
    for (i, name) in modes.iter().enumerate() {
        let (q1, q2, q3) = quartiles(&slowdowns[i]);
        let rec_cpu = if cpu[i].is_empty() {
            "-".to_string()
        } else {
            format!("{:.3}", median(&cpu[i]))
        };
        println!(
            "{:<28} {:>9.3} {:>8.2}% {:>17} {:>14}",
            name,
            median(&times[i]),
            100.0 * q2,
            format!("[{:+.1}%, {:+.1}%]", 100.0 * q1, 100.0 * q3),
            rec_cpu
        );
    }
    println!(
        "python walker on - off slowdown at 99 Hz: {:+.2} percentage points",
        100.0 * (median(&slowdowns[2]) - median(&slowdowns[1]))
    );
    // The same runs as a ratio: each round's walker-on time over its walker-off time.
    let ratios: Vec<f64> = times[2]
        .iter()
        .zip(&times[1])
        .map(|(on, off)| on / off)
        .collect();
    let (r1, r2, r3) = quartiles(&ratios);
    println!(
        "python walker on / --unwind fp walker off, time ratio: {r2:.4} [{r1:.4}, {r3:.4}] \
         (median [quartiles] over rounds)"
    );
    Ok(())
}
