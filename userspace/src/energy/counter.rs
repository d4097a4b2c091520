//! Turning raw counter reads into cumulative, unwrapped microjoules.
//!
//! RAPL registers are 32-bit and wrap (about 11 minutes at 100 W with 15.3 µJ units), and
//! update about every 1 ms, so a read sooner than one update shows no change (DESIGN.md §4
//! "Counters", seed 004). Rules, shared by every backend:
//! - unchanged since the last read: merged into the next interval (no reading), never 0 W;
//! - lower than the last read: a wrap when the counter has a wrap point and the wrapped
//!   delta is physically plausible, else flagged;
//! - a delta implying more than the power bound: flagged.
//!
//! A flagged reading keeps the cumulative energy where it was (so it never goes down) and
//! carries a `flag`; consumers drop the interval ending at it.
//! Arithmetic is on integer counts, so totals are exact to the counter's unit.

/// Largest plausible power of one counter domain (a package, a GPU), watts. Above this a
/// delta is a glitch, not energy. The largest server packages draw about 500 W.
pub const MAX_PLAUSIBLE_W: f64 = 2000.0;

/// What one read did to a counter.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Same raw value as the last read: merged into the next interval.
    Unchanged,
    /// The counter advanced; cumulative energy since open.
    Advanced {
        /// Cumulative µJ since the counter was opened.
        energy_uj: f64,
    },
    /// The read was implausible; the interval ending here must be dropped.
    Flagged {
        /// Cumulative µJ since open (unchanged by this read).
        energy_uj: f64,
        /// Why.
        flag: String,
    },
}

/// Unwrapping state of one counter.
#[derive(Clone, Debug)]
pub struct Unwrapper {
    unit_uj: f64,
    wrap: Option<u64>,
    max_w: f64,
    last_count: u64,
    last_ns: u64,
    total_counts: u64,
}

impl Unwrapper {
    /// Starts at a first read `count` taken at `ts_ns`; cumulative energy is 0 there.
    pub fn new(count: u64, ts_ns: u64, unit_uj: f64, wrap: Option<u64>, max_w: f64) -> Self {
        Self {
            unit_uj,
            wrap,
            max_w,
            last_count: count,
            last_ns: ts_ns,
            total_counts: 0,
        }
    }

    /// Cumulative µJ since open.
    pub fn energy_uj(&self) -> f64 {
        self.total_counts as f64 * self.unit_uj
    }

    /// Accounts one read.
    pub fn update(&mut self, count: u64, ts_ns: u64) -> Step {
        if count == self.last_count || ts_ns <= self.last_ns {
            return Step::Unchanged;
        }
        let dt_ns = ts_ns - self.last_ns;
        let delta = if count > self.last_count {
            Ok(count - self.last_count)
        } else {
            match self.wrap {
                // The counter wrapped once: what remained to the wrap point plus the new
                // value. Two wraps between reads cannot be seen; the read interval keeps
                // that impossible (seconds of energy at full power per wrap).
                Some(wrap) if self.last_count < wrap && count < wrap => {
                    Ok(wrap - self.last_count + count)
                }
                _ => Err(()),
            }
        };
        let prev = (self.last_count, self.last_ns);
        self.last_count = count;
        self.last_ns = ts_ns;
        let Ok(delta) = delta else {
            return Step::Flagged {
                energy_uj: self.energy_uj(),
                flag: format!(
                    "counter went backwards ({} -> {count}) with no wrap point",
                    prev.0
                ),
            };
        };
        // µJ per ns × 1e3 = W.
        let watts = delta as f64 * self.unit_uj / dt_ns as f64 * 1e3;
        if watts > self.max_w {
            let what = if count < prev.0 {
                "counter went backwards; as a wrap"
            } else {
                "delta"
            };
            return Step::Flagged {
                energy_uj: self.energy_uj(),
                flag: format!(
                    "{what} it implies {watts:.0} W over {dt_ns} ns, above the {:.0} W bound",
                    self.max_w
                ),
            };
        }
        self.total_counts += delta;
        Step::Advanced {
            energy_uj: self.energy_uj(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn unchanged_is_merged_and_advance_is_cumulative() {
        let mut u = Unwrapper::new(100, 0, 2.0, None, MAX_PLAUSIBLE_W);
        assert_eq!(u.update(100, MS), Step::Unchanged);
        // The merged read does not move the interval start: 150 counts over 2 ms.
        assert_eq!(u.update(250, 2 * MS), Step::Advanced { energy_uj: 300.0 });
        assert_eq!(u.update(251, 3 * MS), Step::Advanced { energy_uj: 302.0 });
    }

    #[test]
    fn wraps_exactly() {
        // 32-bit register, 15.26 µJ units (ESU 16).
        let unit = 1e6 / 65536.0;
        let wrap = 1u64 << 32;
        let mut u = Unwrapper::new(wrap - 10, 0, unit, Some(wrap), MAX_PLAUSIBLE_W);
        assert_eq!(
            u.update(5, 10 * MS),
            Step::Advanced {
                energy_uj: 15.0 * unit
            }
        );
        assert_eq!(
            u.update(wrap - 1, 20 * MS),
            Step::Flagged {
                energy_uj: 15.0 * unit,
                flag: "delta it implies 6553600 W over 10000000 ns, above the 2000 W bound".into(),
            }
        );
    }

    #[test]
    fn backwards_without_wrap_is_flagged_and_never_negative() {
        let mut u = Unwrapper::new(1000, 0, 1.0, None, MAX_PLAUSIBLE_W);
        assert_eq!(
            u.update(2000, 10 * MS),
            Step::Advanced { energy_uj: 1000.0 }
        );
        let step = u.update(500, 20 * MS);
        let Step::Flagged { energy_uj, flag } = step else {
            panic!("not flagged: {step:?}")
        };
        assert_eq!(energy_uj, 1000.0);
        assert!(flag.contains("backwards"), "{flag}");
        // Counting resumes from the new value.
        assert_eq!(u.update(700, 30 * MS), Step::Advanced { energy_uj: 1200.0 });
    }

    #[test]
    fn implausible_wrap_is_flagged() {
        // A 1 TJ-range counter dropping by half in 10 ms is not a wrap.
        let wrap = 1u64 << 40;
        let mut u = Unwrapper::new(1_000_000, 0, 1.0, Some(wrap), MAX_PLAUSIBLE_W);
        let step = u.update(500_000, 10 * MS);
        let Step::Flagged { energy_uj, flag } = step else {
            panic!("not flagged: {step:?}")
        };
        assert_eq!(energy_uj, 0.0);
        assert!(
            flag.starts_with("counter went backwards; as a wrap"),
            "{flag}"
        );
    }
}
