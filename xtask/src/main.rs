//! Project tasks, run as `cargo xtask <task>`:
//!
//! - `setup`: install what a fresh machine lacks (apt packages, the pinned eBPF nightly
//!   with rust-src, bpf-linker built against LLVM 22). Idempotent; does nothing when all
//!   is present.
//! - `cycles`: fail when files of `userspace/src` import each other in a cycle.
//! - `test`: setup, then format check, the import-cycle check, clippy, the whole test suite (the eBPF
//!   integration tests run for real: they need root, which CI has), `model-table check`,
//!   the Debian package test (`deb::test_package`), and each fuzz target for a short
//!   fixed time.
//! - `test --slow-machine`: setup, then only the integration tests, with one CPU kept busy
//!   by a pinned spinner: a test that assumes how fast the machine is fails here.
//! - `fuzz [SECS]`: setup, then run every cargo-fuzz target for SECS seconds (default 60).
//! - `model-table build|check`: the estimated model's CPU power table from SPECpower
//!   results, and its held-out check (docs/estimated-energy.md).
//! - `run ARGS...`: setup, build release, run `energy-bpf ARGS...` (e.g. `run top`).
//! - `deb [--install-test]`: a Debian package in `target/deb/`; with `--install-test`,
//!   installed into a debootstrapped Debian root and checked there.
//! - `bench overhead|accuracy|outputs|top|agent`: benchmarks (see README); setup is skipped
//!   when `ENERGY_BPF_BIN` names a prebuilt binary.
use std::process::ExitCode;

mod bench;
mod cycles;
mod deb;
mod fuzz;
mod guest_kernel;
mod model_table;
mod setup;
mod slow;
mod util;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("setup") => setup::run(),
        Some("cycles") => cycles::run(),
        Some("test") if args.get(1).is_some_and(|a| a == "--slow-machine") => {
            setup::run().and_then(|()| slow::run(&args[2..]))
        }
        Some("test") => setup::run().and_then(|()| test(&args[1..])),
        Some("fuzz") => setup::run().and_then(|()| fuzz::run(&args[1..])),
        Some("run") => setup::run().and_then(|()| run(&args[1..])),
        Some("model-table") => model_table::run(&args[1..]),
        Some("deb") => setup::run().and_then(|()| deb::run(&args[1..])),
        // A prebuilt binary (`ENERGY_BPF_BIN`, e.g. on a machine without cargo or network):
        // nothing to build, so nothing to install; a bench checks its own tools.
        Some("bench") if std::env::var_os("ENERGY_BPF_BIN").is_some() => bench::run(&args[1..]),
        Some("bench") => setup::run().and_then(|()| bench::run(&args[1..])),
        _ => Err(
            "usage: cargo xtask setup | cycles | test [--slow-machine] | fuzz [SECS] | run ARGS... | deb [--install-test] | bench overhead|python|accuracy|outputs|diff|top|agent|server|probe|web|agent-scale"
                .into(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn test(extra: &[String]) -> util::Result {
    util::cargo(&["fmt", "--all", "--check"])?;
    cycles::run()?;
    // The probes crate is built for the BPF target by userspace/build.rs; on the host it
    // is only a stub library, so it is left out of the host-side workspace commands.
    let host = ["--workspace", "--exclude", "energy-bpf-probes"];
    let mut clippy = vec!["clippy", "--locked", "--all-targets"];
    clippy.extend(host);
    clippy.extend(["--", "-D", "warnings"]);
    util::cargo(&clippy)?;
    // The library's docs: every public item documented, every intra-doc link resolving.
    util::status(
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "doc",
                "--locked",
                "--no-deps",
                "-p",
                "energy-bpf",
                "-p",
                "energy-bpf-abi",
            ])
            .env(
                "RUSTDOCFLAGS",
                "-D warnings -D missing_docs -D rustdoc::broken_intra_doc_links",
            )
            .current_dir(util::root()),
    )?;
    let mut args = vec!["test", "--locked", "--no-fail-fast"];
    args.extend(host);
    args.extend(extra.iter().map(String::as_str));
    util::cargo(&args)?;
    // The estimated model's table is what its build makes, and its held-out error is
    // within target (the real binary, on servers the table never saw).
    model_table::run(&["check".to_string()])?;
    // The Debian package: lintian, then installed, verified and removed in a Debian root.
    deb::test_package(&util::root().join("target/debug/energy-bpf"))?;
    // Every decoder of outside bytes, fuzzed briefly: the seeds replay, then some search.
    fuzz::run_all(fuzz::TEST_SECS)
}

fn run(args: &[String]) -> util::Result {
    // One progress line; cargo stays quiet unless something fails (then it prints the
    // errors and the probe build's whole log).
    eprintln!("xtask: building energy-bpf and its eBPF probes (release)...");
    util::cargo(&[
        "build",
        "--quiet",
        "--locked",
        "--release",
        "-p",
        "energy-bpf",
    ])?;
    let bin = util::root().join("target/release/energy-bpf");
    let status = std::process::Command::new(&bin)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("energy-bpf exited with {status}"))
    }
}
