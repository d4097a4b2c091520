//! Whole-pipeline tests: conservation as a property over random inputs (thread, process and
//! stack level), tables for per-package isolation, GPU and estimated sources, and accuracy
//! against the simulator.

use proptest::prelude::*;

use super::*;
use crate::pb::v1::{GpuProcessUsage, SwitchEvent};
use crate::testing::sim::{self, SimClass, SimConfig, simulate};

fn source(id: u32, domain: EnergyDomain, package: u32) -> EnergySource {
    EnergySource {
        id,
        domain: domain as i32,
        package,
        update_period_ns: 1_000,
        ..Default::default()
    }
}

fn reading(source_id: u32, ts_ns: u64, energy_uj: f64) -> EnergyReading {
    EnergyReading {
        source_id,
        ts_ns,
        energy_uj,
        ..Default::default()
    }
}

use crate::testing::sw;

pub(super) fn input<'a>(
    timeline: &'a Timeline,
    samples: &'a [Sample],
    sources: &'a [EnergySource],
    readings: &'a [EnergyReading],
    cpus: &'a [Cpu],
) -> Input<'a> {
    Input {
        timeline,
        samples,
        sources,
        readings,
        cpus,
        threads: &[],
        activity: None,
    }
}

/// The simulator's whole output as attribution input (its threads' names included).
pub(super) fn sim_input(out: &sim::SimOutput) -> Input<'_> {
    Input {
        threads: &out.threads,
        ..input(
            &out.timeline,
            &out.samples,
            &out.sources,
            &out.readings,
            &out.cpus,
        )
    }
}

/// Attributes the simulator's output with `opts`, checking conservation.
pub(super) fn attribute_sim(out: &sim::SimOutput, opts: &Options) -> Attribution {
    let attr = attribute(&sim_input(out), opts);
    assert_conserved(&attr);
    attr
}

/// The largest absolute relative error of any class's joules.
pub(super) fn worst(out: &sim::SimOutput, attr: &Attribution) -> f64 {
    class_errors(out, attr)
        .iter()
        .map(|(_, e)| e.abs())
        .fold(0.0, f64::max)
}

fn rel_eq(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0)
}

/// Checks every conservation law; panics with a message naming the broken one.
pub(super) fn assert_conserved(attr: &Attribution) {
    for s in &attr.sources {
        assert!(
            s.static_w >= 0.0 && s.static_w <= s.static_bound_w * (1.0 + 1e-12),
            "static {} W above the lowest interval power {} W",
            s.static_w,
            s.static_bound_w
        );
        assert!(
            rel_eq(s.measured_uj, s.attributed_uj + s.idle_uj + s.unknown_uj),
            "source {}: {s:?}",
            s.source_id
        );
        for iv in &s.intervals {
            assert!(
                rel_eq(
                    iv.measured_uj,
                    iv.attributed_uj + iv.idle_uj + iv.unknown_uj
                ),
                "interval {iv:?}"
            );
            assert!(
                iv.attributed_uj >= -1e-9 && iv.idle_uj >= 0.0 && iv.unknown_uj >= -1e-9,
                "{iv:?}"
            );
        }
    }
    for d in attribution::DOMAINS {
        let threads: f64 = attr.threads.iter().map(|t| t.energy.get(d)).sum();
        assert!(
            rel_eq(
                threads + attr.idle.get(d) + attr.unknown.get(d),
                attr.measured.get(d)
            ),
            "threads, {d:?}"
        );
        let stacks: f64 = attr.sample_energy.iter().map(|e| e.get(d)).sum::<f64>()
            + attr.threads.iter().map(|t| t.no_stack.get(d)).sum::<f64>();
        assert!(
            rel_eq(stacks, threads),
            "stacks {stacks} vs threads {threads}, {d:?}"
        );
    }
    assert!(
        attr.sample_energy
            .iter()
            .all(|e| e.0.iter().all(|v| *v >= 0.0)),
        "negative sample energy"
    );
}

/// Random switches on 4 CPUs in 2 packages, samples, and readings of a package source per
/// package, a PSYS source and a GPU source, some flagged or going backwards.
fn arb_case() -> impl Strategy<
    Value = (
        Timeline,
        Vec<Sample>,
        Vec<EnergySource>,
        Vec<EnergyReading>,
        Vec<Cpu>,
    ),
