//! Simulator scenarios of the busy-machine cases (static power, SMT, DVFS) shared by the unit
//! tests and the accuracy bench, so both measure the same machines.

use super::sim::{ClassDuty, DutyCycle, SimClass, SimConfig};

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
        ghz: 0.0,
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

/// DVFS: four processes on 4 CPUs at 1.2, 2.0, 3.0 and 3.6 GHz, each drawing 5 W per GHz
/// (dynamic power ∝ frequency at a fixed voltage step): equal busy time is not equal
/// energy. Each run's switch event carries its cycles, as the probe's counter would.
pub fn dvfs_classes(seed: u64) -> SimConfig {
    let at = |name: &str, tgid: u32, ghz: f64, weight: f64| SimClass {
        weight,
        ghz,
        mean_run_ns: 2_000_000,
        ..class(name, tgid, 5.0 * ghz, 4, Vec::new())
    };
    SimConfig {
        seed,
        cpus_per_package: 4,
        duration_ns: 12_000_000_000,
        static_w: 6.0,
        classes: vec![
            at("eco-1.2GHz", 1, 1.2, 1.0),
            at("base-2.0GHz", 2, 2.0, 0.8),
            at("fast-3.0GHz", 3, 3.0, 0.8),
            at("turbo-3.6GHz", 4, 3.6, 0.6),
        ],
        ..SimConfig::default()
    }
}

/// The never-idle machine of issue 22: 2 CPUs, 6 W static, a spinner pinned to CPU 0 that
/// never sleeps (10 W) and a process on CPU 1 that spins 10 ms and sleeps 10 ms (10 W), both
/// stretches ± 1 ms. Every 50 ms row averages about 1.5 busy CPUs: only rows as short as
/// the counter resolves see the load change. `update_period_ns` is the counter's (RAPL:
/// 1 ms); the reads come every `max(10 ms, 5 updates)`, as the recorder's.
pub fn duty_cycle_beside_spinner(seed: u64, update_period_ns: u64) -> SimConfig {
    SimConfig {
        seed,
        cpus_per_package: 2,
        duration_ns: 10_000_000_000,
        static_w: 6.0,
        update_period_ns,
        read_period_ns: 10_000_000u64.max(5 * update_period_ns),
        never_idle_cpus: vec![0],
        duty_cycles: vec![DutyCycle {
            cpu: 1,
            on_ns: 10_000_000,
            off_ns: 10_000_000,
            jitter_ns: 1_000_000,
        }],
        classes: vec![
            SimClass {
                mean_run_ns: 4_000_000,
                ..class("spinner", 1, 10.0, 1, vec![0])
            },
            SimClass {
                mean_run_ns: 10_000_000,
                ..class("duty-10ms", 2, 10.0, 1, vec![1])
            },
        ],
        ..SimConfig::default()
    }
}

/// [`duty_cycle_beside_spinner`] with a 1 ms counter that the reads follow in step, 100 µs
/// after each update (a counter a writer updates just before the reader runs), not at any
/// moment between updates.
pub fn duty_cycle_reads_in_step(seed: u64) -> SimConfig {
    SimConfig {
        read_lag_ns: Some(100_000),
        ..duty_cycle_beside_spinner(seed, 1_000_000)
    }
}

/// Three always-runnable processes of 15, 5 and 10 W sharing 2 CPUs (every CPU always
/// busy), 6 W static, 10 s, rotated fairly in 3 ms slices as a fair scheduler does: each
/// process gets 2/3 of a CPU and a row's shares differ from that by about one slice, so
/// per-class watts come only from that small variation.
pub fn three_always_runnable(seed: u64) -> SimConfig {
    let spin = |name: &str, tgid: u32, watts: f64| SimClass {
        mean_run_ns: 3_000_000,
        ..class(name, tgid, watts, 2, Vec::new())
    };
    SimConfig {
        seed,
        cpus_per_package: 2,
        duration_ns: 10_000_000_000,
        static_w: 6.0,
        phase_ns: 0,
        rotation_slice_ns: 3_000_000,
        never_idle_cpus: vec![0, 1],
        classes: vec![
            spin("w15", 1, 15.0),
            spin("w5", 2, 5.0),
            spin("w10", 3, 10.0),
        ],
        ..SimConfig::default()
    }
}

