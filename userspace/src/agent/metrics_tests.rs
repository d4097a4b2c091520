use super::*;
use crate::pipeline::{DomainJoules, ProcessRow};

fn labels_of(text: &str, name: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("name value");
            (series.to_string(), value.parse().expect("number"))
        })
        .collect()
}

#[test]
fn exposition_has_the_families_and_the_sum_rule() {
    let m = Metrics::new(1).expect("metrics");
    {
        let mut s = m.lock();
        let rows = vec![
            ProcessRow {
                pid: 42,
                comm: "busy".into(),
                cgroup: format!("/system.slice/docker-{}.scope", "cd".repeat(32)),
                // As the rollup reads it from the cgroup.
                container_id: "cd".repeat(32),
                energy_j: DomainJoules::from([("package", 3.0)]),
                ..Default::default()
            },
            ProcessRow {
                pid: 43,
                comm: "small".into(),
                energy_j: DomainJoules::from([("package", 1.0)]),
                ..Default::default()
            },
        ];
        let measured = DomainJoules::from([("package", 6.0)]);
        let idle = DomainJoules::from([("package", 1.5)]);
        let unknown = DomainJoules::from([("package", 0.5)]);
        s.ledger.apply(
            &WindowEnergy {
                secs: 2.0,
                measured: &measured,
                idle: &idle,
                unknown: &unknown,
                rows: &rows,
                exited: &[],
            },
            &|_| true,
        );
        s.publish();
    }
    m.observe_processing(Duration::from_millis(3), 7);
    let text = m.encode().expect("encodes");
    let node = labels_of(&text, "energy_bpf_node_joules_total");
    assert!(
        node.contains(&(
            "energy_bpf_node_joules_total{zone=\"package\",mode=\"active\"}".into(),
            4.5
        )),
        "{text}"
    );
    let procs = labels_of(&text, "energy_bpf_process_joules_total");
    let sum: f64 = procs.iter().map(|(_, v)| v).sum();
    assert!((sum - 4.5).abs() < 1e-9, "{procs:?}");
    let id = "cd".repeat(32);
    assert!(
        procs.iter().any(|(l, v)| *v == 3.0
            && l.contains("pid=\"42\"")
            && l.contains(&format!("container_id=\"{id}\""))),
        "{procs:?}"
    );
    assert!(
        procs
            .iter()
            .any(|(l, v)| *v == 1.0 && l.contains("comm=\"[other]\""))
    );
    assert!(
        procs
            .iter()
            .any(|(l, v)| *v == 0.5 && l.contains("comm=\"[unknown]\""))
    );
    let watts = labels_of(&text, "energy_bpf_process_watts");
    assert!(
        watts
            .iter()
            .any(|(l, v)| *v == 1.5 && l.contains("pid=\"42\""))
    );
    assert!(text.contains(&format!(
        "energy_bpf_container_joules_total{{container_id=\"{id}\",zone=\"package\"}} 3"
    )));
    for family in [
        "energy_bpf_process_series 1",
        "energy_bpf_agent_cpu_seconds_total",
        "energy_bpf_agent_resident_memory_bytes",
        "energy_bpf_window_processing_seconds{quantile=\"0.99\"}",
        "energy_bpf_window_processing_seconds_total",
        "energy_bpf_windows_total 1",
        "energy_bpf_pipeline_pending_events 7",
    ] {
        assert!(text.contains(family), "{family} missing:\n{text}");
    }
}

