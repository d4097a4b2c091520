//! Fitting the roofline constants to measured kernels. PURE.
//!
//! π_0 comes first, measured like `calibrate`'s static power; then ε_flop and ε_mem by
//! non-negative least squares on the dynamic energy E − π_0·T ≈ W·ε_flop + Q·ε_mem, rows
//! weighted by 1/E so every kernel counts by its relative error (the thesis normalises by
//! W for the same reason, §2.3). τ_flop and τ_mem are throughput values (1/peak), fitted
//! to the roofline T = max(W·τ_flop, Q·τ_mem) by least squares (ch. 4), T being the time
//! the kernel's threads ran (on-CPU time, so other load does not pass for a slow machine). Each constant gets a
//! 95% bootstrap interval (kernels resampled), π_0 the interval the caller measured.

use rand::{RngExt as _, SeedableRng as _, rngs::ChaCha8Rng};

use super::model::Constants;
use crate::attribute::linalg::solve_nonneg;

/// One kernel run as measured.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct KernelPoint {
    /// W/Q by construction.
    pub flop_per_byte: f64,
    /// W, flops in the measured window.
    pub flops: f64,
    /// Q, bytes in the measured window.
    pub bytes: f64,
    /// T, s: the wall-clock span of the measured window (constant power accrues over it).
    pub seconds: f64,
    /// The kernel threads' own on-CPU time over the window divided by the threads, s: the
    /// time the kernel actually ran (τ comes from it; on a quiet machine it is T).
    pub busy_seconds: f64,
    /// E, J (the source's whole reading over the window).
    pub joules: f64,
    /// Threads that ran it.
    pub threads: u32,
}

/// How well the constants explain the kernels.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FitReport {
    /// Kernels fitted.
    pub kernels: usize,
    /// Median |E_model − E|/E over kernels.
    pub energy_residual_median: f64,
    /// Largest |E_model − E|/E.
    pub energy_residual_max: f64,
    /// Median |T_model − T|/T (T_model = max(W·τ_flop, Q·τ_mem)).
    pub time_residual_median: f64,
    /// Largest |T_model − T|/T.
    pub time_residual_max: f64,
    /// R² of the modelled energies.
    pub energy_r2: f64,
    /// 95% intervals, `[low, high]`, per constant.
    pub intervals: Intervals,
}

/// 95% intervals of the constants, `[low, high]`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Intervals {
    /// π_0, W.
    pub const_w: [f64; 2],
    /// ε_flop, J/flop.
    pub j_per_flop: [f64; 2],
    /// ε_mem, J/byte.
    pub j_per_byte: [f64; 2],
    /// τ_flop, s/flop.
    pub s_per_flop: [f64; 2],
    /// τ_mem, s/byte.
    pub s_per_byte: [f64; 2],
}

#[cfg(test)]
impl FitReport {
    /// The report of a fit over `kernels` kernels that the constants explain exactly: no
    /// residual, R² of 1, zero-width intervals. For tests that need a report, not a fit.
    pub(crate) fn exact(kernels: usize) -> Self {
        Self {
            kernels,
            energy_residual_median: 0.0,
            energy_residual_max: 0.0,
            time_residual_median: 0.0,
            time_residual_max: 0.0,
            energy_r2: 1.0,
            intervals: Intervals {
                const_w: [0.0; 2],
                j_per_flop: [0.0; 2],
                j_per_byte: [0.0; 2],
                s_per_flop: [0.0; 2],
                s_per_byte: [0.0; 2],
            },
        }
    }
}

/// Why the kernels cannot be fitted.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FitError {
    /// Fewer usable kernels than constants.
    #[error("only {usable} kernel(s) had a usable measurement (need 3): run longer kernels")]
    TooFewKernels {
        /// Kernels with positive time, energy, flops and bytes.
        usable: usize,
    },
    /// All kernels had the same intensity: flop and byte costs cannot be told apart.
    #[error("every kernel had the same intensity: flop and byte costs cannot be told apart")]
    NoSpread,
}

/// Bootstrap resamples.
const RESAMPLES: usize = 400;

