//! `energy-bpf top`: live per-process power, full screen or as `top -b` style text (or
//! JSON lines); `--replay FILE` plays a recording through the same view.
//!
//! Wiring only: `crate::feed` makes the snapshots (live capture or replay, both through
//! the pipeline), [`run_with_feed`] shows whatever arrives on the channel; the view itself
//! lives in [`crate::tui`].
use std::io::{self, IsTerminal};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::Receiver;
use std::time::Duration;

use anyhow::Context;

use crate::commands::args::{AttributeArgs, RangeArgs};
use crate::tui::{self, Exit, FrameFormat, Snapshot, State};

/// How `--batch` prints frames.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BatchFormat {
    /// Plain-text tables, like `top -b` (`text` is accepted too).
    #[default]
    #[value(name = "table", alias = "text")]
    Text,
    /// One JSON document per frame, one per line (`start_ns`, `end_ns`, `processes[]` with
    /// the keys of `report --format json`).
    Json,
}

/// Arguments of `energy-bpf top`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Seconds between updates: here a refresh of the view (in `agent`, `-i` is the same
    /// beat: a window closed and exported).
    #[arg(short = 'i', long, value_name = "SECS", default_value_t = 1.0, value_parser = parse_interval)]
    pub(crate) interval: f64,
    /// Print plain-text frames like `top -b` instead of the full-screen view (also the
    /// default when stdout is not a terminal).
    #[arg(short = 'b', long)]
    pub(crate) batch: bool,
    /// With `--batch`: plain-text tables or one JSON document per frame.
    #[arg(long, value_enum, default_value_t = BatchFormat::Text)]
    pub(crate) format: BatchFormat,
    /// Play this recording through the view instead of capturing: one frame per `-i`
    /// seconds of recording time (as fast as it can with `--batch`).
    #[arg(long, value_name = "FILE")]
    pub(crate) replay: Option<PathBuf>,
    /// With `--replay`: which part of the recording (or of a directory of the agent's
    /// rotating recordings).
    #[command(flatten)]
    pub(crate) range: RangeArgs,
    /// Show what the agent at this socket publishes instead of capturing (what `top` does
    /// without root when the agent's socket exists).
    #[arg(long, value_name = "PATH", conflicts_with = "replay")]
    pub(crate) connect: Option<PathBuf>,
    /// Stop after this many refreshes (default: run until quit).
    #[arg(short = 'n', long, value_name = "N", value_parser = super::args::count)]
    pub(crate) iterations: Option<u64>,
    /// Stack-sampling frequency in Hz. 49 by default, below `record`'s 99: a live view runs
    /// for long and shows stacks in aggregate.
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 49,
          value_parser = super::args::hz)]
    pub freq: u32,
    /// How runs reach `top`: `aggregate` (the default) sums each thread's on-CPU time per
    /// CPU and 10 ms slot in the kernel, so `top` costs little on a machine switching
    /// hundreds of thousands of times a second; `stream` sends every switch, as `record`
    /// does.
    #[arg(long, value_name = "MODE", value_enum,
          default_value_t = super::args::SwitchesMode::Aggregate)]
    pub(crate) switches: super::args::SwitchesMode,
    /// Only show these processes (repeat, or separate with commas or spaces).
    #[arg(short = 'p', long = "pid", value_name = "PID", num_args = 1.., value_delimiter = ',')]
    pub(crate) pids: Vec<u32>,
    /// Energy sources (counters, fake trees for testing, model parameters).
    #[command(flatten)]
    pub(crate) energy: super::args::EnergyFlags,
    /// How energy is split between threads. `auto` fits each window's split on the last two
    /// minutes of windows: a per-class regression needs minutes of intervals, which `report`
    /// has and a single window does not.
    #[command(flatten)]
    pub(crate) attribute: AttributeArgs,
    /// Static power measured by `energy-bpf calibrate`.
    #[command(flatten)]
    pub(crate) calibration: super::args::CalibrationFlags,
    /// The per-run activity counter.
    #[command(flatten)]
    pub(crate) activity: super::args::ActivityArgs,
    /// How user stacks are walked.
    #[command(flatten)]
    pub(crate) unwind: super::args::UnwindArgs,
    /// Grams of CO2e per process since start, and the intensity used.
    #[command(flatten)]
    pub(crate) carbon: crate::carbon::cli::CarbonArgs,
}

impl Args {
    /// The refresh interval.
    pub fn interval(&self) -> Duration {
        Duration::from_secs_f64(self.interval)
    }
}

