//! Tests of `energy::perf`.

use super::*;
use crate::energy::fake;

#[test]
fn parses_fake_pmu_description() {
    let tmp = tempfile::tempdir().expect("tempdir");
    fake::power_pmu(
        tmp.path(),
        4242,
        &["energy-pkg", "energy-ram", "energy-psys"],
    )
    .expect("fake pmu");
    let pmu = describe(tmp.path()).expect("describe").expect("present");
    assert_eq!(pmu.pmu_type, 4242);
    let got: Vec<(&str, u64, pb::EnergyDomain)> = pmu
        .events
        .iter()
        .map(|e| (e.name.as_str(), e.config, e.domain))
        .collect();
    assert_eq!(
        got,
        vec![
            ("energy-pkg", 0x02, pb::EnergyDomain::Package),
            ("energy-psys", 0x05, pb::EnergyDomain::Psys),
            ("energy-ram", 0x03, pb::EnergyDomain::Dram),
        ]
    );
    assert_eq!(pmu.events[0].scale, 2f64.powi(-32));
    assert_eq!(pmu.events[0].unit, "Joules");
}

#[test]
fn absent_pmu_is_none() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert_eq!(describe(tmp.path()).expect("describe"), None);
}

#[test]
fn bad_event_text_names_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    fake::power_pmu(tmp.path(), 7, &["energy-pkg"]).expect("fake pmu");
    std::fs::write(pmu_dir(tmp.path()).join("events/energy-pkg"), "umask=3").expect("write");
    let err = describe(tmp.path()).expect_err("bad event accepted");
    assert!(
        err.to_string()
            .contains("events/energy-pkg: expected `event=0xNN`"),
        "{err}"
    );
}

#[test]
fn opening_a_fake_pmu_fails_clearly() {
    // The fake type number is not a PMU the kernel knows, so the syscall is refused
    // (here: no power PMU at all); the error names the event, the CPU and a fix.
    let tmp = tempfile::tempdir().expect("tempdir");
    fake::power_pmu(tmp.path(), 0x7fff_0000, &["energy-pkg"]).expect("fake pmu");
    let pmu = describe(tmp.path()).expect("describe").expect("present");
    let err = open(
        &pmu,
        &[pb::Cpu {
            id: 0,
            package: 0,
            core: 0,
        }],
    )
    .expect_err("opened");
    let text = err.to_string();
    assert!(
        text.starts_with("perf_event_open(power/energy-pkg, cpu 0) failed: "),
        "{text}"
    );
    assert!(text.contains("; "), "no hint: {text}");
}
