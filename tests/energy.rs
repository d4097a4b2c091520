//! Energy readings in recordings, against fake RAPL trees driven by an emulator (this VM
//! has no counters): the same code path as real powercap, checked to one counter unit.

use std::{collections::BTreeMap, time::Duration};

use energy_bpf::{
    energy::fake::{self, FakePowercap},
    pb::v1::EnergyDomain,
};

use crate::util::{Recorder, require_root};

#[test]
fn record_on_fake_two_package_powercap_keeps_unwrapped_totals() {
    if !require_root("record_on_fake_two_package_powercap_keeps_unwrapped_totals") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let sysfs = dir.path().join("sys");
    // Package zones wrap every 1-2 s at these watts: several wraps in a 3 s run. At the
    // 2000 W bound the 600 J range wraps in 300 ms, so the reader reads every 150 ms (not
    // 250 ms), and a read is ambiguous (flagged) only after 350 ms or more without one.
    let range_uj = 600_000_000;
    let tree = FakePowercap::two_packages(&sysfs, range_uj).expect("fake powercap");
    fake::topology(&sysfs, 2, 1).expect("fake topology");
    let file = dir.path().join("fake.ebpr");
    // Powercap by name: the counters stand still until the emulator starts after the
    // recorder's first reading (so its totals are the recording's), and chosen
    // automatically a counter that does not move at start-up is not used.
    let rec = Recorder::start(&[
        "-o",
        file.to_str().expect("path"),
        "--energy-source",
        "powercap",
        "--sysfs-root",
        sysfs.to_str().expect("path"),
    ]);
    let watts = [
        ("intel-rapl:0", 600.0),
        ("intel-rapl:0:0", 360.0),
        ("intel-rapl:0:1", 90.0),
        ("intel-rapl:1", 300.0),
        ("intel-rapl:1:0", 180.0),
        ("intel-rapl:1:1", 75.0),
    ];
    let emulator = tree.spawn(&watts).expect("emulator");
    std::thread::sleep(Duration::from_secs(3));
    let truth = emulator.stop();
    // Let the reader see the final values before stopping.
    std::thread::sleep(Duration::from_millis(600));
    rec.stop();

    let recording = energy_bpf::record::read_file(&file).expect("read recording");
    assert!(!recording.truncated);
    let mut last: BTreeMap<u32, f64> = BTreeMap::new();
    for r in &recording.readings {
        assert!(
            r.flag.is_empty(),
            "no reading is flagged on a well-behaved tree: {r:?}"
        );
        let prev = last.insert(r.source_id, r.energy_uj).unwrap_or(0.0);
        assert!(
            r.energy_uj >= prev,
            "cumulative energy never goes backwards"
        );
    }
    let mut packages_seen = Vec::new();
    for (zone, _) in watts {
        let source = recording
            .sources
            .iter()
            .find(|s| s.name.contains(&format!("{zone} ")) || s.name == zone)
            .unwrap_or_else(|| panic!("no source for {zone} in {:?}", recording.sources));
        assert_eq!(source.kind, "powercap");
        assert!(!source.estimated, "a counter is not estimated");
        if source.domain() == EnergyDomain::Package {
            packages_seen.push(source.package);
        }
        let recorded = last.get(&source.id).copied().unwrap_or(0.0);
        let expected = truth[zone];
        if source.domain() == EnergyDomain::Package {
            assert!(
                expected > range_uj as f64,
                "{zone} wrapped at least once ({expected} µJ)"
            );
        }
        assert!(
            (recorded - expected).abs() <= 1.0,
            "{zone}: recorded {recorded} µJ, emulator added {expected} µJ (must match to one counter unit)"
        );
    }
    packages_seen.sort_unstable();
    assert_eq!(
        packages_seen,
        vec![0, 1],
        "both packages' readings are in the file"
    );
    assert_eq!(
        recording
            .header
            .cpus
            .iter()
            .map(|c| c.package)
            .collect::<Vec<_>>(),
        vec![0, 1],
        "topology comes from the (fake) sysfs root"
    );
}
