use super::*;

/// A row as the rollup makes it: the container and pod read from the cgroup.
fn row(pid: u32, comm: &str, cgroup: &str, package_j: f64) -> ProcessRow {
    let container = crate::container::parse(cgroup);
    ProcessRow {
        pid,
        comm: comm.into(),
        cgroup: cgroup.into(),
        container_id: container.container_id.unwrap_or_default(),
        pod_uid: container.pod_uid.unwrap_or_default(),
        energy_j: DomainJoules::from([("package", package_j)]),
        ..Default::default()
    }
}

fn joules(z: &[(&'static str, f64)]) -> DomainJoules {
    z.iter().copied().collect()
}

/// Applies a window whose rows and unknown energy make up its active energy, with 1 J idle.
fn apply(l: &mut Ledger, rows: &[ProcessRow], unknown: f64, exited: &[u32]) {
    let attributed: f64 = rows.iter().map(|r| r.energy_j["package"]).sum();
    let measured = joules(&[("package", attributed + unknown + 1.0)]);
    let idle = joules(&[("package", 1.0)]);
    let unknown = joules(&[("package", unknown)]);
    l.apply(
        &WindowEnergy {
            secs: 5.0,
            measured: &measured,
            idle: &idle,
            unknown: &unknown,
            rows,
            exited,
        },
        &|_| true,
    );
}

fn assert_sums(l: &Ledger) {
    let sum = l.process_sum();
    for (z, active) in &l.active {
        let s = sum.get(z).copied().unwrap_or(0.0);
        assert!(
            (s - active).abs() <= 1e-9 * active.max(1.0),
            "zone {z}: processes {s} vs active {active}"
        );
    }
}

#[test]
fn processes_and_unknown_sum_to_active() {
    let mut l = Ledger::new(10, 3, 100);
    apply(
        &mut l,
        &[row(1, "a", "", 2.0), row(2, "b", "", 3.0)],
        0.5,
        &[],
    );
    assert_sums(&l);
    assert_eq!(l.active["package"], 5.5);
    assert_eq!(l.idle["package"], 1.0);
    assert_eq!(l.buckets[&Bucket::Unknown]["package"], 0.5);
    assert_eq!(l.processes[&2].watts["package"], 3.0 / 5.0);
}

#[test]
fn exited_process_lingers_then_folds() {
    let mut l = Ledger::new(10, 3, 100);
    apply(
        &mut l,
        &[row(1, "a", "", 2.0), row(2, "b", "", 3.0)],
        0.0,
        &[2],
    );
    for _ in 0..2 {
        apply(&mut l, &[row(1, "a", "", 1.0)], 0.0, &[]);
        assert!(l.processes.contains_key(&2), "still lingering");
        assert_sums(&l);
    }
    apply(&mut l, &[row(1, "a", "", 1.0)], 0.0, &[]);
    assert!(!l.processes.contains_key(&2), "folded after 3 windows");
    assert_eq!(l.buckets[&Bucket::Exited]["package"], 3.0);
    assert_sums(&l);
}

#[test]
fn lost_exit_event_is_noticed_by_liveness() {
    let mut l = Ledger::new(10, 2, 100);
    apply(&mut l, &[row(7, "gone", "", 1.0)], 0.0, &[]);
    let none: DomainJoules = DomainJoules::new();
    for _ in 0..2 {
        l.apply(
            &WindowEnergy {
                secs: 1.0,
                measured: &none,
                idle: &none,
                unknown: &none,
                rows: &[],
                exited: &[],
            },
            &|pid| pid != 7,
        );
    }
    assert!(!l.processes.contains_key(&7));
    assert_eq!(l.buckets[&Bucket::Exited]["package"], 1.0);
}

#[test]
fn quiet_but_alive_process_keeps_its_series() {
    let mut l = Ledger::new(10, 2, 100);
    apply(&mut l, &[row(7, "sleepy", "", 1.0)], 0.0, &[]);
    for _ in 0..5 {
        apply(&mut l, &[], 0.0, &[]);
    }
    assert!(l.processes.contains_key(&7));
}

#[test]
fn series_beyond_the_limit_go_to_other() {
    let mut l = Ledger::new(2, 3, 100);
    let rows: Vec<ProcessRow> = (1..=5).map(|p| row(p, "x", "", 1.0)).collect();
    apply(&mut l, &rows, 0.0, &[]);
    assert_eq!(l.processes.len(), 2);
    assert_eq!(l.buckets[&Bucket::Other]["package"], 3.0);
    assert_sums(&l);
    // Lowering the limit folds the least recently seen into [other]; sums stay true.
    apply(&mut l, &[row(2, "x", "", 1.0)], 0.0, &[]);
    l.set_max_series(1);
    assert_eq!(l.processes.keys().copied().collect::<Vec<_>>(), [2]);
    assert_sums(&l);
}

#[test]
fn totals_never_decrease() {
    let mut l = Ledger::new(3, 2, 100);
    let mut last: Option<(Zones, Zones)> = None;
    for i in 0..20u32 {
        let rows: Vec<ProcessRow> = (0..4)
            .map(|k| row(100 + (i + k) % 9, "w", "", f64::from(k) * 0.25))
            .collect();
        apply(&mut l, &rows, 0.1, &[100 + i % 9]);
        assert_sums(&l);
        let buckets: Zones = Bucket::ALL
            .iter()
            .map(|b| {
                (
                    b.comm(),
                    l.buckets
                        .get(b)
                        .and_then(|z| z.get("package"))
                        .copied()
                        .unwrap_or(0.0),
                )
            })
            .collect();
        if let Some((active, prev)) = &last {
            assert!(l.active["package"] >= active["package"]);
            for (k, v) in &buckets {
                assert!(*v >= prev[k], "{k} went down");
            }
        }
        last = Some((l.active.clone(), buckets));
    }
}

#[test]
fn containers_are_labelled_and_summed() {
    let id = "ab".repeat(32);
    let cg = format!("/system.slice/docker-{id}.scope");
    let mut l = Ledger::new(10, 3, 2);
    apply(
        &mut l,
        &[row(1, "nginx", &cg, 2.0), row(2, "worker", &cg, 1.0)],
        0.0,
        &[],
    );
    let key = (id.clone(), String::new());
    assert_eq!(l.containers[&key].joules["package"], 3.0);
    assert_eq!(
        l.processes[&1].container.container_id.as_deref(),
        Some(id.as_str())
    );
    // A container with nothing running for `container_linger` windows is dropped.
    apply(&mut l, &[], 0.0, &[]);
    apply(&mut l, &[], 0.0, &[]);
    assert!(l.containers.is_empty());
}
