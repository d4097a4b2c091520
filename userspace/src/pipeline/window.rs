//! The windower: events arrive in any order and in batches (live capture, a recording, the
//! agent); it decides where the next window can end and hands out exactly the events that
//! window needs. Pure: no clocks, no I/O; the caller says up to when it may close.
//!
//! Rules (each has a row in the table tests below):
//! - A window is `[start, end)`. The next one starts at `end`, so windows tile time and
//!   every switch, sample and lifecycle event lands in exactly one window.
//! - Where counters are read (not modelled), a window ends on a reading: at the oldest of
//!   the counters' newest readings at or before the limit, so every counter covers the
//!   window. With no new reading yet, the window cannot close. Modelled sources have no
//!   readings to wait for: the window ends at the limit.
//! - Each counter's last reading at or before `start` is carried into the next window as its
//!   first reading, so no energy falls between two windows.
//! - The last switch of each CPU before `start` is carried too: it names the task that was
//!   running across the boundary (its `next`), so the new window's timeline starts known.
//! - Late switch batches: the caller passes a limit that leaves room for events still on
//!   their way (live: batches wait in the kernel for up to two sampling periods).

use std::collections::BTreeMap;

use crate::pb::v1::{EnergyReading, ProcessEvent, Sample, SwitchEvent};

/// The events of one closed window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowEvents {
    /// Window start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// Window end (exclusive), ns.
    pub end_ns: u64,
    /// The carried last switch of each CPU before `start_ns`, the window's switches, then
    /// each CPU's first switch after the window when it has arrived (a lookahead: it names
    /// the task running at the end; it stays pending for the next window).
    pub switches: Vec<SwitchEvent>,
    /// Stack samples in `[start_ns, end_ns)`.
    pub samples: Vec<Sample>,
    /// Each counter's carried reading at or before `start_ns`, then its readings in
    /// `(start_ns, end_ns]`.
    pub readings: Vec<EnergyReading>,
    /// Lifecycle events in `[start_ns, end_ns)`.
    pub process_events: Vec<ProcessEvent>,
}

/// Buffers events and cuts them into windows.
#[derive(Clone, Debug)]
pub struct Windower {
    start_ns: u64,
    /// Source ids whose readings are measured: a window must end on one of their readings.
    counters: Vec<u32>,
    carry_switch: BTreeMap<u32, SwitchEvent>,
    carry_reading: BTreeMap<u32, EnergyReading>,
    switches: Vec<SwitchEvent>,
    samples: Vec<Sample>,
    readings: Vec<EnergyReading>,
    process_events: Vec<ProcessEvent>,
}

impl Windower {
    /// A windower whose first window starts at `start_ns`; `counters` are the ids of the
    /// sources whose readings are measured (not modelled).
    pub fn new(start_ns: u64, counters: Vec<u32>) -> Self {
        Self {
            start_ns,
            counters,
            carry_switch: BTreeMap::new(),
            carry_reading: BTreeMap::new(),
            switches: Vec::new(),
            samples: Vec::new(),
            readings: Vec::new(),
            process_events: Vec::new(),
        }
    }

    /// Start of the next window.
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Events buffered and not yet handed out (switches, samples, readings, lifecycle).
    pub fn pending(&self) -> usize {
        self.switches.len() + self.samples.len() + self.readings.len() + self.process_events.len()
    }

    /// Adds switch events. One that is older than the current window start can no longer be
    /// placed in its window; it only updates what is carried (the task running at `start`).
    pub fn push_switches(&mut self, events: impl IntoIterator<Item = SwitchEvent>) {
        for s in events {
            if s.ts_ns < self.start_ns {
                self.carry(s);
            } else {
                self.switches.push(s);
            }
        }
    }

    /// Makes room for `n` more switch events, so that a whole recording's take exactly
    /// their size rather than up to twice it (as a growing vector would).
    pub fn reserve_switches(&mut self, n: usize) {
        self.switches.reserve_exact(n);
    }