/// The energy counter a power-model scenario is read through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// RAPL: updated every ~1 ms by the hardware, read at any moment (within 1 ms).
    Rapl,
    /// A writer that updates the counter every 3 ms and, when the CPUs are busy, gets a
    /// CPU up to 5 ms later: its lag grows with the load.
    Lagging,
    /// A counter a host shares into a VM: updated about once a second.
    Vm,
}

impl Counter {
    /// Every counter, in table order.
    pub const ALL: [Counter; 3] = [Counter::Rapl, Counter::Lagging, Counter::Vm];

    /// How tables name it.
    pub fn name(self) -> &'static str {
        match self {
            Counter::Rapl => "1 ms (RAPL)",
            Counter::Lagging => "3 ms + up to 5 ms under load",
            Counter::Vm => "1 s (VM's shared counter)",
        }
    }

    /// `cfg` read through this counter.
    pub fn apply(self, cfg: SimConfig) -> SimConfig {
        match self {
            Counter::Rapl => cfg,
            Counter::Lagging => SimConfig {
                update_period_ns: 3_000_000,
                update_jitter_ns: 100_000,
                update_delay_ns: 5_000_000,
                ..cfg
            },
            // Each update timed within 2 ms, as the hypervisor source's phase lock times a
            // share that is cheap to read (`energy::reader`, `PhaseLock`); reads that saw
            // no update are not written.
            Counter::Vm => SimConfig {
                update_period_ns: 1_000_000_000,
                update_jitter_ns: 5_000_000,
                read_period_ns: 2_000_000,
                ..cfg
            },
        }
    }
}

/// Three processes that each loop between work and sleep, with their own duty cycles, on 2
/// CPUs (6 W static, 20 s): "w15" draws 15 W per CPU-second, "w5" 5 W (3:1), "w8" 8 W.
/// `watts` replaces the three powers (equal watts: [10, 10, 10]).
pub fn mixed_duty_watts(seed: u64, watts: [f64; 3]) -> SimConfig {
    let worker = |name: &str, tgid: u32, w: f64| SimClass {
        mean_run_ns: 4_000_000,
        ..class(name, tgid, w, 2, Vec::new())
    };
    let duty = |tgid: u32, on_ms: u64, off_ms: u64| ClassDuty {
        tgid,
        on_ns: on_ms * 1_000_000,
        off_ns: off_ms * 1_000_000,
        jitter_ns: (on_ms.min(off_ms) / 3) * 1_000_000,
    };
    SimConfig {
        seed,
        cpus_per_package: 2,
        duration_ns: 20_000_000_000,
        static_w: 6.0,
        idle_weight: 0.0,
        phase_ns: 0,
        classes: vec![
            worker("w15", 1, watts[0]),
            worker("w5", 2, watts[1]),
            worker("w8", 3, watts[2]),
        ],
        class_duty: vec![duty(1, 70, 50), duty(2, 40, 80), duty(3, 300, 200)],
        ..SimConfig::default()
    }
}

/// [`mixed_duty_watts`] at 15, 5 and 8 W.
pub fn mixed_duty(seed: u64) -> SimConfig {
    mixed_duty_watts(seed, [15.0, 5.0, 8.0])
}

/// Two processes in phases of seconds with idle gaps between (2 CPUs, 6 W static, 20 s):
/// "w12" (12 W per CPU-second) works about 2 s and sleeps 1.5 s, "w4" (4 W) works 1.5 s
/// and sleeps 2 s, so they run alone, together, or not at all.
pub fn phased(seed: u64) -> SimConfig {
    let worker = |name: &str, tgid: u32, w: f64| SimClass {
        mean_run_ns: 4_000_000,
        ..class(name, tgid, w, 2, Vec::new())
    };
    let duty = |tgid: u32, on_ms: u64, off_ms: u64| ClassDuty {
        tgid,
        on_ns: on_ms * 1_000_000,
        off_ns: off_ms * 1_000_000,
        jitter_ns: 500_000_000,
    };
    SimConfig {
        seed,
        cpus_per_package: 2,
        duration_ns: 20_000_000_000,
        static_w: 6.0,
        idle_weight: 0.0,
        phase_ns: 0,
        classes: vec![worker("w12", 1, 12.0), worker("w4", 2, 4.0)],
        class_duty: vec![duty(1, 2_000, 1_500), duty(2, 1_500, 2_000)],
        ..SimConfig::default()
    }
}
