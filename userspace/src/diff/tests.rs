//! Tests of the diff on hand-made runs and on the attribution simulator (A/A pairs: the
//! false-positive rate of `significant`).

use super::*;
use crate::record::Recording;
use crate::testing::sim::{SimClass, SimConfig, simulate};

fn run(total: f64, secs: f64, rows: &[(&str, f64, f64)]) -> side::Run {
    side::Run {
        duration_s: secs,
        total_j: total,
        idle_j: 0.0,
        rows: rows
            .iter()
            .map(|&(n, j, v)| (n.to_string(), (j, v)))
            .collect(),
        stacks: Default::default(),
    }
}

fn side_of(runs: Vec<side::Run>) -> Side {
    Side {
        facts: side::Facts {
            hostnames: vec!["box".into()],
            source: "model".into(),
            estimated: true,
            sample_hz: vec![999],
            ..Default::default()
        },
        runs,
    }
}

#[test]
fn a_real_change_is_significant_and_noise_is_not() {
    let base = side_of(vec![
        run(10.0, 1.0, &[("hot", 4.0, 0.0), ("cold", 2.0, 0.0)]),
        run(10.2, 1.0, &[("hot", 4.1, 0.0), ("cold", 2.1, 0.0)]),
        run(9.9, 1.0, &[("hot", 3.9, 0.0), ("cold", 1.9, 0.0)]),
    ]);
    let new = side_of(vec![
        run(11.0, 1.0, &[("hot", 5.0, 0.0), ("cold", 2.0, 0.0)]),
        run(11.1, 1.0, &[("hot", 5.1, 0.0), ("cold", 2.1, 0.0)]),
        run(10.9, 1.0, &[("hot", 4.9, 0.0), ("cold", 1.95, 0.0)]),
    ]);
    let d = compare(&base, &new, By::Function, Per::Run);
    assert_eq!(d.rows[0].name, "hot", "largest |delta| first");
    let hot = &d.rows[0];
    assert!((hot.delta_j - 1.0).abs() < 1e-9);
    assert!((hot.delta_pct.expect("pct") - 25.0).abs() < 1e-6);
    assert!(hot.significant && hot.ci95[0] > 0.0, "{hot:?}");
    let cold = &d.rows[1];
    assert!(!cold.significant, "{cold:?}");
    assert!(cold.ci95[0] < 0.0 && cold.ci95[1] > 0.0);
    assert!(d.total.significant && d.total.delta_j > 0.0);
    assert!((hot.share - 5.0 / 11.0).abs() < 1e-9);
    assert!(d.mismatch.is_empty());
    assert_eq!(d.unit, "J/run");
}

#[test]
fn per_second_and_per_unit_normalise_each_run() {
    let base = side_of(vec![run(10.0, 2.0, &[("a", 4.0, 0.0)])]);
    let new = side_of(vec![run(10.0, 1.0, &[("a", 4.0, 0.0)])]);
    let d = compare(&base, &new, By::Function, Per::Second);
    assert_eq!(d.unit, "W");
    assert!((d.rows[0].base_j - 2.0).abs() < 1e-12 && (d.rows[0].new_j - 4.0).abs() < 1e-12);
    let d = compare(
        &base,
        &new,
        By::Function,
        Per::Unit {
            base: 4.0,
            new: 8.0,
        },
    );
    assert!((d.rows[0].base_j - 1.0).abs() < 1e-12 && (d.rows[0].new_j - 0.5).abs() < 1e-12);
    assert!(
        d.method.contains("one run"),
        "single runs are called out: {}",
        d.method
    );
    // No variance at all (whole processes, one run each): nothing is called significant.
    assert!(!d.rows[0].significant);
}

#[test]
fn mismatched_sides_are_named() {
    let base = side_of(vec![run(1.0, 1.0, &[])]);
    let mut new = side_of(vec![run(1.0, 1.0, &[])]);
    new.facts.hostnames = vec!["other".into()];
    new.facts.estimated = false;
    new.facts.source = "powercap".into();
    let d = compare(&base, &new, By::Process, Per::Run);
    let text = d.mismatch.join("\n");
    assert!(text.contains("different machines"), "{text}");
    assert!(
        text.contains("estimated (modelled)") && text.contains("measured"),
        "{text}"
    );
}

#[test]
fn gate_fails_only_on_a_significant_rise_above_the_limit() {
    let base = side_of(vec![
        run(10.0, 1.0, &[("hot", 4.0, 0.0)]),
        run(10.1, 1.0, &[("hot", 4.1, 0.0)]),
        run(9.9, 1.0, &[("hot", 3.9, 0.0)]),
    ]);
    let new = side_of(vec![
        run(11.0, 1.0, &[("hot", 5.0, 0.0)]),
        run(11.1, 1.0, &[("hot", 5.1, 0.0)]),
        run(10.9, 1.0, &[("hot", 4.9, 0.0)]),
    ]);
    let d = compare(&base, &new, By::Function, Per::Run);
    let v = gate::check(&d, &gate::Scope::Total, 5.0).expect("gate");
    assert!(v.failed, "{}", v.line);
    assert!(
        v.line.contains("FAIL") && v.line.contains("total"),
        "{}",
        v.line
    );
    let v = gate::check(&d, &gate::Scope::Total, 15.0).expect("gate");
    assert!(!v.failed, "10% rise under a 15% limit: {}", v.line);
    let v = gate::check(&d, &gate::Scope::Row("hot".into()), 20.0).expect("gate");
    assert!(v.failed, "hot rose 25%: {}", v.line);
    let err = gate::check(&d, &gate::Scope::Row("nope".into()), 5.0).expect_err("no row");
    assert!(err.to_string().contains("nope"), "{err}");
    // A drop never fails.
    let d = compare(&new, &base, By::Function, Per::Run);
    assert!(
        !gate::check(&d, &gate::Scope::Total, 0.0)
            .expect("gate")
            .failed
    );
}

