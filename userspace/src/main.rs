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
    #[command(after_long_help = EXAMPLES_RECORD)]
    Record(commands::record::Args),
    /// Summarise a recording per process and thread.
    #[command(after_long_help = EXAMPLES_REPORT)]
    Report(commands::report::Args),
    /// List the energy sources on this machine and which one would be used.
    #[command(after_long_help = EXAMPLES_SOURCES)]
    Sources(commands::sources::Args),
    /// Live per-process and per-thread power, like top.
    #[command(after_long_help = EXAMPLES_TOP)]
    Top(commands::top::Args),
    /// Energy flamegraph (SVG, collapsed, pprof, speedscope) from a recording.
    #[command(after_long_help = EXAMPLES_FLAMEGRAPH)]
    Flamegraph(commands::flamegraph::Args),
    /// Always-on daemon: continuous capture, Prometheus metrics per process and container.
    #[command(after_long_help = EXAMPLES_AGENT)]
    Agent(commands::agent::Args),
    /// Measure static (all-idle) power per energy source on a quiet machine.
    #[command(after_long_help = EXAMPLES_CALIBRATE)]
    Calibrate(commands::calibrate::Args),
    /// Compare two versions: energy per function (or process) with 95% intervals and
    /// significance; differential flamegraph; CI gate.
    #[command(after_long_help = EXAMPLES_DIFF)]
    Diff(commands::diff::Args),
    /// The estimated model's parameters here, or for a machine described by flags: the
    /// power-table row, idle and full-load watts, the load curve and the error.
    #[command(after_long_help = EXAMPLES_MODEL)]
    Model(commands::model::Args),
    /// Run one built-in roofline kernel (a known memory- or compute-bound workload).
    /// Software Carbon Intensity (ISO/IEC 21031) of recordings: (E·I + M) per run,
    /// request or second, per command or container and in total, as JSON.
    #[command(after_long_help = EXAMPLES_SCI)]
    Sci(commands::sci::Args),
    #[command(hide = true)]
    Kernel(commands::kernel::Args),
    /// Write man pages and shell completions (for packages).
    #[command(hide = true)]
    Assets(commands::assets::Args),
}

// Real invocations at the end of each subcommand's long help (`--help`); tests/docs.rs
// checks that every flag in them exists.
const EXAMPLES_RECORD: &str = "Examples:
  sudo energy-bpf record -d 10 -o x.ebpr
  sudo energy-bpf record -F 999 -o x.ebpr -- ./my-benchmark --size 4
  sudo energy-bpf record -p 1234 -o x.ebpr
  sudo energy-bpf record -F 999 --repeat 5 -o base.ebpr -- ./ab 400";
const EXAMPLES_REPORT: &str = "Examples:
  energy-bpf report x.ebpr
  energy-bpf report x.ebpr --format json
  energy-bpf report x.ebpr --by function --limit 50
  energy-bpf report x.ebpr --window 60 --format csv --carbon-zone FR --pue 1.2
  energy-bpf report /var/lib/energy-bpf/recordings --from=-15m";
const EXAMPLES_SOURCES: &str = "Examples:
  energy-bpf sources
  energy-bpf sources --format json
  energy-bpf sources --energy-source model --model-idle-w 40 --model-max-w 180";
const EXAMPLES_TOP: &str = "Examples:
  sudo energy-bpf top
  sudo energy-bpf top --batch --format json -n 5
  energy-bpf top --replay x.ebpr
  energy-bpf top --connect /run/energy-bpf/agent.sock";
const EXAMPLES_FLAMEGRAPH: &str = "Examples:
  energy-bpf flamegraph x.ebpr -o x.svg
  energy-bpf flamegraph x.ebpr --format pprof -o x.pb.gz
  energy-bpf flamegraph x.ebpr --format collapsed -p 1234 -o x.folded
  energy-bpf flamegraph x.ebpr --format otlp -o x.pb";
const EXAMPLES_AGENT: &str = "Examples:
  sudo energy-bpf agent
  sudo energy-bpf agent --config /etc/energy-bpf/agent.toml
  sudo energy-bpf agent --record-dir /var/lib/energy-bpf/recordings --retain 24h
  sudo energy-bpf agent --otlp-endpoint http://127.0.0.1:4317";
const EXAMPLES_CALIBRATE: &str = "Examples:
  sudo energy-bpf calibrate
  sudo energy-bpf calibrate -d 10 --load
  sudo energy-bpf calibrate --roofline --plot roofline.svg";
const EXAMPLES_DIFF: &str = "Examples:
  energy-bpf diff base.ebpr new.ebpr
  energy-bpf diff base.ebpr new.ebpr --format svg -o diff.svg
  energy-bpf diff --base a1.ebpr,a2.ebpr --new b1.ebpr,b2.ebpr --by process --format json
  energy-bpf diff base.ebpr new.ebpr --fail-above 5 --scope total --summary gate.json";
const EXAMPLES_MODEL: &str = "Examples:
  energy-bpf model
  energy-bpf model --format json
  energy-bpf model --cpu \"Intel Xeon Platinum 8375C\" --threads 128 --chips 2 --memory-gb 512";
const EXAMPLES_SCI: &str = "Examples:
  energy-bpf sci base.ebpr --carbon-zone FR
  energy-bpf sci base.ebpr --carbon-intensity 350 --embodied-g-per-hour 12
  energy-bpf sci a.ebpr b.ebpr --per request --unit-count 10000 --carbon-zone aws:eu-west-3
  energy-bpf sci base.ebpr --carbon-series grid.csv --embodied auto --instance-type aws:m5.large";

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
        Command::Sci(args) => commands::sci::run(args),
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
