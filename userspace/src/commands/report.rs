//! `energy-bpf report` (being built; see the issue for this command).
use std::process::ExitCode;

/// Arguments of `energy-bpf report`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs the command.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`report` is not available in this build yet")
}
