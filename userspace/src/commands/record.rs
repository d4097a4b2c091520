//! `energy-bpf record` (being built; see the issue for this command).
use std::process::ExitCode;

/// Arguments of `energy-bpf record`.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs the command.
pub fn run(_args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`record` is not available in this build yet")
}
