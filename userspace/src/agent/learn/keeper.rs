//! The bounded set of quiet load rows kept per energy source: [`Keeper`] spreads them over
//! distinct utilisation levels and fits static power over them ([`Keeper::estimate`]).
//! PURE: no files, no clocks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::attribute::{
    Learned, Unidentified,
    load::LoadRow,
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

    pub(super) fn levels(&self) -> BTreeMap<i64, usize> {
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
                updates: 0.0,
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
