//! `energy-bpf record`: capture to a file until a duration passes, a command exits, or
//! Ctrl-C/SIGTERM. Every drain becomes one flushed chunk, so nothing recorded is lost if
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
    pb::v1::{Header, Trailer},
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
    pub energy: crate::energy::EnergyArgs,
    /// Static power from `energy-bpf calibrate`, stored in the recording's header.
    #[command(flatten)]
    pub calibration: crate::calibration::CalibrationArgs,
    /// The per-run activity counter, stored with every switch event.
    #[command(flatten)]
    pub activity: super::args::ActivityArgs,
    /// How user stacks are walked.
    #[command(flatten)]
    pub unwind: super::args::UnwindArgs,
    /// Command to run; recording stops when it exits.
    #[arg(last = true)]
    pub command: Vec<String>,
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
    let mut live = Live::start(LiveOptions {
        sample_hz: args.freq,
        activity: args.activity.event,
        unwind: args.unwind.mode,
        sample_ring_bytes: None,
        energy: args.energy.clone(),
        targets: Targets::new(args.pids.iter().copied()),
        // Build-ids too, so symbolization finds the same binary after it is gone.
        read_mappings: crate::symbolize::process_mappings,
    })?;
    let activity_event = live.activity_event().map(|e| e.name());
    let cpus = live.cpus().to_vec();
    let mut header = host::header(cpus, args.freq as u32, args.pids.clone());
    let calibration = args
        .calibration
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
    let mut writer = Writer::create(&args.output, &header)
        .with_context(|| "choose a writable path with -o FILE".to_string())?;
    let mut child = match args.command.as_slice() {
        [] => None,
        [program, rest @ ..] => {
            let child = Command::new(program)
                .args(rest)
                .spawn()
                .with_context(|| format!("cannot run {program}"))?;
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
                // Likewise the interpreter of a CPython command (a shared build's
                // libpython, if not mapped yet, is found at a later sample).
                live.load_python(child.id());
            }
            Some(child)
        }
    };
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
        thread::sleep(tick);
        let chunk = live.poll();
        for fault in live.new_faults() {
            eprintln!("energy-bpf: warning: {fault}; recording goes on with the other sources");
        }
        if let Err(err) = writer.chunk(chunk) {
            kill(&mut child);
            return Err(stopped_early(writer, err, &header, &args.output));
        }
        if stop.load(Ordering::Relaxed) {
            break "signal".to_string();
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break "duration".to_string();
        }
        if let Some(c) = child.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            child_status = Some(status);
            break format!("command exited ({status})");
        }
    };
    kill(&mut child);
    // A last sweep pins down who is on each CPU at the end of the window.
    let (last, unwind_stats) = live.finish();
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

fn kill(child: &mut Option<Child>) {
    if let Some(c) = child.as_mut()
        && matches!(c.try_wait(), Ok(None))
    {
        let _ = c.kill();
        let _ = c.wait();
    }
}
