//! Any bytes as a grid-intensity answer (`carbon-intensity/latest` and `/history` of the
//! Electricity Maps shape) or a `--carbon-series` file: decoding errors or yields plausible
//! intensities at parsable times, bounded in number, and a series answers every query with
//! a value among its points' range; never panics.
#![no_main]

use energy_bpf::carbon::{live, series};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let plausible = |g: f64| g.is_finite() && (0.0..5000.0).contains(&g);
    if let Ok((_, g)) = live::decode_latest(data) {
        assert!(plausible(g));
    }
    if let Ok(points) = live::decode_history(data) {
        assert!(!points.is_empty() && points.len() <= series::MAX_POINTS);
        assert!(points.iter().all(|p| plausible(p.1)));
    }
    if let Ok(s) = series::Series::decode(data) {
        let points = s.points();
        assert!(!points.is_empty() && points.len() <= series::MAX_POINTS);
        assert!(points.windows(2).all(|w| w[0].0 < w[1].0));
        let (lo, hi) = points.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
            (lo.min(p.1), hi.max(p.1))
        });
        let t0 = points[0].0;
        for (a, b) in [
            (t0, t0.saturating_add(1)),
            (t0.saturating_sub(1 << 40), t0.saturating_add(1 << 40)),
            (0, u64::MAX),
            (u64::MAX, u64::MAX),
        ] {
            if let Some(g) = s.over(a, b) {
                assert!(g >= lo - 1e-6 * hi.abs().max(1.0) && g <= hi + 1e-6 * hi.abs().max(1.0));
            }
        }
    }
});
