//! `energy-bpf calibrate --roofline`: π_0 from a quiet window (as `calibrate` measures
//! static power), then the built-in kernels on one thread and on every CPU while capture
//! and the counters run; per source the kernels' energy is read between the counter
//! readings inside each kernel, their flops and bytes interpolated from the progress log
//! at those readings' times. The sweep, the fit and everything stored are
//! [`crate::roofline`]'s ([`crate::roofline::sweep`]); this file maps arguments, wires
//! capture and prints.

use std::{
    path::Path,
    process::ExitCode,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use anyhow::Context as _;

use super::args::CalibrateArgs as Args;
use crate::{
    attribute::{calibrate, source_key},
    calibration::{self, CalibrationFile, SourceCalibration},
    capture::{
        host,
        live::{Live, LiveOptions},
    },
    pb::v1::{EnergyDomain, EnergyReading, EnergySource, SwitchEvent},
    roofline::{
        self, Roofline,
        cpufreq::{self, Pinned},
        kernels::{self, Buffer, Counters, INTENSITIES, Isa},
        sweep::{self, PASSES, SourceRuns, Sweeper},
    },
    timeline::Timeline,
};

/// Counter readings every 10 ms unless `--energy-interval-ms` says otherwise: a kernel
/// spans tens of readings.
const READ_MS: u64 = 10;

/// Runs `calibrate --roofline`.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        (20..=60_000).contains(&args.kernel_ms),
        "--kernel-ms must be between 20 and 60000"
    );
    let (freqs, mut live) = start(args)?;
    let cpu_ids = live.cpu_ids().to_vec();
    let cpus = live.cpus().to_vec();
    let sources = cpu_sources(&live)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&interrupted))
            .context("cannot handle Ctrl-C")?;
    }
    let (mut switches, mut readings): (Vec<SwitchEvent>, Vec<EnergyReading>) = Default::default();
    let start_ns = crate::clock::monotonic_ns();
    eprintln!(
        "energy-bpf: measuring constant power for {:.1} s; keep the machine quiet",
        args.duration
    );
    live.drain_for(
        Duration::from_secs_f64(args.duration),
        &mut switches,
        &mut readings,
    );
    let static_end_ns = crate::clock::monotonic_ns();

    let (buffer, kernel) = sizes(args, &sources)?;
    let isa = Isa::detect();
    let runs = sweep_all(
        args,
        Sweeper::new(
            &mut live,
            &mut switches,
            &mut readings,
            counters(args)?,
            &interrupted,
        ),
        &cpu_ids,
        (&buffer, kernel, isa),
        &freqs,
    )?;
    let (last, _) = live.finish();
    switches.extend(last.switches);
    readings.extend(last.readings);
    let end_ns = crate::clock::monotonic_ns();
    let timeline = Timeline::build(start_ns, end_ns, &cpu_ids, &switches);
    let readings = crate::energy::readings_for(&sources, &readings, &timeline, &cpus);

    let measured = quiet(
        args,
        &cpu_ids,
        &sources,
        &switches,
        &readings,
        (start_ns, static_end_ns),
    )?;
    let plotted = fit_and_save(
        args,
        &sources,
        &measured,
        &SourceInputs {
            cpus: &cpus,
            readings: &readings,
            timeline: &timeline,
            quiet_ns: (start_ns, static_end_ns),
        },
        (&runs, &freqs, isa, buffer.bytes() as u64),
    )?;
    if let Some(path) = &args.plot {
        let refs: Vec<(String, &Roofline)> = plotted.iter().map(|(n, r)| (n.clone(), r)).collect();
        write_plot(path, &roofline::plot::svg(&refs))?;
        println!("plot written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Checks the frequencies asked for, then starts the capture (readings every 10 ms
/// unless asked otherwise). Only who ran matters, not what each run did: a low sampling
/// rate, no stacks kept.
fn start(args: &Args) -> anyhow::Result<(Vec<u64>, Live)> {
    let freqs = args
        .frequencies
        .iter()
        .map(|f| parse_khz(f))
        .collect::<anyhow::Result<Vec<u64>>>()?;
    if !freqs.is_empty() {
        cpufreq::check(&args.energy.sysfs_root, &freqs)?;
    }
    let mut energy_args = args.energy.config();
    energy_args.energy_interval_ms.get_or_insert(READ_MS);
    Ok((freqs, Live::start(LiveOptions::timeline(energy_args))?))
}

/// The CPU energy sources (GPUs are not in the roofline); the model is said as such.
fn cpu_sources(live: &Live) -> anyhow::Result<Vec<EnergySource>> {
    let sources: Vec<EnergySource> = live
        .sources()
        .into_iter()
        .filter(|s| s.domain() != EnergyDomain::Gpu)
        .collect();
    anyhow::ensure!(!sources.is_empty(), "no CPU energy source to calibrate");
    let estimated = sources.iter().any(|s| s.estimated);
    if estimated {
        eprintln!(
            "energy-bpf: the energy source is the estimated model: the roofline measures the \
             model, not the machine (times are real, energies are estimated)"
        );
    }
    Ok(sources)
}

/// The kernels' progress counters: in `--progress-file` when given (for a watcher), else
/// in memory.
fn counters(args: &Args) -> anyhow::Result<Arc<Counters>> {
    Ok(Arc::new(match &args.progress_file {
        Some(path) => {
            Counters::in_file(path).with_context(|| format!("cannot map {}", path.display()))?
        }
        None => Counters::default(),
    }))
}

/// Every kernel on one CPU then on all, unpinned and then at each of `freqs` (kHz).
fn sweep_all(
    args: &Args,
    mut sweeper: Sweeper<'_>,
    cpu_ids: &[u32],
    (buffer, kernel, isa): (&Arc<Buffer>, Duration, Isa),
    freqs: &[u64],
) -> anyhow::Result<Vec<roofline::points::Run>> {
    let threads: Vec<Vec<u32>> = if cpu_ids.len() > 1 {
        vec![cpu_ids[..1].to_vec(), cpu_ids.to_vec()]
    } else {
        vec![cpu_ids.to_vec()]
    };
    eprintln!(
        "energy-bpf: {} kernels ({}) of {} ms over {} MiB, on 1 then {} CPU(s)",
        INTENSITIES.len(),
        isa.name(),
        kernel.as_millis(),
        buffer.bytes() >> 20,
        cpu_ids.len()
    );
    let mut runs = sweeper.sweep(buffer, isa, &threads, kernel, None)?;
    for &khz in freqs {
        eprintln!("energy-bpf: every CPU at {khz} kHz");
        let pinned = Pinned::pin(&args.energy.sysfs_root, khz)?;
        let at = sweeper.sweep(buffer, isa, &threads, kernel, Some(khz));
        pinned.restore()?;
        runs.extend(at?);
    }
    Ok(runs)
}

/// The kernels' buffer (twice the last-level cache unless `--buffer-mib`) and each
/// kernel's duration (at least 50 counter updates per pass).
fn sizes(args: &Args, sources: &[EnergySource]) -> anyhow::Result<(Arc<Buffer>, Duration)> {
    let buffer_bytes = match args.buffer_mib {
        Some(mib) => {
            anyhow::ensure!((1..=16384).contains(&mib), "--buffer-mib must be 1..16384");
            mib << 20
        }
        None => (kernels::llc_bytes(&args.energy.sysfs_root).unwrap_or(32 << 20) * 2)
            .clamp(64 << 20, 1024 << 20),
    };
    let buffer = Arc::new(Buffer::new(buffer_bytes));
    let update_ns = sources
        .iter()
        .map(|s| s.update_period_ns)
        .max()
        .unwrap_or(0);
    // At least 50 counter updates per pass of a kernel.
    let kernel =
        Duration::from_millis(args.kernel_ms).max(Duration::from_nanos(update_ns * 50) * PASSES);
    Ok((buffer, kernel))
}

/// π_0: the quiet window at the start, measured as `calibrate` does.
fn quiet(
    args: &Args,
    cpu_ids: &[u32],
    sources: &[EnergySource],
    switches: &[SwitchEvent],
    readings: &[EnergyReading],
    (start_ns, static_end_ns): (u64, u64),
) -> anyhow::Result<Vec<calibrate::Measured>> {
    let quiet: Vec<SwitchEvent> = switches
        .iter()
        .filter(|s| s.ts_ns <= static_end_ns)
        .cloned()
        .collect();
    let quiet_timeline = Timeline::build(start_ns, static_end_ns, cpu_ids, &quiet);
    let quiet_readings: Vec<EnergyReading> = readings
        .iter()
        .filter(|r| r.ts_ns <= static_end_ns)
        .cloned()
        .collect();
    calibrate::measure(
        &quiet_timeline,
        sources,
        &quiet_readings,
        args.max_busy / 100.0,
        Some(std::process::id()),
        crate::attribute::Options::default().regression_row_ns,
    )
    .context("constant power: calibration refused")
}

/// What every source's fit reads.
struct SourceInputs<'a> {
    cpus: &'a [crate::pb::v1::Cpu],
    readings: &'a [EnergyReading],
    timeline: &'a Timeline,
    quiet_ns: (u64, u64),
}

/// Fits each source's roofline, prints it and stores it in the calibration file; returns
/// what to plot.
fn fit_and_save(
    args: &Args,
    sources: &[EnergySource],
    measured: &[calibrate::Measured],
    inputs: &SourceInputs<'_>,
    (runs, freqs, isa, buffer_bytes): (&[roofline::points::Run], &[u64], Isa, u64),
) -> anyhow::Result<Vec<(String, Roofline)>> {
    let (_, hostname) = host::uname();
    let mut file = CalibrationFile::load_or_default(&args.calibration)?;
    file.version = calibration::VERSION;
    let date = calibration::rfc3339(crate::clock::realtime_ns());
    let host_cal = file.hosts.entry(hostname.clone()).or_default();
    let mut plotted = Vec::new();
    for source in sources {
        let key = source_key(source);
        let Some(m) = measured.iter().find(|m| m.key == key) else {
            continue;
        };
        let r = sweep::fit_source(
            &SourceRuns {
                source,
                cpus: inputs.cpus,
                static_w: m.static_w,
                quiet_ns: inputs.quiet_ns,
                readings: inputs.readings,
                timeline: inputs.timeline,
                own_tgid: std::process::id(),
            },
            runs,
            freqs,
            isa,
            buffer_bytes,
        )?;
        print!("{}", sweep::summary_text(&source.name, &r));
        let entry = host_cal
            .sources
            .entry(key)
            .or_insert_with(|| SourceCalibration {
                date: date.clone(),
                duration_s: (inputs.quiet_ns.1 - inputs.quiet_ns.0) as f64 / 1e9,
                measured: m.clone(),
                roofline: None,
            });
        entry.roofline = Some(r.clone());
        plotted.push((source.name.clone(), r));
    }
    file.save(&args.calibration)?;
    println!(
        "roofline for {hostname} written to {}",
        args.calibration.display()
    );
    Ok(plotted)
}

fn write_plot(path: &Path, svg: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut f = crate::output::file::create_private(path)?;
    f.write_all(svg.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `2400000`, `2400MHz`, `2.4GHz` → kHz.
fn parse_khz(text: &str) -> anyhow::Result<u64> {
    let t = text.trim().to_ascii_lowercase();
    let (num, scale) = if let Some(n) = t.strip_suffix("ghz") {
        (n, 1e6)
    } else if let Some(n) = t.strip_suffix("mhz") {
        (n, 1e3)
    } else {
        (t.strip_suffix("khz").unwrap_or(&t), 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)
        .with_context(|| format!("bad frequency {text:?} (kHz, or with MHz/GHz)"))?;
    Ok((v * scale).round() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn frequencies_parse_with_units() {
        assert_eq!(super::parse_khz("2400000").ok(), Some(2_400_000));
        assert_eq!(super::parse_khz("1800MHz").ok(), Some(1_800_000));
        assert_eq!(super::parse_khz("2.1GHz").ok(), Some(2_100_000));
        assert!(super::parse_khz("fast").is_err());
        assert!(super::parse_khz("-1").is_err());
    }
}
