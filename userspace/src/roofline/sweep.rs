//! Measuring the roofline (`calibrate --roofline`): the built-in kernels run round-robin
//! while capture goes on ([`Sweeper`]), then per energy source the kernels' points are read
//! from its counter and fitted ([`fit_source`]). What is printed is [`summary_text`]'s.

use std::{
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use super::{
    FitError, KernelPoint, Roofline, dvfs,
    kernels::{self, Body, Buffer, Counters, INTENSITIES, Isa, Progress},
    points::{Meter, Run, const_w_interval, point},
    summarize,
};
use crate::{
    capture::live::Live,
    pb::v1::{Cpu, EnergyReading, EnergySource, SwitchEvent},
    timeline::Timeline,
};

/// Each kernel runs in this many round-robin passes, summed.
pub const PASSES: u32 = 3;

/// Why a sweep or a fit stopped.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// Ctrl-C or SIGTERM during the sweep.
    #[error("interrupted (CPU frequencies, if changed, are restored)")]
    Interrupted,
    /// The kernels' points of a source admit no roofline.
    #[error("{source_name}: cannot fit the roofline")]
    Fit {
        /// The energy source.
        source_name: String,
        /// Why.
        #[source]
        err: FitError,
    },
    /// Likewise at one pinned frequency.
    #[error("{source_name}: cannot fit at {khz} kHz")]
    FitAt {
        /// The energy source.
        source_name: String,
        /// The frequency, kHz.
        khz: u64,
        /// Why.
        #[source]
        err: FitError,
    },
}

/// What the sweep drives besides the kernels: capture, counters, the progress file.
pub struct Sweeper<'a> {
    live: &'a mut Live,
    switches: &'a mut Vec<SwitchEvent>,
    readings: &'a mut Vec<EnergyReading>,
    counters: Arc<Counters>,
    last_poll: Instant,
    interrupted: &'a AtomicBool,
}

impl<'a> Sweeper<'a> {
    /// A sweep polling `live` into `switches` and `readings` as kernels run, counting their
    /// progress in `counters`, and stopping when `interrupted` is set.
    pub fn new(
        live: &'a mut Live,
        switches: &'a mut Vec<SwitchEvent>,
        readings: &'a mut Vec<EnergyReading>,
        counters: Arc<Counters>,
        interrupted: &'a AtomicBool,
    ) -> Self {
        Self {
            live,
            switches,
            readings,
            counters,
            last_poll: Instant::now(),
            interrupted,
        }
    }

