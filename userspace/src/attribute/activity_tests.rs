//! Activity (cycles) weights against the simulator's DVFS scenario: four processes at
//! different clocks, power ∝ frequency. Time weights charge them equally per busy ns;
//! cycles weights follow the power.

use super::tests::{assert_conserved, class_errors, sim_input};
use super::*;
use crate::testing::scenarios::dvfs_classes;
use crate::testing::sim::{SimOutput, simulate};

fn worst_error(out: &SimOutput, activity: Option<&ActivityWeights>, model: PowerModel) -> f64 {
    let inp = Input {
        activity,
        ..sim_input(out)
    };
    let opts = Options {
        static_w: Some(6.0),
        power_model: model,
        ..Options::default()
    };
    let attr = attribute(&inp, &opts);
    assert_conserved(&attr);
    class_errors(out, &attr)
        .iter()
        .map(|(_, e)| e.abs())
        .fold(0.0, f64::max)
}

#[test]
fn cycles_weights_follow_dvfs_where_time_weights_cannot() {
    for seed in 1..=2 {
        let out = simulate(&dvfs_classes(seed));
        let weights = ActivityWeights::from_timeline(&out.timeline).expect("cycles counted");
        assert!(weights.coverage > 0.95, "coverage {}", weights.coverage);
        let time = worst_error(&out, None, PowerModel::Time);
        let cycles = worst_error(&out, Some(&weights), PowerModel::Time);
        assert!(
            time > 0.20,
            "seed {seed}: time weights worst {:.1}%",
            time * 100.0
        );
        assert!(
            cycles < 0.05,
            "seed {seed}: cycles weights worst {:.1}%",
            cycles * 100.0
        );
        // The regression on top of cycles must not count the clock difference twice.
        let both = worst_error(&out, Some(&weights), PowerModel::Auto);
        assert!(
            both < 0.05,
            "seed {seed}: cycles + auto worst {:.1}%",
            both * 100.0
        );
    }
}

#[test]
fn without_counts_the_split_is_by_time_exactly() {
    let mut cfg = dvfs_classes(3);
    for c in &mut cfg.classes {
        c.ghz = 0.0;
    }
    let out = simulate(&cfg);
    assert!(ActivityWeights::from_timeline(&out.timeline).is_none());
    assert!(out.switches.iter().all(|s| s.activity.is_none()));
}
