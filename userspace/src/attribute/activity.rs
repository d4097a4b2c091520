//! Activity weights: dynamic energy inside an interval split by what the CPU did (cycles,
//! instructions) rather than by how long a thread sat on it (docs/ARCHITECTURE.md,
//! "Attribution"; TProf's per-core activity, legacy Kepler's instructions).
//!
//! The probe counts the activity event over every run (`Run::activity`). A run's weight per
//! ns is its count per ns relative to the window's mean, so two threads at 1 GHz and 3 GHz
//! (power roughly ∝ frequency under DVFS) draw 1:3, not 1:1. A run without a count (the run
//! still going when the window closed, a failed read) weighs its CPU's mean rate over the
//! window, or the machine's when its CPU has no count either. With no counts at all there
//! are no weights: the split is by time, and every output says so.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::timeline::{Run, Timeline};

/// Count-per-ns rates of one window's counted runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivityWeights {
    /// Mean count per busy ns per CPU, over its counted busy runs.
    per_cpu: BTreeMap<u32, f64>,
    /// Mean count per busy ns over every CPU: weights are relative to it (1.0 = mean).
    mean: f64,
    /// Share of busy ns whose run was counted, 0..1.
    pub coverage: f64,
}

impl ActivityWeights {
    /// The rates of `timeline`'s counted busy runs; `None` when no busy run was counted
    /// (or every count was zero), i.e. the split must be by time.
    pub fn from_timeline(timeline: &Timeline) -> Option<Self> {
        // No count but 0 anywhere: the sum below would be 0.
        if !timeline.cpus.iter().any(|c| c.store().has_counts()) {
            return None;
        }
        let mut per_cpu = BTreeMap::new();
        let (mut count, mut counted_ns, mut busy_ns) = (0.0f64, 0.0f64, 0.0f64);
        for cpu in &timeline.cpus {
            let (mut c, mut ns) = (0.0f64, 0.0f64);
            for run in cpu.runs().filter(|r| r.is_busy()) {
                busy_ns += run.len_ns() as f64;
                if let Some(a) = run.activity {
                    c += a as f64;
                    ns += run.len_ns() as f64;
                }
            }
            if ns > 0.0 && c > 0.0 {
                per_cpu.insert(cpu.cpu, c / ns);
            }
            count += c;
            counted_ns += ns;
        }
        if count <= 0.0 || counted_ns <= 0.0 {
            return None;
        }
        Some(Self {
            per_cpu,
            mean: count / counted_ns,
            coverage: if busy_ns > 0.0 {
                counted_ns / busy_ns
            } else {
                0.0
            },
        })
    }

    /// Weight per ns of `run` on `cpu`, relative to the window's mean rate.
    pub fn weight(&self, cpu: u32, run: &Run) -> f64 {
        let rate = match run.activity {
            Some(count) if run.len_ns() > 0 => count as f64 / run.len_ns() as f64,
            _ => self.per_cpu.get(&cpu).copied().unwrap_or(self.mean),
        };
        rate / self.mean
    }
}

/// Which activity weighted the split, as every output names it ([`crate::pipeline::Totals`]
/// and `sources`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ActivityUsed {
    /// The event counted per run (`cycles`, `task-clock`, ...), `None` without one.
    pub event: Option<String>,
    /// Whether the split used the counts (false: split by time).
    pub weighted: bool,
    /// Share of busy time whose run was counted, 0..1 (the rest weighs its CPU's mean).
    pub coverage: f64,
}

impl ActivityUsed {
    /// What a window used: `event` as recorded, and the weights when there were counts.
    pub fn of(event: Option<&str>, weights: Option<&ActivityWeights>) -> Self {
        Self {
            event: event.filter(|e| !e.is_empty()).map(str::to_owned),
            weighted: weights.is_some(),
            coverage: weights.map_or(0.0, |w| w.coverage),
        }
    }

    /// One line for headers: e.g. `cycles (97% of busy time counted)`, or `none: split by
    /// time`.
    pub fn label(&self) -> String {
        match (&self.event, self.weighted) {
            (Some(e), true) => format!(
                "{e} ({:.0}% of busy time counted)",
                (self.coverage * 100.0).min(100.0)
            ),
            (Some(e), false) => format!("{e}: no runs counted, split by time"),
            (None, _) => "none: split by time".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::sw_counted as sw;

    /// CPU 0: thread 1 at 3 counts/ns for [100, 300), thread 2 at 1 count/ns for [300, 500).
    /// CPU 1: thread 3, uncounted, for [100, 500).
    fn timeline() -> Timeline {
        let ev = [
            sw(100, 0, 0, 1, None),
            sw(300, 0, 1, 2, Some(600)),
            sw(500, 0, 2, 0, Some(200)),
            sw(100, 1, 0, 3, None),
            sw(500, 1, 3, 0, None),
        ];
        Timeline::build(0, 600, &[0, 1], &ev)
    }

    #[test]
    fn weights_are_rates_relative_to_the_mean() {
        let tl = timeline();
        let w = ActivityWeights::from_timeline(&tl).expect("counted runs");
        // 800 counts over 400 counted ns: mean 2/ns; 400 of 800 busy ns counted.
        assert!((w.coverage - 0.5).abs() < 1e-12);
        let of = |tid: u32| tl.cpus[0].runs().find(|r| r.tid == tid).expect("run");
        assert!((w.weight(0, &of(1)) - 1.5).abs() < 1e-12);
        assert!((w.weight(0, &of(2)) - 0.5).abs() < 1e-12);
        // Uncounted: its CPU's mean rate, else the machine's.
        let uncounted = tl.cpus[1].runs().find(|r| r.tid == 3).expect("run");
        assert!((w.weight(0, &uncounted) - 1.0).abs() < 1e-12);
        assert!((w.weight(1, &uncounted) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn no_counts_means_no_weights_and_says_time() {
        let ev = [sw(100, 0, 1, 0, None)];
        let tl = Timeline::build(0, 200, &[0], &ev);
        assert!(ActivityWeights::from_timeline(&tl).is_none());
        assert_eq!(ActivityUsed::of(None, None).label(), "none: split by time");
        assert_eq!(
            ActivityUsed::of(Some("cycles"), None).label(),
            "cycles: no runs counted, split by time"
        );
        let w = ActivityWeights::from_timeline(&timeline());
        assert_eq!(
            ActivityUsed::of(Some("task-clock"), w.as_ref()).label(),
            "task-clock (50% of busy time counted)"
        );
    }

    #[test]
    fn the_split_follows_the_counts() {
        use super::super::IdlePolicy;
        use super::super::split::{Occupancy, equal_power, split_cpu};
        let tl = timeline();
        let w = ActivityWeights::from_timeline(&tl).expect("counted runs");
        let occ = Occupancy::tally(&tl, &[0], 0, 600, &|cpu, run| w.weight(cpu, run));
        let s = split_cpu(800.0, 0.0, &occ, IdlePolicy::Separate, &equal_power);
        let of = |tid: u32| {
            s.threads
                .iter()
                .find(|((_, t), _)| *t == tid)
                .map_or(0.0, |(_, e)| *e)
        };
        // Equal time, 3:1 counts: 600 and 200 µJ, not 400 and 400.
        assert!((of(1) - 600.0).abs() < 1e-9, "{}", of(1));
        assert!((of(2) - 200.0).abs() < 1e-9, "{}", of(2));
        assert!((s.total() - 800.0).abs() < 1e-9);
    }
}