#[test]
fn collapsed_has_both_columns_and_svg_both_colours() {
    let mut b = run(10.0, 1.0, &[("hot", 4.0, 0.0), ("cold", 4.0, 0.0)]);
    b.stacks = [("prog;main;hot", 4.0), ("prog;main;cold", 4.0)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let mut b2 = b.clone();
    b2.rows.insert("hot".into(), (4.1, 0.0));
    b2.rows.insert("cold".into(), (4.1, 0.0));
    let mut n = run(10.0, 1.0, &[("hot", 6.0, 0.0), ("cold", 2.0, 0.0)]);
    n.stacks = [("prog;main;hot", 6.0), ("prog;main;cold", 2.0)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let mut n2 = n.clone();
    n2.rows.insert("hot".into(), (6.1, 0.0));
    n2.rows.insert("cold".into(), (2.1, 0.0));
    let (base, new) = (side_of(vec![b, b2]), side_of(vec![n, n2]));
    let d = compare(&base, &new, By::Function, Per::Run);
    let mut out = Vec::new();
    flame::collapsed(
        &flame::mean_stacks(&base, Per::Run, false),
        &flame::mean_stacks(&new, Per::Run, true),
        &mut out,
    )
    .expect("collapsed");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains("prog;main;hot 4000000 6000000"), "{text}");
    assert!(text.contains("prog;main;cold 4000000 2000000"), "{text}");
    let mut svg = Vec::new();
    flame::svg(
        &d,
        &flame::mean_stacks(&new, Per::Run, true),
        Some(800),
        &mut svg,
    )
    .expect("svg");
    let svg = String::from_utf8(svg).expect("utf-8");
    let hot = flame::colour(d.rows.iter().find(|r| r.name == "hot").expect("hot"));
    let cold = flame::colour(d.rows.iter().find(|r| r.name == "cold").expect("cold"));
    assert_eq!((hot.r, hot.b > 200), (255, false), "red: {hot:?}");
    assert_eq!((cold.b, cold.r > 200), (255, false), "blue: {cold:?}");
    for c in [hot, cold] {
        let fill = format!("rgb({},{},{})", c.r, c.g, c.b);
        assert!(svg.contains(&fill), "{fill} in the svg");
    }
    assert!(svg.contains("delta +2.0"), "tooltip has the delta");
    assert!(svg.contains("95% CI"), "tooltip has the interval");
}

/// A simulated recording: three processes of four functions each, phases of varying
/// load, RAPL-like counter noise.
fn sim_recording(seed: u64, phase_ns: u64) -> Recording {
    let class = |name: &str, tgid: u32, watts: f64, functions: Vec<f64>| SimClass {
        name: name.into(),
        tgid,
        threads: 2,
        watts,
        weight: 1.0,
        mean_run_ns: 3_000_000,
        functions,
        cpus: Vec::new(),
        ghz: 0.0,
    };
    let cfg = SimConfig {
        seed,
        cpus_per_package: 2,
        duration_ns: 2_000_000_000,
        sample_hz: 499,
        phase_ns,
        classes: vec![
            class("alpha", 10, 8.0, vec![4.0, 2.0, 1.0, 1.0]),
            class("beta", 20, 5.0, vec![3.0, 3.0, 1.0, 1.0]),
            class("gamma", 30, 3.0, vec![2.0, 1.0, 1.0, 0.5]),
        ],
        ..SimConfig::default()
    };
    simulate(&cfg).into_recording(cfg.duration_ns, cfg.sample_hz)
}

fn sim_side(seeds: std::ops::Range<u64>, phase_ns: u64) -> Side {
    let inputs = seeds
        .map(|seed| {
            let rec = sim_recording(seed, phase_ns);
            let cfg = crate::analysis::config(
                &rec,
                crate::attribute::Options::default(),
                &Default::default(),
            );
            Input {
                label: format!("seed {seed}"),
                rec,
                cfg,
            }
        })
        .collect();
    side(inputs, By::Function, false)
}

/// A/A: both sides are runs of the same workload (other seeds). Over 24 pairs of 4 runs a
/// side, at most 5% of the rows holding >= 1% of the energy may be called significant.
#[test]
fn aa_pairs_in_the_simulator_keep_false_positives_at_most_five_percent() {
    let (mut tested, mut positives) = (0, 0);
    for pair in 0..24u64 {
        // Load phases (every 0.5 s each class's weight is rescaled by U(0.2, 1.8)): runs
        // differ far more than their sampling noise says.
        let base = sim_side(1000 + pair * 8..1000 + pair * 8 + 4, 500_000_000);
        let new = sim_side(1004 + pair * 8..1004 + pair * 8 + 4, 500_000_000);
        let d = compare(&base, &new, By::Function, Per::Run);
        for r in d.rows.iter().filter(|r| r.share.max(r.base_share) >= 0.01) {
            tested += 1;
            positives += usize::from(r.significant);
        }
    }
    let rate = positives as f64 / tested as f64;
    eprintln!(
        "A/A: {positives} of {tested} rows significant ({:.1}%)",
        100.0 * rate
    );
    assert!(tested >= 200, "{tested} rows tested");
    assert!(rate <= 0.05, "false-positive rate {:.1}%", 100.0 * rate);
}
