//! A roofline kernel's measured point: its energy between the counter readings inside it
//! (or the model's energy over that span), its flops and bytes interpolated from its
//! progress log at those readings, and its threads' on-CPU time from the timeline; and the
//! 95% interval of the static power π_0 from a quiet window.

use super::{
    KernelPoint,
    kernels::{self, Body, Progress},
};
use crate::{attribute::calibrate, pb::v1::EnergyReading, timeline::Timeline};

/// The first part of each kernel is not measured (threads starting, caches filling).
const SETTLE: f64 = 0.1;

/// One kernel run: which, where, and its progress log.
pub struct Run {
    /// The kernel.
    pub body: Body,
    /// Threads it ran on.
    pub threads: u32,
    /// The pinned frequency, kHz (`None`: not pinned).
    pub khz: Option<u64>,
    /// Start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// End, ns.
    pub end_ns: u64,
    /// Its progress log: work and traffic done by each time.
    pub log: Vec<Progress>,
}

/// How a source's kernel energy is read.
#[derive(Clone, Copy, Debug)]
pub enum Meter {
    /// The counter's readings over the window.
    Counter,
    /// The estimated model: it is linear in busy CPUs, so the kernel's own modelled energy
    /// is exact: π_0 over the window plus (P_max − P_idle)/CPUs per second its threads ran
    /// (other load on the machine is not the kernel's).
    Model {
        /// π_0, W.
        const_w: f64,
        /// (P_max − P_idle) / CPUs, W per busy CPU.
        per_cpu_w: f64,
    },
}

/// A kernel's point for one source: energy between the first and last readings inside the
/// kernel (after it settled), flops, bytes and the threads' on-CPU time over that span.
pub fn point(
    run: &Run,
    readings: &[&EnergyReading],
    timeline: &Timeline,
    own_tgid: u32,
    meter: Meter,
) -> Option<KernelPoint> {
    let from = run.start_ns + ((run.end_ns - run.start_ns) as f64 * SETTLE) as u64;
    let mut inside = readings
        .iter()
        .filter(|r| r.ts_ns >= from && r.ts_ns <= run.end_ns);
    let first = inside.next()?;
    let last = inside.next_back()?;
    let seconds = last.ts_ns.checked_sub(first.ts_ns).filter(|&d| d > 0)? as f64 / 1e9;
    let (w0, q0) = kernels::progress_at(&run.log, first.ts_ns);
    let (w1, q1) = kernels::progress_at(&run.log, last.ts_ns);
    let own_ns: u64 = timeline
        .thread_ns(first.ts_ns, last.ts_ns)
        .into_iter()
        .filter(|((tgid, _), _)| *tgid == own_tgid)
        .map(|(_, ns)| ns)
        .sum();
    let own_s = own_ns as f64 / 1e9;
    let joules = match meter {
        Meter::Counter => (last.energy_uj - first.energy_uj) / 1e6,
        Meter::Model { const_w, per_cpu_w } => const_w * seconds + per_cpu_w * own_s,
    };
    Some(KernelPoint {
        flop_per_byte: run.body.intensity(),
        flops: w1 - w0,
        bytes: q1 - q0,
        seconds,
        busy_seconds: (own_s / run.threads.max(1) as f64).min(seconds),
        joules,
        threads: run.threads,
    })
}

