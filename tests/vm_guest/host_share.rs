//! A stand-in for the host agent's VM directory writer, in the contract's format
//! (docs/virtual-machines.md): every second, the VM's cumulative energy, a static share of
//! `static_w` plus `per_cpu_w` per CPU-second the qemu process ran on this host (the
//! emulated-RAPL model of `util::BusyEmulator`, applied to the VM's threads), zone file
//! first, then `energy-bpf.json`, each written atomically. It can be killed and restarted
//! like the agent: a restart continues the counters from the directory and counts a gap,
//! without inventing the energy of the time it was down. Every value written is logged, so
//! a test can check the guest read only real host values.
use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// What the writer put in the share: (seq, cumulative µJ, cumulative static µJ).
pub type Log = Arc<Mutex<Vec<(u64, u64, u64)>>>;

/// The running writer; stops (leaving the directory as it is) on drop or [`HostShare::kill`].
pub struct HostShare {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// A qemu process's CPU time on this host, ns (all its threads).
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| {
            std::fs::read_to_string(t.path().join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn put(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write share file");
    std::fs::rename(&tmp, dir.join(name)).expect("rename share file");
}

impl HostShare {
    /// Starts writing `dir` for the VM whose qemu process is `pid`, continuing from what the
    /// directory holds when it names the same instance (and counting the restart as a gap).
    pub fn start(dir: &Path, pid: u32, static_w: f64, per_cpu_w: f64, log: Log) -> Self {
        let zone = dir.join("intel-rapl:0");
        std::fs::create_dir_all(&zone).expect("zone dir");
        put(&zone, "name", "package-0\n");
        put(&zone, "max_energy_range_uj", "9223372036854775807\n");
        let instance = format!("{pid}:test");
        let previous: Option<serde_json::Value> = std::fs::read(dir.join("energy-bpf.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(|m: &serde_json::Value| m["instance"] == instance.as_str());
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, dir) = (stop.clone(), PathBuf::from(dir));
            std::thread::spawn(move || {
                let prev = |k: &str| previous.as_ref().map_or(0, |m| m[k].as_u64().unwrap_or(0));
                let zone_prev = |k: &str| {
                    previous
                        .as_ref()
                        .map_or(0, |m| m["zones"]["package"][k].as_u64().unwrap_or(0))
                };
                let (base_uj, base_static, mut seq) =
                    (zone_prev("energy_uj"), zone_prev("static_uj"), prev("seq"));
                let gaps = prev("gaps") + u64::from(previous.is_some());
                let missing_ms = previous.as_ref().map_or(0, |_| {
                    std::fs::metadata(dir.join("energy-bpf.json"))
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .map_or(0, |d| d.as_millis() as u64)
                });
                let (t0, cpu0) = (Instant::now(), cpu_ns(pid));
                while !stop.load(Ordering::Relaxed) {
                    seq += 1;
                    let secs = t0.elapsed().as_secs_f64();
                    let cpu_s = cpu_ns(pid).saturating_sub(cpu0) as f64 / 1e9;
                    let stat = base_static + (static_w * secs * 1e6) as u64;
                    let uj = base_uj + ((static_w * secs + per_cpu_w * cpu_s) * 1e6) as u64;
                    put(&dir.join("intel-rapl:0"), "energy_uj", &format!("{uj}\n"));
                    let last_gap = (gaps > 0).then(|| {
                        serde_json::json!({"seq": seq, "reason": "host agent restarted",
                            "missing_ms": missing_ms})
                    });
                    let meta = serde_json::json!({
                        "format": 1, "vm": "e2e-guest", "instance": instance, "seq": seq,
                        "interval_ms": 1000, "vcpus": 2, "static_policy": "vcpus",
                        "measured": true, "host_source": "powercap",
                        "zones": {"package": {"energy_uj": uj, "static_uj": stat}},
                        "gaps": gaps, "last_gap": last_gap,
                    });
                    put(&dir, "energy-bpf.json", &format!("{meta}\n"));
                    log.lock().expect("log").push((seq, uj, stat));
                    let next = Duration::from_secs_f64(seq as f64 - prev("seq") as f64);
                    std::thread::sleep(next.saturating_sub(t0.elapsed()));
                }
            })
        };
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops writing, as a killed agent does: the directory stays as it was.
    pub fn kill(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HostShare {
    fn drop(&mut self) {
        self.halt();
    }
}
