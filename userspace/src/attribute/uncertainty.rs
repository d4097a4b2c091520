//! How soft a process's absolute joules are: the relative standard error that the fitted
//! per-class watts (regression) and an estimated static power put on each class's energy.
//!
//! PURE. Stack sampling adds no error to whole threads ([`super::ci`]); what does is the
//! model. With the split renormalised to the measured energy, class k's energy is its share
//! `s_k = P_k T_k / Σ_j P_j T_j` of the dynamic energy, so an error in `P_k` moves it by
//! `(1 − s_k)` and an error in another class's `P_j` by `s_j`; with independent class errors
//! `r = se / P`, `var(δE_k / E_k) = (1 − s_k)² r_k² + Σ_{j≠k} s_j² r_j²`. Static power
//! estimated from the recording moves `δS × duration` between the idle row and every
//! process by share (`--idle separate`). Given, calibrated and model static power count as
//! exact: their error is the user's or the calibration's, not this recording's. The
//! estimated model's parameters from the power table carry that table row's error
//! ([`with_model_error`]), which every class of the source shares.

use std::collections::HashMap;

use super::IdlePolicy;
use super::attribution::{ModelDisagreement, PowerModelUsed, SourceAttribution};
use super::static_power::StaticOrigin;

/// Relative standard error of a class's energy on one source.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RelativeError {
    /// Per process of a fitted class.
    pub by_tgid: HashMap<u32, f64>,
    /// Every other thread ("other", unknown time, or no fit).
    pub other: f64,
}

impl RelativeError {
    /// The relative standard error of a process's energy.
    pub fn of(&self, tgid: u32) -> f64 {
        self.by_tgid.get(&tgid).copied().unwrap_or(self.other)
    }
}

/// The relative errors of one source's split. `class_tgid[k]` is the process of fitted
/// class k (the last class, "other", has none).
pub fn relative_error(
    report: &SourceAttribution,
    class_tgid: &[u32],
    idle: IdlePolicy,
) -> RelativeError {
    let duration_s = report
        .intervals
        .iter()
        .map(|iv| (iv.end_ns - iv.start_ns) as f64 * 1e-9)
        .sum::<f64>();
    let dynamic_j = (report.measured_uj - report.idle_uj).max(0.0) * 1e-6;
    // 95% interval of the extrapolation → one standard error.
    let static_sd_w = match (&report.static_origin, idle) {
        (
            StaticOrigin::Extrapolated { fit } | StaticOrigin::Learned { fit, .. },
            IdlePolicy::Separate,
        ) => ((fit.ci_high_w - fit.ci_low_w) / 3.92).max(0.0),
        _ => 0.0,
    };
    let static_rel = if dynamic_j > 0.0 {
        static_sd_w * duration_s / dynamic_j
    } else {
        0.0
    };
    let mut out = RelativeError {
        other: static_rel,
        ..RelativeError::default()
    };
    let Some(reg) = report
        .regression
        .as_ref()
        .filter(|_| report.power_model == PowerModelUsed::Regression)
    else {
        for &t in class_tgid {
            out.by_tgid.insert(t, static_rel);
        }
        return out;
    };
    // The watts that weighted the split (the fit's, shrunk and weighted toward equal
    // power) and the share of their error that reaches it.
    let split_w = |k: usize| {
        reg.split_w
            .get(k)
            .copied()
            .unwrap_or(reg.classes[k].fit.watts)
    };
    let energy: Vec<f64> = reg
        .classes
        .iter()
        .enumerate()
        .map(|(k, c)| (split_w(k) * c.fit.occupancy).max(0.0))
        .collect();
    let total: f64 = energy.iter().sum();
    if total <= 0.0 {
        return out;
    }
    let share: Vec<f64> = energy.iter().map(|e| e / total).collect();
    let rel: Vec<f64> = reg
        .classes
        .iter()
        .enumerate()
        .map(|(k, c)| {
            if split_w(k) > 0.0 {
                reg.regression_weight * c.fit.se_w / split_w(k)
            } else {
                0.0
            }
        })
        .collect();
    let class_var = |k: usize| -> f64 {
        (0..rel.len())
            .map(|j| {
                let s = if j == k { 1.0 - share[j] } else { share[j] };
                (s * rel[j]).powi(2)
            })
            .sum()
    };
    let total_rel = |k: usize| (class_var(k) + static_rel * static_rel).sqrt();
    for (k, &t) in class_tgid.iter().enumerate() {
        out.by_tgid.insert(t, total_rel(k));
    }
    out.other = total_rel(reg.classes.len().saturating_sub(1));
    out
}
/// Where the models leave a process's energy open: the per-process interval widened to
/// cover both models, and, when the same reach at 99% ([`FLAG_Z`]) goes further than
/// [`UNCERTAIN`] from the energy the split gave, the biggest such disagreement. For each
/// fitted class the models are the time split's energy (a point: equal watts) and the
/// regression's energy with its interval; the time split drops out where held-out rows
/// settled the choice for the regression (weight ≥ [`SETTLED`]). A regression whose
/// interval is wide (rows that cannot tell the processes apart, as a counter updated once
/// a second under loads that change faster) leaves the energy open just as two models far
/// apart do. `class_tgid` as for [`relative_error`]. Conservation is untouched: only the
/// intervals move.
pub fn cover_models(
    report: &SourceAttribution,
    class_tgid: &[u32],
    mut rel: RelativeError,
) -> (RelativeError, Option<ModelDisagreement>) {
    let Some(reg) = report.regression.as_ref() else {
        return (rel, None);
    };
    let dynamic_j = (report.measured_uj - report.idle_uj).max(0.0) * 1e-6;
    let n = reg.classes.len();
    let share = |w: &dyn Fn(usize) -> f64| -> Vec<f64> {
        let e: Vec<f64> = (0..n)
            .map(|k| (w(k) * reg.classes[k].fit.occupancy).max(0.0))
            .collect();
        let total: f64 = e.iter().sum();
        e.iter()
            .map(|x| if total > 0.0 { x / total } else { 0.0 })
            .collect()
    };
    let time = share(&|_| 1.0);
    let fitted = share(&|k| reg.classes[k].fit.watts);
    let used = share(&|k| reg.split_w.get(k).copied().unwrap_or(reg.prior_w));
    let settled = reg.regression_weight >= SETTLED;
    let mut worst: Option<(f64, ModelDisagreement)> = None;
    for k in 0..n {
        let c = &reg.classes[k].fit;
        let (t, f, u) = (
            time[k] * dynamic_j,
            fitted[k] * dynamic_j,
            used[k] * dynamic_j,
        );
        if u <= 0.0 || c.not_identifiable.is_some() {
            continue;
        }
        // The regression's own interval: its watts' errors through its shares, added as
        // they are, not in quadrature. Classes the rows tell apart poorly are fitted with
        // errors of opposite sign (one high where another is low), and each moves this
        // share the same way: on a once-a-second counter a 5 W process fitted 2 σ high
        // beside an 8 W one fitted 2.7 σ low was split 27.5% over its energy with a
        // quadrature reach of 24% at 99%. The sum bounds the share's error whatever the
        // fitted errors' correlation.
        let fit_rel: f64 = (0..n)
            .map(|j| {
                let cj = &reg.classes[j].fit;
                let rj = if cj.watts > 0.0 {
                    cj.se_w / cj.watts
                } else {
                    0.0
                };
                let sj = if j == k { 1.0 - fitted[j] } else { fitted[j] };
                sj * rj
            })
            .sum();
        let time_reach = if settled { 0.0 } else { (t - u).abs() };
        let reach_at = |z: f64| ((f - u).abs() + z * fit_rel * f).max(time_reach) / u;
        let reach = reach_at(super::ci::Z95);
        let r = class_tgid.get(k).map_or(rel.other, |&tgid| rel.of(tgid));
        let widened = r.max(reach / super::ci::Z95);
        match class_tgid.get(k) {
            Some(&tgid) => {
                rel.by_tgid.insert(tgid, widened);
            }
            None => rel.other = rel.other.max(widened),
        }
        // The flag promises more than the interval: a process is never further than
        // UNCERTAIN off without it. A 95% reach is exceeded by one fitted class in twenty
        // by construction, and a bench of 30 processes per cell finds that one (a 5 W
        // process fitted 2 σ high on a once-a-second counter, 26.8% off, its 95% reach
        // 24%): the flag judges the 99% reach.
        let flag_reach = reach_at(FLAG_Z);
        if flag_reach <= UNCERTAIN || c.occupancy < UNCERTAIN_MIN_OCCUPANCY {
            continue;
        }
        if worst.as_ref().is_none_or(|(w, _)| flag_reach > *w) {
            let apart_pct = if t.min(f) > 0.0 {
                (t - f).abs() / t.min(f) * 100.0
            } else {
                100.0
            };
            worst = Some((
                flag_reach,
                ModelDisagreement {
                    class: reg.classes[k].label,
                    time_j: t,
                    regression_j: f,
                    regression_ci_j: super::ci::Z95 * fit_rel * f,
                    apart_pct,
                    regression_weight: reg.regression_weight,
                },
            ));
        }
    }
    (rel, worst.map(|(_, d)| d))
}

