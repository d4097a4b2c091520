//! `energy-bpf record`: capture to a file until a duration passes, a command exits, or
//! Ctrl-C/SIGTERM. With `--repeat N` the command runs N times in a row, each run marked in
//! the recording (`RunMarker`: start, end, exit code; the runs are
//! `crate::capture::command_runs`'s). Every drain becomes one flushed chunk, so nothing recorded
//! is lost if the recorder is killed; a clean stop adds a trailer.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{Arc, atomic::AtomicBool},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    capture::{Live, LiveOptions, command_runs::Runs, host, session::Targets},
    pb::v1::Header,
    record::{Finished, Recorder, Target},
};

/// Arguments of `energy-bpf record`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Stack sampling frequency per CPU, Hz. 99 by default: a recording is read once,
    /// later, and wants detail; `top` and the agent sample at 49 Hz because they run for
    /// long and only show their stacks in aggregate. It is the mean rate: each CPU's rate
    /// is drawn anew within ±25% of it four times a second, so work that repeats at a
    /// multiple of the period is not always sampled at the same point.
    #[arg(short = 'F', long = "freq", value_name = "HZ", default_value_t = 99,
          value_parser = |s: &str| super::args::hz(s).map(u64::from))]
    pub(crate) freq: u64,
    /// Stop after this many seconds (more than 0).
    #[arg(short = 'd', long = "duration", value_name = "SECS", allow_negative_numbers = true,
          value_parser = super::args::positive_secs)]
    pub(crate) duration: Option<f64>,
    /// Keep stacks of these processes (and their children) only; scheduling is always
    /// recorded system-wide because the energy split needs every thread's time.
    #[arg(short = 'p', long = "pid")]
    pub(crate) pids: Vec<u32>,
    /// Output file. A non-empty file already there is kept as FILE.old once the recording
    /// starts (as perf does); a command that fails to start leaves it untouched.
    #[arg(short = 'o', long = "output", default_value = "energy-bpf.ebpr")]
    pub(crate) output: PathBuf,
    /// How often the ring buffers are drained into the file, ms.
    #[arg(long = "drain-ms", default_value_t = 100, value_parser = clap::value_parser!(u64).range(5..=5000))]
    pub(crate) drain_ms: u64,
    /// Energy sources (counters, fake trees for testing, model parameters).
    #[command(flatten)]
    pub(crate) energy: super::args::EnergyFlags,
    /// Static power from `energy-bpf calibrate`, stored in the recording's header.
    #[command(flatten)]
    pub(crate) calibration: super::args::CalibrationFlags,
    /// The per-run activity counter, stored with every switch event.
    #[command(flatten)]
    pub(crate) activity: super::args::ActivityArgs,
    /// Also count these events per run, for `report --by function --roofline`: up to three
    /// of instructions, cycles, llc-misses (hardware), task-clock, cpu-clock, page-faults,
    /// context-switches (software). An event this machine cannot count is said and left out;
    /// recording goes on.
    #[arg(long = "activity-events", value_name = "EVENTS", value_parser = crate::capture::run_counts::parse_run_events)]
    pub(crate) activity_events: Option<crate::capture::run_counts::RunEvents>,
    /// How user stacks are walked.
    #[command(flatten)]
    pub(crate) unwind: super::args::UnwindArgs,
    /// Run the command this many times, one after the other, into one recording; each run
    /// is marked (start, end, exit code), so `energy-bpf diff` sees a distribution of runs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) repeat: u32,
    /// Command to run; recording stops when it exits (after its last run with `--repeat`).
    #[arg(last = true)]
    pub(crate) command: Vec<String>,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }
    check(&args)?;
    crate::capture::probe_log::enable(args.unwind.debug_probes);
    // Mappings with build-ids, so symbolization finds the same binary after it is gone.
    let mut live = Live::start(
        LiveOptions::timeline(args.energy.config())
            .stacks(args.freq, args.unwind.mode)
            .activity(args.activity.event)
            .targets(Targets::new(args.pids.iter().copied()))
            .run_events(
                args.activity_events
                    .as_ref()
                    .map(|e| e.0.clone())
                    .unwrap_or_default(),
            ),
    )?;
    let header = header(&args, &live)?;
    // The command starts before the output is touched: a typo in it leaves the previous
    // recording as it was. Its events wait in the ring buffers until the first drain.
    let mut runs = Runs::new(&args.command, args.repeat);
    if let Some(r) = runs.as_mut() {
        r.start(&mut live)?;
    }
    let mut recorder = match open(&args.output, &header) {
        Ok(recorder) => recorder,
        Err(err) => {
            kill(&mut runs);
            return Err(err);
        }
    };
    announce(&args, &live, &header);
    let deadline = args
        .duration
        .map(|s| Instant::now() + Duration::from_secs_f64(s));
    let tick = Duration::from_millis(args.drain_ms);
    let ended = recorder.drain(&mut live, runs.as_mut(), tick, &stop, deadline);
    kill(&mut runs);
    let ended = ended?;
    // A last sweep pins down who is on each CPU at the end of the window.
    let (mut last, unwind_stats) = live.finish();
    if let Some(u) = unwind_stats {
        eprintln!("energy-bpf: unwind tables: {}", u.summary());
    }
    if let Some(r) = runs.as_mut() {
        last.runs = r.take_done();
    }
    let lost = last
        .losses
        .map(|l| crate::record::lost_events(&l))
        .unwrap_or(0);
    let done = recorder.close(Some(last), &ended.reason)?;
    summary(&args.output, &header, &done, &ended.reason, lost);
    Ok(match ended.status {
        Some(status) if !status.success() => {
            ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8)
        }
        _ => ExitCode::SUCCESS,
    })
}