#[test]
fn loss_counters_are_exported_as_they_grow() {
    let m = Metrics::new(10).expect("metrics");
    for dropped in [3, 5, 5] {
        m.chunk(&pb::Chunk {
            switches: vec![pb::SwitchEvent::default(); 2],
            losses: Some(pb::LossCounters {
                switch_dropped: dropped,
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    let text = m.encode().expect("encodes");
    assert!(
        text.contains("energy_bpf_dropped_events_total{kind=\"switch\"} 5"),
        "{text}"
    );
    assert!(
        text.contains("energy_bpf_events_total{kind=\"switch\"} 6"),
        "{text}"
    );
}

#[test]
fn samples_are_counted_by_unwind_method_and_stop() {
    let m = Metrics::new(10).expect("metrics");
    let fresh = m.encode().expect("encodes");
    for line in [
        "energy_bpf_samples_unwound_total{method=\"dwarf\",stop=\"end_of_stack\"} 0",
        "energy_bpf_samples_unwound_total{method=\"frame_pointer\",stop=\"end_of_stack\"} 0",
    ] {
        assert!(
            fresh.contains(line),
            "before any sample, {line} missing:\n{fresh}"
        );
    }
    let sample = |method: pb::UnwindMethod, stop: pb::UnwindStop| pb::Sample {
        unwind_method: method as i32,
        unwind_stop: stop as i32,
        ..Default::default()
    };
    m.chunk(&pb::Chunk {
        samples: vec![
            sample(pb::UnwindMethod::Dwarf, pb::UnwindStop::EndOfStack),
            sample(pb::UnwindMethod::Dwarf, pb::UnwindStop::EndOfStack),
            sample(
                pb::UnwindMethod::FramePointer,
                pb::UnwindStop::NoProcessTable,
            ),
        ],
        ..Default::default()
    });
    m.unwind_tables(&crate::capture::unwinder::UnwindStats {
        processes: 3,
        files: 7,
        rows: 1000,
        row_capacity: 1 << 20,
        ..Default::default()
    });
    let text = m.encode().expect("encodes");
    for line in [
        "energy_bpf_samples_unwound_total{method=\"dwarf\",stop=\"end_of_stack\"} 2",
        "energy_bpf_samples_unwound_total{method=\"frame_pointer\",stop=\"no_process_table\"} 1",
        "energy_bpf_unwind_tables{what=\"processes\"} 3",
        "energy_bpf_unwind_tables{what=\"rows\"} 1000",
        "energy_bpf_unwind_tables{what=\"row_capacity\"} 1048576",
    ] {
        assert!(text.contains(line), "{line} missing:\n{text}");
    }
}

#[test]
fn learned_static_power_and_its_drift_only_where_both_exist() {
    use crate::agent::learn::SourceLearned;
    use crate::attribute::{Calibrated, Learned, zero_load::ZeroLoadFit};
    let m = Metrics::new(1).expect("metrics");
    let fit = ZeroLoadFit {
        intercept_w: 6.3,
        slope_w: 10.0,
        spread_cpus: 0.5,
        min_busy_cpus: 0.1,
        levels: 16,
        residual_w: 0.1,
        ci_low_w: 6.0,
        ci_high_w: 6.6,
        rows: 64,
        rejected: 0,
        lag_ns: 0,
    };
    let learned = |name: &str, w: Option<f64>| SourceLearned {
        key: format!("powercap:{name}"),
        name: name.into(),
        learned: w.map(|watts| Learned {
            watts,
            intervals: 64,
            span_s: 3600.0,
            fit,
        }),
    };
    let calibrated = BTreeMap::from([
        (
            "powercap:package-0".to_string(),
            Calibrated {
                watts: 6.0,
                date: "2026-05-20T10:00:00Z".into(),
                file: String::new(),
            },
        ),
        (
            "powercap:package-2".to_string(),
            Calibrated {
                watts: 4.0,
                date: "2026-05-20T10:00:00Z".into(),
                file: String::new(),
            },
        ),
    ]);
    m.set_learned(
        &[
            learned("package-0", Some(6.3)),
            learned("package-1", Some(5.0)),
            learned("package-2", None),
        ],
        &calibrated,
    );
    let text = m.encode().expect("encode");
    let watts = labels_of(&text, "energy_bpf_static_learned_watts");
    assert_eq!(watts.len(), 2, "{text}");
    assert!(watts.contains(&(
        "energy_bpf_static_learned_watts{source=\"package-1\"}".into(),
        5.0
    )));
    // Drift only for package-0: package-1 has no calibration, package-2 learned nothing.
    let drift = labels_of(&text, "energy_bpf_static_drift_ratio");
    assert_eq!(drift.len(), 1, "{text}");
    assert_eq!(
        drift[0].0,
        "energy_bpf_static_drift_ratio{source=\"package-0\"}"
    );
    assert!((drift[0].1 - 0.05).abs() < 1e-9, "{drift:?}");
}

#[test]
fn power_model_uncertainty_is_a_gauge_per_source() {
    use crate::testing::{scenarios, sim::simulate};
    // A once-a-second counter under 15 / 5 / 8 W mixed duty cycles, as a live view splits
    // it: the first windows have too few rows for a regression (time), later ones fit the
    // past windows; each says when a process may be more than 25% off.
    let mut cfg = scenarios::Counter::Vm.apply(scenarios::mixed_duty(1));
    cfg.duration_ns = 60_000_000_000;
    let rec = simulate(&cfg).into_recording(cfg.duration_ns, cfg.sample_hz);
    let pcfg = crate::pipeline::Config {
        cpus: rec.header.cpus.clone(),
        sources: rec.sources.clone(),
        options: crate::attribute::Options {
            static_w: Some(cfg.static_w),
            ..Default::default()
        }
        .live(),
        activity_event: None,
    };
    let mut seen = BTreeMap::new();
    for w in crate::pipeline::folded_windows(&rec, pcfg, Duration::from_secs(5)) {
        let m = Metrics::new(10).expect("metrics");
        m.window(&w, &|_| true);
        let src = &w.analysis.attribution.sources[0];
        let model = src.power_model.name();
        let want = i64::from(src.power_model_uncertain.is_some());
        let line = format!(
            "energy_bpf_power_model_uncertain{{source=\"{}\",model=\"{model}\"}} {want}",
            src.name
        );
        let text = m.encode().expect("encodes");
        assert!(text.contains(&line), "{line} missing:\n{text}");
        seen.insert((model, want), ());
    }
    // The first windows' few rows already disagree with the time split beyond its reach.
    assert!(seen.contains_key(&("time", 1)), "{seen:?}");
    assert!(seen.keys().any(|(m, _)| *m == "regression"), "{seen:?}");
}
