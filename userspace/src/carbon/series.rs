//! A time series of intensities, `timestamp,g_per_kwh` per line (RFC 3339 or Unix
//! seconds; a header line and `#` comments are skipped), matched to each window by time.
//!
//! Each point holds from its time stamp until the next one; the last holds for as long
//! as the gap before it (an hour when it is alone). A window is given the time-weighted
//! mean of the points it overlaps.

use std::path::Path;

use super::{parse_time, valid_intensity};

/// Largest series file read (about a year of 5-minute points).
pub const MAX_BYTES: u64 = 16 << 20;
/// Most points kept.
pub const MAX_POINTS: usize = 200_000;
const HOUR_NS: u64 = 3_600_000_000_000;

/// Points in time order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    /// (Unix ns, gCO2e/kWh), sorted by time, no two at the same time.
    points: Vec<(u64, f64)>,
}

/// Why a series could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SeriesError {
    /// A line is not `timestamp,g_per_kwh`.
    #[error(
        "line {line}: {what} (expected `timestamp,g_per_kwh`, e.g. `2024-05-14T09:00:00Z,312`)"
    )]
    Line {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        what: String,
    },
    /// No point in it.
    #[error("no points in it (expected lines of `timestamp,g_per_kwh`)")]
    Empty,
    /// Reading failed.
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
}

impl Series {
    /// Builds a series from points in any order (later duplicates win; at most
    /// [`MAX_POINTS`], the latest kept).
    pub fn from_points(mut points: Vec<(u64, f64)>) -> Self {
        points.sort_by_key(|p| p.0);
        points.reverse();
        points.dedup_by_key(|p| p.0);
        points.reverse();
        if points.len() > MAX_POINTS {
            points.drain(..points.len() - MAX_POINTS);
        }
        Self { points }
    }

    /// Reads a series file.
    pub fn read(path: &Path) -> Result<Self, SeriesError> {
        use std::io::Read as _;
        let mut bytes = Vec::new();
        std::fs::File::open(path)?
            .take(MAX_BYTES)
            .read_to_end(&mut bytes)?;
        Self::decode(&bytes)
    }

    /// Decodes series text.
    pub fn decode(bytes: &[u8]) -> Result<Self, SeriesError> {
        let text = String::from_utf8_lossy(bytes);
        let mut points = Vec::new();
        let mut seen_line = false;
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |what: &str| SeriesError::Line {
                line: n + 1,
                what: what.to_string(),
            };
            let (t, g) = line.split_once(',').ok_or_else(|| bad("no comma"))?;
            let g = g.split(',').next().unwrap_or("").trim();
            let Some(at) = parse_time(t) else {
                if !seen_line {
                    seen_line = true;
                    continue; // a header line
                }
                return Err(bad(&format!("`{}` is not a time", t.trim())));
            };
            seen_line = true;
            let g: f64 = g
                .parse()
                .map_err(|_| bad(&format!("`{g}` is not a number of g/kWh")))?;
            if !valid_intensity(g) {
                return Err(bad(&format!("{g} g/kWh is not a plausible intensity")));
            }
            points.push((at, g));
            if points.len() > MAX_POINTS * 2 {
                break;
            }
        }
        if points.is_empty() {
            return Err(SeriesError::Empty);
        }
        Ok(Self::from_points(points))
    }

    /// The points, in time order.
    pub fn points(&self) -> &[(u64, f64)] {
        &self.points
    }

    /// How long the last point holds.
    fn last_hold(&self) -> u64 {
        match self.points.as_slice() {
            [.., (a, _), (b, _)] => b - a,
            _ => HOUR_NS,
        }
    }

    /// The end of what the series covers, Unix ns.
    pub fn end_ns(&self) -> u64 {
        self.points
            .last()
            .map_or(0, |(t, _)| t.saturating_add(self.last_hold()))
    }

    /// Time-weighted mean over `[start, end)` of the part the series covers; `None` when it
    /// covers none of it.
    pub fn over(&self, start: u64, end: u64) -> Option<f64> {
        let end = end.max(start.saturating_add(1));
        let first = self.points.first()?.0;
        let last_end = self.end_ns();
        let (mut weighted, mut covered) = (0.0, 0.0);
        // The point in force at `start` and those after it, up to `end`.
        let i0 = self
            .points
            .partition_point(|p| p.0 <= start)
            .saturating_sub(1);
        for (i, &(t, g)) in self.points.iter().enumerate().skip(i0) {
            if t >= end {
                break;
            }
            let until = self.points.get(i + 1).map_or(last_end, |p| p.0);
            let a = t.max(start).max(first);
            let b = until.min(end);
            if b > a {
                weighted += g * (b - a) as f64;
                covered += (b - a) as f64;
            }
        }
        (covered > 0.0).then(|| weighted / covered)
    }

    /// The value of the point nearest to `at`.
    pub fn nearest(&self, at: u64) -> f64 {
        self.points
            .iter()
            .min_by_key(|p| p.0.abs_diff(at))
            .map_or(0.0, |p| p.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_window_gets_the_time_weighted_mean_of_the_points_it_overlaps() {
        let s =
            Series::decode(b"timestamp,g_per_kwh\n100,100\n110,500\n120,300\n").expect("series");
        assert_eq!(s.over(100 * S, 110 * S), Some(100.0));
        assert_eq!(s.over(105 * S, 115 * S), Some(300.0));
        assert_eq!(s.over(112 * S, 113 * S), Some(500.0));
        // The last point holds for the gap before it (10 s).
        assert_eq!(s.over(125 * S, 126 * S), Some(300.0));
        assert_eq!(s.over(131 * S, 140 * S), None);
        assert_eq!(s.over(50 * S, 60 * S), None);
        // Half covered: the covered half counts.
        assert_eq!(s.over(95 * S, 105 * S), Some(100.0));
    }

    #[test]
    fn times_past_the_nanosecond_range_are_refused_and_queries_at_its_end_do_not_overflow() {
        // Found by the `carbon` fuzz target.
        assert_eq!(super::super::parse_time("99999999999"), None);
        let e = Series::decode(b"100,5\n99999999999,5\n").expect_err("too late");
        assert!(e.to_string().contains("not a time"), "{e}");
        let s = Series::decode(b"100,5\n").expect("series");
        assert_eq!(s.over(u64::MAX, u64::MAX), None);
    }

    #[test]
    fn rfc3339_times_and_bad_lines_say_which_line() {
        let s = Series::decode(b"2024-05-14T09:00:00Z,312\n2024-05-14T10:00:00Z,290.5\n")
            .expect("series");
        assert_eq!(s.points().len(), 2);
        let e = Series::decode(b"2024-05-14T09:00:00Z,312\nnoon,4\n").expect_err("bad time");
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = Series::decode(b"100,-5\n").expect_err("negative");
        assert!(e.to_string().contains("plausible"), "{e}");
        assert!(matches!(
            Series::decode(b"\n# nothing\n"),
            Err(SeriesError::Empty)
        ));
    }
}
