//! End-to-end tests of the reader against fake trees and the emulator: the same code path
//! as on real machines, with totals checked against the exact energy the emulator added.

use std::{collections::BTreeMap, path::Path, time::Duration};

use super::{
    EnergyArgs, SourceKind,
    fake::{self, FakeMsr, FakePowercap},
    start,
};
use crate::{pb::v1 as pb, timeline::Timeline};

fn args(root: &Path, kind: SourceKind, interval_ms: u64) -> EnergyArgs {
    EnergyArgs {
        energy_source: kind,
        sysfs_root: root.to_owned(),
        dev_cpu_root: root.join("dev/cpu"),
        energy_interval_ms: Some(interval_ms),
        ..Default::default()
    }
}

fn two_package_cpus() -> Vec<pb::Cpu> {
    crate::energy::fake::cpus(2, 2)
}

/// Last cumulative energy per source name, after checking every source's readings are
/// time-ordered, never decreasing and unflagged.
fn totals(sources: &[pb::EnergySource], readings: &[pb::EnergyReading]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in sources {
        let mine: Vec<&pb::EnergyReading> =
            readings.iter().filter(|r| r.source_id == s.id).collect();
        assert!(mine.len() >= 2, "{}: {} readings", s.name, mine.len());
        assert_eq!(
            mine[0].energy_uj, 0.0,
            "{}: first reading is the origin",
            s.name
        );
        for w in mine.windows(2) {
            assert!(w[1].ts_ns > w[0].ts_ns, "{}: time goes back", s.name);
            assert!(
                w[1].energy_uj > w[0].energy_uj,
                "{}: not increasing (merged reads must not appear): {}",
                s.name,
                w[1].flag
            );
            assert!(w[1].flag.is_empty(), "{}: flagged: {}", s.name, w[1].flag);
        }
        out.insert(s.name.clone(), mine[mine.len() - 1].energy_uj);
    }
    out
}

/// Waits until the emulator has added at least `uj` to every counter (5 s at most).
fn wait_until(emu: &fake::Emulator, uj: f64) {
    wait_until_for(emu, &[], uj);
}

/// Waits until the emulator has added at least `uj` to each of `labels` (all counters when
/// empty), 5 s at most.
fn wait_until_for(emu: &fake::Emulator, labels: &[&str], uj: f64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while emu
        .totals_uj()
        .iter()
        .any(|(label, &t)| (labels.is_empty() || labels.contains(&label.as_str())) && t < uj)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "emulator too slow: {:?}",
            emu.totals_uj()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_within(got: f64, want: f64, unit: f64, what: &str) {
    assert!(
        (got - want).abs() <= unit,
        "{what}: read {got} µJ, emulator added {want} µJ"
    );
}

#[test]
fn powercap_two_packages_dram_and_wraps_exact_to_one_unit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // 300 J range: the packages at 250 and 220 W wrap within 1.4 s. At the 2000 W bound the
    // range is 150 ms of energy, so reads 40 ms apart are unambiguous: a read late by over
    // ~130 ms would be flagged (one more wrap would be plausible), never counted short.
    // Modest watts over 40 ms keep a late emulator write from looking like > 2000 W.
    let range_uj = 300_000_000;
    let tree = FakePowercap::two_packages(tmp.path(), range_uj).expect("fake tree");
    let reader = start(&args(tmp.path(), SourceKind::Powercap, 40), &[]).expect("start");
    let sources = reader.sources();
    assert_eq!(sources.len(), 6);
    assert!(!reader.is_model());
    let watts = [
        ("intel-rapl:0", 250.0),
        ("intel-rapl:0:0", 30.0),
        ("intel-rapl:0:1", 20.0),
        ("intel-rapl:1", 220.0),
        ("intel-rapl:1:0", 25.0),
        ("intel-rapl:1:1", 18.0),
    ];
    let packages = ["intel-rapl:0", "intel-rapl:1"];
    let emu = tree.spawn(&watts).expect("emulator");
    // Until both packages have wrapped, however loaded the machine is.
    wait_until_for(&emu, &packages, range_uj as f64 + 500_000.0);
    let want = emu.stop();
    let mut readings = reader.drain();
    readings.extend(reader.stop());
    let got = totals(&sources, &readings);
    for (id, _) in watts {
        let name = sources
            .iter()
            .find(|s| s.name.starts_with(&format!("{id} ")))
            .expect("source")
            .name
            .clone();
        assert_within(got[&name], want[id], 1.0, &name);
    }
    for id in packages {
        assert!(want[id] > range_uj as f64 + 1.0, "{id} did not wrap");
    }
}

