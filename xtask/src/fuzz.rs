//! `cargo xtask fuzz [SECS]`: runs every cargo-fuzz target in `fuzz/` for SECS seconds
//! (default 60) with the pinned nightly. Each starts from the checked-in seeds
//! (`fuzz/seeds/TARGET`, made from real recordings) and what earlier runs found
//! (`fuzz/corpus/TARGET`, not checked in). A crash fails the task; libFuzzer leaves the
//! input in `fuzz/artifacts/TARGET/` — turn it into a regression test.
use std::process::Command;

use crate::util::{self, Result, status};

/// The targets, as named in `fuzz/Cargo.toml`.
pub const TARGETS: &[&str] = &[
    "recording",
    "columns",
    "btf",
    "socket",
    "unwind",
    "python_lines",
    "perf_map",
    "podlist",
    "web_query",
    "carbon",
];

/// Seconds per target when `cargo xtask test` runs them: enough to replay the seeds and
/// explore a little, small next to the suite's few minutes.
pub const TEST_SECS: u64 = 20;

/// Parses `[SECS]` and runs every target for that long.
pub fn run(args: &[String]) -> Result {
    let secs = match args.first() {
        None => 60,
        Some(s) => s
            .parse()
            .map_err(|_| format!("usage: cargo xtask fuzz [SECS] (got {s:?})"))?,
    };
    run_all(secs)
}

/// Builds the targets, then runs each for `secs` seconds.
pub fn run_all(secs: u64) -> Result {
    let nightly = crate::setup::pinned_nightly()?;
    status(fuzz_cmd(&nightly).arg("build"))?;
    for target in TARGETS {
        let corpus = util::root().join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .map_err(|e| format!("cannot create {}: {e}", corpus.display()))?;
        status(fuzz_cmd(&nightly).args([
            "run",
            target,
            &format!("fuzz/corpus/{target}"),
            &format!("fuzz/seeds/{target}"),
            "--",
            &format!("-max_total_time={secs}"),
            // Inputs up to 64 KiB; any single allocation over 512 MiB or a process over
            // 2 GiB (with the sanitizer's own overhead) is a bug: reading is bounded by
            // 200 MiB + 20 x the input size.
            "-max_len=65536",
            "-malloc_limit_mb=512",
            "-rss_limit_mb=2048",
            "-print_final_stats=1",
        ]))?;
    }
    Ok(())
}

fn fuzz_cmd(nightly: &str) -> Command {
    // The rustup proxy, not the stable cargo that runs xtask (`CARGO`): `+nightly` picks
    // the toolchain that cargo-fuzz's sanitizer flags need.
    let mut cmd = Command::new("cargo");
    cmd.arg(format!("+{nightly}"))
        .arg("fuzz")
        .current_dir(util::root())
        .env_remove("CARGO")
        .env_remove("RUSTUP_TOOLCHAIN");
    cmd
}
