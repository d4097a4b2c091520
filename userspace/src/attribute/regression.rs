//! Per-class power by regression (StarPU least squares, Risse et al.).
//!
//! Rows are measurement intervals (merged to ≥ ~50 ms, StarPU least squares' minimum delay), columns the
//! on-CPU seconds of each class (top-N processes by occupancy plus "other"), the target the
//! dynamic energy `ΔE − P_static·Δt`. We solve `y ≈ Σ_k P_k T_k` for `P_k ≥ 0` by bounded
//! least squares with ridge toward the equal-power prior, on columns standardised to unit
//! RMS and with no free intercept: the StarPU least-squares digest measured ~127% error with an
//! intercept and a 40× difference between ms and s units for unstandardised ridge. Classes
//! that cannot be told apart are flagged: < 1% occupancy or an ill-conditioned system keeps the
//! prior; classes that always co-run share one fitted power (equal within the group, as the
//! prior assumes). The fitted watts only weight the split, so conservation still holds.

use super::linalg::{Matrix, invert, solve_nonneg, sym_eigenvalues};

/// One regression row.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Row start and end, ns.
    pub start_ns: u64,
    /// Row end, ns.
    pub end_ns: u64,
    /// On-CPU seconds per class.
    pub t_s: Vec<f64>,
    /// Dynamic energy, J.
    pub y_j: f64,
}

/// Why a class fell back to the prior.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NotIdentifiable {
    /// Under the minimum share of busy time (StarPU least squares reports only states ≥ 1%).
    LowOccupancy,
    /// Its time moves with other classes' (always co-runs): variance inflation too high.
    Collinear,
    /// The system as a whole is too ill-conditioned to trust.
    IllConditioned,
}

/// Tuning of the fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FitOptions {
    /// Standard deviation of the equal-power prior, as a share of the prior's watts. The
    /// ridge is this prior: its strength is the residual variance over this variance, so
    /// it only holds a class near equal power where the rows cannot tell. (A ridge fixed
    /// relative to the row count pulled 5, 10 and 15 W classes that always share the CPUs
    /// to 7.7, 8.9 and 13.1 W: their shares vary little between rows, so a fixed ridge
    /// outweighed the data there, and the reported error did not include that bias.)
    pub prior_sd: f64,
    /// Minimum share of busy time for a class to be fitted.
    pub min_occupancy: f64,
    /// Maximum variance inflation factor of a fitted class.
    pub max_vif: f64,
    /// Maximum condition number of the standardised Gram matrix.
    pub max_condition: f64,
}

impl Default for FitOptions {
    fn default() -> Self {
        Self {
            prior_sd: 1.0,
            min_occupancy: 0.01,
            max_vif: 1e4,
            max_condition: 1e8,
        }
    }
}

/// The fit of one class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassFit {
    /// Power while on CPU, W.
    pub watts: f64,
    /// Standard error of `watts`, W (0 for a class held at the prior).
    pub se_w: f64,
    /// Share of busy time, 0..1.
    pub occupancy: f64,
    /// Set when the class was held at the prior.
    pub not_identifiable: Option<NotIdentifiable>,
}

/// A fit over a set of rows.
#[derive(Clone, Debug, PartialEq)]
pub struct Fit {
    /// One per class, in column order.
    pub classes: Vec<ClassFit>,
    /// The equal-power prior, W per busy CPU.
    pub prior_w: f64,
    /// Condition number of the standardised Gram matrix of the fitted classes.
    pub condition: f64,
    /// Rows used.
    pub rows: usize,
}

impl Fit {
    /// Predicted dynamic energy of a row, J.
    pub fn predict(&self, row: &Row) -> f64 {
        self.classes
            .iter()
            .zip(&row.t_s)
            .map(|(c, t)| c.watts * t)
            .sum()
    }
}

