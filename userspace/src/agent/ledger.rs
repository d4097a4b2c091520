//! The ledger: energy per metric series since the agent started, kept so that the
//! Prometheus rules hold at every scrape (docs/ARCHITECTURE.md, "Agent"):
//! - per zone, the process series sum to the node's `mode="active"` energy: energy no
//!   thread could be given goes to `comm="[unknown]"`;
//! - a series' total never decreases;
//! - an exited process keeps its series for `linger` windows, then its total moves into
//!   `comm="[exited]"`;
//! - at most `max_series` processes have a series of their own; energy of the rest goes to
//!   `comm="[other]"`.
//!
//! Pure: it reads rows the pipeline made (never computing a per-process number itself) and
//! asks the caller whether a pid is still alive.

use std::collections::{BTreeMap, HashMap};

use crate::{
    container::ContainerRef,
    pipeline::{DomainJoules, ProcessRow},
};

/// Energy per zone name, J.
pub type Zones = BTreeMap<&'static str, f64>;

/// Series that stand for many processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Bucket {
    /// Energy of the zone's active power that no thread could be given.
    Unknown,
    /// Processes beyond `max_series`.
    Other,
    /// Processes that exited more than `linger` windows ago.
    Exited,
}

impl Bucket {
    /// The `comm` label of the bucket's series.
    pub fn comm(self) -> &'static str {
        match self {
            Bucket::Unknown => "[unknown]",
            Bucket::Other => "[other]",
            Bucket::Exited => "[exited]",
        }
    }

    /// Every bucket, in label order.
    pub const ALL: [Bucket; 3] = [Bucket::Unknown, Bucket::Other, Bucket::Exited];
}

/// A process with a series of its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tracked {
    /// `comm` of its latest row.
    pub comm: String,
    /// Container and pod from its latest row's cgroup path.
    pub container: ContainerRef,
    /// Energy since it got its series, J per zone.
    pub joules: Zones,
    /// Power over the last window, W per zone (0 when it did not run).
    pub watts: Zones,
    last_seen: u64,
    exited_at: Option<u64>,
}

/// One container's (or pod's) energy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerEnergy {
    /// Energy since the agent started, J per zone.
    pub joules: Zones,
    last_seen: u64,
}

/// What one window contributes.
#[derive(Clone, Copy, Debug)]
pub struct WindowEnergy<'a> {
    /// Window length, s.
    pub secs: f64,
    /// Measured energy per zone, J.
    pub measured: &'a DomainJoules,
    /// Idle (static) energy per zone, J.
    pub idle: &'a DomainJoules,
    /// Energy no thread could be given, per zone, J.
    pub unknown: &'a DomainJoules,
    /// The window's process rows.
    pub rows: &'a [ProcessRow],
    /// Pids whose main thread exited in the window.
    pub exited: &'a [u32],
}

/// Series totals since the agent started.
#[derive(Clone, Debug)]
pub struct Ledger {
    max_series: usize,
    linger: u64,
    container_linger: u64,
    window: u64,
    /// `mode="active"` and `mode="idle"` energy per zone.
    pub active: Zones,
    /// See `active`.
    pub idle: Zones,
    /// Processes with their own series, by pid.
    pub processes: HashMap<u32, Tracked>,
    /// The shared series, J per zone.
    pub buckets: BTreeMap<Bucket, Zones>,
    /// Last window's power of the shared series, W per zone.
    pub bucket_watts: BTreeMap<Bucket, Zones>,
    /// Energy per (container id, pod UID), either possibly empty.
    pub containers: HashMap<(String, String), ContainerEnergy>,
}

impl Ledger {
    /// An empty ledger. `linger`: windows an exited process keeps its series;
    /// `container_linger`: windows a container with no running process keeps its series.
    pub fn new(max_series: usize, linger: u64, container_linger: u64) -> Self {
        Self {
            max_series,
            linger,
            container_linger,
            window: 0,
            active: Zones::new(),
            idle: Zones::new(),
            processes: HashMap::new(),
            buckets: BTreeMap::new(),
            bucket_watts: BTreeMap::new(),
            containers: HashMap::new(),
        }
    }

    /// Changes the series limit; processes beyond it fold into `[other]`, the least
    /// recently seen first.
    pub fn set_max_series(&mut self, max_series: usize) {
        self.max_series = max_series;
        self.evict();
    }

