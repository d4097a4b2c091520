//! `energy-bpf flamegraph` (being built; see the issue for this command).
use std::process::ExitCode;

/// Arguments of `energy-bpf flamegraph`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs the command.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`flamegraph` is not available in this build yet")
}
