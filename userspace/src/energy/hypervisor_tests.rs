//! Tests of the hypervisor source: a share written as the host writes it (zone files, then
//! `energy-bpf.json`), read through the same code as in a guest.
use super::*;

fn meta(seq: u64, instance: &str, gaps: u64) -> Meta {
    Meta {
        format: 1,
        vm: "web-1".into(),
        instance: instance.into(),
        seq,
        interval_ms: 1000,
        vcpus: 2,
        static_policy: "vcpus".into(),
        measured: true,
        host_source: "powercap".into(),
        gaps,
        ..Default::default()
    }
}

/// Writes `dir/name` as the host does: a temporary file renamed over.
fn put(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, dir.join(name)).expect("rename");
}

/// Writes a share with one package zone as the host does: zone file, then the metadata,
/// with the host time the counters cover where `counted_us` is given (hosts before that
/// field did not write it).
fn write_share(dir: &Path, seq: u64, energy_uj: u64, static_uj: u64, counted_us: Option<u64>) {
    let zone = dir.join("intel-rapl:0");
    std::fs::create_dir_all(&zone).expect("zone dir");
    put(&zone, "name", "package-0\n");
    put(&zone, "max_energy_range_uj", "9223372036854775807\n");
    put(&zone, "energy_uj", &format!("{energy_uj}\n"));
    let mut json = serde_json::json!({
        "format": 1, "vm": "web-1", "instance": "100:5", "seq": seq, "interval_ms": 200,
        "vcpus": 2, "static_policy": "vcpus", "measured": true, "host_source": "powercap",
        "zones": {"package": {"energy_uj": energy_uj, "static_uj": static_uj}},
        "gaps": 0,
    });
    if let Some(us) = counted_us {
        json["counted_us"] = us.into();
    }
    put(dir, META_FILE, &json.to_string());
}

fn zone_at(count: u64) -> HypervisorZone {
    HypervisorZone {
        dir: "/run/energy-bpf/host".into(),
        energy_path: "/run/energy-bpf/host/intel-rapl:0/energy_uj".into(),
        desc: source_desc(
            SourceKind::Hypervisor,
            pb::EnergyDomain::Package,
            0,
            "intel-rapl:0 (package-0)".into(),
        ),
        interval_ns: 1_000_000_000,
        instance: "100:5".into(),
        gaps: 0,
        seq: 1,
        seq_moved_ns: 0,
        count,
        stale_since_ns: None,
        gap: None,
        notice: None,
    }
}

const S: u64 = 1_000_000_000;

#[test]
fn an_unchanged_seq_holds_the_value_and_a_silent_host_is_stale_within_two_intervals() {
    let mut z = zone_at(1_000);
    // The host wrote the zone but not yet the metadata: the new count waits for its seq.
    assert_eq!(z.account(S / 2, Some((1_500, meta(1, "100:5", 0)))), 1_000);
    assert_eq!(z.account(S, Some((2_000, meta(2, "100:5", 0)))), 2_000);
    assert!(z.take_gap().is_none() && z.take_notice().is_none());
    // Silent for two intervals: nothing yet; past them: stale, said once.
    assert_eq!(z.account(3 * S, Some((2_000, meta(2, "100:5", 0)))), 2_000);
    assert!(z.take_notice().is_none());
    assert_eq!(z.account(3 * S + 1, None), 2_000);
    let notice = z.take_notice().expect("stale notice");
    assert!(
        notice.contains("stopped updating") && notice.contains("seq 2"),
        "{notice}"
    );
    assert_eq!(z.account(4 * S, None), 2_000);
    assert!(z.take_notice().is_none(), "said once");
    // The host resumes: the interval spanning the silence is flagged.
    assert_eq!(z.account(5 * S, Some((9_000, meta(3, "100:5", 0)))), 9_000);
    let gap = z.take_gap().expect("gap");
    assert!(gap.contains("did not update the share"), "{gap}");
}

#[test]
fn a_new_instance_a_host_gap_or_a_counter_that_went_down_is_a_flagged_gap() {
    let mut z = zone_at(5_000);
    assert_eq!(z.account(S, Some((6_000, meta(2, "100:5", 1)))), 6_000);
    let gap = z.take_gap().expect("host gap");
    assert!(gap.contains("the host flagged a gap"), "{gap}");
    assert_eq!(z.account(2 * S, Some((10, meta(1, "200:9", 0)))), 10);
    let gap = z.take_gap().expect("new instance");
    assert!(
        gap.contains("new instance") && gap.contains("went down"),
        "{gap}"
    );
    assert_eq!(z.account(3 * S, Some((20, meta(2, "200:9", 0)))), 20);
    assert!(z.take_gap().is_none());
}

