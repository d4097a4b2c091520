//! Static power on busy machines against the simulator (issue: "Joules you can trust on a
//! busy machine"): one CPU always busy, every CPU always busy, with and without calibration.

use super::tests::{attribute_sim, worst};
use super::*;
use crate::testing::scenarios::{
    all_cpus_always_busy, duty_cycle_beside_spinner, duty_cycle_reads_in_step, one_cpu_always_busy,
    smt_siblings,
};
use crate::testing::sim::simulate;

#[test]
fn one_cpu_always_busy_is_right_without_calibration() {
    for seed in 1..=3 {
        let out = simulate(&one_cpu_always_busy(seed));
        let attr = attribute_sim(&out, &Options::default());
        let s = &attr.sources[0];
        assert!(
            matches!(s.static_origin, StaticOrigin::Extrapolated { .. }),
            "{:?}",
            s.static_origin
        );
        assert!((s.static_w - 6.0).abs() < 0.3, "static {} W", s.static_w);
        let e = worst(&out, &attr);
        assert!(e < 0.05, "seed {seed}: worst {:.1}%", e * 100.0);
    }
}

/// A 10 ms duty cycle beside a spinner, read 100 µs after each update of a 1 ms counter:
/// the zero-load fit finds the counter's lag (not half a period) and static power with it.
/// At half a period the rows' load edges are smeared and static comes out up to 10% high
/// (6.02–6.63 W over these seeds).
#[test]
fn a_counter_read_in_step_with_its_updates_has_its_lag_found() {
    for seed in 1..=6 {
        let cfg = duty_cycle_reads_in_step(seed);
        let out = simulate(&cfg);
        let attr = attribute_sim(&out, &Options::default());
        let s = &attr.sources[0];
        let StaticOrigin::Extrapolated { fit } = s.static_origin else {
            panic!("seed {seed}: {:?}", s.static_origin);
        };
        assert!(
            fit.lag_ns <= 250_000,
            "seed {seed}: lag {} ns for reads 100 µs after each update",
            fit.lag_ns
        );
        assert!(
            (s.static_w - 6.0).abs() < 0.03 * 6.0,
            "seed {seed}: static {:.3} W (true 6), lag {} ns",
            s.static_w,
            fit.lag_ns
        );
    }
}

/// Reads at any moment between updates (a timer against RAPL's clock) keep half a period.
#[test]
fn a_counter_read_out_of_step_keeps_half_a_period() {
    for seed in 1..=3 {
        let out = simulate(&duty_cycle_beside_spinner(seed, 1_000_000));
        let attr = attribute_sim(&out, &Options::default());
        let StaticOrigin::Extrapolated { fit } = attr.sources[0].static_origin else {
            panic!("seed {seed}: {:?}", attr.sources[0].static_origin);
        };
        assert!(
            (250_000..=750_000).contains(&fit.lag_ns),
            "seed {seed}: lag {} ns",
            fit.lag_ns
        );
    }
}

#[test]
fn all_cpus_always_busy_is_flagged_without_calibration() {
    let out = simulate(&all_cpus_always_busy(1));
    let attr = attribute_sim(&out, &Options::default());
    let s = &attr.sources[0];
    assert_eq!(
        s.static_origin,
        StaticOrigin::Unidentified {
            reason: Unidentified::NoSpread,
            fit: None
        }
    );
    let warning = s.static_origin.warning().expect("a warning line");
    assert!(warning.contains("energy-bpf calibrate") && warning.contains("--static-power-w"));
    // Separate idle still conserves (checked above); static energy stays in the processes.
    assert_eq!(s.static_w, 0.0);
    let json = serde_json::to_value(&s.static_origin).expect("json");
    assert_eq!(json["kind"], "unidentified");
    assert_eq!(json["reason"], "no_spread");
}