/// A regression weight at or above which held-out rows settled the choice for it.
pub const SETTLED: f64 = 0.9;
/// How far (relative) the models may leave a process's energy open before the output says
/// the power model is uncertain.
pub const UNCERTAIN: f64 = 0.25;
/// The normal quantile of the reach the flag judges: two-sided 99%.
pub const FLAG_Z: f64 = 2.575_829_303_548_901;
/// Classes below this share of busy time do not raise the flag (their intervals still
/// widen).
pub const UNCERTAIN_MIN_OCCUPANCY: f64 = 0.05;

/// `rel` widened by the estimated model's own error, `model_error_pct`: the median absolute
/// error of the power table's row (energy/power_table.rs). The model's error moves the
/// whole source's energy, so every class carries it, independent of the split's own error
/// (added in quadrature). A median absolute error m of a normal error is 0.6745 σ, so
/// σ = m / 0.6745. 0 (a measured source, a model set by flags, older recordings) leaves
/// `rel` as it is.
pub fn with_model_error(mut rel: RelativeError, model_error_pct: f64) -> RelativeError {
    if !(model_error_pct.is_finite() && model_error_pct > 0.0) {
        return rel;
    }
    let sigma = model_error_pct / 100.0 / 0.6745;
    let widen = |r: f64| (r * r + sigma * sigma).sqrt();
    rel.other = widen(rel.other);
    for r in rel.by_tgid.values_mut() {
        *r = widen(*r);
    }
    rel
}

#[cfg(test)]
mod model_error_tests {
    use super::*;

    #[test]
    fn the_model_error_widens_every_class_in_quadrature() {
        let rel = RelativeError {
            by_tgid: HashMap::from([(7, 0.03)]),
            other: 0.0,
        };
        assert_eq!(with_model_error(rel.clone(), 0.0), rel);
        let wide = with_model_error(rel, 12.0);
        let sigma = 0.12 / 0.6745;
        assert!((wide.other - sigma).abs() < 1e-12, "{wide:?}");
        assert!((wide.of(7) - (0.03f64.powi(2) + sigma * sigma).sqrt()).abs() < 1e-12);
    }
}