/// Fits per-class watts over `rows` with `k` classes.
pub fn fit(rows: &[Row], k: usize, opts: &FitOptions) -> Fit {
    let n = rows.len();
    let col_sum: Vec<f64> = (0..k)
        .map(|c| rows.iter().map(|r| r.t_s[c]).sum())
        .collect();
    let busy: f64 = col_sum.iter().sum();
    let y_sum: f64 = rows.iter().map(|r| r.y_j).sum();
    // Equal power per busy CPU-second: the time model, and the ridge's target.
    let prior_w = if busy > 0.0 {
        (y_sum / busy).max(0.0)
    } else {
        0.0
    };
    let mut classes: Vec<ClassFit> = col_sum
        .iter()
        .map(|&s| ClassFit {
            watts: prior_w,
            se_w: 0.0,
            occupancy: if busy > 0.0 { s / busy } else { 0.0 },
            not_identifiable: None,
        })
        .collect();
    for cf in classes.iter_mut() {
        if cf.occupancy < opts.min_occupancy {
            cf.not_identifiable = Some(NotIdentifiable::LowOccupancy);
        }
    }
    // Columns are groups of classes: a class whose time moves with another's is merged into
    // it (only their combined power is identifiable; within the group power is equal, the
    // prior's assumption).
    let mut groups: Vec<Vec<usize>> = (0..k)
        .filter(|&c| classes[c].not_identifiable.is_none())
        .map(|c| vec![c])
        .collect();
    let col = |r: &Row, g: &[usize]| g.iter().map(|&c| r.t_s[c]).sum::<f64>();
    let rms = |g: &[usize]| {
        (rows.iter().map(|r| col(r, g).powi(2)).sum::<f64>() / n.max(1) as f64).sqrt()
    };
    let mut condition = 1.0;
    while groups.len() > 1 {
        let scale: Vec<f64> = groups.iter().map(|g| rms(g)).collect();
        let m = groups.len();
        let gram: Matrix = (0..m)
            .map(|a| {
                (0..m)
                    .map(|b| {
                        rows.iter()
                            .map(|r| col(r, &groups[a]) * col(r, &groups[b]))
                            .sum::<f64>()
                            / (n as f64 * scale[a] * scale[b])
                    })
                    .collect()
            })
            .collect();
        let ev = sym_eigenvalues(&gram);
        condition = match (ev.first(), ev.last()) {
            (Some(&lo), Some(&hi)) if lo > 0.0 => hi / lo,
            _ => f64::INFINITY,
        };
        // A tiny ridge keeps the inverse finite when columns are exactly collinear, so the
        // variance inflation factors still point at the culprits.
        let mut reg = gram.clone();
        for (i, row) in reg.iter_mut().enumerate() {
            row[i] += 1e-9;
        }
        let worst = invert(&reg).and_then(|inv| {
            (0..m)
                .map(|i| (i, inv[i][i]))
                .max_by(|a, b| a.1.total_cmp(&b.1))
        });
        let Some((i, vif)) = worst else { break };
        if vif <= opts.max_vif && vif.is_finite() {
            break;
        }
        let partner = (0..m)
            .filter(|&j| j != i)
            .max_by(|&a, &b| gram[i][a].total_cmp(&gram[i][b]))
            .unwrap_or(0);
        let moved = groups.remove(i);
        let partner = if partner > i { partner - 1 } else { partner };
        groups[partner].extend(moved);
        for &c in &groups[partner] {
            classes[c].not_identifiable = Some(NotIdentifiable::Collinear);
        }
    }
    // One group left (everything merged into it) is a single column: nothing to condition.
    if groups.len() == 1 {
        condition = 1.0;
    }
    if condition > opts.max_condition {
        for &c in groups.iter().flatten() {
            classes[c].not_identifiable = Some(NotIdentifiable::IllConditioned);
        }
        groups.clear();
    }
    let m = groups.len();
    if m == 0 || n <= m {
        return Fit {
            classes,
            prior_w,
            condition,
            rows: n,
        };
    }
    // Classes held at the prior leave their predicted energy out of the target.
    let fixed: Vec<usize> = (0..k)
        .filter(|&c| {
            matches!(
                classes[c].not_identifiable,
                Some(NotIdentifiable::LowOccupancy)
            )
        })
        .collect();
    let y: Vec<f64> = rows
        .iter()
        .map(|r| r.y_j - fixed.iter().map(|&c| prior_w * r.t_s[c]).sum::<f64>())
        .collect();
    let scale: Vec<f64> = groups.iter().map(|g| rms(g)).collect();
    let z = |r: &Row, i: usize| col(r, &groups[i]) / scale[i];
    let ztz: Matrix = (0..m)
        .map(|i| {
            (0..m)
                .map(|j| rows.iter().map(|r| z(r, i) * z(r, j)).sum())
                .collect()
        })
        .collect();
    let beta0: Vec<f64> = scale.iter().map(|s| prior_w * s).collect();
    let zty: Vec<f64> = (0..m)
        .map(|i| rows.iter().zip(&y).map(|(r, yi)| z(r, i) * yi).sum())
        .collect();
    let rss_of = |beta: &[f64]| -> f64 {
        rows.iter()
            .zip(&y)
            .map(|(r, yi)| {
                let pred: f64 = (0..m).map(|i| beta[i] * z(r, i)).sum();
                (yi - pred).powi(2)
            })
            .sum()
    };
    // First the residual variance of a nearly free fit, then the prior at that noise:
    // λ_i = σ² / (τ² · scale_i²) on standardised columns, τ = prior_sd × prior watts.
    let free: Vec<f64> = vec![1e-9 * n as f64; m];
    let (beta, _) = solve_ridge(&ztz, &zty, &beta0, &free);
    let sigma2 = rss_of(&beta) / (n - m) as f64;
    let tau = (opts.prior_sd * prior_w).max(1e-9);
    let lambda: Vec<f64> = scale
        .iter()
        .map(|s| (sigma2 / (tau * tau * s * s)).max(1e-9 * n as f64))
        .collect();
    let (beta, a) = solve_ridge(&ztz, &zty, &beta0, &lambda);
    let sigma2 = rss_of(&beta) / (n - m) as f64;
    // Posterior covariance σ² A⁻¹ (prior included, so a class the prior holds gets the
    // prior's width, not a falsely narrow one).
    let se: Vec<f64> = match invert(&a) {
        Some(ai) => (0..m)
            .map(|i| (sigma2 * ai[i][i]).max(0.0).sqrt())
            .collect(),
        None => vec![f64::INFINITY; m],
    };
    for (i, g) in groups.iter().enumerate() {
        for &c in g {
            classes[c].watts = beta[i] / scale[i];
            classes[c].se_w = se[i] / scale[i];
        }
    }
    Fit {
        classes,
        prior_w,
        condition,
        rows: n,
    }
}