#[test]
fn all_cpus_always_busy_is_right_with_calibration() {
    let out = simulate(&all_cpus_always_busy(2));
    let opts = Options {
        calibrated: [(
            "sim:sim package-0".to_string(),
            Calibrated {
                watts: 6.0,
                date: "2026-05-20T10:00:00Z".into(),
                file: "/var/lib/energy-bpf/calibration.json".into(),
            },
        )]
        .into(),
        ..Options::default()
    };
    let attr = attribute_sim(&out, &opts);
    let s = &attr.sources[0];
    assert_eq!(s.static_origin.kind(), "calibrated");
    let e = worst(&out, &attr);
    assert!(e < 0.05, "worst {:.1}%", e * 100.0);
}

#[test]
fn every_cpu_busy_is_right_with_learned_static_power_and_calibration_wins() {
    let out = simulate(&all_cpus_always_busy(2));
    // What an agent learned on quieter hours of this machine.
    let fit = super::zero_load::fit_zero_load(
        &(0..40)
            .map(|i| super::zero_load::PowerRow {
                busy_cpus: 0.1 * f64::from(i % 20),
                power_w: 6.0 + 10.0 * 0.1 * f64::from(i % 20),
                updates: 0.0,
            })
            .collect::<Vec<_>>(),
    )
    .expect("identified");
    let learned = Learned {
        watts: 6.0,
        intervals: 40,
        span_s: 7200.0,
        fit,
    };
    let key = "sim:sim package-0".to_string();
    let opts = Options {
        learned: [(key.clone(), learned)].into(),
        ..Options::default()
    };
    let attr = attribute_sim(&out, &opts);
    let s = &attr.sources[0];
    assert_eq!(s.static_origin.kind(), "learned");
    assert_eq!(s.static_w, 6.0);
    let e = worst(&out, &attr);
    assert!(e < 0.05, "worst {:.1}%", e * 100.0);
    let lines = attr
        .sources
        .iter()
        .flat_map(super::SourceAttribution::static_notes)
        .collect::<Vec<_>>();
    assert!(
        lines[0].contains("learned from 40 quiet intervals over 2.0 h"),
        "{lines:?}"
    );
    let json = serde_json::to_value(&s.static_origin).expect("json");
    assert_eq!(
        (json["kind"].as_str(), json["intervals"].as_u64()),
        (Some("learned"), Some(40))
    );
    // A calibration wins over what was learned.
    let both = Options {
        calibrated: [(
            key,
            Calibrated {
                watts: 5.5,
                date: "2026-05-20T10:00:00Z".into(),
                file: "calibration.json".into(),
            },
        )]
        .into(),
        ..opts
    };
    let attr = attribute_sim(&out, &both);
    assert_eq!(attr.sources[0].static_origin.kind(), "calibrated");
    assert_eq!(attr.sources[0].static_w, 5.5);
}

#[test]
fn static_power_is_never_above_the_quietest_interval() {
    // Ask for an absurd 100 W: the bound holds and the clamp is reported.
    let out = simulate(&one_cpu_always_busy(4));
    let attr = attribute_sim(
        &out,
        &Options {
            static_w: Some(100.0),
            ..Options::default()
        },
    );
    let s = &attr.sources[0];
    assert!(
        s.static_w <= s.static_bound_w && s.static_bound_w < 30.0,
        "{s:?}"
    );
    assert_eq!(s.static_clamped_from_w, Some(100.0));
}

#[test]
fn smt_siblings_share_their_core() {
    let cfg = smt_siblings(1);
    let out = simulate(&cfg);
    let given = Options {
        static_w: Some(cfg.static_w),
        power_model: PowerModel::Time,
        ..Options::default()
    };
    let attr = attribute_sim(&out, &given);
    let e = worst(&out, &attr);
    assert!(e < 0.05, "per-core first: worst {:.1}%", e * 100.0);
    let flat = attribute_sim(
        &out,
        &Options {
            smt_sibling_extra: 1.0,
            ..given
        },
    );
    let f = worst(&out, &flat);
    assert!(
        f > 0.10,
        "per-CPU time would be off: worst {:.1}%",
        f * 100.0
    );
}
