//! Never-idle machines (issue 22) against the simulator: a 10 ms duty cycle beside a pinned
//! spinner (static power from rows as short as the counter resolves), and three
//! always-runnable classes on 2 CPUs with a calibrated static power.

use super::scenarios::{duty_cycle_beside_spinner, three_always_runnable};
use super::sim::{SimOutput, simulate};
use super::tests::{assert_conserved, class_errors, input};
use super::*;

fn attribute_sim(out: &SimOutput, opts: &Options) -> Attribution {
    let inp = Input {
        threads: &out.threads,
        ..input(
            &out.timeline,
            &out.samples,
            &out.sources,
            &out.readings,
            &out.cpus,
        )
    };
    let attr = attribute(&inp, opts);
    assert_conserved(&attr);
    attr
}

#[test]
fn explore() {
    for period in [1_000_000u64, 3_000_000] {
        for seed in 1..=10 {
            let out = simulate(&duty_cycle_beside_spinner(seed, period));
            let attr = attribute_sim(&out, &Options::default());
            let s = &attr.sources[0];
            eprintln!(
                "duty U={period} seed {seed}: static {:.2} {:?} errs {:?}",
                s.static_w,
                s.static_origin.kind(),
                class_errors(&out, &attr)
            );
        }
    }
    for seed in 1..=10 {
        let out = simulate(&three_always_runnable(seed));
        let opts = Options {
            calibrated: [(
                "sim:sim package-0".to_string(),
                Calibrated {
                    watts: 6.2,
                    date: "x".into(),
                    file: String::new(),
                },
            )]
            .into(),
            ..Options::default()
        };
        let attr = attribute_sim(&out, &opts);
        let s = &attr.sources[0];
        eprintln!(
            "three seed {seed}: {:?} errs {:?} reg {:?}",
            s.power_model,
            class_errors(&out, &attr),
            s.regression.as_ref().map(|r| r
                .classes
                .iter()
                .map(|c| (c.fit.watts, c.fit.se_w))
                .collect::<Vec<_>>())
        );
    }
}