    /// Adds stack samples (older than the window start: dropped, their window is gone).
    pub fn push_samples(&mut self, samples: impl IntoIterator<Item = Sample>) {
        let start = self.start_ns;
        self.samples
            .extend(samples.into_iter().filter(|s| s.ts_ns >= start));
    }

    /// Adds energy readings of any source. A counter reading at or before the window start
    /// replaces the carried one when newer.
    pub fn push_readings(&mut self, readings: impl IntoIterator<Item = EnergyReading>) {
        for r in readings {
            if !self.counters.contains(&r.source_id) {
                continue; // modelled sources are recomputed from each window's timeline
            }
            if r.ts_ns <= self.start_ns {
                let keep = self
                    .carry_reading
                    .get(&r.source_id)
                    .is_none_or(|c| c.ts_ns <= r.ts_ns);
                if keep {
                    self.carry_reading.insert(r.source_id, r);
                }
            } else {
                self.readings.push(r);
            }
        }
    }

    /// Adds lifecycle events.
    pub fn push_process_events(&mut self, events: impl IntoIterator<Item = ProcessEvent>) {
        let start = self.start_ns;
        self.process_events
            .extend(events.into_iter().filter(|e| e.ts_ns >= start));
    }

    /// Where a window asked to end by `limit_ns` would end, or `None` when it cannot close
    /// yet (it would be empty, or a counter has no reading after the start).
    pub fn boundary(&self, limit_ns: u64) -> Option<u64> {
        if limit_ns <= self.start_ns {
            return None;
        }
        let mut end = limit_ns;
        for &id in &self.counters {
            let mut seen: Vec<(u64, f64)> = self
                .readings
                .iter()
                .filter(|r| r.source_id == id && r.ts_ns <= limit_ns)
                .map(|r| (r.ts_ns, r.energy_uj))
                .collect();
            seen.sort_by_key(|&(ts, _)| ts);
            let newest = seen.last()?.0;
            // The newest reading that saw the counter move. A counter read more often than
            // it updates (a VM's, once a second, read every 10 ms) would otherwise end the
            // window in reads that saw nothing new, and the next window's first interval
            // would hold an update's energy drawn before that window began: up to a second
            // of it over a few ms of busy time, a row no regression can fit.
            let mut prev = self.carry_reading.get(&id).map(|c| c.energy_uj);
            let mut moved = None;
            for &(ts, e) in &seen {
                if prev.is_some_and(|p| p != e) {
                    moved = Some(ts);
                }
                prev = Some(e);
            }
            end = end.min(moved.unwrap_or(newest));
        }
        Some(end)
    }

    /// Closes the window that ends at [`Self::boundary`]`(limit_ns)` and hands out its
    /// events; the next window starts where this one ends.
    pub fn close(&mut self, limit_ns: u64) -> Option<WindowEvents> {
        let end = self.boundary(limit_ns)?;
        Some(self.close_at(end))
    }

    /// Closes the window at exactly `end_ns` (> start), whatever the readings: for the last
    /// window of a finished capture, which ends where the capture ended.
    pub fn close_at(&mut self, end_ns: u64) -> WindowEvents {
        let start = self.start_ns;
        let end = end_ns.max(start + 1);
        // Taken out in place: the pending switches of a whole recording are not copied at
        // every window.
        let mut now: Vec<SwitchEvent> = self.switches.extract_if(.., |s| s.ts_ns < end).collect();
        let mut switches: Vec<SwitchEvent> = self.carry_switch.values().copied().collect();
        for s in &now {
            self.carry(*s);
        }
        switches.append(&mut now);
        // Lookahead: each CPU's first switch after the window, when it is already here. A
        // timeline gives the time before a switch to the task that switch shows leaving, so
        // with it the window's last run is named exactly as one long timeline would name
        // it (the `next` of the window's last switch can disagree when events were lost).
        let mut first_after: BTreeMap<u32, SwitchEvent> = BTreeMap::new();
        for s in &self.switches {
            if first_after.get(&s.cpu).is_none_or(|f| s.ts_ns < f.ts_ns) {
                first_after.insert(s.cpu, *s);
            }
        }
        switches.extend(first_after.into_values());

        let (samples, later) = std::mem::take(&mut self.samples)
            .into_iter()
            .partition(|s| s.ts_ns < end);
        self.samples = later;
        let (process_events, later) = std::mem::take(&mut self.process_events)
            .into_iter()
            .partition(|e| e.ts_ns < end);
        self.process_events = later;

        let (now, later): (Vec<EnergyReading>, Vec<EnergyReading>) =
            std::mem::take(&mut self.readings)
                .into_iter()
                .partition(|r| r.ts_ns <= end);
        self.readings = later;
        let mut readings: Vec<EnergyReading> = self.carry_reading.values().cloned().collect();
        for r in &now {
            let keep = self
                .carry_reading
                .get(&r.source_id)
                .is_none_or(|c| c.ts_ns <= r.ts_ns);
            if keep {
                self.carry_reading.insert(r.source_id, r.clone());
            }
        }
        readings.extend(now);

        self.start_ns = end;
        WindowEvents {
            start_ns: start,
            end_ns: end,
            switches,
            samples,
            readings,
            process_events,
        }
    }

