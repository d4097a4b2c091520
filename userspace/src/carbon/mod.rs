//! Carbon: grams of CO2e from measured joules, and the grid intensity that made them.
//!
//! An intensity (gCO2e/kWh) comes from one [`Source`]: a fixed value, a zone's yearly
//! average from the checked-in table ([`zones`]), a time series file ([`series`]) or a
//! live HTTP source in the Electricity Maps API shape ([`live`]). Every intensity carries
//! a label saying where it came from (`live FR, 5 min old`; `yearly average FR 2024
//! (Electricity Maps)`), and every output that prints grams prints the label with them.
//!
//! Carbon is computed per window or per row, never per event: `grams = joules / 3.6e6 ×
//! g_per_kwh × pue`. See docs/carbon.md.

pub mod cli;
pub mod embodied;
pub mod live;
pub mod series;
pub mod zones;

use std::path::PathBuf;

use serde::Serialize;

/// Joules in one kWh.
pub const J_PER_KWH: f64 = 3.6e6;

/// The intensity applied to one window or row, with where it came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Intensity {
    /// Grid intensity, gCO2e/kWh (before PUE).
    pub g_per_kwh: f64,
    /// Where it came from, for people: `yearly average FR 2024 (Electricity Maps)`.
    pub source: String,
    /// Power usage effectiveness applied (1 when none was given).
    pub pue: f64,
    /// True when the configured source failed and this is its fallback.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub fallback: bool,
}

impl Intensity {
    /// Grams of CO2e for `joules` at this intensity (PUE included).
    pub fn grams(&self, joules: f64) -> f64 {
        grams(joules, self.g_per_kwh, self.pue)
    }

    /// Grams per joule (PUE included).
    pub fn g_per_joule(&self) -> f64 {
        self.g_per_kwh * self.pue / J_PER_KWH
    }

    /// `350 gCO2e/kWh (fixed), PUE 1.2`: the label a table prints beside its grams.
    pub fn describe(&self) -> String {
        let pue = if (self.pue - 1.0).abs() > f64::EPSILON {
            format!(", PUE {}", self.pue)
        } else {
            String::new()
        };
        format!("{:.1} gCO2e/kWh ({}){pue}", self.g_per_kwh, self.source)
    }
}

/// Grams of CO2e for `joules` at `g_per_kwh` and `pue`.
pub fn grams(joules: f64, g_per_kwh: f64, pue: f64) -> f64 {
    joules / J_PER_KWH * g_per_kwh * pue
}

/// Where intensities come from.
pub enum Source {
    /// One value for all time.
    Fixed(f64),
    /// A zone's yearly average from the checked-in table.
    Zone(zones::Zone),
    /// A time series file.
    Series(series::Series, PathBuf),
    /// The live HTTP source.
    Live(Box<live::Live>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Fixed(g) => write!(f, "Fixed({g})"),
            Source::Zone(z) => write!(f, "Zone({})", z.zone),
            Source::Series(_, p) => write!(f, "Series({})", p.display()),
            Source::Live(_) => write!(f, "Live"),
        }
    }
}

/// A source and the PUE applied to it.
#[derive(Debug)]
pub struct Carbon {
    /// The source.
    pub source: Source,
    /// Power usage effectiveness (1 = none).
    pub pue: f64,
}

impl Carbon {
    /// The intensity over `[start, end)`, Unix ns: time-weighted where the source changes
    /// inside the span.
    pub fn over(&mut self, start_unix_ns: u64, end_unix_ns: u64) -> Intensity {
        let pue = self.pue;
        let (g_per_kwh, source, fallback) = match &mut self.source {
            Source::Fixed(g) => (*g, "fixed, --carbon-intensity".to_string(), false),
            Source::Zone(z) => (z.g_per_kwh, z.label(), false),
            Source::Series(s, path) => match s.over(start_unix_ns, end_unix_ns) {
                Some(g) => (g, format!("series {}", path.display()), false),
                None => (
                    s.nearest(start_unix_ns),
                    format!(
                        "series {}, nearest point (window outside it)",
                        path.display()
                    ),
                    true,
                ),
            },
            Source::Live(l) => {
                let i = l.over(start_unix_ns, end_unix_ns);
                (i.g_per_kwh, i.source, i.fallback)
            }
        };
        Intensity {
            g_per_kwh,
            source,
            pue,
            fallback,
        }
    }

    /// The intensity now (the agent's and `top`'s windows).
    pub fn now(&mut self) -> Intensity {
        let now = unix_now_ns();
        match &mut self.source {
            Source::Live(l) => {
                let i = l.latest(now);
                Intensity { pue: self.pue, ..i }
            }
            _ => self.over(now, now + 1),
        }
    }
}

/// The wall clock, ns since the Unix epoch.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Parses a time stamp of the sources: RFC 3339 (`2024-05-14T09:00:00.000Z`, `+00:00`
/// accepted) or Unix seconds (`1715677200`, fractions allowed). Unix ns.
pub fn parse_time(text: &str) -> Option<u64> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<f64>() {
        return (secs.is_finite() && (0.0..1e10).contains(&secs)).then_some((secs * 1e9) as u64);
    }
    let t = t
        .strip_suffix("+00:00")
        .map_or_else(|| t.to_string(), |s| format!("{s}Z"));
    let at = humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok()?;
    at.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_nanos()).ok())
}

/// Checks an intensity read from outside: finite, not negative, below 5000 g/kWh (no grid
/// emits more than pure lignite's ~1,200).
pub fn valid_intensity(g: f64) -> bool {
    g.is_finite() && (0.0..5000.0).contains(&g)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grams_of_one_kwh_are_the_intensity() {
        assert!((grams(J_PER_KWH, 350.0, 1.0) - 350.0).abs() < 1e-9);
        assert!((grams(J_PER_KWH, 350.0, 1.2) - 420.0).abs() < 1e-9);
    }

    #[test]
    fn times_parse_in_both_forms() {
        assert_eq!(parse_time("1715677200"), Some(1_715_677_200_000_000_000));
        assert_eq!(
            parse_time("2024-05-14T09:00:00.000Z"),
            Some(1_715_677_200_000_000_000)
        );
        assert_eq!(
            parse_time("2024-05-14T09:00:00+00:00"),
            Some(1_715_677_200_000_000_000)
        );
        assert_eq!(parse_time("yesterday"), None);
    }
}
