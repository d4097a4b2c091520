//! Rows of past windows, for the regression of a live view (`top`, the agent).
//!
//! A live window holds seconds, where per-process watts need minutes of rows: a counter
//! updated once a second gives one row a second, and mixed duty cycles need about 120 of
//! them (docs/accuracy.md). So a live pipeline keeps, per source, the intervals of the last
//! [`LIVE_HORIZON`] as rows of busy seconds per process, and each window's regression is
//! fitted on all of them, its own included. Energy is kept as measured: static power is
//! taken off when the rows are fitted, with the static power of that window.
//!
//! That static power reads past windows too. Where nothing gives it (a calibration, the
//! agent's learned value, a host's share), a window finds it from its own idle intervals or
//! by extrapolating its power to zero load; five seconds of a phased load hold few levels,
//! so each window kept its zero-load rows ([`LoadRows`]) for the same horizon, and the
//! estimate is made over all of them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::zero_load::PowerRow;

/// How far back a live regression reads.
pub const LIVE_HORIZON: Duration = Duration::from_secs(120);

/// Most rows kept per source, whatever the horizon: 41 s of a counter read every 10 ms
/// (its regression needs seconds), over an hour of one updated once a second.
pub(super) const MAX_ROWS: usize = 4096;

/// Processes a row names; the rest of its busy time goes with unknown threads', to the
/// regression's "other" (which only its eight busiest processes leave). Rows and processes
/// bound a source's history at 4096 × 32 entries, 2 MiB, however many processes run.
pub(super) const MAX_ROW_PROCESSES: usize = 32;

/// One interval of a past window: its energy and who ran over the span that energy was
/// drawn in.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PastRow {
    /// The interval's start and end, ns (the readings' span).
    pub start_ns: u64,
    /// See `start_ns`.
    pub end_ns: u64,
    /// Energy the counter measured, µJ.
    pub energy_uj: f64,
    /// Busy seconds per process (activity-weighted where the split weighs activity), the
    /// [`MAX_ROW_PROCESSES`] busiest, in process order.
    pub busy_s: Vec<(u32, f64)>,
    /// Busy seconds of threads not known and of processes past those.
    pub rest_s: f64,
}

/// One source's rows.
#[derive(Debug, Default)]
struct SourceRows {
    rows: VecDeque<PastRow>,
    by_activity: bool,
}

/// One window's rows for the static-power estimate of one source.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct LoadRows {
    /// The window's first interval start and last interval end, ns.
    pub start_ns: u64,
    /// See `start_ns`.
    pub end_ns: u64,
    /// Its zero-load rows (power against busy CPUs).
    pub rows: Vec<PowerRow>,
    /// Energy (µJ) and length (ns) of its intervals in which the domain was (nearly) idle.
    pub idle: Vec<(f64, f64)>,
}

/// Past rows of every source.
#[derive(Debug)]
pub struct History {
    horizon_ns: u64,
    sources: HashMap<u32, SourceRows>,
    loads: HashMap<u32, VecDeque<LoadRows>>,
}

impl History {
    /// Adds `rows` of source `source` (a window's intervals, in order) and forgets rows
    /// that ended more than the horizon before the last. Rows that start before the last
    /// one held ends are skipped: a window analysed twice adds nothing. Columns counted
    /// another way (`by_activity` changed) start the source over.
    pub(super) fn extend(&mut self, source: u32, by_activity: bool, rows: Vec<PastRow>) {
        let s = self.sources.entry(source).or_default();
        if s.by_activity != by_activity {
            s.rows.clear();
            s.by_activity = by_activity;
        }
        for r in rows {
            if s.rows.back().is_some_and(|last| r.start_ns < last.end_ns) {
                continue;
            }
            s.rows.push_back(r);
        }
        let end = s.rows.back().map_or(0, |r| r.end_ns);
        while s.rows.len() > MAX_ROWS
            || s.rows
                .front()
                .is_some_and(|r| r.end_ns.saturating_add(self.horizon_ns) <= end)
        {
            s.rows.pop_front();
        }
    }

    /// Adds a window's static-power rows of `source` (skipped when it starts before the
    /// last one held ends) and forgets windows that ended more than the horizon before it,
    /// and the oldest windows past [`MAX_ROWS`] rows. Returns every held window's rows and
    /// idle powers, oldest first.
    pub(super) fn extend_load(
        &mut self,
        source: u32,
        load: LoadRows,
    ) -> (Vec<PowerRow>, Vec<(f64, f64)>) {
        let held = self.loads.entry(source).or_default();
        if held.back().is_none_or(|last| load.start_ns >= last.end_ns) {
            held.push_back(load);
        }
        let end = held.back().map_or(0, |l| l.end_ns);
        let mut rows: usize = held.iter().map(|l| l.rows.len()).sum();
        while held.len() > 1
            && (rows > MAX_ROWS
                || held
                    .front()
                    .is_some_and(|l| l.end_ns.saturating_add(self.horizon_ns) <= end))
        {
            rows -= held.pop_front().map_or(0, |l| l.rows.len());
        }
        (
            held.iter().flat_map(|l| l.rows.iter().copied()).collect(),
            held.iter().flat_map(|l| l.idle.iter().copied()).collect(),
        )
    }

    /// Source `source`'s rows, oldest first.
    fn rows(&mut self, source: u32) -> &[PastRow] {
        self.sources
            .get_mut(&source)
            .map_or(&[], |s| &*s.rows.make_contiguous())
    }
}

/// A `History` shared by every window of one live pipeline (it travels in
/// [`super::Options`]). Two are always equal: they are state, not settings.
#[derive(Clone, Debug)]
pub struct SharedHistory(Arc<Mutex<History>>);

