//! `energy-bpf record`: capture to a file until a duration passes, a command exits, or
//! Ctrl-C/SIGTERM. With `--repeat N` the command runs N times in a row, each run marked in
//! the recording (`RunMarker`: start, end, exit code). Every drain becomes one flushed chunk, so nothing recorded is lost if
//! the recorder is killed; a clean stop adds a trailer.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    capture::{Live, LiveOptions, host, session::Targets},
    pb::v1::{Header, RunMarker, Trailer},
    record::{WriteError, Writer},
};

/// Arguments of `energy-bpf record`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Stack sampling frequency per CPU, Hz.
    #[arg(short = 'F', long = "freq", default_value_t = 99)]
    pub freq: u64,
    /// Stop after this many seconds.
    #[arg(short = 'd', long = "duration")]
    pub duration: Option<f64>,
    /// Keep stacks of these processes (and their children) only; scheduling is always
    /// recorded system-wide because the energy split needs every thread's time.
    #[arg(short = 'p', long = "pid")]
    pub pids: Vec<u32>,
    /// Output file.
    #[arg(short = 'o', long = "output", default_value = "energy-bpf.ebpr")]
    pub output: PathBuf,
    /// How often the ring buffers are drained into the file, ms.
    #[arg(long = "drain-ms", default_value_t = 100, value_parser = clap::value_parser!(u64).range(5..=5000))]
    pub drain_ms: u64,
    /// Energy sources (counters, fake trees for testing, model parameters).
    #[command(flatten)]
    pub energy: super::args::EnergyFlags,
    /// Static power from `energy-bpf calibrate`, stored in the recording's header.
    #[command(flatten)]
    pub calibration: super::args::CalibrationFlags,
    /// The per-run activity counter, stored with every switch event.
    #[command(flatten)]
    pub activity: super::args::ActivityArgs,
    /// Also count these events per run, for `report --by function --roofline`: up to three
    /// of instructions, cycles, llc-misses (hardware), task-clock, cpu-clock, page-faults,
    /// context-switches (software). An event this machine cannot count is said and left out;
    /// recording goes on.
    #[arg(long = "activity-events", value_name = "EVENTS", value_parser = crate::capture::run_counts::parse_run_events)]
    pub activity_events: Option<crate::capture::run_counts::RunEvents>,
    /// How user stacks are walked.
    #[command(flatten)]
    pub unwind: super::args::UnwindArgs,
    /// Run the command this many times, one after the other, into one recording; each run
    /// is marked (start, end, exit code), so `energy-bpf diff` sees a distribution of runs.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub repeat: u32,
    /// Command to run; recording stops when it exits (after its last run with `--repeat`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// The runs of the recorded command: which one is running, and the markers of those done.
struct Runs {
    program: String,
    rest: Vec<String>,
    left: u32,
    index: u32,
    current: Option<(Child, u64)>,
    done: Vec<RunMarker>,
}

impl Runs {
    /// Starts the next run; its process joins the targets.
    fn start(&mut self, live: &mut Live) -> anyhow::Result<()> {
        let start_ns = crate::clock::monotonic_ns();
        let child = Command::new(&self.program)
            .args(&self.rest)
            .spawn()
            .with_context(|| format!("cannot run {}", self.program))?;
        live.targets_mut().add(child.id());
        let tables = live.unwind_stats().is_some();
        let python = live.python_on();
        if (tables || python) && wait_for_exec(child.id()) {
            // Tables from the first milliseconds, not after the first drain; libraries
            // the dynamic loader maps later are picked up at the first walk that meets
            // them.
            if tables {
                live.load_unwind_tables(child.id());
            }
            // Likewise the interpreter of a CPython command (a shared build's libpython,
            // if not mapped yet, is found at a later sample).
            live.load_python(child.id());
        }
        self.left -= 1;
        self.current = Some((child, start_ns));
        Ok(())
    }

    /// Marks the current run done if it exited; returns its status.
    fn reap(&mut self) -> Option<std::process::ExitStatus> {
        let (child, start_ns) = self.current.as_mut()?;
        let status = child.try_wait().ok()??;
        let end_ns = crate::clock::monotonic_ns();
        self.done.push(RunMarker {
            index: self.index,
            start_ns: *start_ns,
            end_ns,
            pid: child.id(),
            exit_code: status
                .code()
                .or_else(|| std::os::unix::process::ExitStatusExt::signal(&status).map(|s| -s))
                .unwrap_or(0),
        });
        self.index += 1;
        self.current = None;
        Some(status)
    }

