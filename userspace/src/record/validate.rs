//! Timestamps that cannot be true are dropped while reading, so no later stage sizes its
//! work from a damaged number: a damaged end time once made the model generate a reading
//! every 10 ms over centuries (24 GB). A checksum cannot catch this in a crafted file or in
//! version 1 and 2 files, which have none.
//!
//! The rules, applied chunk by chunk in file order:
//! - nothing before the capture start, less [`PRE_START_NS`] (the probes start before the
//!   header is stamped, so the first drain holds a little earlier data);
//! - nothing after a silence longer than [`MAX_QUIET_NS`]: a live system switches tasks
//!   and reads its counters many times a second, and the recorder drains every few
//!   seconds at most, so each timestamp lies within that span of the data before it (the
//!   chunk's earlier timestamps included);
//! - no switch or sample on a CPU the header does not list;
//! - the trailer's end time lies within [`MAX_QUIET_NS`] of the last data;
//! - an energy source is listed once, and there are at most [`MAX_SOURCES`];
//! - a run marker (`record --repeat`) ends no earlier than it starts, lies in the window like
//!   any timestamp, and there are at most [`MAX_RUNS`] (each costs `diff` an analysis).
//!
//! The capture window is thus at most [`MAX_QUIET_NS`] per timestamp in the file: bounded
//! by the file's size.

use crate::pb::v1::{Chunk, Header};

/// How long before the header's start time data may begin, ns.
pub const PRE_START_NS: u64 = 60_000_000_000;

/// The longest silence between one timestamp and the next, ns.
pub const MAX_QUIET_NS: u64 = 60_000_000_000;

/// The most CPUs a header may list (Linux's largest `NR_CPUS` is 8192). Work per unit of
/// time grows with the CPU count, so a damaged count must not be believed.
pub const MAX_CPUS: usize = 8192;

/// The most energy sources a recording may list. A machine has a few per package (RAPL
/// domains), one per GPU and a few hwmon sensors; thousands are a damaged or crafted file,
/// and each source costs every later stage work per reading.
pub const MAX_SOURCES: usize = 4096;

/// The most run markers a recording may hold: `record --repeat` takes a few to a few
/// hundred; each costs `diff` one analysis of its slice, so a damaged count is not believed.
pub const MAX_RUNS: usize = 10_000;

/// The window admitted so far.
pub(super) struct Window {
    /// Run markers admitted so far.
    runs: usize,
    /// Ids of the energy sources admitted: a source is listed once (the first listing wins).
    source_ids: std::collections::HashSet<u32>,
    lower: u64,
    /// The latest timestamp admitted; `None` until the first one when the header has no
    /// start time (synthetic files).
    frontier: Option<u64>,
    /// CPU ids of the header, sorted; empty when it lists none (then any CPU goes).
    cpus: Vec<u32>,
}

impl Window {
    pub(super) fn new(header: &Header) -> Self {
        let mut cpus: Vec<u32> = header.cpus.iter().map(|c| c.id).collect();
        cpus.sort_unstable();
        cpus.dedup();
        let start = header.start_ns;
        Self {
            runs: 0,
            source_ids: std::collections::HashSet::new(),
            lower: start.saturating_sub(PRE_START_NS),
            frontier: (start != 0).then_some(start),
            cpus,
        }
    }

    /// The latest timestamp admitted (the header's start before any).
    pub(super) fn frontier(&self) -> u64 {
        self.frontier.unwrap_or(self.lower)
    }

    fn known_cpu(&self, cpu: u32) -> bool {
        self.cpus.is_empty() || self.cpus.binary_search(&cpu).is_ok()
    }

    /// Drops from `chunk` what cannot be true and moves the window on. Returns how many
    /// events and readings were dropped.
    pub(super) fn admit(&mut self, chunk: &mut Chunk) -> u64 {
        let sources = chunk.sources.len();
        let ids = &mut self.source_ids;
        chunk
            .sources
            .retain(|s| ids.len() < MAX_SOURCES && ids.insert(s.id));
        let sources_dropped = (sources - chunk.sources.len()) as u64;
        self.admit_times(chunk) + sources_dropped
    }

    /// The chunk's timestamps at or after the lower bound, on known CPUs.
    fn times<'c>(&'c self, chunk: &'c Chunk) -> impl Iterator<Item = u64> + 'c {
        chunk
            .switches
            .iter()
            .filter(|s| self.known_cpu(s.cpu))
            .map(|s| s.ts_ns)
            .chain(
                chunk
                    .samples
                    .iter()
                    .filter(|s| self.known_cpu(s.cpu))
                    .map(|s| s.ts_ns),
            )
            .chain(chunk.readings.iter().map(|r| r.ts_ns))
            .chain(chunk.process_events.iter().map(|p| p.ts_ns))
            .chain(chunk.runs.iter().flat_map(|r| [r.start_ns, r.end_ns]))
            .filter(|&t| t >= self.lower)
    }

