//! Simulator scenarios of the busy-machine cases (static power, SMT) shared by the unit
//! tests and the accuracy bench, so both measure the same machines.

use super::sim::{SimClass, SimConfig};

fn class(name: &str, tgid: u32, watts: f64, threads: u32, cpus: Vec<u32>) -> SimClass {
    SimClass {
        name: name.into(),
        tgid,
        threads,
        watts,
        weight: 1.0,
        mean_run_ns: 3_000_000,
        functions: vec![2.0, 1.0],
        cpus,
    }
}

/// The machine: 2 CPUs, 6 W static, 10 W per busy CPU. "pinned" runs on CPU 0 and
/// never sleeps; "half" runs about half the time on CPU 1.
pub fn one_cpu_always_busy(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        cpus_per_package: 2,
        duration_ns: 12_000_000_000,
        static_w: 6.0,
        idle_weight: 1.0,
        mean_idle_ns: 3_000_000,
        never_idle_cpus: vec![0],
        classes: vec![
            SimClass {
                mean_run_ns: 5_000_000,
                ..class("pinned", 1, 10.0, 1, vec![0])
            },
            SimClass {
                mean_run_ns: 3_000_000,
                ..class("half", 2, 10.0, 1, vec![1])
            },
        ],
        ..SimConfig::default()
    }
}

/// Every CPU always busy: a 15 W and a 5 W process share both CPUs in phases.
pub fn all_cpus_always_busy(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        cpus_per_package: 2,
        duration_ns: 12_000_000_000,
        static_w: 6.0,
        never_idle_cpus: vec![0, 1],
        classes: vec![
            SimClass {
                mean_run_ns: 4_000_000,
                ..class("hot", 1, 15.0, 2, Vec::new())
            },
            SimClass {
                mean_run_ns: 4_000_000,
                ..class("cool", 2, 5.0, 2, Vec::new())
            },
        ],
        ..SimConfig::default()
    }
}

/// Two cores of two SMT siblings, 10 W per busy thread alone: "shared" often runs on both
/// siblings of core 0, "alone" never shares core 1.
pub fn smt_siblings(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        cpus_per_package: 4,
        threads_per_core: 2,
        smt_extra: 0.25,
        duration_ns: 12_000_000_000,
        static_w: 6.0,
        never_idle_cpus: vec![0, 2],
        classes: vec![
            SimClass {
                mean_run_ns: 3_000_000,
                ..class("shared", 1, 10.0, 2, vec![0, 1])
            },
            SimClass {
                mean_run_ns: 3_000_000,
                ..class("alone", 2, 10.0, 1, vec![2])
            },
        ],
        ..SimConfig::default()
    }
}
