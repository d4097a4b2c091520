//! `energy-bpf calibrate`: measure static (all-idle) power per energy source on a quiet
//! machine and store it in the calibration file that `record`, `top` and `report` read.
//!
//! Capture runs as for `record` (the switch timeline says how quiet the machine was and
//! what did run); the measurement itself is the pure `crate::attribute::calibrate`.

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    attribute::calibrate,
    calibration::{self, CalibrationFile, SourceCalibration},
    capture::{Live, LiveOptions, host},
    pb::v1::{EnergyReading, SwitchEvent},
    timeline::Timeline,
};

pub use super::args::CalibrateArgs as Args;

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.duration > 0.0 && args.duration <= 3600.0,
        "--duration must be between 0 and 3600 seconds"
    );
    if args.roofline {
        return super::roofline::run(&args);
    }
    // A low sampling rate: stacks are not needed, only the switch timeline.
    // Only who ran matters here, not what each run did.
    let mut live = Live::start(LiveOptions::timeline(args.energy.config()))?;
    let cpu_ids = live.cpu_ids().to_vec();
    let cpus = live.cpus().to_vec();
    let sources = live.sources();
    anyhow::ensure!(
        sources.iter().all(|s| !s.estimated),
        "no energy counter to calibrate: the estimated model has no static power to measure \
         (set it with --model-idle-w instead)"
    );
    let start_ns = crate::clock::monotonic_ns();
    let (mut switches, mut readings): (Vec<SwitchEvent>, Vec<EnergyReading>) = Default::default();
    let step = Duration::from_secs_f64(args.duration);
    eprintln!(
        "energy-bpf: calibrating {} source(s) for {:.1} s; keep the machine quiet",
        sources.len(),
        args.duration
    );
    live.drain_for(step, &mut switches, &mut readings);
    let steps = if args.load {
        load_steps(&mut live, &cpus, step, &mut switches, &mut readings)
    } else {
        Vec::new()
    };
    let (last, _) = live.finish();
    switches.extend(last.switches);
    readings.extend(last.readings);
    let end_ns = crate::clock::monotonic_ns();
    let timeline = Timeline::build(start_ns, end_ns, &cpu_ids, &switches);
    let mut measured = calibrate::measure(
        &timeline,
        &sources,
        &readings,
        args.max_busy / 100.0,
        Some(std::process::id()),
        crate::attribute::Options::default().regression_row_ns,
    )
    .context("calibration refused")?;
    for m in &mut measured {
        if let Some(source) = sources
            .iter()
            .find(|s| crate::attribute::source_key(s) == m.key)
        {
            m.load_curve = steps
                .iter()
                .filter_map(|&(busy_cpus, busy_cores, from, to)| {
                    Some(calibrate::LoadStep {
                        busy_cpus,
                        busy_cores,
                        watts: calibrate::mean_power(&readings, source.id, from, to)?,
                    })
                })
                .collect();
        }
    }
    for m in &measured {
        print(m);
    }
    save(&args, &measured, (end_ns - start_ns) as f64 / 1e9)?;
    Ok(ExitCode::SUCCESS)
}

/// Load steps: 1..N spinners, distinct physical cores first, then SMT siblings; returns
/// (busy CPUs, busy cores, start, end) of each step (the first 20% of a step settles).
fn load_steps(
    live: &mut Live,
    cpus: &[crate::pb::v1::Cpu],
    step: Duration,
    switches: &mut Vec<SwitchEvent>,
    readings: &mut Vec<EnergyReading>,
) -> Vec<(u32, u32, u64, u64)> {
    let order = calibrate::spin_order(cpus);
    let mut steps = Vec::new();
    for n in 1..=order.len() {
        let spun = &order[..n];
        let cores = spun
            .iter()
            .map(|c| (c.package, c.core))
            .collect::<std::collections::HashSet<_>>()
            .len();
        eprintln!(
            "energy-bpf: load step: {n} busy CPU(s) on {cores} core(s) for {:.1} s",
            step.as_secs_f64()
        );
        let stop = Arc::new(AtomicBool::new(false));
        let spinners: Vec<_> = spun.iter().map(|c| spin(c.id, Arc::clone(&stop))).collect();
        let from = crate::clock::monotonic_ns() + (step.as_nanos() / 5) as u64;
        live.drain_for(step, switches, readings);
        steps.push((n as u32, cores as u32, from, crate::clock::monotonic_ns()));
        stop.store(true, Ordering::Relaxed);
        for s in spinners {
            let _ = s.join();
        }
    }
    steps
}

/// Prints one source's static power and load curve.
fn print(m: &calibrate::Measured) {
    println!(
        "{}: static {:.3} W ({}; {:.1}% busy{})",
        m.name,
        m.static_w,
        m.method,
        m.busy_share * 100.0,
        m.per_busy_cpu_w
            .map(|w| format!("; {w:.2} W per busy CPU"))
            .unwrap_or_default()
    );
    let mut before = m.static_w;
    for s in &m.load_curve {
        println!(
            "  {} busy CPU(s) on {} core(s): {:.3} W ({:+.3} W for this step)",
            s.busy_cpus,
            s.busy_cores,
            s.watts,
            s.watts - before
        );
        before = s.watts;
    }
}

/// Stores the measurements for this host in the calibration file, keeping each source's
/// roofline.
fn save(args: &Args, measured: &[calibrate::Measured], duration_s: f64) -> anyhow::Result<()> {
    let (_, hostname) = host::uname();
    let mut file = CalibrationFile::load_or_default(&args.calibration)?;
    file.version = calibration::VERSION;
    let date = calibration::rfc3339(crate::clock::realtime_ns());
    let host_cal = file.hosts.entry(hostname.clone()).or_default();
    for m in measured {
        let roofline = host_cal
            .sources
            .get(&m.key)
            .and_then(|s| s.roofline.clone());
        host_cal.sources.insert(
            m.key.clone(),
            SourceCalibration {
                date: date.clone(),
                duration_s,
                measured: m.clone(),
                roofline,
            },
        );
    }
    file.save(&args.calibration)?;
    println!(
        "calibration for {hostname} written to {}",
        args.calibration.display()
    );
    Ok(())
}

/// A thread that spins on `cpu` until `stop`.
fn spin(cpu: u32, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it, and
        // sched_setaffinity(0, ...) only changes this thread's affinity.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
        let mut x = 0u64;
        while !stop.load(Ordering::Relaxed) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    })
}