/// 95% interval of π_0: the static value ± 1.96 standard errors of the quiet window's
/// power over ten equal slices.
pub fn const_w_interval(
    readings: &[&EnergyReading],
    from: u64,
    to: u64,
    static_w: f64,
) -> [f64; 2] {
    let slices = 10u64;
    let len = (to - from) / slices;
    let rs: Vec<EnergyReading> = readings.iter().map(|r| (*r).clone()).collect();
    let watts: Vec<f64> = (0..slices)
        .filter_map(|k| {
            let a = from + k * len;
            calibrate::mean_power(&rs, rs.first()?.source_id, a, a + len)
        })
        .collect();
    if watts.len() < 3 {
        return [static_w; 2];
    }
    let n = watts.len() as f64;
    let mean = watts.iter().sum::<f64>() / n;
    let sd = (watts.iter().map(|w| (w - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    let half = 1.96 * sd / n.sqrt();
    [(static_w - half).max(0.0), static_w + half]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(ts_ns: u64, energy_uj: f64) -> EnergyReading {
        EnergyReading {
            ts_ns,
            energy_uj,
            ..EnergyReading::default()
        }
    }

    #[test]
    fn a_point_reads_energy_and_work_between_the_readings_after_the_settle() {
        // 1 s run at 10 W; readings every 100 ms; 1 Gflop and 2 GB per second.
        let run = Run {
            body: Body::for_intensity(1.0),
            threads: 1,
            khz: None,
            start_ns: 0,
            end_ns: 1_000_000_000,
            log: vec![
                Progress {
                    ts_ns: 0,
                    flops: 0,
                    bytes: 0,
                },
                Progress {
                    ts_ns: 1_000_000_000,
                    flops: 1_000_000_000,
                    bytes: 2_000_000_000,
                },
            ],
        };
        let rs: Vec<EnergyReading> = (0..=10)
            .map(|k| reading(k * 100_000_000, k as f64 * 1e6))
            .collect();
        let refs: Vec<&EnergyReading> = rs.iter().collect();
        let p = point(&run, &refs, &Timeline::default(), 1, Meter::Counter).expect("point");
        // The first 10% is skipped: readings at 0.1 s .. 1.0 s.
        assert!((p.seconds - 0.9).abs() < 1e-9, "{p:?}");
        assert!((p.joules - 9.0).abs() < 1e-9, "{p:?}");
        assert!((p.flops - 0.9e9).abs() < 1.0, "{p:?}");
        assert!((p.bytes - 1.8e9).abs() < 1.0, "{p:?}");
        // The model: π_0 over the span, nothing for threads that did not run.
        let m = Meter::Model {
            const_w: 2.0,
            per_cpu_w: 5.0,
        };
        let p = point(&run, &refs, &Timeline::default(), 1, m).expect("point");
        assert!((p.joules - 1.8).abs() < 1e-9, "{p:?}");
        // One reading inside: no span, no point.
        assert!(point(&run, &refs[..2], &Timeline::default(), 1, Meter::Counter).is_none());
    }

    #[test]
    fn the_static_interval_widens_with_noisy_power() {
        // Steady 5 W: the interval is the value itself.
        let steady: Vec<EnergyReading> = (0..=100)
            .map(|k| reading(k * 10_000_000, k as f64 * 50_000.0))
            .collect();
        let refs: Vec<&EnergyReading> = steady.iter().collect();
        let [lo, hi] = const_w_interval(&refs, 0, 1_000_000_000, 5.0);
        assert!(
            (lo - 5.0).abs() < 1e-6 && (hi - 5.0).abs() < 1e-6,
            "{lo} {hi}"
        );
        // Alternating 4 W and 6 W slices: a band around the value.
        let mut e = 0.0;
        let noisy: Vec<EnergyReading> = (0..=100)
            .map(|k| {
                let r = reading(k * 10_000_000, e);
                e += if (k / 10) % 2 == 0 {
                    40_000.0
                } else {
                    60_000.0
                };
                r
            })
            .collect();
        let refs: Vec<&EnergyReading> = noisy.iter().collect();
        let [lo, hi] = const_w_interval(&refs, 0, 1_000_000_000, 5.0);
        assert!(lo < 5.0 && hi > 5.0 && hi - lo < 2.0, "{lo} {hi}");
        // Too few readings: no interval to speak of.
        assert_eq!(
            const_w_interval(&refs[..2], 0, 1_000_000_000, 5.0),
            [5.0; 2]
        );
    }
}