/// Fits the constants to `points` given π_0 (`const_w`, with its interval).
pub fn fit(
    points: &[KernelPoint],
    const_w: f64,
    const_w_interval: [f64; 2],
) -> Result<(Constants, FitReport), FitError> {
    let usable: Vec<&KernelPoint> = points
        .iter()
        .filter(|p| p.seconds > 0.0 && p.joules > 0.0 && p.flops > 0.0 && p.bytes > 0.0)
        .collect();
    if usable.len() < 3 {
        return Err(FitError::TooFewKernels {
            usable: usable.len(),
        });
    }
    let (lo, hi) = usable.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), p| {
        let i = p.flops / p.bytes;
        (lo.min(i), hi.max(i))
    });
    if hi <= lo * 1.5 {
        return Err(FitError::NoSpread);
    }
    let c = constants(&usable, const_w);
    let mut rng = ChaCha8Rng::seed_from_u64(0x2002);
    let mut samples: Vec<Constants> = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        let pick: Vec<&KernelPoint> = (0..usable.len())
            .map(|_| usable[rng.random_range(0..usable.len())])
            .collect();
        samples.push(constants(&pick, const_w));
    }
    let interval = |f: fn(&Constants) -> f64| {
        let mut v: Vec<f64> = samples.iter().map(f).filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            v.get(((v.len() as f64 - 1.0) * q).round() as usize)
                .copied()
        };
        let point = f(&c);
        [
            at(0.025).unwrap_or(point).min(point),
            at(0.975).unwrap_or(point).max(point),
        ]
    };
    let intervals = Intervals {
        const_w: const_w_interval,
        j_per_flop: interval(|c| c.j_per_flop),
        j_per_byte: interval(|c| c.j_per_byte),
        s_per_flop: interval(|c| c.s_per_flop),
        s_per_byte: interval(|c| c.s_per_byte),
    };
    let mut e_res: Vec<f64> = Vec::new();
    let mut t_res: Vec<f64> = Vec::new();
    let mean_e = usable.iter().map(|p| p.joules).sum::<f64>() / usable.len() as f64;
    let (mut ss_res, mut ss_tot) = (0.0, 0.0);
    for p in &usable {
        let t_model = c.time(p.flops, p.bytes);
        let t = run_time(p);
        let e_model = p.flops * c.j_per_flop + p.bytes * c.j_per_byte + const_w * p.seconds;
        e_res.push((e_model - p.joules).abs() / p.joules);
        t_res.push((t_model - t).abs() / t);
        ss_res += (e_model - p.joules).powi(2);
        ss_tot += (p.joules - mean_e).powi(2);
    }
    let report = FitReport {
        kernels: usable.len(),
        energy_residual_median: median(&mut e_res),
        energy_residual_max: e_res.iter().copied().fold(0.0, f64::max),
        time_residual_median: median(&mut t_res),
        time_residual_max: t_res.iter().copied().fold(0.0, f64::max),
        energy_r2: if ss_tot > 0.0 {
            1.0 - ss_res / ss_tot
        } else {
            1.0
        },
        intervals,
    };
    Ok((c, report))
}

/// The point estimates from `points` (at least one).
fn constants(points: &[&KernelPoint], const_w: f64) -> Constants {
    // Rows [W, Q]/E, target (E − π_0·T)/E; columns scaled to unit RMS for conditioning.
    let rows: Vec<([f64; 2], f64)> = points
        .iter()
        .map(|p| {
            (
                [p.flops / p.joules, p.bytes / p.joules],
                (p.joules - const_w * p.seconds) / p.joules,
            )
        })
        .collect();
    let scale: Vec<f64> = (0..2)
        .map(|j| {
            let ms = rows.iter().map(|(a, _)| a[j] * a[j]).sum::<f64>() / rows.len() as f64;
            if ms > 0.0 { ms.sqrt() } else { 1.0 }
        })
        .collect();
    let mut ata = vec![vec![0.0; 2]; 2];
    let mut atb = vec![0.0; 2];
    for (a, y) in &rows {
        for i in 0..2 {
            atb[i] += a[i] / scale[i] * y;
            for j in 0..2 {
                ata[i][j] += a[i] / scale[i] * a[j] / scale[j];
            }
        }
    }
    let x = solve_nonneg(&ata, &atb, &[0.0, 0.0]);
    let (s_per_flop, s_per_byte) = fit_times(points);
    Constants {
        const_w,
        j_per_flop: x[0] / scale[0],
        j_per_byte: x[1] / scale[1],
        s_per_flop,
        s_per_byte,
    }
}

/// τ_flop and τ_mem by least squares of the roofline T = max(W·τ_flop, Q·τ_mem) in
/// relative error (the thesis's ch. 4 regression): starting from the fastest rates, each
/// kernel is assigned to the side of the max it is on and each τ refitted on its side,
/// until the assignment settles. Less biased than the single fastest kernel when times
/// are noisy (another load, a shared cache).
fn fit_times(points: &[&KernelPoint]) -> (f64, f64) {
    let fastest = |f: &dyn Fn(&KernelPoint) -> f64| {
        points
            .iter()
            .map(|p| f(p))
            .filter(|x| x.is_finite() && *x > 0.0)
            .fold(f64::INFINITY, f64::min)
    };
    let mut tf = fastest(&|p| run_time(p) / p.flops);
    let mut tm = fastest(&|p| run_time(p) / p.bytes);
    if !tf.is_finite() || !tm.is_finite() {
        return (tf.min(f64::MAX), tm.min(f64::MAX));
    }
    // min Σ (τ·x/T − 1)² over one side: τ = Σ(x/T) / Σ(x/T)².
    let refit = |side: &[&&KernelPoint], x: fn(&KernelPoint) -> f64, old: f64| {
        let (a, b) = side.iter().fold((0.0, 0.0), |(a, b), p| {
            let r = x(p) / run_time(p);
            (a + r, b + r * r)
        });
        if b > 0.0 { a / b } else { old }
    };
    let mut last: Vec<bool> = Vec::new();
    for _ in 0..50 {
        let compute: Vec<bool> = points
            .iter()
            .map(|p| p.flops * tf >= p.bytes * tm)
            .collect();
        if compute == last {
            break;
        }
        let (c, m): (Vec<_>, Vec<_>) = points
            .iter()
            .zip(&compute)
            .partition(|(_, is_compute)| **is_compute);
        let c: Vec<&&KernelPoint> = c.into_iter().map(|(p, _)| p).collect();
        let m: Vec<&&KernelPoint> = m.into_iter().map(|(p, _)| p).collect();
        tf = refit(&c, |p| p.flops, tf);
        tm = refit(&m, |p| p.bytes, tm);
        last = compute;
    }
    (tf, tm)
}