/// A host writing every 200 ms for a while, 10 W of which 2 W static, counted over the time
/// that really passed (as a host does when its own writes are late); `counted` says whether
/// it writes `counted_us`.
fn run_host(dir: &Path, counted: bool) -> std::thread::JoinHandle<()> {
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        for seq in 2..20u64 {
            // Late now and then, as a loaded host is.
            let late = if seq % 3 == 0 { 70 } else { 0 };
            std::thread::sleep(Duration::from_millis(200 + late));
            let us = t0.elapsed().as_micros() as u64;
            write_share(&dir, seq, us * 10, us * 2, counted.then_some(us));
        }
    })
}

#[test]
fn a_share_opens_as_measured_with_the_hosts_static_power_and_reads_through_the_reader() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    write_share(&dir, 1, 0, 0, Some(0));
    let host = run_host(&dir, true);
    let zones = open(&dir).expect("open");
    assert_eq!(zones.len(), 1);
    let d = zones[0].describe();
    assert_eq!((d.kind.as_str(), d.estimated), ("hypervisor", false));
    // Timed by the host's own clock: exact but for the µs rounding.
    assert!((d.host_static_w - 2.0).abs() < 1e-3, "{}", d.host_static_w);
    assert_eq!(d.update_period_ns, 200_000_000);
    let text = read_meta(&dir).expect("meta").describe(&dir);
    assert!(
        text.starts_with(&format!(
            "measured by the host, shared at {}, updated every 0.200 s",
            dir.display()
        )),
        "{text}"
    );
    host.join().expect("host");
    // The host is gone: the share is stale at start, and says why.
    let err = open(&dir).expect_err("stale share accepted");
    assert!(err.to_string().contains("is stale"), "{err}");
}

#[test]
fn a_host_that_does_not_say_its_time_is_timed_by_the_guests_polls() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    write_share(&dir, 1, 0, 0, None);
    let host = run_host(&dir, false);
    let d = open(&dir).expect("open")[0].describe();
    // Timed by polls every 2 ms over one update of 200 or 270 ms: a late poll on a loaded
    // machine moves it by its lateness over that.
    assert!((d.host_static_w - 2.0).abs() < 0.3, "{}", d.host_static_w);
    host.join().expect("host");
}

#[test]
fn no_share_is_absent_not_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert!(open(tmp.path()).expect("open").is_empty());
}

#[test]
fn the_reader_times_each_host_update_within_a_few_ms() {
    // A host writing every 200 ms: read five times per update, each update would reach the
    // guest 20 ms late on average; in step with the host, within the lock's 2 ms steps.
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_owned();
    write_share(&dir, 1, 0, 0, Some(0));
    let host = {
        let dir = dir.clone();
        std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let mut written = Vec::new();
            for seq in 2..20u64 {
                std::thread::sleep(Duration::from_millis(200));
                let us = t0.elapsed().as_micros() as u64;
                write_share(&dir, seq, us * 10, us * 2, Some(us));
                written.push(crate::clock::monotonic_ns());
            }
            written
        })
    };
    let args = crate::energy::EnergyArgs {
        energy_source: SourceKind::Hypervisor,
        hypervisor_dir: dir.clone(),
        sysfs_root: dir.join("no-sysfs"),
        dev_cpu_root: dir.join("no-dev-cpu"),
        ..Default::default()
    };
    let reader =
        crate::energy::reader::start(&args, &crate::energy::fake::cpus(1, 2)).expect("reader");
    let source = reader.sources()[0].clone();
    let written = host.join().expect("host");
    let readings = reader.stop();
    // The recording says what timed each update: the lock's step, not the plain 40 ms.
    assert!(
        source.read_interval_ns < 40_000_000,
        "read interval {} ns",
        source.read_interval_ns
    );
    // Each reading after the first update, against the host's write before it.
    let mut late_ms: Vec<f64> = readings
        .iter()
        .filter_map(|r| {
            let w = written.iter().rev().find(|&&w| w <= r.ts_ns)?;
            Some((r.ts_ns - w) as f64 / 1e6)
        })
        .collect();
    assert!(
        late_ms.len() >= 10,
        "{} readings after an update",
        late_ms.len()
    );
    late_ms.sort_by(f64::total_cmp);
    let median = late_ms[late_ms.len() / 2];
    assert!(
        median < 10.0,
        "updates reached the reader {median:.1} ms late (median): {late_ms:?}"
    );
}
