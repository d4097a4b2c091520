//! `energy-bpf calibrate --roofline`: π_0 from a quiet window (as `calibrate` measures
//! static power), then the built-in kernels on one thread and on every CPU while capture
//! and the counters run; per source the kernels' energy is read between the counter
//! readings inside each kernel, their flops and bytes interpolated from the progress log
//! at those readings' times. The fit and everything stored are [`crate::roofline`]'s.

use std::{
    path::Path,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
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
        self, KernelPoint, Roofline,
        cpufreq::{self, Pinned},
        dvfs,
        kernels::{self, Body, Buffer, Counters, INTENSITIES, Isa, Progress},
        points::{Meter, Run, const_w_interval, point},
    },
    timeline::Timeline,
};

/// Counter readings every 10 ms unless `--energy-interval-ms` says otherwise: a kernel
/// spans tens of readings.
const READ_MS: u64 = 10;
/// Each kernel runs in this many round-robin passes, summed.
const PASSES: u32 = 3;

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
    let mut sweeper = Sweeper {
        live: &mut live,
        switches: &mut switches,
        readings: &mut readings,
        counters: Arc::new(match &args.progress_file {
            Some(path) => {
                Counters::in_file(path).with_context(|| format!("cannot map {}", path.display()))?
            }
            None => Counters::default(),
        }),
        last_poll: Instant::now(),
        interrupted: &interrupted,
    };
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
        let mine: Vec<&EnergyReading> = readings
            .iter()
            .filter(|r| r.source_id == source.id)
            .collect();
        // The model's constant power is its idle power by definition (its P = P_idle +
        // (P_max − P_idle)·u); a busy machine would hide it from the quiet window.
        let const_w = if source.estimated && source.model_idle_w > 0.0 {
            source.model_idle_w
        } else {
            m.static_w
        };
        let interval = if source.estimated {
            [const_w; 2]
        } else {
            const_w_interval(&mine, start_ns, static_end_ns, const_w)
        };
        let meter = if source.estimated {
            let n = cpus
                .iter()
                .filter(|c| c.package == source.package)
                .count()
                .max(1);
            Meter::Model {
                const_w,
                per_cpu_w: (source.model_max_w - source.model_idle_w).max(0.0) / n as f64,
            }
        } else {
            Meter::Counter
        };
        let own = std::process::id();
        let points_of = |khz: Option<u64>| -> Vec<KernelPoint> {
            let mut sums: Vec<KernelPoint> = Vec::new();
            for p in runs
                .iter()
                .filter(|r| r.khz == khz)
                .filter_map(|r| point(r, &mine, &timeline, own, meter))
            {
                match sums
                    .iter_mut()
                    .find(|s| s.threads == p.threads && s.flop_per_byte == p.flop_per_byte)
                {
                    Some(s) => {
                        s.flops += p.flops;
                        s.bytes += p.bytes;
                        s.seconds += p.seconds;
                        s.busy_seconds += p.busy_seconds;
                        s.joules += p.joules;
                    }
                    None => sums.push(p),
                }
            }
            sums
        };
        let kernels = points_of(None);
        let (all, one_thread) = roofline::summarize(&kernels, const_w, interval)
            .with_context(|| format!("{}: cannot fit the roofline", source.name))?;
        let dvfs = if freqs.is_empty() {
            None
        } else {
            let fits = freqs
                .iter()
                .map(|&khz| {
                    let (summary, _) =
                        roofline::summarize(&points_of(Some(khz)), const_w, interval)
                            .with_context(|| format!("{}: cannot fit at {khz} kHz", source.name))?;
                    Ok(dvfs::FrequencyFit { khz, summary })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Some(dvfs::analyze(fits))
        };
        let r = Roofline {
            estimated: source.estimated,
            isa: isa.name().into(),
            buffer_bytes: buffer.bytes() as u64,
            all,
            one_thread,
            kernels,
            dvfs,
        };
        print_summary(&source.name, &r);
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

/// What the sweep drives besides the kernels: capture, counters, the progress file.
struct Sweeper<'a> {
    live: &'a mut Live,
    switches: &'a mut Vec<SwitchEvent>,
    readings: &'a mut Vec<EnergyReading>,
    counters: Arc<Counters>,
    last_poll: Instant,
    interrupted: &'a AtomicBool,
}

impl Sweeper<'_> {
    /// Every kernel on each CPU set in `threads`, in turn.
    fn sweep(
        &mut self,
        buffer: &Arc<Buffer>,
        isa: Isa,
        threads: &[Vec<u32>],
        kernel: Duration,
        khz: Option<u64>,
    ) -> anyhow::Result<Vec<Run>> {
        let mut runs = Vec::new();
        // Round-robin passes: a burst of other load is spread over every intensity
        // instead of falling on one kernel.
        let pass = kernel / PASSES;
        for cpus in threads {
            for &intensity in INTENSITIES
                .iter()
                .cycle()
                .take(INTENSITIES.len() * PASSES as usize)
            {
                anyhow::ensure!(
                    !self.interrupted.load(Ordering::Relaxed),
                    "interrupted (CPU frequencies, if changed, are restored)"
                );
                let body = Body::for_intensity(intensity);
                let start_ns = crate::clock::monotonic_ns();
                let counters = Arc::clone(&self.counters);
                let log = kernels::run(buffer, body, isa, cpus, pass, &counters, &mut |p| {
                    self.tick(p)
                });
                runs.push(Run {
                    body,
                    threads: cpus.len() as u32,
                    khz,
                    start_ns,
                    end_ns: crate::clock::monotonic_ns(),
                    log,
                });
            }
        }
        Ok(runs)
    }

    fn tick(&mut self, _: Progress) {
        if self.last_poll.elapsed() >= Duration::from_millis(100) {
            self.last_poll = Instant::now();
            let chunk = self.live.poll();
            self.switches.extend(chunk.switches);
            self.readings.extend(chunk.readings);
        }
    }
}

