//! The roofline over CPU frequencies (the energy roofline thesis, ch. 5). PURE.
//!
//! The thesis fits E = W·C_core·V² + Q·C_mem·V_mem² + (C_1·V + π_misc)·T (eq. 48) with
//! voltages from the board. cpufreq exposes no voltage, so we take V affine in f over the
//! DVFS range and fit, by non-negative least squares over the per-frequency constants:
//! ε_flop(f) = a_0 + a_2·f², ε_mem(f) = b_0 + b_2·f² (the memory clock does not follow the
//! core's, so b_2 is usually ≈ 0) and π_0(f) = p_0 + p_1·f. The energy-optimal frequency
//! of an intensity band is the measured frequency whose modelled energy per flop
//! ε_flop + ε_mem/I + π_0·T/W is least, T/W from that frequency's own τ values.

use super::Summary;
use crate::attribute::linalg::solve_nonneg;

/// Constants measured at one frequency.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FrequencyFit {
    /// The frequency every CPU was pinned to, kHz.
    pub khz: u64,
    /// The machine's constants there.
    #[serde(flatten)]
    pub summary: Summary,
}

/// The V²-scaling fit (f in GHz).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Scaling {
    /// ε_flop(f) = `flop[0]` + `flop[1]`·f², J/flop.
    pub flop: [f64; 2],
    /// ε_mem(f) = `byte[0]` + `byte[1]`·f², J/byte.
    pub byte: [f64; 2],
    /// π_0(f) = `const_w[0]` + `const_w[1]`·f, W.
    pub const_w: [f64; 2],
}

/// The best frequency for one intensity band.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Band {
    /// Intensity at the centre of the band (powers of two), flop/byte.
    pub flop_per_byte: f64,
    /// Energy-optimal frequency, kHz.
    pub best_khz: u64,
    /// Energy saved there against the highest frequency (racing to halt), 0..1.
    pub saving_vs_fastest: f64,
}

/// Everything `--frequencies` adds.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Dvfs {
    /// Constants per frequency.
    pub frequencies: Vec<FrequencyFit>,
    /// The fit across them.
    pub scaling: Scaling,
    /// The energy-optimal frequency per band, 1/16 to 64 flop/byte.
    pub optimal: Vec<Band>,
}

/// Fits the scaling and picks the best frequency per band (`fits` non-empty).
pub fn analyze(fits: Vec<FrequencyFit>) -> Dvfs {
    let ghz: Vec<f64> = fits.iter().map(|f| f.khz as f64 / 1e6).collect();
    let sq: Vec<f64> = ghz.iter().map(|g| g * g).collect();
    let c = |f: fn(&Summary) -> f64| -> Vec<f64> { fits.iter().map(|x| f(&x.summary)).collect() };
    let scaling = Scaling {
        flop: nnls2(&sq, &c(|s| s.constants.j_per_flop)),
        byte: nnls2(&sq, &c(|s| s.constants.j_per_byte)),
        const_w: nnls2(&ghz, &c(|s| s.constants.const_w)),
    };
    let fastest = fits.iter().max_by_key(|f| f.khz);
    let optimal = (-4..=6)
        .map(|e| 2f64.powi(e))
        .filter_map(|i| {
            let per_flop = |f: &FrequencyFit| {
                let g = f.khz as f64 / 1e6;
                let s = &f.summary.constants;
                let eps_f = scaling.flop[0] + scaling.flop[1] * g * g;
                let eps_m = scaling.byte[0] + scaling.byte[1] * g * g;
                let pi0 = scaling.const_w[0] + scaling.const_w[1] * g;
                eps_f + eps_m / i + pi0 * s.s_per_flop.max(s.s_per_byte / i)
            };
            let best = fits
                .iter()
                .min_by(|a, b| per_flop(a).total_cmp(&per_flop(b)))?;
            let top = per_flop(fastest?);
            Some(Band {
                flop_per_byte: i,
                best_khz: best.khz,
                saving_vs_fastest: if top > 0.0 {
                    1.0 - per_flop(best) / top
                } else {
                    0.0
                },
            })
        })
        .collect();
    Dvfs {
        frequencies: fits,
        scaling,
        optimal,
    }
}

/// y ≈ c_0 + c_1·x with c ≥ 0.
fn nnls2(x: &[f64], y: &[f64]) -> [f64; 2] {
    let n = x.len() as f64;
    let (sx, sxx) = (x.iter().sum::<f64>(), x.iter().map(|v| v * v).sum::<f64>());
    let sy = y.iter().sum::<f64>();
    let sxy = x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    let s = solve_nonneg(&vec![vec![n, sx], vec![sx, sxx]], &[sy, sxy], &[0.0, 0.0]);
    [s[0], s[1]]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roofline::{Constants, fit::FitReport};

    fn at(khz: u64, c: Constants) -> FrequencyFit {
        let report = FitReport::exact(11);
        FrequencyFit {
            khz,
            summary: Summary::new(1, c, report),
        }
    }

    /// A machine following the assumed form: flops cost 100 pJ + 50 pJ·f², bytes 500 pJ,
    /// π_0 = 5 + 2·f W; flops take 1/(8·f GHz) ns, bytes 0.1 ns whatever the clock.
    fn machine(ghz: f64) -> Constants {
        Constants {
            const_w: 5.0 + 2.0 * ghz,
            j_per_flop: 100e-12 + 50e-12 * ghz * ghz,
            j_per_byte: 500e-12,
            s_per_flop: 1e-9 / (8.0 * ghz),
            s_per_byte: 0.1e-9,
        }
    }

    #[test]
    fn fits_the_scaling_and_slows_down_memory_bound_codes() {
        let fits: Vec<FrequencyFit> = [1_000_000, 1_500_000, 2_000_000, 3_000_000]
            .iter()
            .map(|&khz| at(khz, machine(khz as f64 / 1e6)))
            .collect();
        let d = analyze(fits);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1e-12);
        assert!(close(d.scaling.flop[0], 100e-12) && close(d.scaling.flop[1], 50e-12));
        assert!(close(d.scaling.const_w[0], 5.0) && close(d.scaling.const_w[1], 2.0));
        assert!(d.scaling.byte[1] < 1e-15, "{:?}", d.scaling);
        let band = |i: f64| {
            *d.optimal
                .iter()
                .find(|b| b.flop_per_byte == i)
                .expect("band")
        };
        // Memory-bound: time does not shrink with f, so the slowest clock wins.
        assert_eq!(band(0.0625).best_khz, 1_000_000);
        assert!(band(0.0625).saving_vs_fastest > 0.0);
        // Compute-bound: racing shortens π_0·T; check against brute force.
        let hi = band(64.0);
        let e = |g: f64| {
            let c = machine(g);
            c.j_per_flop + c.j_per_byte / 64.0 + c.const_w * c.s_per_flop.max(c.s_per_byte / 64.0)
        };
        let brute = [1.0, 1.5, 2.0, 3.0]
            .into_iter()
            .min_by(|a, b| e(*a).total_cmp(&e(*b)))
            .expect("min");
        assert_eq!(hi.best_khz, (brute * 1e6) as u64);
    }
}