/// Ridge solution of `(ZᵀZ + Λ) β = Zᵀy + Λ β₀` with `β ≥ 0`, and the matrix `ZᵀZ + Λ`:
/// the exact solve where it is non-negative, else coordinate descent under the bound.
fn solve_ridge(ztz: &Matrix, zty: &[f64], beta0: &[f64], lambda: &[f64]) -> (Vec<f64>, Matrix) {
    let mut a = ztz.clone();
    let mut b = zty.to_vec();
    for (i, l) in lambda.iter().enumerate() {
        a[i][i] += l;
        b[i] += l * beta0[i];
    }
    let exact = invert(&a).map(|ai| {
        (0..b.len())
            .map(|i| (0..b.len()).map(|j| ai[i][j] * b[j]).sum::<f64>())
            .collect::<Vec<f64>>()
    });
    let beta = match exact {
        Some(beta) if beta.iter().all(|v| v.is_finite() && *v >= 0.0) => beta,
        _ => solve_nonneg(&a, &b, beta0),
    };
    (beta, a)
}

/// Held-out squared error of the equal-power time model and of the regression, by
/// contiguous folds (rows close in time are correlated; random folds would flatter the fit).
#[cfg(test)]
pub fn heldout_sse(rows: &[Row], k: usize, folds: usize, opts: &FitOptions) -> (f64, f64) {
    let h = heldout(rows, k, folds, opts);
    (h.sse_time, h.sse_regression)
}

/// What held-out rows say about the two models.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Heldout {
    /// Squared error of the time model's predictions, J².
    pub sse_time: f64,
    /// Squared error of the regression's predictions, J².
    pub sse_regression: f64,
    /// The weight `w` on the regression whose blend `time + w·(regression − time)` predicts
    /// the held-out rows best, within 0..1 (stacking): 0 when the regression adds nothing
    /// the time model does not, 1 when it explains all it can.
    pub weight: f64,
}

/// Held-out predictions of the time model and the regression by contiguous folds (rows
/// close in time are correlated; random folds would flatter the fit), with the stacking
/// weight of the regression ([`Heldout::weight`]).
pub fn heldout(rows: &[Row], k: usize, folds: usize, opts: &FitOptions) -> Heldout {
    let n = rows.len();
    let folds = folds.clamp(2, n.max(2));
    let mut h = Heldout::default();
    let (mut num, mut den) = (0.0, 0.0);
    for f in 0..folds {
        let (lo, hi) = (f * n / folds, (f + 1) * n / folds);
        let train: Vec<Row> = rows[..lo].iter().chain(&rows[hi..]).cloned().collect();
        let model = fit(&train, k, opts);
        for r in &rows[lo..hi] {
            let busy: f64 = r.t_s.iter().sum();
            let time = model.prior_w * busy;
            let reg = model.predict(r);
            h.sse_time += (r.y_j - time).powi(2);
            h.sse_regression += (r.y_j - reg).powi(2);
            num += (r.y_j - time) * (reg - time);
            den += (reg - time).powi(2);
        }
    }
    h.weight = if den > 0.0 {
        (num / den).clamp(0.0, 1.0)
    } else {
        0.0
    };
    h
}