    /// The latest timestamp reached from the frontier without a silence longer than
    /// [`MAX_QUIET_NS`]; `None` when there is neither a frontier nor a timestamp.
    fn upper(&self, chunk: &Chunk) -> Option<u64> {
        // The common case, with no sort: nothing lies past the frontier's reach, so no
        // silence can stop the walk below and it ends at the latest timestamp.
        if let Some(frontier) = self.frontier {
            let latest = self.times(chunk).max().unwrap_or(frontier);
            if latest <= frontier.saturating_add(MAX_QUIET_NS) {
                return Some(frontier.max(latest));
            }
        }
        self.upper_by_walk(chunk)
    }

    /// [`Self::upper`] the long way: the timestamps in order, walked from the frontier
    /// until a silence longer than [`MAX_QUIET_NS`].
    fn upper_by_walk(&self, chunk: &Chunk) -> Option<u64> {
        let mut times: Vec<u64> = self.times(chunk).collect();
        times.sort_unstable();
        let mut upper = self.frontier.or(times.first().copied());
        for t in times {
            match upper {
                Some(u) if t > u.saturating_add(MAX_QUIET_NS) => break,
                _ => upper = Some(upper.map_or(t, |u| u.max(t))),
            }
        }
        upper
    }

    fn admit_times(&mut self, chunk: &mut Chunk) -> u64 {
        let upper = self.upper(chunk);
        let Some(upper) = upper else {
            // No timestamp to admit: everything with one is dropped below.
            return self.drop_all(chunk);
        };
        self.frontier = Some(upper);
        let lower = self.lower;
        let ok = |t: u64| (lower..=upper).contains(&t);
        let before = counts(chunk);
        let cpus = &self.cpus;
        let known = |cpu: u32| cpus.is_empty() || cpus.binary_search(&cpu).is_ok();
        chunk.switches.retain(|s| ok(s.ts_ns) && known(s.cpu));
        chunk.samples.retain(|s| ok(s.ts_ns) && known(s.cpu));
        chunk.readings.retain(|r| ok(r.ts_ns));
        chunk.process_events.retain(|p| ok(p.ts_ns));
        let runs = &mut self.runs;
        chunk.runs.retain(|r| {
            let keep = r.start_ns <= r.end_ns && ok(r.start_ns) && ok(r.end_ns) && *runs < MAX_RUNS;
            *runs += usize::from(keep);
            keep
        });
        before - counts(chunk)
    }

    fn drop_all(&self, chunk: &mut Chunk) -> u64 {
        let n = counts(chunk);
        chunk.switches.clear();
        chunk.samples.clear();
        chunk.readings.clear();
        chunk.process_events.clear();
        chunk.runs.clear();
        n
    }

    /// The capture's end: the trailer's when it is plausible, else the last data. The
    /// bool says whether it was clamped.
    pub(super) fn end(&self, trailer_end_ns: Option<u64>) -> (u64, bool) {
        let last = self.frontier();
        match trailer_end_ns {
            None => (last, false),
            Some(end) => {
                let clamped = end.clamp(last, last.saturating_add(MAX_QUIET_NS));
                // Ending before the last data is how a recording always read (the end
                // is the latest of both); only a leap into the future is damage.
                (clamped, end > clamped)
            }
        }
    }
}

