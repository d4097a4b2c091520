//! `energy-bpf record`: capture to a file until a duration passes, a command exits, or
//! Ctrl-C/SIGTERM. With `--repeat N` the command runs N times in a row, each run marked in
//! the recording (`RunMarker`: start, end, exit code; the runs are
//! `crate::capture::runs`'s). Every drain becomes one flushed chunk, so nothing recorded
//! is lost if the recorder is killed; a clean stop adds a trailer.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    capture::{Live, LiveOptions, host, runs::Runs, session::Targets},
    pb::v1::{Header, Trailer},
    record::{
        WriteError, Writer,
        early::{self, Kept},
    },
};

/// Arguments of `energy-bpf record`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Stack sampling frequency per CPU, Hz. 99 by default: a recording is read once,
    /// later, and wants detail; `top` and the agent sample at 49 Hz because they run for
    /// long and only show their stacks in aggregate.
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
    if args.command.is_empty() && args.repeat > 1 {
        anyhow::bail!("--repeat needs a command to run: energy-bpf record --repeat N -- CMD");
    }
    if let Some(pid) = args
        .pids
        .iter()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    {
        anyhow::bail!("no process with pid {pid} (it may have exited); check the pid with `ps`");
    }
    // A bad output path is said before the probes and counters start (and warn).
    crate::output::file::refuse_symlink(&args.output)
        .with_context(|| "choose a writable path with -o FILE".to_string())?;
    crate::capture::probe_log::enable(args.unwind.debug_probes);
    let mut live = Live::start(LiveOptions {
        sample_hz: args.freq,
        activity: args.activity.event,
        unwind: args.unwind.mode,
        sample_ring_bytes: None,
        run_events: args
            .activity_events
            .as_ref()
            .map(|events| events.0.clone())
            .unwrap_or_default(),
        energy: args.energy.config(),
        targets: Targets::new(args.pids.iter().copied()),
        // Build-ids too, so symbolization finds the same binary after it is gone.
        read_mappings: crate::symbolize::process_mappings,
    })?;
    let activity_event = live.activity_event().map(|e| e.name());
    let run_counters = super::run_counters::announce(&live);
    let cpus = live.cpus().to_vec();
    let mut header = host::header(cpus, args.freq as u32, args.pids.clone());
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
    header.activity_event = activity_event.unwrap_or_default().into();
    header.run_counters = run_counters;
    // The command starts before the output is touched: a typo in it leaves the previous
    // recording as it was. Its events wait in the ring buffers until the first drain.
    let mut runs = Runs::new(&args.command, args.repeat);
    if let Some(r) = runs.as_mut() {
        r.start(&mut live)?;
    }
    let kept = match keep_previous(&args.output) {
        Ok(kept) => kept,
        Err(err) => {
            kill(&mut runs);
            return Err(err);
        }
    };
    let mut writer = match Writer::create(&args.output, &header) {
        Ok(w) => w,
        Err(err) => {
            kill(&mut runs);
            return Err(anyhow::Error::new(err).context("choose a writable path with -o FILE"));
        }
    };
    if let Some(old) = kept {
        eprintln!(
            "energy-bpf: the previous {} is kept as {}",
            args.output.display(),
            old.display()
        );
    }
    // Every address the samples hit, named once at the end.
    let mut names = crate::symbolize::Collector::default();
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
        activity_event.unwrap_or("none: split by time"),
    );
    let started = Instant::now();
    let deadline = args
        .duration
        .map(|s| started + Duration::from_secs_f64(s.max(0.0)));
    let tick = Duration::from_millis(args.drain_ms);
    let mut child_status = None;
    let stop_reason = loop {
        let exited = match runs.as_mut() {
            Some(r) => match r.tick(&mut live, tick) {
                Ok(exited) => exited,
                Err(err) => {
                    r.kill();
                    return Err(err.into());
                }
            },
            None => {
                thread::sleep(tick);
                None
            }
        };
        let mut chunk = live.poll();
        if let Some(r) = runs.as_mut() {
            chunk.runs = r.take_done();
        }
        for fault in live.new_faults() {
            eprintln!("energy-bpf: warning: {fault}; recording goes on with the other sources");
        }
        names.add(&chunk);
        if let Err(err) = writer.chunk(chunk) {
            kill(&mut runs);
            return Err(stopped_early(writer, err, &header, &args.output));
        }
        if stop.load(Ordering::Relaxed) {
            break "signal".to_string();
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break "duration".to_string();
        }
        if let Some(status) = exited {
            child_status = Some(status);
            break runs
                .as_ref()
                .map_or_else(String::new, |r| r.stop_reason(status));
        }
    };
    kill(&mut runs);
    // A last sweep pins down who is on each CPU at the end of the window.
    let (mut last, unwind_stats) = live.finish();
    if let Some(u) = unwind_stats {
        eprintln!(
            "energy-bpf: unwind tables: {} processes, {} files, {} of {} rows ({:.1} of {} MiB \
             of kernel memory), {} processes gone or unreadable before loading, {} ms spent loading",
            u.processes,
            u.files,
            u.rows,
            u.row_capacity,
            u.rows as f64 * 16.0 / 1048576.0,
            u.row_bytes() >> 20,
            u.failed,
            u.load_ms
        );
    }
    if let Some(r) = runs.as_mut() {
        last.runs = r.take_done();
    }
    let losses = last.losses;
    names.add(&last);
    if let Err(err) = writer.chunk(last) {
        return Err(stopped_early(writer, err, &header, &args.output));
    }
    let end_ns = crate::clock::monotonic_ns();
    let naming = Instant::now();
    match crate::symbolize::store(&names, &mut writer) {
        Ok(stored) => eprintln!(
            "energy-bpf: stored the names of {} addresses in {:.2} s{}",
            stored.addresses,
            naming.elapsed().as_secs_f64(),
            if stored.skipped > 0 {
                " (addresses past the first 2 Mi are left to reports to resolve)"
            } else {
                ""
            }
        ),
        Err(err) => return Err(stopped_early(writer, err, &header, &args.output)),
    }
    let bytes = writer
        .finish(Trailer {
            end_ns,
            stop_reason: stop_reason.clone(),
            losses,
        })
        .context("finishing the recording")?;
    let lost = losses.map(|l| crate::record::lost_events(&l)).unwrap_or(0);
    eprintln!(
        "energy-bpf: recorded {:.1} s to {} ({} KiB, stopped by {stop_reason}, {lost} events lost)",
        (end_ns - header.start_ns) as f64 / 1e9,
        args.output.display(),
        bytes / 1024,
    );
    Ok(match child_status {
        Some(status) if !status.success() => {
            ExitCode::from(status.code().unwrap_or(1).clamp(1, 255) as u8)
        }
        _ => ExitCode::SUCCESS,
    })
}

/// A write failed (disk full, I/O error): the recording is closed as well as it can be
/// ([`crate::record::early`]) and the error says what the file keeps.
fn stopped_early(writer: Writer, err: WriteError, header: &Header, path: &Path) -> anyhow::Error {
    let why = if err.is_disk_full() {
        "the disk is full"
    } else {
        "writing failed"
    };
    let kept = match early::close_after_error(writer, &err, header.start_ns) {
        Kept::Closed { secs, bytes } => format!(
            "{} keeps the first {secs:.1} s ({} KiB) and reads normally",
            path.display(),
            bytes / 1024
        ),
        Kept::CutShort => format!(
            "{} keeps everything before this point (it reads as cut short)",
            path.display()
        ),
    };
    anyhow::Error::new(err).context(format!("recording stopped early because {why}; {kept}"))
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