#[test]
fn hwmon_totals_exact() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let counters = fake::hwmon_amd_energy(tmp.path(), 1, 2).expect("fake hwmon");
    let cpus = crate::energy::fake::cpus(1, 2);
    let reader = start(&args(tmp.path(), SourceKind::Hwmon, 10), &cpus).expect("start");
    let sources = reader.sources();
    assert_eq!(sources.len(), 3);
    let emu =
        fake::Emulator::spawn(counters.into_iter().zip([5.0, 7.0, 30.0]).collect()).expect("emu");
    std::thread::sleep(Duration::from_millis(100));
    let want = emu.stop();
    let got = totals(&sources, &reader.stop());
    for s in &sources {
        let label = s.name.trim_start_matches("amd_energy ");
        assert_within(got[&s.name], want[label], 1.0, &s.name);
    }
}

fn msr_run(fake: &FakeMsr, kind_cpus: &[pb::Cpu], root: &Path, watts: &[(&str, f64)]) {
    let reader = start(&args(root, SourceKind::Msr, 10), kind_cpus).expect("start");
    let sources = reader.sources();
    assert_eq!(sources.len(), fake.counters().len(), "{sources:?}");
    let emu = fake.spawn(watts).expect("emulator");
    let unit = 1e6 / 65536.0;
    // Every register started 4096 counts before the 32-bit wrap: wait until all wrapped.
    wait_until(&emu, 2.0 * 4096.0 * unit);
    let want = emu.stop();
    let got = totals(&sources, &reader.stop());
    // Map source names back to fake labels by order (both package-major, same registers).
    let mut got_sorted: Vec<f64> = sources.iter().map(|s| got[&s.name]).collect();
    let mut want_sorted: Vec<f64> = watts.iter().map(|(l, _)| want[*l]).collect();
    got_sorted.sort_by(f64::total_cmp);
    want_sorted.sort_by(f64::total_cmp);
    for (g, w) in got_sorted.iter().zip(&want_sorted) {
        assert_within(*g, *w, unit, "msr register");
    }
}

#[test]
fn msr_intel_wraps_exact_to_one_unit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("dev/cpu");
    let cpus = two_package_cpus();
    let fake = FakeMsr::intel(&root, &cpus).expect("fake msr");
    // Distinct powers so sorted totals pair up unambiguously.
    let watts = [
        ("pkg-0", 50.0),
        ("pp0-0", 30.0),
        ("dram-0", 6.0),
        ("pkg-1", 45.0),
        ("pp0-1", 20.0),
        ("dram-1", 4.0),
    ];
    msr_run(&fake, &cpus, tmp.path(), &watts);
}

#[test]
fn msr_amd_wraps_exact_to_one_unit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path().join("dev/cpu");
    // Two threads per core (see `msr::open`): 2 packages × 2 cores × 2 threads.
    let cpus: Vec<pb::Cpu> = (0..8)
        .map(|id| pb::Cpu {
            id,
            package: id / 4,
            core: (id / 2) % 2,
        })
        .collect();
    let fake = FakeMsr::amd(&root, &cpus).expect("fake msr");
    let watts = [
        ("pkg-0", 60.0),
        ("core-0-0", 12.0),
        ("core-0-1", 9.0),
        ("pkg-1", 50.0),
        ("core-1-0", 15.0),
        ("core-1-1", 7.0),
    ];
    msr_run(&fake, &cpus, tmp.path(), &watts);
}

