//! `energy-bpf`: the command line. Parsing and dispatch only; the library does the work.
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use energy_bpf::commands;

/// System-wide energy profiler: which code burned these joules?
#[derive(Parser)]
#[command(name = "energy-bpf", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Record scheduling, stacks and energy readings to a file.
    Record(commands::record::Args),
    /// Summarise a recording per process and thread.
    Report(commands::report::Args),
    /// List the energy sources on this machine and which one would be used.
    Sources(commands::sources::Args),
    /// Live per-process and per-thread power, like top.
    Top(commands::top::Args),
    /// Energy flamegraph (SVG, collapsed, pprof, speedscope) from a recording.
    Flamegraph(commands::flamegraph::Args),
    /// Always-on daemon: continuous capture, Prometheus metrics per process and container.
    Agent(commands::agent::Args),
    /// Measure static (all-idle) power per energy source on a quiet machine.
    Calibrate(commands::calibrate::Args),
    /// Compare two versions: energy per function (or process) with 95% intervals and
    /// significance; differential flamegraph; CI gate.
    Diff(commands::diff::Args),
    /// The estimated model's parameters here, or for a machine described by flags: the
    /// power-table row, idle and full-load watts, the load curve and the error.
    Model(commands::model::Args),
    /// Run one built-in roofline kernel (a known memory- or compute-bound workload).
    #[command(hide = true)]
    Kernel(commands::kernel::Args),
    /// Write man pages and shell completions (for packages).
    #[command(hide = true)]
    Assets(commands::assets::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The agent is a daemon: its start, bound address and stop are worth a line in the
    // journal. One-shot commands only say what goes wrong.
    let default_level = match cli.command {
        Command::Agent(_) => "info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ENERGY_BPF_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level)),
        )
        .with_writer(std::io::stderr)
        // journald and log files get plain text, a terminal gets colour.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let result = match cli.command {
        Command::Record(args) => commands::record::run(args),
        Command::Report(args) => commands::report::run(args),
        Command::Sources(args) => commands::sources::run(args),
        Command::Top(args) => commands::top::run(args),
        Command::Flamegraph(args) => commands::flamegraph::run(args),
        Command::Agent(args) => commands::agent::run(args),
        Command::Calibrate(args) => commands::calibrate::run(args),
        Command::Diff(args) => commands::diff::run(args),
        Command::Kernel(args) => commands::kernel::run(&args),
        Command::Assets(args) => {
            commands::assets::run(&args, <Cli as clap::CommandFactory>::command())
        }
        Command::Model(args) => commands::model::run(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            // One clear line (context, then causes), no panic, non-zero exit. Library errors
            // often already quote their cause; it is not repeated.
            let mut line = err.to_string();
            for cause in err.chain().skip(1).map(ToString::to_string) {
                if !line.contains(&cause) {
                    line = format!("{line}: {cause}");
                }
            }
            eprintln!("energy-bpf: error: {line}");
            ExitCode::FAILURE
        }
    }
}
