//! A background thread that advances fake energy counters about every 1 ms at given watts,
//! like RAPL hardware (IgProf RAPL: ≈ 1 ms updates), and keeps the exact energy it added.

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    os::unix::fs::FileExt,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use crate::clock::monotonic_ns;

/// Where a fake counter lives.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// A sysfs-style text file holding a decimal count (powercap `energy_uj`, hwmon
    /// `energyN_input`); replaced atomically (write + rename) like sysfs regenerating it.
    Text(PathBuf),
    /// Eight little-endian bytes at `offset` (= register number) of an MSR file.
    Msr {
        /// The `N/msr` file.
        path: PathBuf,
        /// The register.
        offset: u64,
    },
}

/// One fake counter: its file, its unit and where it wraps.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeCounter {
    /// Name used to ask for its total (zone id, hwmon label, register label).
    pub label: String,
    /// Where it is written.
    pub target: Target,
    /// µJ per count.
    pub unit_uj: f64,
    /// Count at which it wraps to 0.
    pub modulus: Option<u64>,
}

impl FakeCounter {
    /// Reads the counter's current raw value from its file.
    pub fn read_raw(&self) -> std::io::Result<u64> {
        match &self.target {
            Target::Text(path) => std::fs::read_to_string(path)?
                .trim()
                .parse()
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Target::Msr { path, offset } => {
                let mut buf = [0u8; 8];
                std::fs::File::open(path)?.read_exact_at(&mut buf, *offset)?;
                Ok(u64::from_le_bytes(buf))
            }
        }
    }

    /// Writes a raw value (wrapped to the modulus).
    pub fn write_raw(&self, value: u64) -> std::io::Result<()> {
        let value = self.modulus.map_or(value, |m| value % m);
        match &self.target {
            Target::Text(path) => {
                let mut tmp = path.clone().into_os_string();
                tmp.push(".tmp");
                std::fs::write(&tmp, format!("{value}\n"))?;
                std::fs::rename(&tmp, path)
            }
            Target::Msr { path, offset } => {
                let file = OpenOptions::new().write(true).open(path)?;
                file.write_all_at(&value.to_le_bytes(), *offset)
            }
        }
    }
}

struct State {
    counter: FakeCounter,
    watts: f64,
    raw: u64,
    carry_uj: f64,
    added_counts: u64,
    alive: bool,
}

/// Handle of a running emulator. Dropping it stops the thread.
pub struct Emulator {
    stop: Arc<AtomicBool>,
    states: Arc<Mutex<Vec<State>>>,
    thread: Option<JoinHandle<()>>,
}

/// How often the counters advance.
pub const TICK: Duration = Duration::from_millis(1);

impl Emulator {
    /// Starts advancing each counter at its watts, from the value its file holds now.
    pub fn spawn(counters: Vec<(FakeCounter, f64)>) -> std::io::Result<Self> {
        let states = counters
            .into_iter()
            .map(|(counter, watts)| {
                let raw = counter.read_raw()?;
                Ok(State {
                    counter,
                    watts,
                    raw,
                    carry_uj: 0.0,
                    added_counts: 0,
                    alive: true,
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let states = Arc::new(Mutex::new(states));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (states, stop) = (states.clone(), stop.clone());
            std::thread::Builder::new()
                .name("fake-energy".into())
                .spawn(move || {
                    let mut last = monotonic_ns();
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(TICK);
                        let now = monotonic_ns();
                        let dt_ns = now - last;
                        last = now;
                        let mut states = states
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        for s in states.iter_mut().filter(|s| s.alive) {
                            // W × ns = 1e-3 µJ.
                            s.carry_uj += s.watts * dt_ns as f64 * 1e-3;
                            let counts = (s.carry_uj / s.counter.unit_uj).floor();
                            if counts < 1.0 {
                                continue;
                            }
                            s.carry_uj -= counts * s.counter.unit_uj;
                            let counts = counts as u64;
                            let next = s
                                .counter
                                .modulus
                                .map_or(s.raw + counts, |m| (s.raw + counts) % m);
                            // A counter whose file vanished stays dead (the test removed it).
                            if s.counter.write_raw(next).is_err() {
                                s.alive = false;
                                continue;
                            }
                            s.raw = next;
                            s.added_counts += counts;
                        }
                    }
                })?
        };
        Ok(Self {
            stop,
            states,
            thread: Some(thread),
        })
    }

    /// Exact energy added to each counter so far, µJ (counts written × unit), by label.
    pub fn totals_uj(&self) -> BTreeMap<String, f64> {
        let states = self
            .states
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        states
            .iter()
            .map(|s| {
                (
                    s.counter.label.clone(),
                    s.added_counts as f64 * s.counter.unit_uj,
                )
            })
            .collect()
    }

    /// Stops advancing (the files keep their last values) and returns [`Self::totals_uj`].
    pub fn stop(mut self) -> BTreeMap<String, f64> {
        self.halt();
        self.totals_uj()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.halt();
    }
}
