//! Turning raw counter reads into cumulative, unwrapped microjoules.
//!
//! RAPL registers are 32-bit and wrap (about 11 minutes at 100 W with 15.3 µJ units), and
//! update about every 1 ms, so a read sooner than one update shows no change (docs/ARCHITECTURE.md, "Energy counters"
//! "Counters", seed 004). Rules, shared by every backend:
//! - unchanged since the last read: merged into the next interval (no reading), never 0 W;
//! - lower than the last read: a wrap when the counter has a wrap point and the wrapped
//!   delta is physically plausible, else flagged;
//! - a delta implying more than the power bound: flagged. A forward delta is judged over
//!   the time since the last change plus [`LATE_WRITE_NS`]: a counter written late (a
//!   meter or a host's share written by software, an emulator on a loaded machine) holds
//!   energy drawn before the previous read, and over a few ms between reads that looked
//!   like several times the power drawn;
//! - a wrapping counter read so long after its last read that one more whole wrap would
//!   still be within the power bound: flagged. Such a delta is ambiguous (it may hide one or
//!   more wraps) and would otherwise under-report silently. The reader reads every wrapping
//!   counter at least twice per [`wrap_period_ns`] to keep this rare.
//!
//! A flagged reading keeps the cumulative energy where it was (so it never goes down) and
//! carries a `flag`; consumers drop the interval ending at it.
//! Arithmetic is on integer counts, so totals are exact to the counter's unit.

/// Largest plausible power of one counter domain (a package, a GPU), watts. Above this a
/// delta is a glitch, not energy. The largest server packages draw about 500 W.
pub const MAX_PLAUSIBLE_W: f64 = 2000.0;

/// How much earlier than the previous read a forward delta's energy may have been drawn,
/// ns: a writer this late cannot make a plausible delta look implausible. A glitch is
/// orders of magnitude off, and stays flagged.
pub const LATE_WRITE_NS: u64 = 50_000_000;