    fn carry(&mut self, s: SwitchEvent) {
        if self
            .carry_switch
            .get(&s.cpu)
            .is_none_or(|c| c.ts_ns <= s.ts_ns)
        {
            self.carry_switch.insert(s.cpu, s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testing::sw;

    fn reading(source_id: u32, ts_ns: u64, energy_uj: f64) -> EnergyReading {
        EnergyReading {
            source_id,
            ts_ns,
            energy_uj,
            ..Default::default()
        }
    }

    fn sample(ts_ns: u64) -> Sample {
        Sample {
            ts_ns,
            ..Default::default()
        }
    }

    /// (counters, readings as (source, ts), limit) -> where the window closes.
    type BoundaryCase<'a> = (&'a [u32], &'a [(u32, u64)], u64, Option<u64>);

    #[test]
    fn boundary_table() {
        let cases: &[BoundaryCase<'_>] = &[
            // Modelled only: the limit.
            (&[], &[], 1000, Some(1000)),
            // Nothing to close: the limit is not after the start (100).
            (&[], &[], 100, None),
            // One counter: its newest reading at or before the limit.
            (&[1], &[(1, 300), (1, 600), (1, 900)], 800, Some(600)),
            // A reading exactly at the limit counts.
            (&[1], &[(1, 300), (1, 800)], 800, Some(800)),
            // No reading after the start yet: wait.
            (&[1], &[], 800, None),
            (&[1], &[(1, 900)], 800, None),
            // Two counters: the older of their newest readings, so both cover the window.
            (&[1, 2], &[(1, 700), (2, 500), (2, 750)], 800, Some(700)),
            // One of two counters has nothing yet: wait.
            (&[1, 2], &[(1, 700)], 800, None),
        ];
        for (i, (counters, rs, limit, want)) in cases.iter().enumerate() {
            let mut w = Windower::new(100, counters.to_vec());
            w.push_readings(rs.iter().map(|&(s, t)| reading(s, t, t as f64)));
            assert_eq!(w.boundary(*limit), *want, "case {i}");
        }
    }

    #[test]
    fn a_slow_counter_ends_the_window_on_its_last_update() {
        // Updated at 1000 and 2000, read every 100: the window asked to end by 2500 ends
        // at the read that saw the update at 2000, not in the reads after it that saw
        // nothing new.
        let mut w = Windower::new(0, vec![1]);
        w.push_readings([reading(1, 0, 5.0)]);
        let updates = |ts: u64| 5.0 + (ts / 1000) as f64;
        w.push_readings((1..=25).map(|k| reading(1, k * 100, updates(k * 100))));
        assert_eq!(w.boundary(2500), Some(2000));
        let first = w.close(2500).expect("first window");
        assert_eq!(first.end_ns, 2000);
        // The next window starts from that reading, so its first interval's energy is
        // drawn after it starts.
        w.push_readings((26..=31).map(|k| reading(1, k * 100, updates(k * 100))));
        assert_eq!(w.boundary(3500), Some(3000));
        // A counter that has not moved since the window began ends it at its newest read.
        let mut flat = Windower::new(0, vec![1]);
        flat.push_readings((0..=5).map(|k| reading(1, k * 100, 5.0)));
        assert_eq!(flat.boundary(450), Some(400));
    }

    #[test]
    fn events_land_in_exactly_one_window() {
        let mut w = Windower::new(0, vec![]);
        w.push_switches([sw(50, 0, 1, 2), sw(150, 0, 2, 1), sw(100, 1, 3, 0)]);
        w.push_samples([sample(10), sample(99), sample(100), sample(250)]);
        let a = w.close(100).expect("first window");
        assert_eq!((a.start_ns, a.end_ns), (0, 100));
        // cpu 0's switch at 50, then each CPU's first later switch as lookahead.
        let ts: Vec<(u32, u64)> = a.switches.iter().map(|s| (s.cpu, s.ts_ns)).collect();
        assert_eq!(ts, [(0, 50), (0, 150), (1, 100)]);
        assert_eq!(a.samples.len(), 2);
        // The switch at 100 belongs to the second window ([100, 200)), and cpu 0's switch
        // at 50 is carried so the second window knows tid 2 was running at 100.
        let b = w.close(200).expect("second window");
        assert_eq!((b.start_ns, b.end_ns), (100, 200));
        let ts: Vec<(u32, u64)> = b.switches.iter().map(|s| (s.cpu, s.ts_ns)).collect();
        assert_eq!(ts, [(0, 50), (0, 150), (1, 100)]);
        assert_eq!(b.samples.iter().map(|s| s.ts_ns).collect::<Vec<_>>(), [100]);
        let c = w.close(300).expect("third window");
        assert_eq!(c.samples.iter().map(|s| s.ts_ns).collect::<Vec<_>>(), [250]);
        // Only the latest switch per CPU is carried.
        let ts: Vec<(u32, u64)> = c.switches.iter().map(|s| (s.cpu, s.ts_ns)).collect();
        assert_eq!(ts, [(0, 150), (1, 100)]);
    }

    #[test]
    fn counter_readings_are_carried_across_the_boundary() {
        let mut w = Windower::new(0, vec![7]);
        w.push_readings([
            reading(7, 0, 0.0),
            reading(7, 60, 6.0),
            reading(7, 120, 12.0),
        ]);
        let a = w.close(100).expect("closes on the reading at 60");
        assert_eq!(a.end_ns, 60);
        let ts: Vec<u64> = a.readings.iter().map(|r| r.ts_ns).collect();
        assert_eq!(ts, [0, 60]);
        let b = w.close(200).expect("closes on 120");
        let ts: Vec<u64> = b.readings.iter().map(|r| r.ts_ns).collect();
        assert_eq!(ts, [60, 120], "the reading at 60 starts the next window");
        assert_eq!(w.close(300), None, "no new reading: cannot close");
        // A late switch for a closed window only updates what is carried.
        w.push_switches([sw(90, 0, 4, 5)]);
        w.push_readings([reading(7, 180, 18.0)]);
        let c = w.close(300).expect("closes on 180");
        assert_eq!(c.switches.iter().map(|s| s.ts_ns).collect::<Vec<_>>(), [90]);
    }

    #[test]
    fn modelled_source_readings_are_not_buffered() {
        let mut w = Windower::new(0, vec![1]);
        w.push_readings([reading(2, 50, 1.0), reading(1, 50, 1.0)]);
        let a = w.close(100).expect("closes");
        assert!(a.readings.iter().all(|r| r.source_id == 1));
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn close_at_ends_where_asked() {
        let mut w = Windower::new(0, vec![1]);
        w.push_readings([reading(1, 10, 1.0)]);
        let a = w.close_at(500);
        assert_eq!((a.start_ns, a.end_ns), (0, 500));
        assert_eq!(w.start_ns(), 500);
    }
}
