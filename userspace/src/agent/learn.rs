//! Static power learned over hours (issue 10: "It keeps the lowest-utilisation intervals,
//! persisted, so a fleet needs no manual step"). Per energy source a bounded [`Keeper`]
//! holds the quietest load rows the agent has seen, spread over distinct utilisation
//! levels; the zero-load fit attribution uses ([`crate::attribute::zero_load`]) over them
//! gives a [`Learned`] static power with the same identifiability checks (spread, levels,
//! residual, bootstrap interval), never above the lowest kept interval power. Without a
//! calibration file it becomes the static power of later windows (origin `learned`).
//! Persistence is in [`super::learn_store`].

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

use super::learn_store;
use crate::attribute::{
    Learned, Unidentified,
    load::{LoadRow, SourceLoad},
    zero_load::{PowerRow, fit_zero_load},
};

/// Intervals kept per source.
pub const CAPACITY: usize = 64;
/// Distinct utilisation levels kept: the lowest ones seen. With [`CAPACITY`] each level
/// keeps at least 4 intervals once all are in use.
pub const MAX_LEVELS: usize = 16;
/// Narrowest level, busy CPUs: the bin the zero-load fit counts levels in.
const MIN_LEVEL_CPUS: f64 = 0.05;
/// Length of a learned interval: 1 s of a counter updated every ~1 ms is read to 0.1%.
pub const ROW_NS: u64 = 1_000_000_000;

/// One kept interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    /// End, Unix seconds (wall clock: it outlives reboots).
    pub unix_s: f64,
    /// Length, s.
    pub secs: f64,
    /// Mean power, W.
    pub power_w: f64,
    /// Mean busy CPUs of the source's CPUs.
    pub busy_cpus: f64,
    /// Activity events per second, when the runs carried counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity_per_s: Option<f64>,
}

impl Kept {
    /// A window's load row, stamped with the wall clock (`unix_offset_ns` = Unix time −
    /// CLOCK_MONOTONIC).
    pub fn from_row(row: &LoadRow, unix_offset_ns: i128) -> Self {
        Self {
            unix_s: (i128::from(row.end_ns) + unix_offset_ns) as f64 / 1e9,
            secs: row.len_ns as f64 / 1e9,
            power_w: row.power_w,
            busy_cpus: row.busy_cpus,
            activity_per_s: row.activity_per_s,
        }
    }

    fn valid(&self) -> bool {
        [self.unix_s, self.secs, self.power_w, self.busy_cpus]
            .iter()
            .all(|v| v.is_finite() && *v >= 0.0)
            && self.secs > 0.0
    }
}

/// The quietest intervals of one source, bounded: at most [`CAPACITY`] intervals, in
/// utilisation levels (bins of `level_cpus` busy CPUs). Until it is full it keeps all.
/// Then:
/// - an interval above every kept level is refused once [`MAX_LEVELS`] levels are kept,
///   and while more levels are kept, the highest gives up its oldest interval for each new
///   one: the lowest levels seen survive, and a quiet spell never empties the keeper at
///   once;
/// - otherwise the most crowded level gives up its oldest interval (ties: the highest):
///   levels share the room, so a machine idle 99% of the time still keeps its few busier
///   levels, which the fit needs to find the slope, and kept intervals stay recent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Keeper {
    /// Width of a level, busy CPUs.
    pub level_cpus: f64,
    /// Kept intervals, oldest first.
    pub kept: Vec<Kept>,
}

impl Keeper {
    /// An empty keeper for a source of `cpus` CPUs: levels are 1/64 of them wide, at least
    /// 0.05 CPU, so 16 levels span a quarter of a large machine.
    pub fn new(cpus: usize) -> Self {
        Self {
            level_cpus: (cpus as f64 / 64.0).max(MIN_LEVEL_CPUS),
            kept: Vec::new(),
        }
    }

    fn level(&self, busy_cpus: f64) -> i64 {
        level_of(busy_cpus, self.level_cpus)
    }

    fn levels(&self) -> BTreeMap<i64, usize> {
        let mut levels = BTreeMap::new();
        for k in &self.kept {
            *levels.entry(self.level(k.busy_cpus)).or_insert(0) += 1;
        }
        levels
    }

    /// Offers an interval; returns whether it was kept.
    pub fn offer(&mut self, k: Kept) -> bool {
        if !k.valid() {
            return false;
        }
        let level = self.level(k.busy_cpus);
        let levels = self.levels();
        if self.kept.len() >= CAPACITY
            && levels.len() >= MAX_LEVELS
            && levels.keys().all(|&l| l < level)
        {
            return false;
        }
        self.kept.push(k);
        self.trim();
        self.kept.contains(&k)
    }

    /// Restores the bound, one interval at a time (after a push, or a file read back).
    fn trim(&mut self) {
        while self.kept.len() > CAPACITY {
            let levels = self.levels();
            // Too many levels: the highest gives way; else the most crowded (the highest
            // among equals).
            let victim = if levels.len() > MAX_LEVELS {
                levels.keys().next_back().copied()
            } else {
                levels
                    .iter()
                    .max_by_key(|&(l, n)| (*n, *l))
                    .map(|(&l, _)| l)
            };
            // `kept` is oldest first, so the first of that level is its oldest.
            let Some(i) =
                victim.and_then(|v| self.kept.iter().position(|k| self.level(k.busy_cpus) == v))
            else {
                return;
            };
            self.kept.remove(i);
        }
    }