/// Says what is recorded, where, and how stacks are walked.
fn announce(args: &Args, live: &Live, header: &Header) {
    let unwind = if live.unwind_stats().is_some() {
        "unwind tables, frame pointers where a PC has none"
    } else {
        "frame pointers"
    };
    eprintln!(
        "energy-bpf: recording {} CPUs at {} Hz to {}, activity: {}, user stacks: {unwind} \
         (Ctrl-C to stop)",
        header.cpus.len(),
        args.freq,
        args.output.display(),
        live.activity_event()
            .map_or("none: split by time", |e| e.name()),
    );
}

/// Says what the recording holds and what the recorder stored.
fn summary(path: &Path, header: &Header, done: &Finished, reason: &str, lost: u64) {
    if let Some((stored, took)) = &done.names {
        eprintln!(
            "energy-bpf: stored the names of {} addresses in {:.2} s{}",
            stored.addresses,
            took.as_secs_f64(),
            if stored.skipped > 0 {
                " (addresses past the first 2 Mi are left to reports to resolve)"
            } else {
                ""
            }
        );
    }
    eprintln!(
        "energy-bpf: recorded {:.1} s to {} ({} KiB, stopped by {}, {lost} events lost)",
        (done.end_ns - header.start_ns) as f64 / 1e9,
        path.display(),
        done.bytes / 1024,
        reason,
    );
}

/// Refuses what cannot work before any probe loads: `--repeat` without a command, a pid
/// that does not exist, an output path that is a planted symlink.
fn check(args: &Args) -> anyhow::Result<()> {
    if args.command.is_empty() && args.repeat > 1 {
        anyhow::bail!("--repeat needs a command to run: energy-bpf record --repeat N -- CMD");
    }
    if let Some(pid) = args
        .pids
        .iter()
        .find(|p| !Path::new(&format!("/proc/{p}")).exists())
    {
        anyhow::bail!("no process with pid {pid} (it may have exited); check the pid with `ps`");
    }
    // A bad output path is said before the probes and counters start (and warn).
    crate::output::file::refuse_symlink(&args.output)
        .with_context(|| "choose a writable path with -o FILE".to_string())
}

/// The recording's header: the host, the calibration in use, the activity and run
/// counters the probes count.
fn header(args: &Args, live: &Live) -> anyhow::Result<Header> {
    let run_counters = super::run_counters::announce(live);
    let mut header = host::header(live.cpus().to_vec(), args.freq as u32, args.pids.clone());
    let calibration = args
        .calibration
        .config()
        .resolve(&header.hostname)
        .context("cannot use the calibration")?;
    for (key, c) in &calibration {
        eprintln!(
            "energy-bpf: static power of {key}: {:.2} W, calibrated {} ({})",
            c.watts, c.date, c.file
        );
    }
    header.calibration = crate::calibration::to_header(&calibration);
    header.activity_event = live
        .activity_event()
        .map(|e| e.name())
        .unwrap_or_default()
        .into();
    header.run_counters = run_counters;
    Ok(header)
}

/// Keeps the previous recording at `path` as `path.old`, then opens the new one.
fn open(path: &Path, header: &Header) -> anyhow::Result<Recorder> {
    let kept = keep_previous(path)?;
    let mut recorder = Recorder::new(Target::File(path.to_path_buf()));
    recorder
        .open(header)
        .map_err(|e| anyhow::Error::new(e).context("choose a writable path with -o FILE"))?;
    if let Some(old) = kept {
        eprintln!(
            "energy-bpf: the previous {} is kept as {}",
            path.display(),
            old.display()
        );
    }
    Ok(recorder)
}

/// Moves a non-empty regular file at `path` to `path.old` (replacing an older one), so a
/// new recording never destroys the last; returns where it went. A device or pipe
/// (`/dev/null`) and an empty or missing file are left alone.
fn keep_previous(path: &Path) -> anyhow::Result<Option<PathBuf>> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(_) => return Ok(None),
    };
    if !meta.is_file() || meta.len() == 0 {
        return Ok(None);
    }
    let mut old = path.as_os_str().to_owned();
    old.push(".old");
    let old = PathBuf::from(old);
    std::fs::rename(path, &old).with_context(|| {
        format!(
            "cannot keep the previous {} as {} (choose another path with -o FILE)",
            path.display(),
            old.display()
        )
    })?;
    Ok(Some(old))
}

/// Kills the command's running run, if any.
fn kill(runs: &mut Option<Runs>) {
    if let Some(r) = runs.as_mut() {
        r.kill();
    }
}
