//! Tests of `energy::msr`.

use super::*;
use crate::energy::fake::FakeMsr;

fn two_package_cpus() -> Vec<pb::Cpu> {
    crate::energy::fake::cpus(2, 2)
}

#[test]
fn unit_from_esu() {
    assert_eq!(unit_uj(0xA0E03), 1e6 / 16384.0); // a real Skylake value, ESU 14
    assert_eq!(unit_uj(16 << 8), 15.2587890625);
}

#[test]
fn intel_registers_per_package() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fake = FakeMsr::intel(tmp.path(), &two_package_cpus()).expect("fake msr");
    let (vendor, regs) = open(tmp.path(), &two_package_cpus()).expect("open");
    assert_eq!(vendor, Vendor::Intel);
    let names: Vec<String> = regs.iter().map(|r| r.describe().name).collect();
    assert_eq!(
        names,
        vec![
            "cpu0 msr 0x611 (package-0)",
            "cpu0 msr 0x639 (pp0-0)",
            "cpu0 msr 0x619 (dram-0)",
            "cpu2 msr 0x611 (package-1)",
            "cpu2 msr 0x639 (pp0-1)",
            "cpu2 msr 0x619 (dram-1)",
        ]
    );
    assert_eq!(regs[0].unit_uj(), 15.2587890625);
    assert_eq!(fake.counters().len(), 6);
}

#[test]
fn amd_registers_per_package_and_core() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // Two threads per core, as AMD servers have (see `open` on why).
    let cpus: Vec<pb::Cpu> = (0..8)
        .map(|id| pb::Cpu {
            id,
            package: id / 4,
            core: (id / 2) % 2,
        })
        .collect();
    FakeMsr::amd(tmp.path(), &cpus).expect("fake msr");
    let (vendor, regs) = open(tmp.path(), &cpus).expect("open");
    assert_eq!(vendor, Vendor::Amd);
    let domains: Vec<(pb::EnergyDomain, u32)> = regs
        .iter()
        .map(|r| (r.describe().domain(), r.describe().package))
        .collect();
    use pb::EnergyDomain::*;
    assert_eq!(
        domains,
        vec![
            (Package, 0),
            (Package, 1),
            (Cores, 0),
            (Cores, 0),
            (Cores, 1),
            (Cores, 1)
        ]
    );
    assert_eq!(regs[0].describe().name, "cpu0 msr 0xc001029b (package-0)");
    assert_eq!(
        regs[3].describe().name,
        "cpu3 msr 0xc001029a (core 1 of package 0)"
    );
    assert_eq!(regs[3].unit_uj(), 15.2587890625);
}

#[test]
fn missing_driver_says_modprobe() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let err = open(tmp.path(), &[]).expect_err("no msr files");
    assert!(err.to_string().contains("modprobe msr"), "{err}");
}