#[test]
fn update_period_is_measured_against_the_emulator() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = FakePowercap::two_packages(tmp.path(), 1 << 40).expect("fake tree");
    let emu = tree
        .spawn(&[("intel-rapl:0", 50.0), ("intel-rapl:1", 50.0)])
        .expect("emu");
    let mut a = args(tmp.path(), SourceKind::Powercap, 10);
    a.energy_interval_ms = None;
    let reader = start(&a, &[]).expect("start");
    let sources = reader.sources();
    let pkg = sources
        .iter()
        .find(|s| s.name.starts_with("intel-rapl:0 "))
        .expect("pkg 0");
    // The emulator ticks every 1 ms; allow for a loaded 2-CPU machine.
    assert!(
        (500_000..=20_000_000).contains(&pkg.update_period_ns),
        "period {} ns",
        pkg.update_period_ns
    );
    assert!(
        pkg.read_cost_ns > 0 && pkg.read_cost_ns < 5_000_000,
        "read cost {} ns",
        pkg.read_cost_ns
    );
    // The dram zone did not move: its period is only the 50 ms lower bound.
    let dram = sources
        .iter()
        .find(|s| s.name.starts_with("intel-rapl:0:1 "))
        .expect("dram");
    assert_eq!(dram.update_period_ns, super::reader::MEASURE_WINDOW_NS);
    assert_eq!(
        super::reader::interval_ns(&a, pkg.update_period_ns),
        10_000_000.max(5 * pkg.update_period_ns)
    );
    drop(emu);
}

#[test]
fn small_max_energy_range_shortens_the_read_interval_on_a_fake_tree() {
    use super::{
        detect,
        reader::{MEASURE_CHANGES, MEASURE_WINDOW_NS, Measurement, read_interval_of},
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    // Package 0: 200 J range, 100 ms per wrap at 2000 W. Package 1: a common real range
    // (262 kJ, over 2 minutes per wrap).
    let tree = FakePowercap::create(
        tmp.path(),
        &[
            fake::ZoneSpec::new("intel-rapl:0", "package-0", 200_000_000),
            fake::ZoneSpec::new("intel-rapl:1", "package-1", 262_143_328_850),
        ],
    )
    .expect("fake tree");
    let mut a = args(tmp.path(), SourceKind::Powercap, 10);
    a.energy_interval_ms = None;
    let mut plan = detect::plan(&a, &[], false).expect("plan");
    let zones = plan.take_used();
    assert_eq!(zones.len(), 2);
    // A period of 50 ms asks for 250 ms.
    let measured = Measurement {
        update_period_ns: MEASURE_WINDOW_NS,
        period_is_lower_bound: false,
        changes: MEASURE_CHANGES as u32,
        read_cost_ns: 10_000,
        period_is_known: false,
    };
    let got: Vec<(String, u64, Option<u64>)> = zones
        .iter()
        .map(|z| {
            let i = read_interval_of(&a, &measured, z.as_ref());
            (z.describe().name, i.ns, i.uncapped_ns)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "intel-rapl:0 (package-0)".into(),
                50_000_000,
                Some(250_000_000)
            ),
            ("intel-rapl:1 (package-1)".into(), 250_000_000, None),
        ]
    );

    // Seen to change at most once at start-up (idle here; a counter updated once a second),
    // a counter is read as often as its read cost allows, within the wrap cap.
    let slow = Measurement {
        period_is_lower_bound: true,
        changes: 0,
        ..measured
    };
    let got: Vec<u64> = zones
        .iter()
        .map(|z| read_interval_of(&a, &slow, z.as_ref()).ns)
        .collect();
    assert_eq!(got, vec![20_000_000, 20_000_000]);

    drop(zones);

    // The reader uses it: asked for 250 ms, package 0 is read about every 50 ms and
    // package 1 about every 250 ms (median gap between readings, robust to load).
    a.energy_interval_ms = Some(250);
    let reader = start(&a, &[]).expect("start");
    let ids = ["intel-rapl:0 ", "intel-rapl:1 "].map(|prefix| {
        reader
            .sources()
            .iter()
            .find(|s| s.name.starts_with(prefix))
            .expect("zone")
            .id
    });
    let emu = tree
        .spawn(&[("intel-rapl:0", 100.0), ("intel-rapl:1", 100.0)])
        .expect("emu");
    let started = crate::clock::monotonic_ns();
    std::thread::sleep(Duration::from_millis(1500));
    drop(emu);
    let readings = reader.stop();
    let median_gap_ms = |id: u32| {
        let ts: Vec<u64> = readings
            .iter()
            .filter(|r| r.source_id == id && r.ts_ns > started)
            .map(|r| r.ts_ns)
            .collect();
        let mut gaps: Vec<u64> = ts.windows(2).map(|w| (w[1] - w[0]) / 1_000_000).collect();
        assert!(gaps.len() >= 2, "source {id}: {} readings", ts.len());
        gaps.sort_unstable();
        gaps[gaps.len() / 2]
    };
    let (fast, slow) = (median_gap_ms(ids[0]), median_gap_ms(ids[1]));
    assert!((25..150).contains(&fast), "package 0 every {fast} ms");
    assert!(slow >= 200, "package 1 every {slow} ms");
}

