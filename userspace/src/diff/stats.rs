//! The test behind every `significant` of `energy-bpf diff`: a Welch interval for the
//! difference of two means, each side's variance taken from its runs.
//!
//! Per side, each run r gives a value y_r (J per run, per second or per unit) and the
//! sampling variance v_r of that value within the run (the per-sample weights, ALEA
//! ALEA; zero for whole processes, whose energy carries no sampling error). The variance of
//! the side's mean is
//! - with n ≥ 2 runs: max(s²/n, Σv_r/n²), s² the run-to-run sample variance (which already
//!   holds the sampling noise; the max keeps a lucky small s² from hiding it), with n − 1
//!   degrees of freedom;
//! - with one run: v_1, with infinite degrees of freedom (sampling noise only; run-to-run
//!   variation is unknown and every output says so).
//!
//! The difference's interval is Δ ± t(0.975, ν)·√(V_base + V_new), ν by Welch–Satterthwaite.
//! Pure functions, no I/O.

/// A side's mean and the variance of that mean.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Mean {
    /// Runs.
    pub n: usize,
    /// Mean over the runs.
    pub mean: f64,
    /// Variance of the mean.
    pub var: f64,
    /// Degrees of freedom of `var` (`f64::INFINITY` when it is sampling variance only).
    pub df: f64,
}

/// The mean of `values` (one per run) with the variance of that mean; `sampling[r]` is the
/// within-run variance of `values[r]`.
pub fn mean(values: &[f64], sampling: &[f64]) -> Mean {
    let n = values.len();
    if n == 0 {
        return Mean::default();
    }
    let nf = n as f64;
    let mean = values.iter().sum::<f64>() / nf;
    let within = sampling.iter().sum::<f64>() / (nf * nf);
    if n == 1 {
        return Mean {
            n,
            mean,
            var: within,
            df: f64::INFINITY,
        };
    }
    let s2 = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (nf - 1.0);
    Mean {
        n,
        mean,
        var: (s2 / nf).max(within),
        df: nf - 1.0,
    }
}

/// The difference `new − base` with its 95% interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Delta {
    /// new − base.
    pub delta: f64,
    /// 95% interval of `delta`.
    pub ci95: [f64; 2],
    /// Welch–Satterthwaite degrees of freedom (infinite: sampling variance only).
    pub df: f64,
    /// The interval excludes zero.
    pub significant: bool,
}

/// Welch's interval for `new.mean − base.mean`. With no variance at all (one run a side of
/// whole processes) nothing can be tested: the interval is the point and `significant` is
/// false.
pub fn welch(base: &Mean, new: &Mean) -> Delta {
    let delta = new.mean - base.mean;
    let var = base.var + new.var;
    if var <= 0.0 || !var.is_finite() {
        return Delta {
            delta,
            ci95: [delta, delta],
            df: f64::INFINITY,
            significant: false,
        };
    }
    let term = |m: &Mean| {
        if m.df.is_finite() && m.df > 0.0 {
            m.var * m.var / m.df
        } else {
            0.0
        }
    };
    let denom = term(base) + term(new);
    let df = if denom > 0.0 {
        var * var / denom
    } else {
        f64::INFINITY
    };
    let half = t975(df) * var.sqrt();
    let ci95 = [delta - half, delta + half];
    Delta {
        delta,
        ci95,
        df,
        significant: ci95[0] > 0.0 || ci95[1] < 0.0,
    }
}

/// z for a two-sided 95% interval.
pub const Z95: f64 = crate::attribute::ci::Z95;

/// The 97.5% quantile of Student's t with `df` degrees of freedom (z at infinity), by
/// bisection on the distribution function.
fn t975(df: f64) -> f64 {
    if !df.is_finite() || df > 1e7 {
        return Z95;
    }
    let df = df.max(1.0);
    let (mut lo, mut hi) = (Z95, 20.0);
    // t(0.975, 1) = 12.71; the bracket holds from df = 1 on.
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < 0.975 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Student's t distribution function at `t ≥ 0`.
fn t_cdf(t: f64, df: f64) -> f64 {
    let x = df / (df + t * t);
    1.0 - 0.5 * beta_inc(0.5 * df, 0.5, x)
}

/// Regularized incomplete beta I_x(a, b), continued fraction (Lentz), as in Numerical
/// Recipes §6.4.
fn beta_inc(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    for m in 1..300 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        if d.abs() < TINY {
            d = TINY;
        }
        c = 1.0 + aa / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-14 {
            break;
        }
    }
    h
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_quantiles_match_tables() {
        // Student's t, 97.5%: 1 -> 12.706, 2 -> 4.303, 5 -> 2.571, 10 -> 2.228, 30 -> 2.042.
        for (df, want) in [
            (1.0, 12.706),
            (2.0, 4.303),
            (5.0, 2.571),
            (10.0, 2.228),
            (30.0, 2.042),
        ] {
            let got = t975(df);
            assert!((got - want).abs() < 2e-3, "df {df}: {got} vs {want}");
        }
        assert_eq!(t975(f64::INFINITY), Z95);
    }

    #[test]
    fn welch_matches_a_worked_example() {
        // Two samples (R: t.test(c(12,13,14,15,16), c(10,11,12,13))): diff 2.5,
        // se = sqrt(1.6667/4 + 2.5/5), df = 6.98, t(0.975, 6.98) = 2.366,
        // 95% CI of new - base (0.234, 4.766).
        let base = mean(&[10.0, 11.0, 12.0, 13.0], &[0.0; 4]);
        let new = mean(&[12.0, 13.0, 14.0, 15.0, 16.0], &[0.0; 5]);
        let d = welch(&base, &new);
        assert!((d.delta - 2.5).abs() < 1e-12);
        assert!((d.df - 6.98).abs() < 0.01, "{}", d.df);
        assert!((d.ci95[0] - 0.234).abs() < 0.01, "{:?}", d.ci95);
        assert!((d.ci95[1] - 4.766).abs() < 0.01, "{:?}", d.ci95);
        assert!(d.significant);
    }

    #[test]
    fn one_run_uses_sampling_variance_and_none_tests_nothing() {
        let base = mean(&[10.0], &[1.0]);
        let new = mean(&[13.0], &[1.0]);
        let d = welch(&base, &new);
        assert!(d.df.is_infinite());
        let half = Z95 * 2f64.sqrt();
        assert!((d.ci95[0] - (3.0 - half)).abs() < 1e-9);
        assert!(d.significant);
        let d = welch(&mean(&[10.0], &[0.0]), &mean(&[13.0], &[0.0]));
        assert!(!d.significant, "no variance: nothing to test");
        assert_eq!(d.ci95, [3.0, 3.0]);
        // Runs that agree closely still carry their sampling noise.
        let m = mean(&[5.0, 5.0], &[2.0, 2.0]);
        assert!((m.var - 1.0).abs() < 1e-12);
    }
}