fn counts(chunk: &Chunk) -> u64 {
    (chunk.switches.len()
        + chunk.samples.len()
        + chunk.readings.len()
        + chunk.process_events.len()
        + chunk.runs.len()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::{Cpu, EnergyReading, Sample, SwitchEvent};

    const S: u64 = 1_000_000_000;

    fn header(start_ns: u64, cpus: &[u32]) -> Header {
        Header {
            start_ns,
            cpus: cpus
                .iter()
                .map(|&id| Cpu {
                    id,
                    ..Cpu::default()
                })
                .collect(),
            ..Header::default()
        }
    }

    fn chunk(switches: &[(u64, u32)], readings: &[u64]) -> Chunk {
        Chunk {
            switches: switches
                .iter()
                .map(|&(ts_ns, cpu)| SwitchEvent {
                    ts_ns,
                    cpu,
                    ..SwitchEvent::default()
                })
                .collect(),
            readings: readings
                .iter()
                .map(|&ts_ns| EnergyReading {
                    ts_ns,
                    ..EnergyReading::default()
                })
                .collect(),
            ..Chunk::default()
        }
    }

    fn times(c: &Chunk) -> Vec<u64> {
        c.switches.iter().map(|s| s.ts_ns).collect()
    }

    #[test]
    fn a_steady_stream_is_kept_whole() {
        let mut w = Window::new(&header(100 * S, &[0, 1]));
        for k in 0..50u64 {
            let t = 100 * S + k * S / 10;
            let mut c = chunk(&[(t, 0), (t + 1, 1), (t - S / 2, 0)], &[t + 2]);
            assert_eq!(w.admit(&mut c), 0, "chunk {k}");
            assert_eq!(c.switches.len(), 3);
        }
        assert_eq!(w.end(Some(106 * S)), (106 * S, false));
        // A trailer stamped before the last data is not damage.
        assert_eq!(w.end(Some(101 * S)), (w.frontier(), false));
    }

    #[test]
    fn run_markers_must_end_after_they_start_inside_the_window() {
        use crate::pb::v1::RunMarker;
        let mut w = Window::new(&header(100 * S, &[0]));
        let run = |start_ns: u64, end_ns: u64| RunMarker {
            start_ns,
            end_ns,
            ..RunMarker::default()
        };
        let mut c = chunk(&[(100 * S, 0), (101 * S, 0)], &[]);
        c.runs = vec![
            run(100 * S, 101 * S),
            run(101 * S, 100 * S),
            run(100 * S, u64::MAX),
            run(1, 100 * S),
        ];
        assert_eq!(w.admit(&mut c), 3);
        assert_eq!(c.runs, vec![run(100 * S, 101 * S)]);
        // At most MAX_RUNS over the whole recording.
        let mut c = chunk(&[(101 * S, 0)], &[]);
        c.runs = vec![run(100 * S, 101 * S); MAX_RUNS + 5];
        assert_eq!(w.admit(&mut c), 6);
        assert_eq!(c.runs.len(), MAX_RUNS - 1);
    }

    #[test]
    fn leaps_into_the_future_and_the_past_are_dropped() {
        let mut w = Window::new(&header(100 * S, &[0]));
        let far = u64::MAX - 5;
        let mut c = chunk(&[(100 * S, 0), (far, 0), (101 * S, 0), (1, 0)], &[far]);
        assert_eq!(w.admit(&mut c), 3);
        assert_eq!(times(&c), [100 * S, 101 * S]);
        assert_eq!(w.frontier(), 101 * S);
        // A long but connected run of timestamps is followed step by step.
        let mut c = chunk(&[(150 * S, 0), (200 * S, 0), (300 * S, 0)], &[]);
        assert_eq!(w.admit(&mut c), 1);
        assert_eq!(times(&c), [150 * S, 200 * S]);
        assert_eq!(w.end(Some(far)), (260 * S, true));
    }

    #[test]
    fn cpus_the_header_does_not_list_are_dropped() {
        let mut w = Window::new(&header(S, &[0, 1]));
        let mut c = chunk(&[(S, 0), (S, 1), (S, 7)], &[]);
        c.samples.push(Sample {
            ts_ns: S,
            cpu: 9,
            ..Sample::default()
        });
        assert_eq!(w.admit(&mut c), 2);
        assert_eq!(c.switches.len(), 2);
        assert!(c.samples.is_empty());
    }

    #[test]
    fn without_a_start_time_the_first_data_sets_the_window() {
        let mut w = Window::new(&header(0, &[]));
        let mut c = chunk(&[(5 * S, 3), (6 * S, 4), (500 * S, 3)], &[]);
        assert_eq!(w.admit(&mut c), 1);
        assert_eq!(times(&c), [5 * S, 6 * S]);
        let mut empty = chunk(&[], &[]);
        assert_eq!(w.admit(&mut empty), 0);
        assert_eq!(w.frontier(), 6 * S);
    }
}

#[cfg(test)]
mod upper_tests {
    use proptest::prelude::*;

    use super::*;
    use crate::pb::v1::{Cpu, EnergyReading, SwitchEvent};

    const S: u64 = 1_000_000_000;

    proptest! {
        /// The walk-free reach of a chunk equals the walk's, whatever the frontier and
        /// however far the timestamps jump (silences past the limit included).
        #[test]
        fn upper_without_sorting_equals_the_walk(
            start in prop::sample::select(vec![0u64, 100 * S, u64::MAX - 10 * S]),
            admitted in prop::option::of(0u64..200 * S),
            steps in prop::collection::vec((0u64..90 * S, 0u32..3, any::<bool>()), 0..40),
        ) {
            let header = Header {
                start_ns: start,
                cpus: vec![Cpu { id: 0, ..Cpu::default() }, Cpu { id: 1, ..Cpu::default() }],
                ..Header::default()
            };
            let mut window = Window::new(&header);
            if let Some(a) = admitted {
                window.frontier = Some(window.frontier().saturating_add(a));
            }
            let mut chunk = Chunk::default();
            let mut t = window.lower;
            for (step, cpu, reading) in steps {
                t = t.saturating_add(step);
                if reading {
                    chunk.readings.push(EnergyReading { ts_ns: t, ..EnergyReading::default() });
                } else {
                    chunk.switches.push(SwitchEvent { ts_ns: t, cpu, ..SwitchEvent::default() });
                }
            }
            // Out of order, as drains interleave CPUs.
            chunk.switches.reverse();
            prop_assert_eq!(window.upper(&chunk), window.upper_by_walk(&chunk));
        }
    }
}