    /// Takes intervals read back from disk for a source of `cpus` CPUs: invalid ones
    /// dropped, ordered oldest first, bounded as if they had been offered.
    pub fn sanitised(mut self, cpus: usize) -> Self {
        self.level_cpus = Self::new(cpus).level_cpus;
        self.kept.retain(Kept::valid);
        self.kept.sort_by(|a, b| a.unix_s.total_cmp(&b.unix_s));
        self.trim();
        self
    }

    /// The static power these intervals identify, or why they do not (yet).
    pub fn estimate(&self) -> Result<Learned, Unidentified> {
        let rows: Vec<PowerRow> = self
            .kept
            .iter()
            .map(|k| PowerRow {
                power_w: k.power_w,
                busy_cpus: k.busy_cpus,
            })
            .collect();
        let fit = fit_zero_load(&rows).map_err(|(reason, _)| reason)?;
        let lowest = rows.iter().map(|r| r.power_w).fold(f64::INFINITY, f64::min);
        let (first, last) = self
            .kept
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), k| {
                (a.min(k.unix_s - k.secs), b.max(k.unix_s))
            });
        Ok(Learned {
            watts: fit.intercept_w.clamp(0.0, lowest.max(0.0)),
            intervals: rows.len(),
            span_s: (last - first).max(0.0),
            fit,
        })
    }
}

/// The level of `busy_cpus` in bins `width` wide, rounded as the fit counts its levels.
fn level_of(busy_cpus: f64, width: f64) -> i64 {
    (busy_cpus / width).round() as i64
}

/// One source's learned static power this window, for the metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceLearned {
    /// Source key (`kind:name`).
    pub key: String,
    /// Source name.
    pub name: String,
    /// The estimate: the last one the kept intervals identified, if any.
    pub learned: Option<Learned>,
}

/// Every source's keeper, fed one window at a time, saved now and then.
pub struct Learner {
    path: PathBuf,
    host: String,
    keepers: BTreeMap<String, Keeper>,
    /// Keepers read from disk whose source has not been seen yet.
    loaded: BTreeMap<String, Keeper>,
    /// The last identified estimate per source.
    learned: BTreeMap<String, Learned>,
    /// The last reason logged per source not learned yet.
    reported: BTreeMap<String, Unidentified>,
    dirty: bool,
    saved_at: Instant,
}

/// Saves at most this often while running (and always at the end).
const SAVE_EVERY: Duration = Duration::from_secs(60);

impl Learner {
    /// Reads what was learned before from `state_dir` for `host`.
    pub fn open(state_dir: &Path, host: &str) -> Self {
        let path = learn_store::path_in(state_dir);
        let loaded = learn_store::load(&path, host);
        if !loaded.is_empty() {
            tracing::info!(
                "learned static power: {} sources read from {}",
                loaded.len(),
                path.display()
            );
        }
        Self {
            path,
            host: host.to_owned(),
            keepers: BTreeMap::new(),
            loaded,
            learned: BTreeMap::new(),
            reported: BTreeMap::new(),
            dirty: false,
            saved_at: Instant::now(),
        }
    }

    /// Offers a window's load rows (`unix_offset_ns` = Unix time − CLOCK_MONOTONIC) and
    /// returns each source's estimate.
    pub fn observe(&mut self, loads: &[SourceLoad], unix_offset_ns: i128) -> Vec<SourceLearned> {
        let mut out = Vec::with_capacity(loads.len());
        for load in loads {
            let keeper = self.keepers.entry(load.key.clone()).or_insert_with(|| {
                self.loaded
                    .remove(&load.key)
                    .map_or_else(|| Keeper::new(load.cpus), |k| k.sanitised(load.cpus))
            });
            for row in &load.rows {
                self.dirty |= keeper.offer(Kept::from_row(row, unix_offset_ns));
            }
            // The last identified value stays in use while a new interval leaves the fit
            // uncertain for a while: static power does not flip back to unidentified.
            match keeper.estimate() {
                Ok(l) => {
                    if !self.learned.contains_key(&load.key) {
                        tracing::info!(
                            "static power of {} learned: {:.2} W from {} intervals",
                            load.name,
                            l.watts,
                            l.intervals
                        );
                    }
                    self.learned.insert(load.key.clone(), l);
                }
                Err(why) if !self.learned.contains_key(&load.key) => {
                    if self.reported.insert(load.key.clone(), why) != Some(why) {
                        tracing::info!(
                            "static power of {} not learned yet ({} of {} intervals kept): {}",
                            load.name,
                            keeper.kept.len(),
                            CAPACITY,
                            why.describe()
                        );
                    }
                }
                Err(_) => {}
            }
            out.push(SourceLearned {
                key: load.key.clone(),
                name: load.name.clone(),
                learned: self.learned.get(&load.key).copied(),
            });
        }
        if self.dirty && self.saved_at.elapsed() >= SAVE_EVERY {
            self.save();
        }
        out
    }

    /// Writes the kept intervals when they changed since the last write.
    pub fn save(&mut self) {
        if !self.dirty {
            return;
        }
        self.saved_at = Instant::now();
        // Sources not seen in this run keep what they had learned.
        let mut all = self.loaded.clone();
        all.extend(self.keepers.iter().map(|(k, v)| (k.clone(), v.clone())));
        match learn_store::save(&self.path, &self.host, &all) {
            Ok(()) => self.dirty = false,
            Err(err) => tracing::warn!("{err}"),
        }
    }
}

#[cfg(test)]
#[path = "learn_tests.rs"]
mod tests;
