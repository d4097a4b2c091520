//! `cargo xtask test --slow-machine`: the integration tests (the real probes, workloads
//! and timings) while one CPU is kept busy by a spinner pinned to it, so that a test which
//! assumes how much a fixed time produces fails here rather than on a slower machine.
//!
//! The spinner takes the last CPU at normal priority, so a workload there gets about half
//! of it, and everything else (probe loading, the tools the tests start) runs slower.
//! `ENERGY_BPF_TEST_BUSY_CPU` tells the tests which CPU it holds; a test that cannot hold
//! with a CPU taken (one that needs idle time, or a quiet machine, by design) skips itself
//! and prints why (`tests/util.rs`, `unless_cpu_taken`).
use std::process::{Child, Command, Stdio};

use crate::util::{self, Result};

/// A busy loop pinned to one CPU, killed on drop.
struct Spinner(Child);

impl Spinner {
    fn start(cpu: usize) -> Result<Self> {
        Command::new("taskset")
            .args(["-c", &cpu.to_string(), "sh", "-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .spawn()
            .map(Spinner)
            .map_err(|e| format!("cannot start the spinner (taskset): {e}"))
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds the integration tests, then runs them beside a spinner on the last CPU.
pub fn run(extra: &[String]) -> Result {
    let base = [
        "test",
        "--locked",
        "-p",
        "energy-bpf",
        "--test",
        "integration",
    ];
    // Build first, without the spinner: the build's time is not what is tested.
    let mut build = base.to_vec();
    build.push("--no-run");
    util::cargo(&build)?;
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let busy = cpus - 1;
    let _spinner = Spinner::start(busy)?;
    eprintln!("xtask: slow machine: CPU {busy} of {cpus} kept busy by a pinned spinner");
    for (test, why) in self_skipped()? {
        eprintln!("xtask: slow machine: {test} skips itself: {why}");
    }
    let mut args = base.to_vec();
    args.push("--");
    args.extend(extra.iter().map(String::as_str));
    util::status(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(&args)
            .env("ENERGY_BPF_TEST_BUSY_CPU", busy.to_string())
            .current_dir(util::root()),
    )
}

/// The tests that skip themselves with a CPU taken, and why: each `unless_cpu_taken(NAME,
/// WHY)` call in `tests/`, read from the source so the list cannot drift from the tests.
fn self_skipped() -> Result<Vec<(String, String)>> {
    let dir = util::root().join("tests");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        // util.rs defines the function; the tests call it.
        if path.extension().is_none_or(|e| e != "rs") || path.ends_with("util.rs") {
            continue;
        }
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for call in text.split("unless_cpu_taken(").skip(1) {
            let mut literals = call.split('"').skip(1).step_by(2);
            if let (Some(test), Some(why)) = (literals.next(), literals.next()) {
                found.push((test.to_string(), why.to_string()));
            }
        }
    }
    found.sort();
    Ok(found)
}