fn print_summary(name: &str, r: &Roofline) {
    let note = if r.estimated {
        " (estimated: describes the model, not the machine)"
    } else {
        ""
    };
    println!("{name}{note}:");
    for s in std::iter::once(&r.all).chain(&r.one_thread) {
        let c = &s.constants;
        let i = &s.fit.intervals;
        println!("  {} thread(s):", s.threads);
        println!(
            "    constant power π0   {:>10.3} W        [{:.3}, {:.3}]",
            c.const_w, i.const_w[0], i.const_w[1]
        );
        println!(
            "    energy per flop ε   {:>10.3} pJ       [{:.3}, {:.3}]",
            c.j_per_flop * 1e12,
            i.j_per_flop[0] * 1e12,
            i.j_per_flop[1] * 1e12
        );
        println!(
            "    energy per byte ε   {:>10.3} pJ       [{:.3}, {:.3}]",
            c.j_per_byte * 1e12,
            i.j_per_byte[0] * 1e12,
            i.j_per_byte[1] * 1e12
        );
        println!(
            "    peak flop rate      {:>10.3} Gflop/s  [{:.3}, {:.3}]",
            1e-9 / c.s_per_flop,
            1e-9 / i.s_per_flop[1],
            1e-9 / i.s_per_flop[0]
        );
        println!(
            "    peak bandwidth      {:>10.3} GB/s     [{:.3}, {:.3}]",
            1e-9 / c.s_per_byte,
            1e-9 / i.s_per_byte[1],
            1e-9 / i.s_per_byte[0]
        );
        println!(
            "    balance: time B_τ = {:.3}, energy B_ε = {:.3}, effective B̂_ε = {:.3} flop/byte (η_flop {:.2})",
            s.time_balance, s.energy_balance, s.effective_energy_balance, s.eta_flop
        );
        println!(
            "    fit: energy residual median {:.1}% (max {:.1}%), time residual median {:.1}%, R² {:.4}",
            s.fit.energy_residual_median * 100.0,
            s.fit.energy_residual_max * 100.0,
            s.fit.time_residual_median * 100.0,
            s.fit.energy_r2
        );
        match s.balance_gap {
            None => println!(
                "    race to halt: yes (B_τ > B̂_ε): finishing sooner saves energy at every intensity"
            ),
            Some([lo, hi]) => println!(
                "    race to halt: no: codes with {lo:.3} < I < {hi:.3} flop/byte are compute-bound in time but memory-bound in energy"
            ),
        }
    }
    if let Some(d) = &r.dvfs {
        println!("  energy-optimal frequency per intensity (from the V²-scaling fit):");
        for b in &d.optimal {
            println!(
                "    I = {:>8.4} flop/byte: {} kHz ({:.1}% less energy than the fastest)",
                b.flop_per_byte,
                b.best_khz,
                b.saving_vs_fastest * 100.0
            );
        }
    }
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