/// Per-class watts shrunk toward the equal-power value by how well each is identified: a
/// non-negative garrote on each class's difference from the common value, scaled by
/// `max(0, 1 − z95² / z²)` where `z` is that difference over its standard error. A
/// difference the rows do not show at 95% (|z| ≤ 1.96) is dropped, so equal power stays
/// equal; one at |z| = 4 keeps 76% of itself, one at |z| = 20 keeps 99%. Continuous in the
/// data, unlike a test that keeps or drops the whole fit. (Shrinking by an estimated
/// between-class spread, a normal hierarchical model, kept 2–3 σ differences nearly whole:
/// equal-watt processes on a once-a-second counter came out 6–10% apart.)
pub fn shrunk_watts(fit: &Fit) -> Vec<f64> {
    let z95_sq = super::linalg::Z95 * super::linalg::Z95;
    fit.classes
        .iter()
        .map(|c| {
            if c.not_identifiable.is_some() || !c.se_w.is_finite() {
                return c.watts;
            }
            let d = c.watts - fit.prior_w;
            let keep = if c.se_w > 0.0 {
                let z_sq = (d / c.se_w).powi(2);
                if z_sq > 0.0 {
                    (1.0 - z95_sq / z_sq).max(0.0)
                } else {
                    0.0
                }
            } else {
                1.0
            };
            fit.prior_w + keep * d
        })
        .collect()
}

