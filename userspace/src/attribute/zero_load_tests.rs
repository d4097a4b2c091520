//! Unit tests of the zero-load fit.

use super::*;

fn rows(points: &[(f64, f64)]) -> Vec<PowerRow> {
    points
        .iter()
        .map(|&(busy_cpus, power_w)| PowerRow {
            power_w,
            busy_cpus,
            updates: 0.0,
        })
        .collect()
}

#[test]
fn extrapolates_a_line_and_rejects_outliers() {
    // 6 W + 10 W per busy CPU, busy between 1 and 2 CPUs, two wild rows.
    let mut pts: Vec<(f64, f64)> = (0..100)
        .map(|i| {
            let u = 1.0 + f64::from(i % 21) / 20.0;
            (u, 6.0 + 10.0 * u + if i % 2 == 0 { 0.1 } else { -0.1 })
        })
        .collect();
    pts[5].1 += 40.0;
    pts[50].1 -= 15.0;
    let fit = fit_zero_load(&rows(&pts)).expect("identifiable");
    assert!((fit.intercept_w - 6.0).abs() < 0.1, "{fit:?}");
    assert!((fit.slope_w - 10.0).abs() < 0.1, "{fit:?}");
    assert_eq!(fit.rejected, 2);
    assert!(
        fit.ci_low_w <= 6.0 + 0.1 && fit.ci_high_w >= 6.0 - 0.1,
        "{fit:?}"
    );
}

#[test]
fn a_regular_counters_step_is_not_an_outlier() {
    // 6 W + 10 W per busy CPU, read every 10.24 updates of a regular counter: a row
    // holds 10 updates (power 2.3% low) or, one row in four, 11 (7.4% high), plus a
    // little noise. Every row is kept and the line is the true one; with the step taken
    // as noise the high rows are rejected and the line is that of the low rows (2.3%).
    let updates = 10.24;
    let pts: Vec<PowerRow> = (0..1000)
        .map(|i| {
            let busy_cpus = 1.0 + f64::from(i % 21) / 20.0;
            let held = if i % 4 == 0 { 11.0 } else { 10.0 };
            let noise = 0.05 * f64::from((i * 7919) % 11) / 10.0 - 0.025;
            PowerRow {
                power_w: (6.0 + 10.0 * busy_cpus) * held / updates + noise,
                busy_cpus,
                updates,
            }
        })
        .collect();
    let fit = fit_zero_load(&pts).expect("identifiable");
    assert_eq!(fit.rejected, 0, "{fit:?}");
    assert!((fit.intercept_w - 6.0).abs() < 0.03, "{fit:?}");
    let plain: Vec<PowerRow> = pts
        .iter()
        .map(|r| PowerRow { updates: 0.0, ..*r })
        .collect();
    let fit = fit_zero_load(&plain).expect("identifiable");
    assert!(fit.rejected > 200, "{fit:?}");
    assert!(fit.intercept_w < 5.9, "{fit:?}");
}

#[test]
fn constant_utilisation_is_unidentified() {
    let pts: Vec<(f64, f64)> = (0..100).map(|i| (2.0, 26.0 + f64::from(i % 3))).collect();
    assert_eq!(
        fit_zero_load(&rows(&pts)).map_err(|e| e.0),
        Err(Unidentified::NoSpread)
    );
    let two: Vec<(f64, f64)> = (0..100)
        .map(|i| (if i % 2 == 0 { 1.0 } else { 2.0 }, 20.0))
        .collect();
    assert_eq!(
        fit_zero_load(&rows(&two)).map_err(|e| e.0),
        Err(Unidentified::FewLevels)
    );
    assert_eq!(
        fit_zero_load(&rows(&pts[..5])).map_err(|e| e.0),
        Err(Unidentified::TooFewIntervals)
    );
}

#[test]
fn noisy_far_extrapolation_is_uncertain() {
    // Utilisation between 3.8 and 4 CPUs with ±3 W noise: the intercept is a guess.
    let pts: Vec<(f64, f64)> = (0..60)
        .map(|i| {
            let u = 3.8 + f64::from(i % 5) * 0.05;
            (
                u,
                6.0 + 10.0 * u + 3.0 * ((i * 7919) % 13) as f64 / 6.0 - 3.0,
            )
        })
        .collect();
    assert_eq!(
        fit_zero_load(&rows(&pts)).map_err(|e| e.0),
        Err(Unidentified::Uncertain)
    );
}

#[test]
fn merged_rows_span_the_row_length() {
    let iv = |s: u64, e: u64, uj: f64| Interval {
        start_ns: s,
        end_ns: e,
        energy_uj: uj,
        gpu_util_ns: Vec::new(),
        pieces: 1,
    };
    // 10 ms intervals at 10 W (1e5 µJ each), rows of 50 ms.
    let ivs: Vec<Interval> = (0..10)
        .map(|i| iv(i * 10_000_000, (i + 1) * 10_000_000, 1e5))
        .collect();
    let occs = vec![Occupancy::default(); 10];
    let r = merge_rows(&ivs, &occs, 50_000_000);
    assert_eq!(r.len(), 2);
    assert!((r[0].power_w - 10.0).abs() < 1e-9, "{r:?}");
}