    fn child(&mut self) -> Option<&mut Child> {
        self.current.as_mut().map(|(c, _)| c)
    }
}

/// Sleeps for one drain tick, watching the command in 1 ms steps so a run's end is marked
/// within a millisecond and the next run starts at once. Returns the status of the last
/// run when the command is done (its runs all ran, or one failed).
fn tick(
    runs: &mut Option<Runs>,
    live: &mut Live,
    tick: Duration,
) -> anyhow::Result<Option<std::process::ExitStatus>> {
    let Some(r) = runs.as_mut() else {
        thread::sleep(tick);
        return Ok(None);
    };
    let until = Instant::now() + tick;
    loop {
        if let Some(status) = r.reap() {
            if r.left == 0 || !status.success() {
                return Ok(Some(status));
            }
            r.start(live)?;
        }
        let now = Instant::now();
        if now >= until {
            return Ok(None);
        }
        thread::sleep((until - now).min(Duration::from_millis(1)));
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing signal handlers")?;
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
    let mut writer = Writer::create(&args.output, &header)
        .with_context(|| "choose a writable path with -o FILE".to_string())?;
    let mut runs = match args.command.as_slice() {
        [] => None,
        [program, rest @ ..] => {
            let mut runs = Runs {
                program: program.clone(),
                rest: rest.to_vec(),
                left: args.repeat,
                index: 0,
                current: None,
                done: Vec::new(),
            };
            runs.start(&mut live)?;
            Some(runs)
        }
    };
    if runs.is_none() && args.repeat > 1 {
        anyhow::bail!("--repeat needs a command to run: energy-bpf record --repeat N -- CMD");
    }
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
        let exited = match self::tick(&mut runs, &mut live, tick) {
            Ok(exited) => exited,
            Err(err) => {
                kill(&mut runs);
                return Err(err);
            }
        };
        let mut chunk = live.poll();
        if let Some(r) = runs.as_mut() {
            chunk.runs = std::mem::take(&mut r.done);
        }
        for fault in live.new_faults() {
            eprintln!("energy-bpf: warning: {fault}; recording goes on with the other sources");
        }
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
            let n = runs.as_ref().map_or(0, |r| r.index);
            break if args.repeat > 1 {
                format!(
                    "command exited ({status}) after {n} of {} runs",
                    args.repeat
                )
            } else {
                format!("command exited ({status})")
            };
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
        last.runs = std::mem::take(&mut r.done);
    }
    let losses = last.losses;
    if let Err(err) = writer.chunk(last) {
        return Err(stopped_early(writer, err, &header, &args.output));
    }
    let end_ns = crate::clock::monotonic_ns();
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

/// Waits (up to 200 ms) until the child we forked has exec'd its program, then 2 ms more
/// for the dynamic loader; false when it did not exec in time.
fn wait_for_exec(pid: u32) -> bool {
    let ours = std::fs::read_link("/proc/self/exe").ok();
    let deadline = Instant::now() + Duration::from_millis(200);
    while Instant::now() < deadline {
        match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(exe) if Some(&exe) != ours.as_ref() => {
                std::thread::sleep(Duration::from_millis(2));
                return true;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => return false,
        }
    }
    false
}

/// A write failed (disk full, I/O error): the writer has cut the partial record off, so
/// the file ends on a whole record. Try to close it with a trailer saying why (the cut-off
/// record freed more than a trailer needs), then report what the file keeps.
fn stopped_early(writer: Writer, err: WriteError, header: &Header, path: &Path) -> anyhow::Error {
    let why = if err.is_disk_full() {
        "the disk is full"
    } else {
        "writing failed"
    };
    let end_ns = crate::clock::monotonic_ns();
    let kept = match writer.finish(Trailer {
        end_ns,
        stop_reason: format!("error: {err}"),
        losses: None,
    }) {
        Ok(bytes) => format!(
            "{} keeps the first {:.1} s ({} KiB) and reads normally",
            path.display(),
            end_ns.saturating_sub(header.start_ns) as f64 / 1e9,
            bytes / 1024
        ),
        Err(_) => format!(
            "{} keeps everything before this point (it reads as cut short)",
            path.display()
        ),
    };
    anyhow::Error::new(err).context(format!("recording stopped early because {why}; {kept}"))
}

fn kill(runs: &mut Option<Runs>) {
    if let Some(c) = runs.as_mut().and_then(Runs::child)
        && matches!(c.try_wait(), Ok(None))
    {
        let _ = c.kill();
        let _ = c.wait();
    }
}