/// Drains `reader` into `into` until `done` holds for the readings of `id` (5 s at most).
fn drain_until(
    reader: &super::EnergyReader,
    id: u32,
    into: &mut Vec<pb::EnergyReading>,
    done: impl Fn(&[pb::EnergyReading]) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        into.extend(reader.drain().into_iter().filter(|r| r.source_id == id));
        if done(into) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "reader too slow: {into:?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn backwards_counter_is_flagged_not_negative() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = FakePowercap::two_packages(tmp.path(), 1 << 40).expect("fake tree");
    tree.set_energy_uj("intel-rapl:0", 5_000_000).expect("set");
    let reader = start(&args(tmp.path(), SourceKind::Powercap, 5), &[]).expect("start");
    let id = reader
        .sources()
        .iter()
        .find(|s| s.name.starts_with("intel-rapl:0 "))
        .expect("pkg")
        .id;
    let mut readings = Vec::new();
    // After each step, wait for the reader to see it, so no step is skipped under load.
    for (value, n) in [(5_100_000, 2), (1_000, 3), (2_000, 4)] {
        tree.set_energy_uj("intel-rapl:0", value).expect("set");
        drain_until(&reader, id, &mut readings, |r| r.len() >= n);
    }
    readings.extend(reader.stop().into_iter().filter(|r| r.source_id == id));
    let energies: Vec<f64> = readings.iter().map(|r| r.energy_uj).collect();
    let flags: Vec<bool> = readings.iter().map(|r| !r.flag.is_empty()).collect();
    assert_eq!(
        energies,
        vec![0.0, 100_000.0, 100_000.0, 101_000.0],
        "{readings:?}"
    );
    assert_eq!(flags, vec![false, false, true, false]);
    assert!(
        readings[2].flag.contains("backwards"),
        "{}",
        readings[2].flag
    );
}

#[test]
fn vanished_zone_is_a_fault_and_the_others_continue() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = FakePowercap::two_packages(tmp.path(), 1 << 40).expect("fake tree");
    let reader = start(&args(tmp.path(), SourceKind::Powercap, 5), &[]).expect("start");
    let pkg0 = reader
        .sources()
        .iter()
        .find(|s| s.name.starts_with("intel-rapl:0 "))
        .expect("pkg")
        .id;
    // Only package 0 is advanced: the emulator must not write into the removed directory.
    let emu = tree.spawn(&[("intel-rapl:0", 20.0)]).expect("emu");
    let mut readings = Vec::new();
    drain_until(&reader, pkg0, &mut readings, |r| r.len() >= 2);
    tree.remove_zone("intel-rapl:1").expect("remove");
    let removed_at = crate::clock::monotonic_ns();
    drain_until(&reader, pkg0, &mut readings, |r| {
        r.iter().filter(|r| r.ts_ns > removed_at).count() >= 3
    });
    drop(emu);
    let faults = reader.faults();
    assert_eq!(faults.len(), 1, "{faults:?}");
    assert!(
        faults[0].contains("intel-rapl:1") && faults[0].contains("disappeared"),
        "{faults:?}"
    );
    assert!(
        reader
            .stop()
            .iter()
            .all(|r| r.source_id != pkg0 || r.flag.is_empty())
    );
}