/// Per-class watts of a fit over part of a recording, shrunk toward `target` (the whole
/// recording's watts) as [`shrunk_watts`] shrinks toward equal power: a window keeps its
/// own difference from the whole only as far as its rows show it (`max(0, 1 − z95² / z²)`),
/// and a class the window cannot fit takes the whole's value.
pub fn shrunk_toward(fit: &Fit, target: &[f64]) -> Vec<f64> {
    let z95_sq = super::linalg::Z95 * super::linalg::Z95;
    fit.classes
        .iter()
        .zip(target)
        .map(|(c, &t)| {
            if c.not_identifiable.is_some() || !(c.se_w.is_finite() && c.se_w > 0.0) {
                return t;
            }
            let d = c.watts - t;
            let z_sq = (d / c.se_w).powi(2);
            let keep = if z_sq > 0.0 {
                (1.0 - z95_sq / z_sq).max(0.0)
            } else {
                0.0
            };
            t + keep * d
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng, rngs::ChaCha8Rng};

    /// Rows for classes with the given watts and random occupancy, 8 CPUs × 50 ms.
    fn rows(watts: &[f64], noise: f64, seed: u64) -> Vec<Row> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..400)
            .map(|i| {
                let t_s: Vec<f64> = watts.iter().map(|_| rng.random_range(0.0..0.1)).collect();
                let y: f64 = t_s.iter().zip(watts).map(|(t, w)| t * w).sum();
                let y_j = y * (1.0 + noise * rng.random_range(-1.0..1.0));
                Row {
                    start_ns: i * 50_000_000,
                    end_ns: (i + 1) * 50_000_000,
                    t_s,
                    y_j,
                }
            })
            .collect()
    }

    #[test]
    fn recovers_known_watts() {
        let watts = [5.0, 10.0, 20.0, 12.0];
        let f = fit(&rows(&watts, 0.01, 1), 4, &FitOptions::default());
        for (c, w) in f.classes.iter().zip(watts) {
            assert!((c.watts - w).abs() / w < 0.02, "{c:?} vs {w}");
            assert!(c.se_w > 0.0 && c.se_w < 0.5, "{c:?}");
            assert_eq!(c.not_identifiable, None);
        }
    }

    #[test]
    fn never_negative_and_flags_low_occupancy() {
        let mut rs = rows(&[5.0, 10.0, 0.0], 0.0, 2);
        for r in &mut rs {
            r.t_s[2] *= 0.001; // a class with ~0.01% of the busy time
        }
        let f = fit(&rs, 3, &FitOptions::default());
        assert_eq!(
            f.classes[2].not_identifiable,
            Some(NotIdentifiable::LowOccupancy)
        );
        assert_eq!(f.classes[2].watts, f.prior_w);
        assert!(f.classes.iter().all(|c| c.watts >= 0.0));
    }

    #[test]
    fn classes_that_always_co_run_fall_back_to_the_prior() {
        let mut rs = rows(&[5.0, 10.0, 20.0], 0.0, 3);
        for r in &mut rs {
            r.t_s[2] = r.t_s[1]; // class 2 runs exactly when class 1 does
            r.y_j = 5.0 * r.t_s[0] + 30.0 * r.t_s[1];
        }
        let f = fit(&rs, 3, &FitOptions::default());
        let flagged = f
            .classes
            .iter()
            .filter(|c| c.not_identifiable == Some(NotIdentifiable::Collinear))
            .count();
        assert_eq!(flagged, 2, "{f:?}");
        // Only their combined power is identifiable: 30 W over twice the time, 15 W each.
        assert!(
            (f.classes[1].watts - 15.0).abs() < 0.1 && (f.classes[2].watts - 15.0).abs() < 0.1,
            "{f:?}"
        );
        assert!((f.classes[0].watts - 5.0).abs() < 0.1, "{f:?}");
    }

    #[test]
    fn heldout_weight_is_whole_for_real_differences_and_small_for_none() {
        let spread = heldout(
            &rows(&[5.0, 10.0, 20.0], 0.01, 4),
            3,
            5,
            &FitOptions::default(),
        );
        assert!(spread.weight > 0.95, "{spread:?}");
        let equal = heldout(&rows(&[10.0; 3], 0.05, 5), 3, 5, &FitOptions::default());
        assert!(equal.weight < 0.5, "{equal:?}");
    }

    #[test]
    fn the_garrote_drops_differences_within_noise_and_keeps_clear_ones() {
        let class = |watts: f64, se_w: f64| ClassFit {
            watts,
            se_w,
            occupancy: 0.3,
            not_identifiable: None,
        };
        let fit = Fit {
            classes: vec![class(10.5, 0.5), class(15.0, 0.25), class(9.0, 0.25)],
            prior_w: 10.0,
            condition: 1.0,
            rows: 100,
        };
        let w = shrunk_watts(&fit);
        assert_eq!(w[0], 10.0, "z = 1: dropped");
        let z95_sq = super::super::linalg::Z95.powi(2);
        assert!(
            (w[1] - (10.0 + 5.0 * (1.0 - z95_sq / 400.0))).abs() < 1e-9,
            "z = 20: 99% kept: {w:?}"
        );
        // z = 4: 1 − 3.84 / 16 of the difference kept.
        let keep = 1.0 - z95_sq / 16.0;
        assert!((w[2] - (10.0 - keep)).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn a_window_keeps_the_whole_recordings_watts_unless_its_rows_show_otherwise() {
        let class = |watts: f64, se_w: f64, not_identifiable| ClassFit {
            watts,
            se_w,
            occupancy: 0.3,
            not_identifiable,
        };
        let window = Fit {
            classes: vec![
                class(6.0, 1.0, None),  // 1 σ from the whole's 5 W: the whole's
                class(20.0, 0.5, None), // 10 σ from 15 W: kept, 96% of it
                class(10.0, 0.0, Some(NotIdentifiable::LowOccupancy)),
            ],
            prior_w: 10.0,
            condition: 1.0,
            rows: 30,
        };
        let w = shrunk_toward(&window, &[5.0, 15.0, 8.0]);
        assert_eq!(w[0], 5.0);
        let keep = 1.0 - super::super::linalg::Z95.powi(2) / 100.0;
        assert!((w[1] - (15.0 + 5.0 * keep)).abs() < 1e-9, "{w:?}");
        assert_eq!(w[2], 8.0, "not fitted in the window: the whole's");
    }

    #[test]
    fn heldout_prefers_regression_only_when_power_differs() {
        let spread = rows(&[5.0, 10.0, 20.0], 0.01, 4);
        let (time, reg) = heldout_sse(&spread, 3, 5, &FitOptions::default());
        assert!(reg < 0.2 * time, "spread: reg {reg} vs time {time}");
        let equal = rows(&[10.0, 10.0, 10.0], 0.01, 5);
        let (time, reg) = heldout_sse(&equal, 3, 5, &FitOptions::default());
        assert!(reg > 0.9 * time, "equal: reg {reg} vs time {time}");
    }
}
