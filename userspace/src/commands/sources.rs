//! `energy-bpf sources` (being built; see the issue for this command).
use std::process::ExitCode;

/// Arguments of `energy-bpf sources`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs the command.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`sources` is not available in this build yet")
}
