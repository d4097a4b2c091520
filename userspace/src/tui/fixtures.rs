//! Snapshots shared by the TUI's unit tests.

use super::snapshot::{DomainPower, Header, ProcessRow, Snapshot, ThreadRow};

/// A process with the given figures; `share` is derived from a 50 W machine.
pub fn process(pid: u32, comm: &str, power_w: f64, energy_j: f64, cpu_pct: f64) -> ProcessRow {
    ProcessRow {
        pid,
        comm: comm.to_string(),
        cmdline: format!("/usr/bin/{comm} --run"),
        cgroup: "/user.slice".to_string(),
        power_w,
        since_start_j: energy_j,
        cpu_pct,
        share: power_w / 50.0,
        threads: Vec::new(),
        ..ProcessRow::default()
    }
}

/// A thread with the given figures.
pub fn thread(tid: u32, comm: &str, power_w: f64, cpu_pct: f64) -> ThreadRow {
    ThreadRow {
        tid,
        comm: comm.to_string(),
        power_w,
        since_start_j: power_w * 10.0,
        cpu_pct,
        share: power_w / 50.0,
        ..ThreadRow::default()
    }
}

/// Four processes whose order differs for every sort column:
/// power: 300 > 20 > 4000 > 1; energy: 4000 > 1 > 20 > 300; cpu: 20 > 4000 > 300 > 1;
/// share follows power; pid: 1 < 20 < 300 < 4000; command: bash < nginx < postgres < zsh.
pub fn four_processes() -> Vec<ProcessRow> {
    let mut db = process(300, "postgres", 20.0, 5.0, 40.0);
    db.cgroup = "/system.slice/docker-0123456789abcdef0123456789abcdef.scope".to_string();
    db.container_id = "0123456789abcdef0123456789abcdef".to_string();
    db.threads = vec![
        thread(301, "pg-writer", 12.0, 20.0),
        thread(302, "pg-wal", 8.0, 20.0),
    ];
    let mut web = process(20, "nginx", 8.0, 30.0, 90.0);
    web.cgroup = db.cgroup.clone();
    let shell = process(4000, "bash", 2.0, 500.0, 50.0);
    let init = process(1, "zsh", 0.5, 100.0, 0.1);
    vec![shell, db, init, web]
}

/// A snapshot of [`four_processes`] on a 2-package machine with a GPU.
pub fn snapshot(estimated: bool) -> Snapshot {
    Snapshot {
        start_ns: 0,
        totals: Default::default(),
        ts_ns: 42_000_000_000,
        interval_s: 1.0,
        header: Header {
            domains: vec![
                DomainPower {
                    name: "package-0".to_string(),
                    watts: 25.5,
                },
                DomainPower {
                    name: "dram-0".to_string(),
                    watts: 3.25,
                },
                DomainPower {
                    name: "gpu-0".to_string(),
                    watts: 21.25,
                },
            ],
            idle_w: 10.0,
            total_w: 50.0,
            source: if estimated { "model" } else { "powercap" }.to_string(),
            estimated,
            sample_hz: 49,
            lost_events: 7,
            cpus: 2,
            model_row: None,
        },
        rows: four_processes(),
    }
}

/// `snap` with its package's static power unidentified (every CPU always busy).
pub fn unidentified(mut snap: Snapshot) -> Snapshot {
    use crate::attribute::{PowerModelUsed, StaticOrigin, Unidentified};
    let origin = StaticOrigin::Unidentified {
        reason: Unidentified::NoSpread,
        fit: None,
    };
    snap.totals.static_power = vec![crate::pipeline::StaticPower {
        source: "package-0".into(),
        static_w: 0.0,
        warning: origin.warning(),
        origin,
        bound_w: 20.0,
        clamped_from_w: None,
        power_model: PowerModelUsed::Time,
        power_model_spread: None,
        note: None,
    }];
    snap
}