/// How long a counter takes to wrap once at `max_w` watts, ns: `wrap × unit` µJ over
/// `max_w`. `None` for a counter that never wraps (or a non-positive bound).
pub fn wrap_period_ns(unit_uj: f64, wrap: Option<u64>, max_w: f64) -> Option<u64> {
    let wrap = wrap?;
    // µJ / W = µs; × 1e3 = ns. `as` saturates for huge ranges.
    (max_w > 0.0).then(|| (wrap as f64 * unit_uj * 1e3 / max_w) as u64)
}

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
    /// Time of the last read that changed the count (the start of the next interval).
    last_ns: u64,
    /// Time of the last read, changed or not. An unchanged read shows no wrap happened
    /// before it (short of exactly whole wraps), so wrap ambiguity is judged from here.
    last_read_ns: u64,
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
            last_read_ns: ts_ns,
            total_counts: 0,
        }
    }

    /// Cumulative µJ since open.
    pub fn energy_uj(&self) -> f64 {
        self.total_counts as f64 * self.unit_uj
    }

    /// Goes on from `count` read at `ts_ns` after a gap the source flagged: nothing of the
    /// change since the last read is counted. Returns the cumulative µJ (unchanged).
    pub fn restart(&mut self, count: u64, ts_ns: u64) -> f64 {
        self.last_count = count;
        self.last_ns = self.last_ns.max(ts_ns);
        self.last_read_ns = self.last_read_ns.max(ts_ns);
        self.energy_uj()
    }

    /// Accounts one read.
    pub fn update(&mut self, count: u64, ts_ns: u64) -> Step {
        if ts_ns <= self.last_ns {
            return Step::Unchanged;
        }
        let since_read_ns = ts_ns.saturating_sub(self.last_read_ns);
        self.last_read_ns = self.last_read_ns.max(ts_ns);
        if count == self.last_count {
            return Step::Unchanged;
        }
        let dt_ns = ts_ns - self.last_ns;
        let delta = if count > self.last_count {
            Ok(count - self.last_count)
        } else {
            match self.wrap {
                // The counter wrapped once: what remained to the wrap point plus the new
                // value. More wraps between reads cannot be seen: see the ambiguity check.
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
        // A wrap is judged over the time since the last change alone: a backward glitch on
        // a small range must not pass for one.
        let wrapped = count < prev.0;
        let span_ns = if wrapped {
            dt_ns
        } else {
            dt_ns + LATE_WRITE_NS
        };
        // µJ per ns × 1e3 = W.
        let watts = delta as f64 * self.unit_uj / span_ns as f64 * 1e3;
        if watts > self.max_w {
            let what = if wrapped {
                "counter went backwards; as a wrap"
            } else {
                "delta"
            };
            return Step::Flagged {
                energy_uj: self.energy_uj(),
                flag: format!(
                    "{what} it implies {watts:.0} W over {span_ns} ns, above the {:.0} W bound",
                    self.max_w
                ),
            };
        }
        // Could one more whole wrap hide in this delta? All of `delta` came after the last
        // read (the count did not move before it), so with the extra wrap the energy over
        // `since_read_ns` would be `delta + wrap` counts. Within the bound: ambiguous.
        if let Some(wrap) = self.wrap
            && since_read_ns > 0
        {
            let extra_w = (delta as f64 + wrap as f64) * self.unit_uj / since_read_ns as f64 * 1e3;
            if extra_w <= self.max_w {
                return Step::Flagged {
                    energy_uj: self.energy_uj(),
                    flag: format!(
                        "ambiguous: {since_read_ns} ns between reads, long enough for an unseen \
                         wrap ({extra_w:.0} W with one, within the {:.0} W bound)",
                        self.max_w
                    ),
                };
            }
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
                flag: "delta it implies 1092267 W over 60000000 ns, above the 2000 W bound".into(),
            }
        );
    }

    #[test]
    fn a_late_write_is_not_a_glitch() {
        // 600 W read 8.6 ms after the last change, by a writer that stalled 29 ms: 22 J
        // (2,572 W over the 8.6 ms) is plausible; a glitch of 2,000 J is not.
        let mut u = Unwrapper::new(0, 0, 1.0, None, MAX_PLAUSIBLE_W);
        assert_eq!(
            u.update(1_000_000, 10 * MS),
            Step::Advanced {
                energy_uj: 1_000_000.0
            }
        );
        let late = 1_000_000 + 22_000_000;
        assert_eq!(
            u.update(late, 10 * MS + 8_600_000),
            Step::Advanced {
                energy_uj: 23_000_000.0
            }
        );
        let step = u.update(late + 2_000_000_000, 30 * MS);
        assert!(
            matches!(&step, Step::Flagged { flag, .. } if flag.starts_with("delta it implies")),
            "{step:?}"
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

    #[test]
    fn wrap_period_at_the_bound() {
        // 32-bit MSR, 15.26 µJ units: 65 536 J, 32.768 s at 2000 W.
        assert_eq!(
            wrap_period_ns(1e6 / 65536.0, Some(1 << 32), MAX_PLAUSIBLE_W),
            Some(32_768_000_000)
        );
        // powercap, 1 µJ units, 200 J range: 100 ms at 2000 W.
        assert_eq!(
            wrap_period_ns(1.0, Some(200_000_001), MAX_PLAUSIBLE_W),
            Some(100_000_000)
        );
        assert_eq!(wrap_period_ns(1.0, None, MAX_PLAUSIBLE_W), None);
    }

    /// 1 µJ units, 100 J range: one wrap is 50 ms at the 2000 W bound.
    const RANGE: u64 = 100_000_000;

    #[test]
    fn wraps_hidden_in_a_long_gap_are_flagged_not_under_reported() {
        let mut u = Unwrapper::new(0, 0, 1.0, Some(RANGE), MAX_PLAUSIBLE_W);
        // 2 J in 20 ms (100 W): another wrap would mean 5100 W, so it is exact.
        assert_eq!(
            u.update(2_000_000, 20 * MS),
            Step::Advanced {
                energy_uj: 2_000_000.0
            }
        );
        // 2.5 s at 100 W later: 250 J went in, 2.5 wraps. The counter shows only +50 J
        // (20 W, plausible); without the check that was 200 J lost silently.
        let step = u.update(52_000_000, 2_520 * MS);
        let Step::Flagged { energy_uj, flag } = step else {
            panic!("not flagged: {step:?}")
        };
        assert_eq!(energy_uj, 2_000_000.0);
        assert!(flag.starts_with("ambiguous: 2500000000 ns"), "{flag}");
        // Counting resumes from the new value.
        assert_eq!(
            u.update(54_000_000, 2_540 * MS),
            Step::Advanced {
                energy_uj: 4_000_000.0
            }
        );
        // A wrap seen in a long gap is as ambiguous as a forward step.
        let step = u.update(1_000_000, 5_000 * MS);
        assert!(
            matches!(&step, Step::Flagged { energy_uj, flag }
                if *energy_uj == 4_000_000.0 && flag.starts_with("ambiguous")),
            "{step:?}"
        );
    }

    #[test]
    fn gap_over_one_wrap_period_is_kept_when_another_wrap_is_implausible() {
        let mut u = Unwrapper::new(0, 0, 1.0, Some(RANGE), MAX_PLAUSIBLE_W);
        // 60 ms (over the 50 ms wrap period) with 30 J (500 W): one more wrap would be
        // 130 J in 60 ms = 2167 W, above the bound, so the delta is certain.
        assert_eq!(
            u.update(30_000_000, 60 * MS),
            Step::Advanced {
                energy_uj: 30_000_000.0
            }
        );
        // The same gap with 15 J (250 W): one more wrap would be 1917 W, within it.
        let step = u.update(45_000_000, 120 * MS);
        assert!(
            matches!(&step, Step::Flagged { flag, .. } if flag.starts_with("ambiguous")),
            "{step:?}"
        );
    }

    #[test]
    fn unchanged_reads_rule_out_hidden_wraps() {
        // An idle counter read every 20 ms for 10 s, then moving: each unchanged read shows
        // no wrap before it, so the step is judged over 20 ms and kept, while the interval
        // (and its power) still spans the whole merged 10 s.
        let mut u = Unwrapper::new(7, 0, 1.0, Some(RANGE), MAX_PLAUSIBLE_W);
        for i in 1..500 {
            assert_eq!(u.update(7, i * 20 * MS), Step::Unchanged);
        }
        assert_eq!(
            u.update(1_007, 10_000 * MS),
            Step::Advanced { energy_uj: 1000.0 }
        );
        // Without the reads in between, the same step is ambiguous.
        let mut u = Unwrapper::new(7, 0, 1.0, Some(RANGE), MAX_PLAUSIBLE_W);
        assert!(matches!(u.update(1_007, 10_000 * MS), Step::Flagged { .. }));
    }

    #[test]
    fn counters_without_a_wrap_point_are_never_ambiguous() {
        // hwmon, perf, NVML: a long gap is just a long interval.
        let mut u = Unwrapper::new(0, 0, 1.0, None, MAX_PLAUSIBLE_W);
        assert_eq!(
            u.update(1_000_000, 3_600_000 * MS),
            Step::Advanced {
                energy_uj: 1_000_000.0
            }
        );
    }
}
