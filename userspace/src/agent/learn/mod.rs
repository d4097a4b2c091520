//! Static power learned over hours (issue 10: "It keeps the lowest-utilisation intervals,
//! persisted, so a fleet needs no manual step"). Per energy source a bounded [`Keeper`]
//! holds the quietest load rows the agent has seen, spread over distinct utilisation
//! levels; the zero-load fit attribution uses ([`crate::attribute::zero_load`]) over them
//! gives a [`Learned`] static power with the same identifiability checks (spread, levels,
//! residual, bootstrap interval), never above the lowest kept interval power. Without a
//! calibration file it becomes the static power of later windows (origin `learned`).
//! The kept rows are `keeper`'s; persistence is [`store`]'s.

mod keeper;
pub(crate) mod store;

pub use keeper::{CAPACITY, Keeper, Kept, ROW_NS};

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use crate::attribute::{Learned, Unidentified, load::SourceLoad};

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
        let path = store::path_in(state_dir);
        let loaded = store::load(&path, host);
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
        match store::save(&self.path, &self.host, &all) {
            Ok(()) => self.dirty = false,
            Err(err) => tracing::warn!("{err}"),
        }
    }
}

#[cfg(test)]
mod tests;