fn parse_interval(text: &str) -> Result<f64, String> {
    let secs: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    // Energy counters update about every millisecond (docs/ARCHITECTURE.md, "Energy counters") but an interval much
    // shorter than a tenth of a second is mostly noise on screen.
    if !(0.1..=3600.0).contains(&secs) {
        return Err(format!(
            "interval must be between 0.1 and 3600 seconds, got {secs}"
        ));
    }
    Ok(secs)
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut attribute = args.attribute.options().live();
    if let Some(path) = &args.replay {
        let rec = args.range.read(path).context("cannot replay")?;
        if rec.truncated && !rec.damage.end_damaged {
            eprintln!(
                "energy-bpf: warning: {} was cut short (recorder killed or disk full); replaying the {:.1} s it holds",
                path.display(),
                rec.duration_ns() as f64 / 1e9
            );
        }
        if let Some(note) = rec.damage.note() {
            eprintln!(
                "energy-bpf: warning: {} is damaged: {note}; replaying the rest",
                path.display()
            );
        }
        let paced = !args.batch && io::stdout().is_terminal();
        let feed = crate::tui::feed::replay(
            rec,
            attribute,
            crate::tui::feed::ReplayConfig {
                interval: args.interval(),
                paced,
            },
        )?;
        return run_with_feed(&args, feed);
    }
    // Without root, watch the agent: capturing needs CAP_BPF+CAP_PERFMON.
    let socket = args.connect.clone().or_else(|| {
        // SAFETY: geteuid has no preconditions.
        (unsafe { libc::geteuid() } != 0).then(|| PathBuf::from(crate::remote::DEFAULT_SOCKET))
    });
    if let Some(path) = socket {
        let feed = crate::remote::connect(&path)?;
        return run_with_feed(&args, feed);
    }
    let (_, hostname) = crate::capture::host::uname();
    attribute.calibrated = args
        .calibration
        .config()
        .resolve(&hostname)
        .context("cannot use the calibration")?;
    crate::capture::probe_log::enable(args.unwind.debug_probes);
    let feed = crate::tui::feed::live(crate::capture::LiveConfig {
        sample_hz: u64::from(args.freq),
        interval: args.interval(),
        energy: args.energy.config(),
        attribute,
        activity: args.activity.event,
        unwind: args.unwind.mode,
        sample_ring_bytes: None,
        aggregate: args.switches == super::args::SwitchesMode::Aggregate,
    })?;
    run_with_feed(&args, feed)
}

/// Shows the snapshots arriving on `feed` until the user quits, a signal arrives, the
/// terminal goes away, `-n` frames were shown, or (batch mode) the feed ends.
///
/// `feed` is dropped on return, so the thread sending snapshots sees its next `send` fail
/// and can stop. Exit status: 0 on quit or `-n`, 128+N on signal N, 129 on hang-up.
pub fn run_with_feed(args: &Args, feed: Receiver<Snapshot>) -> anyhow::Result<ExitCode> {
    let mut state = State::new(args.pids.clone());
    if let Some(c) = args.carbon.carbon()? {
        state.set_carbon(c);
    }
    let batch = args.batch || !io::stdout().is_terminal();
    let exit = if batch {
        let mut out = io::stdout().lock();
        let format = match args.format {
            BatchFormat::Text => FrameFormat::Text,
            BatchFormat::Json => FrameFormat::Json,
        };
        tui::run_batch(&feed, &mut out, &mut state, args.iterations, format)
            .context("`top --batch` failed")?
    } else {
        let (exit, _stats) =
            tui::run_interactive(&feed, &mut state, args.iterations).context("`top` failed")?;
        exit
    };
    match exit {
        Exit::Quit | Exit::Iterations => Ok(ExitCode::SUCCESS),
        // Conventional shell status for "ended by signal N".
        Exit::Signal(signal) => Ok(ExitCode::from(128u8.saturating_add(signal as u8))),
        Exit::Hangup => Ok(ExitCode::from(128 + libc::SIGHUP as u8)),
        // A replay ends with its recording.
        Exit::FeedClosed if args.replay.is_some() => Ok(ExitCode::SUCCESS),
        Exit::FeedClosed if args.connect.is_some() => anyhow::bail!(
            "`top`: the agent's feed stopped after {} refreshes (see above)",
            state.snapshots_shown()
        ),
        Exit::FeedClosed => anyhow::bail!(
            "`top`: the live feed stopped after {} refreshes (see the errors above)",
            state.snapshots_shown()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        top: Args,
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("top").chain(args.iter().copied())).map(|c| c.top)
    }

    #[test]
    fn defaults_match_top() {
        let args = parse(&[]).expect("no arguments is valid");
        assert_eq!(args.interval, 1.0);
        assert_eq!(args.freq, 49);
        assert!(!args.batch);
        assert_eq!(args.iterations, None);
        assert!(args.pids.is_empty());
    }

    #[test]
    fn all_flags_parse() {
        let args = parse(&[
            "-i", "0.5", "--batch", "-n", "3", "-F", "99", "-p", "1", "2,3",
        ])
        .expect("valid arguments");
        assert_eq!(args.interval(), Duration::from_millis(500));
        assert!(args.batch);
        assert_eq!(args.iterations, Some(3));
        assert_eq!(args.freq, 99);
        assert_eq!(args.pids, [1, 2, 3]);
    }

    #[test]
    fn bad_values_are_rejected_with_a_reason() {
        let err = parse(&["-i", "0"]).expect_err("0 s is rejected");
        assert!(err.to_string().contains("between 0.1 and 3600"), "{err}");
        assert!(parse(&["-i", "abc"]).is_err());
        assert!(parse(&["-n", "0"]).is_err());
        assert!(parse(&["-F", "0"]).is_err());
    }

    #[test]
    fn batch_run_prints_n_frames_and_succeeds() {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            tx.send(Snapshot::default()).expect("receiver alive");
        }
        let args = parse(&["--batch", "-n", "2"]).expect("valid");
        let code = run_with_feed(&args, rx).expect("two frames are queued");
        assert_eq!(code, ExitCode::SUCCESS);
        // The feed is dropped on return, so the live thread's next send fails and it stops.
        assert!(tx.send(Snapshot::default()).is_err(), "feed still held");
        // What the frames hold is checked where they are written (tui::app tests, and
        // tests/top_tmux.rs on the real binary).
    }

    #[test]
    fn batch_run_fails_when_the_feed_stops_early() {
        let (tx, rx) = std::sync::mpsc::channel();
        tx.send(Snapshot::default()).expect("receiver alive");
        drop(tx);
        let args = parse(&["--batch", "-n", "5"]).expect("valid");
        let err = run_with_feed(&args, rx).expect_err("feed ends after one frame");
        assert!(err.to_string().contains("after 1 refreshes"), "{err}");
    }
}