/// The time a kernel ran: its on-CPU time, or the wall time when that was not measured.
pub fn run_time(p: &KernelPoint) -> f64 {
    if p.busy_seconds > 0.0 {
        p.busy_seconds
    } else {
        p.seconds
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kernels over the built-in sweep on a machine with constants `c`, 2% noise on E.
    pub(crate) fn synthetic(c: &Constants, noise: f64, seed: u64) -> Vec<KernelPoint> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        super::super::kernels::INTENSITIES
            .iter()
            .map(|&i| {
                let bytes = 1e9;
                let flops = i * bytes;
                let seconds = c.time(flops, bytes);
                let jitter = if noise > 0.0 {
                    rng.random_range(-noise..noise)
                } else {
                    0.0
                };
                let joules = c.energy(flops, bytes) * (1.0 + jitter);
                KernelPoint {
                    flop_per_byte: i,
                    flops,
                    bytes,
                    seconds,
                    busy_seconds: seconds,
                    joules,
                    threads: 1,
                }
            })
            .collect()
    }

    /// Thesis Table 4, i7-950 double precision: ε_d 670 pJ, ε_mem 795 pJ/B, π_0 122 W.
    fn i7() -> Constants {
        Constants {
            const_w: 122.0,
            j_per_flop: 670e-12,
            j_per_byte: 795e-12,
            s_per_flop: 1.0 / 53.28e9,
            s_per_byte: 1.0 / 25.6e9,
        }
    }

    #[test]
    fn recovers_known_constants_from_noisy_kernels() {
        let truth = i7();
        let points = synthetic(&truth, 0.02, 7);
        let (c, report) = fit(&points, truth.const_w, [121.0, 123.0]).expect("fit");
        let close = |a: f64, b: f64| (a - b).abs() / b;
        assert!(close(c.j_per_flop, truth.j_per_flop) < 0.05, "{c:?}");
        assert!(close(c.j_per_byte, truth.j_per_byte) < 0.05, "{c:?}");
        assert!(close(c.s_per_flop, truth.s_per_flop) < 1e-9, "{c:?}");
        assert!(close(c.s_per_byte, truth.s_per_byte) < 1e-9, "{c:?}");
        assert!(report.energy_r2 > 0.99, "{report:?}");
        assert!(report.energy_residual_median < 0.03, "{report:?}");
        assert!(report.time_residual_max < 1e-9, "{report:?}");
        for (name, [lo, hi], v) in [
            ("flop", report.intervals.j_per_flop, c.j_per_flop),
            ("byte", report.intervals.j_per_byte, c.j_per_byte),
        ] {
            assert!(lo <= v && v <= hi && lo >= 0.0, "{name}: {lo} {v} {hi}");
            assert!(
                lo <= truth.j_per_flop.max(truth.j_per_byte) * 2.0,
                "{name} interval {lo}..{hi} is absurd"
            );
        }
    }

    #[test]
    fn noiseless_kernels_give_exact_constants_and_zero_residuals() {
        let truth = i7();
        let (c, report) = fit(&synthetic(&truth, 0.0, 1), truth.const_w, [122.0; 2]).expect("fit");
        assert!((c.energy_balance() - truth.energy_balance()).abs() < 1e-6);
        assert!(report.energy_residual_max < 1e-9, "{report:?}");
        assert_eq!(c.race_to_halt(), truth.race_to_halt());
    }

    #[test]
    fn costs_stay_non_negative_and_bad_input_is_refused() {
        let mut points = synthetic(&i7(), 0.0, 1);
        // A π_0 larger than any kernel's power: all dynamic energy negative, costs clamp at 0.
        let (c, _) = fit(&points, 1e6, [1e6; 2]).expect("fit");
        assert!(c.j_per_flop >= 0.0 && c.j_per_byte >= 0.0, "{c:?}");
        points.truncate(2);
        assert_eq!(
            fit(&points, 1.0, [1.0; 2]),
            Err(FitError::TooFewKernels { usable: 2 })
        );
        let same: Vec<KernelPoint> = (0..4).map(|_| points[0].clone()).collect();
        assert_eq!(fit(&same, 1.0, [1.0; 2]), Err(FitError::NoSpread));
    }
}