> {
    let switches = prop::collection::vec(
        (0u64..1_000_000, 0u32..4, 0u32..6, 0u32..6, any::<bool>()),
        0..120,
    );
    let samples = prop::collection::vec((0u64..1_100_000, 0u32..4, 0u32..6), 0..200);
    let steps = prop::collection::vec((1u64..80_000, 0.0f64..5_000.0, 0u8..20), 1..40);
    (switches, samples, steps.clone(), steps.clone(), steps).prop_map(|(sws, smp, s0, s1, s2)| {
        let events: Vec<SwitchEvent> = sws
            .into_iter()
            .map(|(ts, cpu, tid, next, known)| SwitchEvent {
                next_known: known,
                ..sw(ts, cpu, tid, next)
            })
            .collect();
        let timeline = Timeline::build(0, 1_000_000, &[0, 1, 2, 3], &events);
        let samples = smp
            .into_iter()
            .map(|(ts_ns, cpu, tid)| Sample {
                ts_ns,
                cpu,
                tid,
                tgid: tid,
                ..Default::default()
            })
            .collect();
        let sources = vec![
            source(0, EnergyDomain::Package, 0),
            source(1, EnergyDomain::Package, 1),
            source(2, EnergyDomain::Psys, 0),
            source(3, EnergyDomain::Gpu, 0),
        ];
        let mut readings = Vec::new();
        for (id, steps) in [(0u32, &s0), (1, &s1), (2, &s2), (3, &s0)] {
            let (mut t, mut e) = (0u64, 0.0f64);
            readings.push(reading(id, t, e));
            for &(dt, de, kind) in steps {
                t += dt;
                e += if kind == 0 {
                    -de
                } else if kind == 1 {
                    0.0
                } else {
                    de
                };
                let mut r = reading(id, t, e);
                if kind == 2 {
                    r.flag = "implausible".into();
                }
                if id == 3 {
                    r.gpu_processes = vec![GpuProcessUsage {
                        pid: u32::from(kind % 3) + 1,
                        sm_util: u32::from(kind) * 5,
                        ..Default::default()
                    }];
                }
                readings.push(r);
            }
        }
        let cpus = (0..4)
            .map(|id| Cpu {
                id,
                package: id / 2,
                core: id % 2,
            })
            .collect();
        (timeline, samples, sources, readings, cpus)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn conservation_holds_for_random_inputs(
        (timeline, samples, sources, readings, cpus) in arb_case(),
        proportional in any::<bool>(),
        static_w in prop::option::of(0.0f64..50_000.0),
        model in 0u8..3,
        stack_window_ns in prop_oneof![Just(0u64), Just(100_000u64), Just(10_000_000u64)],
    ) {
        let opts = Options {
            idle: if proportional { IdlePolicy::Proportional } else { IdlePolicy::Separate },
            static_w,
            power_model: [PowerModel::Time, PowerModel::Regression, PowerModel::Auto][model as usize],
            regression_row_ns: 20_000,
            stack_window_ns,
            ..Options::default()
        };
        let attr = attribute(&input(&timeline, &samples, &sources, &readings, &cpus), &opts);
        assert_conserved(&attr);
        prop_assert_eq!(attr.sample_energy.len(), samples.len());
    }
}

#[test]
fn package_energy_stays_on_its_package() {
    // Thread 5 on CPU 0 (package 0), thread 6 on CPU 1 (package 1), both busy throughout.
    let tl = Timeline::build(0, 1000, &[0, 1], &[sw(1000, 0, 5, 0), sw(1000, 1, 6, 0)]);
    let sources = [
        source(0, EnergyDomain::Package, 0),
        source(1, EnergyDomain::Dram, 1),
    ];
    let readings = [
        reading(0, 0, 0.0),
        reading(0, 1000, 700.0),
        reading(1, 0, 0.0),
        reading(1, 1000, 300.0),
    ];
    let cpus = [
        Cpu {
            id: 0,
            package: 0,
            core: 0,
        },
        Cpu {
            id: 1,
            package: 1,
            core: 0,
        },
    ];
    let opts = Options {
        static_w: Some(0.0),
        power_model: PowerModel::Time,
        ..Options::default()
    };
    let opts = Options {
        static_w_by_source: [(1, 0.0)].into(),
        ..opts
    };
    let attr = attribute(&input(&tl, &[], &sources, &readings, &cpus), &opts);
    let t5 = attr.threads.iter().find(|t| t.tid == 5).expect("thread 5");
    let t6 = attr.threads.iter().find(|t| t.tid == 6).expect("thread 6");
    assert_eq!(
        (
            t5.energy.get(EnergyDomain::Package),
            t5.energy.get(EnergyDomain::Dram)
        ),
        (700.0, 0.0)
    );
    assert_eq!(
        (
            t6.energy.get(EnergyDomain::Package),
            t6.energy.get(EnergyDomain::Dram)
        ),
        (0.0, 300.0)
    );
    assert_eq!(
        t5.no_stack.get(EnergyDomain::Package),
        700.0,
        "no samples: all at thread level"
    );
    assert_eq!(
        attr.headline,
        vec![EnergyDomain::Package, EnergyDomain::Dram]
    );
}

#[test]
fn gpu_energy_goes_to_gpu_processes_and_idle() {
    let tl = Timeline::build(0, 1000, &[0], &[]);
    let sources = [source(9, EnergyDomain::Gpu, 0)];
    let mut r1 = reading(9, 1000, 1000.0);
    r1.gpu_processes = vec![
        GpuProcessUsage {
            pid: 40,
            sm_util: 60,
            ..Default::default()
        },
        GpuProcessUsage {
            pid: 41,
            sm_util: 20,
            ..Default::default()
        },
    ];
    let readings = [reading(9, 0, 0.0), r1];
    let opts = Options {
        static_w_by_source: [(9, 200.0)].into(),
        ..Options::default()
    };
    let attr = attribute(&input(&tl, &[], &sources, &readings, &[]), &opts);
    let gpu = |tgid| {
        attr.threads
            .iter()
            .find(|t| t.tgid == tgid)
            .map_or(0.0, |t| t.energy.get(EnergyDomain::Gpu))
    };
    // Static 200 W × 1 µs = 200 µJ to idle; 800 µJ split 3:1.
    assert!(
        (attr.idle.get(EnergyDomain::Gpu) - 200.0).abs() < 1e-9,
        "{:?}",
        attr.sources
    );
    assert!((gpu(40) - 600.0).abs() < 1e-9 && (gpu(41) - 200.0).abs() < 1e-9);
}

#[test]
fn estimated_sources_never_use_regression() {
    let out = simulate(&spread_config(3));
    let mut sources = out.sources.clone();
    for s in &mut sources {
        s.estimated = true;
        s.model_idle_w = 7.0;
    }
    let inp = Input {
        threads: &out.threads,
        ..input(
            &out.timeline,
            &out.samples,
            &sources,
            &out.readings,
            &out.cpus,
        )
    };
    let opts = Options {
        power_model: PowerModel::Regression,
        ..Options::default()
    };
    let attr = attribute(&inp, &opts);
    let s = &attr.sources[0];
    assert_eq!(s.power_model, PowerModelUsed::Time);
    assert!(
        s.power_model_note
            .as_deref()
            .is_some_and(|n| n.contains("estimated"))
    );
    assert_eq!((s.static_w, &s.static_origin), (7.0, &StaticOrigin::Model));
    assert!(attr.estimated);
}

pub(super) fn class(name: &str, tgid: u32, watts: f64, weight: f64, mean_run_ns: u64) -> SimClass {
    SimClass {
        name: name.into(),
        tgid,
        threads: 4,
        watts,
        weight,
        mean_run_ns,
        functions: vec![2.0, 1.0],
        cpus: Vec::new(),
        ghz: 0.0,
    }
}

fn spread_config(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        duration_ns: 20_000_000_000,
        classes: vec![
            class("avx", 1, 24.0, 1.0, 3_000_000),
            class("mem", 2, 8.0, 1.0, 2_000_000),
            class("mid", 3, 14.0, 0.8, 1_000_000),
            class("burst", 4, 18.0, 0.5, 200_000),
        ],
        ..SimConfig::default()
    }
}

/// Relative error of each class's attributed energy against the truth.
pub(super) fn class_errors(out: &sim::SimOutput, attr: &Attribution) -> Vec<(u32, f64)> {
    out.truth
        .class_uj
        .iter()
        .map(|(&tgid, &truth)| {
            let got: f64 = attr
                .threads
                .iter()
                .filter(|t| t.tgid == tgid)
                .map(|t| attr.headline_uj(&t.energy))
                .sum();
            (tgid, (got - truth) / truth)
        })
        .collect()
}

#[test]
fn regression_recovers_power_spread_from_the_simulator() {
    let cfg = spread_config(7);
    let out = simulate(&cfg);
    let inp = sim_input(&out);
    let given = [(0, cfg.static_w)].into();
    let auto = attribute(
        &inp,
        &Options {
            static_w_by_source: given,
            ..Options::default()
        },
    );
    assert_conserved(&auto);
    assert_eq!(
        auto.sources[0].power_model,
        PowerModelUsed::Regression,
        "{:?}",
        auto.sources[0].power_model_note
    );
    for (tgid, err) in class_errors(&out, &auto) {
        assert!(err.abs() < 0.05, "class {tgid}: {:.1}%", err * 100.0);
    }
    let reg = auto.sources[0]
        .regression
        .as_ref()
        .expect("regression report");
    let avx = reg
        .classes
        .iter()
        .find(|c| c.label == ClassLabel::Process(1))
        .expect("avx class");
    assert!(
        (avx.fit.watts - 24.0).abs() < 1.5 && avx.fit.se_w > 0.0,
        "{avx:?}"
    );
    // The time model is far off for the same input.
    let time = attribute(
        &inp,
        &Options {
            power_model: PowerModel::Time,
            static_w: Some(cfg.static_w),
            ..Options::default()
        },
    );
    let worst = class_errors(&out, &time)
        .iter()
        .map(|(_, e)| e.abs())
        .fold(0.0, f64::max);
    assert!(worst > 0.2, "time model worst error {worst}");
}

#[test]
fn equal_power_prefers_time_and_is_accurate() {
    let mut cfg = spread_config(8);
    for c in &mut cfg.classes {
        c.watts = 12.0;
    }
    let out = simulate(&cfg);
    let inp = input(
        &out.timeline,
        &out.samples,
        &out.sources,
        &out.readings,
        &out.cpus,
    );
    let attr = attribute(
        &inp,
        &Options {
            static_w: Some(cfg.static_w),
            ..Options::default()
        },
    );
    for (tgid, err) in class_errors(&out, &attr) {
        assert!(err.abs() < 0.02, "class {tgid}: {:.2}%", err * 100.0);
    }
    assert_eq!(attr.sources[0].static_origin, StaticOrigin::Given);
}

#[test]
fn average_power_is_over_the_span_the_counter_measured() {
    // A counter updated every 1,000 ns and read every 20: the head before its first update
    // (0..300) and the tail after its last (2,300..2,600) hold no energy of the recording,
    // so watts are the 10 µJ over 2,000 ns, not over the timeline's 2,600.
    let tl = Timeline::build(0, 2_600, &[0], &[sw(2_600, 0, 5, 0)]);
    let sources = [EnergySource {
        read_interval_ns: 20,
        ..source(0, EnergyDomain::Package, 0)
    }];
    let readings = [
        reading(0, 0, 0.0),
        reading(0, 300, 9.0),
        reading(0, 1_300, 14.0),
        reading(0, 2_300, 19.0),
    ];
    let cpus = [Cpu {
        id: 0,
        package: 0,
        core: 0,
    }];
    let opts = Options {
        static_w: Some(0.0),
        power_model: PowerModel::Time,
        ..Options::default()
    };
    let attr = attribute(&input(&tl, &[], &sources, &readings, &cpus), &opts);
    assert!(rel_eq(attr.total_uj(), 10.0), "{}", attr.total_uj());
    assert_eq!(attr.measured_span_ns(), Some(2_000));
    let without = Attribution {
        sources: Vec::new(),
        ..attr
    };
    assert_eq!(
        without.measured_span_ns(),
        None,
        "no intervals: the caller's span"
    );
}