impl SharedHistory {
    /// An empty history reading back `horizon`.
    pub fn new(horizon: Duration) -> Self {
        Self(Arc::new(Mutex::new(History {
            horizon_ns: u64::try_from(horizon.as_nanos()).unwrap_or(u64::MAX),
            sources: HashMap::new(),
            loads: HashMap::new(),
        })))
    }

    /// Adds a window's rows of `source` and gives `read` every row held for it, oldest
    /// first, while the history is held (4,096 rows are read, not copied).
    pub(super) fn extend_and_read<R>(
        &self,
        source: u32,
        by_activity: bool,
        rows: Vec<PastRow>,
        read: impl FnOnce(&[PastRow]) -> R,
    ) -> R {
        // A panic elsewhere while holding the lock leaves rows that are still rows.
        let mut h = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        h.extend(source, by_activity, rows);
        read(h.rows(source))
    }

    /// Adds a window's static-power rows of `source` and returns those of every window
    /// held for it: zero-load rows and idle intervals.
    pub(super) fn extend_load(
        &self,
        source: u32,
        load: LoadRows,
    ) -> (Vec<PowerRow>, Vec<(f64, f64)>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_load(source, load)
    }
}

impl PartialEq for SharedHistory {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(start_s: u64, end_s: u64) -> PastRow {
        PastRow {
            start_ns: start_s * 1_000_000_000,
            end_ns: end_s * 1_000_000_000,
            energy_uj: 1.0,
            busy_s: vec![(7, 0.5)],
            rest_s: 0.0,
        }
    }

    /// Every row held, copied out of the history.
    fn read(h: &SharedHistory, source: u32, by_activity: bool, rows: Vec<PastRow>) -> Vec<PastRow> {
        h.extend_and_read(source, by_activity, rows, <[PastRow]>::to_vec)
    }

    #[test]
    fn keeps_the_horizon_once_and_starts_over_when_columns_change() {
        let h = SharedHistory::new(Duration::from_secs(10));
        let rows = read(&h, 1, false, (0..5).map(|s| row(s, s + 1)).collect());
        assert_eq!(rows.len(), 5);
        // The same window again adds nothing.
        let again = read(&h, 1, false, (0..5).map(|s| row(s, s + 1)).collect());
        assert_eq!(again, rows);
        // Rows ending 10 s or more before the last one's end are forgotten.
        let later = read(&h, 1, false, (5..15).map(|s| row(s, s + 1)).collect());
        assert_eq!(later.first().map(|r| r.start_ns), Some(5_000_000_000));
        assert_eq!(later.len(), 10);
        // Another source is kept apart.
        assert_eq!(read(&h, 2, false, Vec::new()).len(), 0);
        // Activity-weighted columns do not mix with time.
        assert_eq!(read(&h, 1, true, vec![row(15, 16)]).len(), 1);
        // However long the horizon, a source keeps MAX_ROWS.
        let long = SharedHistory::new(Duration::from_secs(1 << 40));
        let many = (0..MAX_ROWS as u64 + 10).map(|s| row(s, s + 1)).collect();
        let kept = read(&long, 1, false, many);
        assert_eq!(kept.len(), MAX_ROWS);
        assert_eq!(kept[0].start_ns, 10_000_000_000);
    }

    /// A window of `n` zero-load rows at power `w` over `[start_s, end_s)`, with one idle
    /// interval.
    fn load(start_s: u64, end_s: u64, n: usize, w: f64) -> LoadRows {
        LoadRows {
            start_ns: start_s * 1_000_000_000,
            end_ns: end_s * 1_000_000_000,
            rows: vec![
                PowerRow {
                    power_w: w,
                    ..PowerRow::default()
                };
                n
            ],
            idle: vec![(w, 1.0)],
        }
    }

    #[test]
    fn static_rows_keep_whole_windows_within_the_horizon_and_the_row_bound() {
        let h = SharedHistory::new(Duration::from_secs(10));
        let (rows, idle) = h.extend_load(1, load(0, 5, 3, 1.0));
        assert_eq!((rows.len(), idle.len()), (3, 1));
        // The same window again adds nothing; an overlapping one neither.
        assert_eq!(h.extend_load(1, load(0, 5, 3, 1.0)).0.len(), 3);
        assert_eq!(h.extend_load(1, load(4, 9, 3, 2.0)).0.len(), 3);
        let (rows, idle) = h.extend_load(1, load(5, 10, 4, 2.0));
        assert_eq!((rows.len(), idle.len()), (7, 2));
        // Oldest first, and the window that ended 10 s before the last is forgotten.
        assert_eq!(rows[0].power_w, 1.0);
        let (rows, _) = h.extend_load(1, load(10, 15, 2, 3.0));
        assert_eq!(rows.len(), 6);
        assert!(rows.iter().all(|r| r.power_w > 1.0));
        // Another source is kept apart.
        assert_eq!(h.extend_load(2, LoadRows::default()).0.len(), 0);
        // Past MAX_ROWS whole windows go, the newest always stays.
        let long = SharedHistory::new(Duration::from_secs(1 << 40));
        long.extend_load(1, load(0, 1, MAX_ROWS / 2 + 1, 1.0));
        let (rows, _) = long.extend_load(1, load(1, 2, MAX_ROWS / 2, 2.0));
        assert_eq!(rows.len(), MAX_ROWS / 2);
        let (rows, _) = long.extend_load(1, load(2, 3, MAX_ROWS + 5, 3.0));
        assert_eq!(rows.len(), MAX_ROWS + 5);
    }
}