#[test]
fn no_counter_gives_model_sources_and_no_readings() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cpus = two_package_cpus();
    let reader = start(&args(tmp.path(), SourceKind::Auto, 10), &cpus).expect("start");
    assert!(reader.is_model());
    let model: Vec<pb::EnergySource> = reader
        .sources()
        .into_iter()
        .filter(|s| s.kind == "model")
        .collect();
    assert_eq!(model.len(), 2);
    assert!(
        model.iter().all(|s| s.estimated
            && s.model_max_w > s.model_idle_w
            && s.model_idle_w > 0.0
            && !s.model_row.is_empty()),
        "the power table's estimate for this machine: {model:?}"
    );
    // (On a GPU machine NVML sources read; the model never does.)
    assert!(
        reader
            .drain()
            .iter()
            .all(|r| !model.iter().any(|m| m.id == r.source_id))
    );
    assert!(
        reader
            .stop()
            .iter()
            .all(|r| !model.iter().any(|m| m.id == r.source_id))
    );
}

/// A hypervisor can expose a power PMU whose counters never move: chosen automatically, such
/// a counter is not used (it would report 0 J as measured), the model covers the packages,
/// and the reader says why. Asked for by name, the counter is read as asked; once it moves,
/// the automatic choice takes it.
#[test]
fn a_counter_that_never_changes_is_not_counting_and_the_model_covers_the_package() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let cpus = two_package_cpus();
    let tree = FakePowercap::two_packages(tmp.path(), 300_000_000).expect("fake tree");
    let reader = start(&args(tmp.path(), SourceKind::Auto, 10), &cpus).expect("start");
    assert!(reader.is_model(), "{:?}", reader.sources());
    assert!(
        reader.sources().iter().all(|s| s.kind != "powercap"),
        "{:?}",
        reader.sources()
    );
    let faults = reader.faults();
    assert!(
        faults
            .iter()
            .any(|f| f.contains("intel-rapl:0") && f.contains("not counting")),
        "{faults:?}"
    );
    drop(reader.stop());

    let forced = start(&args(tmp.path(), SourceKind::Powercap, 10), &cpus).expect("start");
    assert!(!forced.is_model());
    drop(forced.stop());

    let emu = tree
        .spawn(&[("intel-rapl:0", 50.0), ("intel-rapl:1", 40.0)])
        .expect("emulator");
    let counting = start(&args(tmp.path(), SourceKind::Auto, 10), &cpus).expect("start");
    let kinds: Vec<String> = counting.sources().into_iter().map(|s| s.kind).collect();
    drop(counting.stop());
    drop(emu.stop());
    assert!(kinds.iter().any(|k| k == "powercap"), "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "model"), "{kinds:?}");
}

