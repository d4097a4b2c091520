//! What the host agent wrote into a VM's directory, as it wrote it: a thread reads
//! `energy-bpf.json` every 50 ms and keeps each new `seq` with its package energy and
//! static share, so a test can check that the guest read only values the host wrote, and
//! measure the host's static share for the VM from the host's own numbers.
use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// One write: (seq, cumulative µJ, cumulative static µJ, when it was seen).
pub type Write = (u64, u64, u64, Instant);

/// The polling thread; stops on drop.
pub struct ShareLog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    writes: Arc<Mutex<Vec<Write>>>,
}

impl ShareLog {
    /// Starts watching the VM directory `dir`.
    pub fn start(dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let writes: Arc<Mutex<Vec<Write>>> = Default::default();
        let thread = {
            let (stop, writes, dir) = (stop.clone(), writes.clone(), PathBuf::from(dir));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let meta: Option<serde_json::Value> =
                        std::fs::read(dir.join("energy-bpf.json"))
                            .ok()
                            .and_then(|b| serde_json::from_slice(&b).ok());
                    if let Some(m) = meta {
                        let pkg = &m["zones"]["package"];
                        let write = (
                            m["seq"].as_u64().unwrap_or(0),
                            pkg["energy_uj"].as_u64().unwrap_or(0),
                            pkg["static_uj"].as_u64().unwrap_or(0),
                            Instant::now(),
                        );
                        let mut w = writes.lock().expect("writes");
                        if w.last().is_none_or(|l| l.0 != write.0) {
                            w.push(write);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Self {
            stop,
            thread: Some(thread),
            writes,
        }
    }

    /// The writes seen so far.
    pub fn writes(&self) -> Vec<Write> {
        self.writes.lock().expect("writes").clone()
    }
}

impl Drop for ShareLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