    /// Every kernel on each CPU set in `threads`, in turn, [`PASSES`] times `kernel` each
    /// (`khz`: the frequency the CPUs are pinned at, if any).
    pub fn sweep(
        &mut self,
        buffer: &Arc<Buffer>,
        isa: Isa,
        threads: &[Vec<u32>],
        kernel: Duration,
        khz: Option<u64>,
    ) -> Result<Vec<Run>, SweepError> {
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
                if self.interrupted.load(Ordering::Relaxed) {
                    return Err(SweepError::Interrupted);
                }
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

/// One source's share of a sweep: what [`fit_source`] reads.
pub struct SourceRuns<'a> {
    /// The source.
    pub source: &'a EnergySource,
    /// The machine's CPUs (the model's power per busy CPU is split over its package's).
    pub cpus: &'a [Cpu],
    /// Its static power, measured over the quiet window, W.
    pub static_w: f64,
    /// The quiet window, ns.
    pub quiet_ns: (u64, u64),
    /// Every reading of the run (the source's are picked out).
    pub readings: &'a [EnergyReading],
    /// Who ran where, over the whole run.
    pub timeline: &'a Timeline,
    /// This process: the kernels' threads.
    pub own_tgid: u32,
}

/// The kernels' points at frequency `khz` (`None`: not pinned), the passes of each kernel
/// and thread count summed.
pub fn kernel_points(
    runs: &[Run],
    khz: Option<u64>,
    readings: &[&EnergyReading],
    timeline: &Timeline,
    own_tgid: u32,
    meter: Meter,
) -> Vec<KernelPoint> {
    let mut sums: Vec<KernelPoint> = Vec::new();
    for p in runs
        .iter()
        .filter(|r| r.khz == khz)
        .filter_map(|r| point(r, readings, timeline, own_tgid, meter))
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
}

/// The roofline of one source from the sweep's `runs` (at `freqs`, kHz, besides the
/// unpinned ones), run with `isa` over `buffer_bytes`.
pub fn fit_source(
    s: &SourceRuns<'_>,
    runs: &[Run],
    freqs: &[u64],
    isa: Isa,
    buffer_bytes: u64,
) -> Result<Roofline, SweepError> {
    let source = s.source;
    let mine: Vec<&EnergyReading> = s
        .readings
        .iter()
        .filter(|r| r.source_id == source.id)
        .collect();
    // The model's constant power is its idle power by definition (its P = P_idle +
    // (P_max − P_idle)·u); a busy machine would hide it from the quiet window.
    let const_w = if source.estimated && source.model_idle_w > 0.0 {
        source.model_idle_w
    } else {
        s.static_w
    };
    let interval = if source.estimated {
        [const_w; 2]
    } else {
        const_w_interval(&mine, s.quiet_ns.0, s.quiet_ns.1, const_w)
    };
    let meter = if source.estimated {
        let n = s
            .cpus
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
    let points_of = |khz| kernel_points(runs, khz, &mine, s.timeline, s.own_tgid, meter);
    let kernels = points_of(None);
    let (all, one_thread) =
        summarize(&kernels, const_w, interval).map_err(|err| SweepError::Fit {
            source_name: source.name.clone(),
            err,
        })?;
    let dvfs = if freqs.is_empty() {
        None
    } else {
        let fits =
            freqs
                .iter()
                .map(|&khz| {
                    let (summary, _) = summarize(&points_of(Some(khz)), const_w, interval)
                        .map_err(|err| SweepError::FitAt {
                            source_name: source.name.clone(),
                            khz,
                            err,
                        })?;
                    Ok(dvfs::FrequencyFit { khz, summary })
                })
                .collect::<Result<Vec<_>, SweepError>>()?;
        Some(dvfs::analyze(fits))
    };
    Ok(Roofline {
        estimated: source.estimated,
        isa: isa.name().into(),
        buffer_bytes,
        all,
        one_thread,
        kernels,
        dvfs,
    })
}

/// What `calibrate --roofline` prints of source `name`'s roofline.
pub fn summary_text(name: &str, r: &Roofline) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_summary(&mut out, name, r);
    out
}

fn write_summary(out: &mut String, name: &str, r: &Roofline) -> std::fmt::Result {
    let note = if r.estimated {
        " (estimated: describes the model, not the machine)"
    } else {
        ""
    };
    writeln!(out, "{name}{note}:")?;
    for s in std::iter::once(&r.all).chain(&r.one_thread) {
        let c = &s.constants;
        let i = &s.fit.intervals;
        writeln!(out, "  {} thread(s):", s.threads)?;
        writeln!(
            out,
            "    constant power π0   {:>10.3} W        [{:.3}, {:.3}]",
            c.const_w, i.const_w[0], i.const_w[1]
        )?;
        writeln!(
            out,
            "    energy per flop ε   {:>10.3} pJ       [{:.3}, {:.3}]",
            c.j_per_flop * 1e12,
            i.j_per_flop[0] * 1e12,
            i.j_per_flop[1] * 1e12
        )?;
        writeln!(
            out,
            "    energy per byte ε   {:>10.3} pJ       [{:.3}, {:.3}]",
            c.j_per_byte * 1e12,
            i.j_per_byte[0] * 1e12,
            i.j_per_byte[1] * 1e12
        )?;
        writeln!(
            out,
            "    peak flop rate      {:>10.3} Gflop/s  [{:.3}, {:.3}]",
            1e-9 / c.s_per_flop,
            1e-9 / i.s_per_flop[1],
            1e-9 / i.s_per_flop[0]
        )?;
        writeln!(
            out,
            "    peak bandwidth      {:>10.3} GB/s     [{:.3}, {:.3}]",
            1e-9 / c.s_per_byte,
            1e-9 / i.s_per_byte[1],
            1e-9 / i.s_per_byte[0]
        )?;
        writeln!(
            out,
            "    balance: time B_τ = {:.3}, energy B_ε = {:.3}, effective B̂_ε = {:.3} flop/byte (η_flop {:.2})",
            s.time_balance, s.energy_balance, s.effective_energy_balance, s.eta_flop
        )?;
        writeln!(
            out,
            "    fit: energy residual median {:.1}% (max {:.1}%), time residual median {:.1}%, R² {:.4}",
            s.fit.energy_residual_median * 100.0,
            s.fit.energy_residual_max * 100.0,
            s.fit.time_residual_median * 100.0,
            s.fit.energy_r2
        )?;
        match s.balance_gap {
            None => writeln!(
                out,
                "    race to halt: yes (B_τ > B̂_ε): finishing sooner saves energy at every intensity"
            )?,
            Some([lo, hi]) => writeln!(
                out,
                "    race to halt: no: codes with {lo:.3} < I < {hi:.3} flop/byte are compute-bound in time but memory-bound in energy"
            )?,
        }
    }
    if let Some(d) = &r.dvfs {
        writeln!(
            out,
            "  energy-optimal frequency per intensity (from the V²-scaling fit):"
        )?;
        for b in &d.optimal {
            writeln!(
                out,
                "    I = {:>8.4} flop/byte: {} kHz ({:.1}% less energy than the fastest)",
                b.flop_per_byte,
                b.best_khz,
                b.saving_vs_fastest * 100.0
            )?;
        }
    }
    Ok(())
}