    /// Adds one window. `alive(pid)` is asked about a process not seen for `linger`
    /// windows, in case its exit event was lost.
    pub fn apply(&mut self, w: &WindowEnergy<'_>, alive: &dyn Fn(u32) -> bool) {
        self.window += 1;
        let now = self.window;
        let secs = w.secs.max(1e-9);
        let zones: std::collections::BTreeSet<&'static str> =
            w.measured.keys().chain(w.idle.keys()).copied().collect();
        for z in zones {
            let measured = w.measured.get(z).copied().unwrap_or(0.0);
            let idle = w.idle.get(z).copied().unwrap_or(0.0);
            *self.active.entry(z).or_default() += (measured - idle).max(0.0);
            *self.idle.entry(z).or_default() += idle.max(0.0);
        }
        for t in self.processes.values_mut() {
            t.watts.clear();
        }
        self.bucket_watts.clear();
        add(
            self.buckets.entry(Bucket::Unknown).or_default(),
            self.bucket_watts.entry(Bucket::Unknown).or_default(),
            w.unknown,
            secs,
        );
        for row in w.rows {
            let c = row.container();
            if !c.is_empty() {
                let key = (
                    c.container_id.clone().unwrap_or_default(),
                    c.pod_uid.clone().unwrap_or_default(),
                );
                let entry = self.containers.entry(key).or_default();
                entry.last_seen = now;
                for (&z, &j) in &row.energy_j {
                    *entry.joules.entry(z).or_default() += j.max(0.0);
                }
            }
            if !self.processes.contains_key(&row.pid) && self.processes.len() < self.max_series {
                self.processes.insert(row.pid, Tracked::default());
            }
            match self.processes.get_mut(&row.pid) {
                Some(t) => {
                    if !row.comm.is_empty() {
                        t.comm.clone_from(&row.comm);
                    }
                    if !c.is_empty() {
                        t.container = c;
                    }
                    t.last_seen = now;
                    t.exited_at = None;
                    add(&mut t.joules, &mut t.watts, &row.energy_j, secs);
                }
                None => add(
                    self.buckets.entry(Bucket::Other).or_default(),
                    self.bucket_watts.entry(Bucket::Other).or_default(),
                    &row.energy_j,
                    secs,
                ),
            }
        }
        for pid in w.exited {
            if let Some(t) = self.processes.get_mut(pid) {
                t.exited_at = Some(now);
            }
        }
        // Fold processes gone for `linger` windows; one whose exit event was lost is
        // noticed when it has not run for as long and no longer exists.
        let linger = self.linger;
        let gone: Vec<u32> = self
            .processes
            .iter()
            .filter(|(pid, t)| match t.exited_at {
                Some(at) => now - at >= linger,
                None => now - t.last_seen >= linger && !alive(**pid),
            })
            .map(|(pid, _)| *pid)
            .collect();
        for pid in gone {
            self.fold(pid, Bucket::Exited);
        }
        self.evict();
        let container_linger = self.container_linger;
        self.containers
            .retain(|_, c| now - c.last_seen < container_linger);
    }

    fn evict(&mut self) {
        while self.processes.len() > self.max_series {
            let Some(pid) = self
                .processes
                .iter()
                .min_by_key(|(pid, t)| (t.last_seen, **pid))
                .map(|(pid, _)| *pid)
            else {
                return;
            };
            self.fold(pid, Bucket::Other);
        }
    }

    fn fold(&mut self, pid: u32, into: Bucket) {
        if let Some(t) = self.processes.remove(&pid) {
            let bucket = self.buckets.entry(into).or_default();
            for (z, j) in t.joules {
                *bucket.entry(z).or_default() += j;
            }
        }
    }

    /// Sum of every process series per zone (own series and buckets): equals
    /// [`Self::active`] up to rounding.
    #[cfg(test)]
    pub fn process_sum(&self) -> Zones {
        let mut sum = Zones::new();
        let all = self
            .processes
            .values()
            .map(|t| &t.joules)
            .chain(self.buckets.values());
        for zones in all {
            for (&z, &j) in zones {
                *sum.entry(z).or_default() += j;
            }
        }
        sum
    }
}

fn add(total: &mut Zones, watts: &mut Zones, joules: &DomainJoules, secs: f64) {
    for (&z, &j) in joules {
        let j = j.max(0.0);
        *total.entry(z).or_default() += j;
        *watts.entry(z).or_default() += j / secs;
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