/// Start-up judges a counter silent at the end of its 50 ms window when it was read often
/// and never moved (a frozen `energy-psys`): quickly. A counter read only a few times in
/// the window (a reader the scheduler kept off the CPU; here each read takes 12 ms) is
/// watched until it moves, up to 1.1 s, so a counting one is used, with its period a lower
/// bound; one that sits still through the watch is not, and the reader says how long it
/// watched.
#[test]
fn a_counter_read_only_a_few_times_in_its_window_is_watched_until_it_moves() {
    use super::{
        EnergyError, EnergySource, RawSample,
        reader::{MEASURE_WINDOW_NS, SILENT_WATCH_NS, measure, patience_ns, silent},
    };
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    use std::time::Instant;
    /// A counter whose every read waits first, as a starved reader does, and the update
    /// period it states, if any.
    struct Starved(Box<dyn EnergySource>, Option<u64>);
    impl EnergySource for Starved {
        fn describe(&self) -> pb::EnergySource {
            self.0.describe()
        }
        fn unit_uj(&self) -> f64 {
            self.0.unit_uj()
        }
        fn wrap_counts(&self) -> Option<u64> {
            self.0.wrap_counts()
        }
        fn read(&mut self) -> Result<RawSample, EnergyError> {
            std::thread::sleep(Duration::from_millis(12));
            self.0.read()
        }
        fn known_update_period_ns(&self) -> Option<u64> {
            self.1
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let tree = FakePowercap::create(
        tmp.path(),
        &[fake::ZoneSpec::new(
            "intel-rapl:0",
            "package-0",
            262_143_328_850,
        )],
    )
    .expect("fake tree");
    let auto = args(tmp.path(), SourceKind::Auto, 10);
    let zone = || {
        let mut plan = super::detect::plan(&auto, &[], false).expect("plan");
        let mut zones = plan.take_used();
        assert_eq!(zones.len(), 1);
        zones.remove(0)
    };
    let watch = |counter: Box<dyn EnergySource>, a: &EnergyArgs| {
        let t = Instant::now();
        let m = measure(&mut [counter], patience_ns(a))
            .remove(0)
            .expect("read");
        (m, t.elapsed())
    };

    // Read thousands of times and still: silent at the window's end. (A machine busy
    // enough to starve this thread too gets it watched, rightly: up to five tries.)
    let quick = (0..5).any(|_| watch(zone(), &auto).1 < Duration::from_millis(500));
    assert!(
        quick,
        "a frozen counter read fast was watched past its window in 5 tries"
    );
    let (m, _) = watch(zone(), &auto);
    assert!(silent(&auto, &m).is_some(), "{m:?}");
    // Read four times and still: watched for the whole patience, then silent.
    let (m, took) = watch(Box::new(Starved(zone(), None)), &auto);
    assert!(took >= Duration::from_nanos(SILENT_WATCH_NS), "{took:?}");
    let why = silent(&auto, &m).expect("a counter that never moved is silent");
    assert!(why.contains("did not change once in 1"), "{why}");
    // One that states its period (a host's share) is never judged silent, so not watched.
    let (m, took) = watch(Box::new(Starved(zone(), Some(1_000_000_000))), &auto);
    assert!(took < Duration::from_nanos(SILENT_WATCH_NS), "{took:?}");
    assert_eq!(
        (m.update_period_ns, silent(&auto, &m)),
        (1_000_000_000, None)
    );
    // Asked for by name, a starved counter is not watched past its window.
    let named = args(tmp.path(), SourceKind::Powercap, 10);
    let (m, took) = watch(Box::new(Starved(zone(), None)), &named);
    assert!(took < Duration::from_nanos(SILENT_WATCH_NS), "{took:?}");
    assert_eq!(m.update_period_ns, MEASURE_WINDOW_NS);

    // Counting (a write every 200 ms): the starved reader sees it move and keeps it.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (counter, stop) = (tree.counter("intel-rapl:0").expect("zone"), stop.clone());
        std::thread::spawn(move || {
            let mut value = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                value += 2_000_000;
                counter.write_raw(value).expect("write");
            }
        })
    };
    let (m, _) = watch(Box::new(Starved(zone(), None)), &auto);
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer");
    assert!(m.changes >= 1, "{m:?}");
    assert!(m.period_is_lower_bound, "{m:?}");
    assert!(m.update_period_ns >= MEASURE_WINDOW_NS, "{m:?}");
    assert_eq!(silent(&auto, &m), None);
}

#[test]
fn readings_for_models_only_model_sources() {
    let cpus = [pb::Cpu {
        id: 0,
        package: 0,
        core: 0,
    }];
    let model = pb::EnergySource {
        id: 1,
        kind: "model".into(),
        estimated: true,
        model_idle_w: 1.0,
        model_max_w: 2.0,
        ..Default::default()
    };
    let gpu = pb::EnergySource {
        id: 2,
        kind: "nvml".into(),
        domain: pb::EnergyDomain::Gpu as i32,
        ..Default::default()
    };
    let recorded = vec![
        pb::EnergyReading {
            source_id: 2,
            ts_ns: 5_000_000,
            energy_uj: 9.0,
            ..Default::default()
        },
        // A stray reading of the model source in a file is ignored: the model is recomputed.
        pb::EnergyReading {
            source_id: 1,
            ts_ns: 6_000_000,
            energy_uj: 1e9,
            ..Default::default()
        },
    ];
    let timeline = Timeline::build(0, 20_000_000, &[0], &[]);
    let got = super::readings_for(&[model, gpu], &recorded, &timeline, &cpus);
    let summary: Vec<(u32, u64, f64)> = got
        .iter()
        .map(|r| (r.source_id, r.ts_ns, r.energy_uj))
        .collect();
    // Unknown task all along = not busy: idle power only, 1 W × 10 ms = 10 000 µJ.
    assert_eq!(
        summary,
        vec![
            (1, 0, 0.0),
            (2, 5_000_000, 9.0),
            (1, 10_000_000, 10_000.0),
            (1, 20_000_000, 20_000.0)
        ]
    );
}
