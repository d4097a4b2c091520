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
        ActivityEvent, host,
        live::{Live, LiveOptions},
        session::Targets,
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
    // Only who ran matters, not what each run did: a low sampling rate, no stacks kept.
    let mut live = Live::start(LiveOptions {
        sample_hz: 1,
        activity: ActivityEvent::None,
        unwind: crate::capture::UnwindMode::Fp,
        sample_ring_bytes: None,
        run_events: Vec::new(),
        energy: energy_args,
        targets: Targets::new([]),
        read_mappings: |_, _| Ok(Vec::new()),
    })?;
    let cpu_ids = live.cpu_ids().to_vec();
    let cpus = live.cpus().to_vec();
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

    let buffer_bytes = match args.buffer_mib {
        Some(mib) => {
            anyhow::ensure!((1..=16384).contains(&mib), "--buffer-mib must be 1..16384");
            mib << 20
        }
        None => (kernels::llc_bytes(&args.energy.sysfs_root).unwrap_or(32 << 20) * 2)
            .clamp(64 << 20, 1024 << 20),
    };
    let buffer = Arc::new(Buffer::new(buffer_bytes));
    let isa = Isa::detect();
    let update_ns = sources
        .iter()
        .map(|s| s.update_period_ns)
        .max()
        .unwrap_or(0);
    // At least 50 counter updates per pass of a kernel.
    let kernel =
        Duration::from_millis(args.kernel_ms).max(Duration::from_nanos(update_ns * 50) * PASSES);
    let counters = Arc::new(match &args.progress_file {
        Some(path) => {
            Counters::in_file(path).with_context(|| format!("cannot map {}", path.display()))?
        }
        None => Counters::default(),
    });
    let mut sweeper = Sweeper::new(
        &mut live,
        &mut switches,
        &mut readings,
        counters,
        &interrupted,
    );
    let threads: Vec<Vec<u32>> = if cpu_ids.len() > 1 {
        vec![cpu_ids[..1].to_vec(), cpu_ids.clone()]
    } else {
        vec![cpu_ids.clone()]
    };
    eprintln!(
        "energy-bpf: {} kernels ({}) of {} ms over {} MiB, on 1 then {} CPU(s)",
        INTENSITIES.len(),
        isa.name(),
        kernel.as_millis(),
        buffer.bytes() >> 20,
        cpu_ids.len()
    );
    let mut runs = sweeper.sweep(&buffer, isa, &threads, kernel, None)?;
    for &khz in &freqs {
        eprintln!("energy-bpf: every CPU at {khz} kHz");
        let pinned = Pinned::pin(&args.energy.sysfs_root, khz)?;
        let at = sweeper.sweep(&buffer, isa, &threads, kernel, Some(khz));
        pinned.restore()?;
        runs.extend(at?);
    }
    drop(sweeper);
    let (last, _) = live.finish();
    switches.extend(last.switches);
    readings.extend(last.readings);
    let end_ns = crate::clock::monotonic_ns();
    let timeline = Timeline::build(start_ns, end_ns, &cpu_ids, &switches);
    let readings = crate::energy::readings_for(&sources, &readings, &timeline, &cpus);

    // π_0: the quiet window, measured as `calibrate` does.
    let quiet: Vec<SwitchEvent> = switches
        .iter()
        .filter(|s| s.ts_ns <= static_end_ns)
        .cloned()
        .collect();
    let quiet_timeline = Timeline::build(start_ns, static_end_ns, &cpu_ids, &quiet);
    let quiet_readings: Vec<EnergyReading> = readings
        .iter()
        .filter(|r| r.ts_ns <= static_end_ns)
        .cloned()
        .collect();
    let measured = calibrate::measure(
        &quiet_timeline,
        &sources,
        &quiet_readings,
        args.max_busy / 100.0,
        Some(std::process::id()),
        crate::attribute::Options::default().regression_row_ns,
    )
    .context("constant power: calibration refused")?;

    let (_, hostname) = host::uname();
    let mut file = CalibrationFile::load_or_default(&args.calibration)?;
    file.version = calibration::VERSION;
    let date = calibration::rfc3339(crate::clock::realtime_ns());
    let host_cal = file.hosts.entry(hostname.clone()).or_default();
    let mut plotted = Vec::new();
    for source in &sources {
        let key = source_key(source);
        let Some(m) = measured.iter().find(|m| m.key == key) else {
            continue;
        };
        let r = sweep::fit_source(
            &SourceRuns {
                source,
                cpus: &cpus,
                static_w: m.static_w,
                quiet_ns: (start_ns, static_end_ns),
                readings: &readings,
                timeline: &timeline,
                own_tgid: std::process::id(),
            },
            &runs,
            &freqs,
            isa,
            buffer.bytes() as u64,
        )?;
        print!("{}", sweep::summary_text(&source.name, &r));
        let entry = host_cal
            .sources
            .entry(key)
            .or_insert_with(|| SourceCalibration {
                date: date.clone(),
                duration_s: (static_end_ns - start_ns) as f64 / 1e9,
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
    if let Some(path) = &args.plot {
        let refs: Vec<(String, &Roofline)> = plotted.iter().map(|(n, r)| (n.clone(), r)).collect();
        write_plot(path, &roofline::plot::svg(&refs))?;
        println!("plot written to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
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
