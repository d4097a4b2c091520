//! Cutting time into reading intervals for one energy source.
//!
//! An interval runs between two consecutive readings of a source. Intervals shorter than the
//! counter's update period (half of it after a kept interval, whose end saw an update), or
//! whose delta is zero, are merged into the next one: RAPL
//! updates about every 1 ms (seeds 000, 004), so a shorter window reads 0 or a whole update
//! step, and a window that read 0 must never be reported as 0 W (docs/ARCHITECTURE.md, "Energy counters").
//! Flagged readings (counter went backwards, implausible power) end a bad interval, which is
//! dropped and counted — never turned into negative energy.

use crate::pb::v1::EnergyReading;

/// One kept interval `[start_ns, end_ns)` of a source.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    /// Start, ns.
    pub start_ns: u64,
    /// End (exclusive), ns.
    pub end_ns: u64,
    /// Measured energy, µJ (≥ 0).
    pub energy_uj: f64,
    /// GPU sources: per pid, Σ sm_util% × ns over the merged readings (utilisation-time).
    pub gpu_util_ns: Vec<(u32, f64)>,
    /// How many reading pairs were merged into this interval (1 = not merged).
    pub pieces: u32,
}

impl Interval {
    /// Length in ns.
    pub fn len_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    fn absorb(&mut self, next: Interval) {
        self.end_ns = next.end_ns;
        self.energy_uj += next.energy_uj;
        self.pieces += next.pieces;
        for (pid, u) in next.gpu_util_ns {
            match self.gpu_util_ns.iter_mut().find(|(p, _)| *p == pid) {
                Some((_, acc)) => *acc += u,
                None => self.gpu_util_ns.push((pid, u)),
            }
        }
    }
}

/// What happened to a source's readings on the way to intervals.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IntervalStats {
    /// Intervals dropped because their closing reading was flagged or went backwards.
    pub dropped: u64,
    /// Time covered by dropped intervals, ns.
    pub dropped_ns: u64,
    /// Reading pairs merged into a neighbour (too short or zero delta).
    pub merged: u64,
}

/// The update period the readings show where the counter was read faster than it
/// updated; else `stated`, the period start-up measured or the source stated.
///
/// A counter that states no period is timed by watching it change for 50 ms at start-up
/// (`energy::reader::measure`); one that updates once a second (a VM's shared counter
/// behind a powercap tree) changes at most once in that window, and the recording holds
/// the window's length, a lower bound 20 times too short. The readings say it: read
/// every 250 ms, the changes come a second apart. Taken from them, the counter's short
/// rows and static bound are those of a once-a-second counter, as they are where the
/// source states its period. The changes' median spacing counts when it is at least two
/// reads' (most reads saw nothing new); a counter that changes at every read (RAPL read
/// every 10 ms) keeps `stated`, which its reads cannot resolve.
pub fn update_period_ns(stated: u64, read_ns: u64, readings: &[&EnergyReading]) -> u64 {
    let mut sorted: Vec<&EnergyReading> = readings.to_vec();
    sorted.sort_by_key(|r| r.ts_ns);
    // Each change is timed at the first read that saw it; a flagged read times nothing.
    let changes: Vec<u64> = sorted
        .windows(2)
        .filter(|w| w[1].flag.is_empty() && w[1].energy_uj != w[0].energy_uj)
        .map(|w| w[1].ts_ns)
        .collect();
    let mut change_gaps: Vec<u64> = changes.windows(2).map(|w| w[1] - w[0]).collect();
    if change_gaps.len() < MIN_CHANGE_GAPS || read_ns == 0 {
        return stated;
    }
    let change = median(&mut change_gaps);
    if change >= 2 * read_ns && change > stated {
        change
    } else {
        stated
    }
}

/// How often the counter was read, ns: as the recording says, else (older recordings) the
/// readings' median spacing, which is the reads' wherever every read saw a change (0 with
/// fewer than two readings).
pub fn read_interval_ns(recorded: u64, readings: &[&EnergyReading]) -> u64 {
    if recorded > 0 {
        return recorded;
    }
    let mut ts: Vec<u64> = readings.iter().map(|r| r.ts_ns).collect();
    ts.sort_unstable();
    let mut gaps: Vec<u64> = ts.windows(2).map(|w| w[1] - w[0]).collect();
    if gaps.is_empty() {
        return 0;
    }
    median(&mut gaps)
}

/// A source's readings without a stale head, and the time left out, ns. A counter read
/// faster than it updates (`period_ns` at least two reads of `read_ns`) starts a recording
/// with the value of an update made before the recording began, up to a period earlier:
/// the energy up to the first change it shows was drawn over that much more time than the
/// recording holds, and split over the recording's first moments it gave whatever ran
/// there (the recorder starting up) a share of energy drawn before. The head is left out,
/// from the recorder's first reading (energy 0) to the first reading that saw a change. A
/// live window's first reading is one that saw a change, and has no stale head.
pub fn without_stale_head(
    mut readings: Vec<&EnergyReading>,
    period_ns: u64,
    read_ns: u64,
) -> (Vec<&EnergyReading>, u64) {
    readings.sort_by_key(|r| r.ts_ns);
    if read_ns == 0 || period_ns < 2 * read_ns {
        return (readings, 0);
    }
    let Some(first) = readings.first().copied().filter(|r| r.energy_uj == 0.0) else {
        return (readings, 0);
    };
    match readings.iter().position(|r| r.energy_uj != first.energy_uj) {
        Some(i) => {
            let head_ns = readings[i].ts_ns - first.ts_ns;
            (readings.split_off(i), head_ns)
        }
        None => (readings, 0),
    }
}

/// One source's readings as analysis takes them: sorted, without a stale head
/// ([`without_stale_head`]), with the update period they show ([`update_period_ns`]) and
/// the read interval ([`read_interval_ns`]), and the head's time, ns.
pub struct Timed<'a> {
    /// The readings kept.
    pub readings: Vec<&'a EnergyReading>,
    /// Update period, ns.
    pub period_ns: u64,
    /// Read interval, ns.
    pub read_ns: u64,
    /// Time of the head left out, ns.
    pub head_ns: u64,
}

/// [`Timed`] readings of `source` out of `readings` (any source, any order).
pub fn timed<'a>(source: &crate::pb::v1::EnergySource, readings: &'a [EnergyReading]) -> Timed<'a> {
    let mine: Vec<&EnergyReading> = readings
        .iter()
        .filter(|r| r.source_id == source.id)
        .collect();
    let read_ns = read_interval_ns(source.read_interval_ns, &mine);
    let period_ns = update_period_ns(source.update_period_ns, read_ns, &mine);
    let (readings, head_ns) = without_stale_head(mine, period_ns, read_ns);
    Timed {
        readings,
        period_ns,
        read_ns,
        head_ns,
    }
}

/// Gaps between changes [`update_period_ns`] needs before it reads a period from them.
const MIN_CHANGE_GAPS: usize = 3;

fn median(v: &mut [u64]) -> u64 {
    let mid = v.len() / 2;
    *v.select_nth_unstable(mid).1
}

/// Cuts one source's readings (any order) into intervals; `min_len_ns` is the counter's
/// update period (0 when unknown: only zero-delta merging applies).
pub fn cut(readings: &[&EnergyReading], min_len_ns: u64) -> (Vec<Interval>, IntervalStats) {
    let mut sorted: Vec<&EnergyReading> = readings.to_vec();
    sorted.sort_by_key(|r| r.ts_ns);
    let mut out: Vec<Interval> = Vec::new();
    let mut stats = IntervalStats::default();
    let mut pending: Option<Interval> = None;
    for pair in sorted.windows(2) {
        let (prev, cur) = (pair[0], pair[1]);
        let dt = cur.ts_ns - prev.ts_ns;
        let delta = cur.energy_uj - prev.energy_uj;
        if !cur.flag.is_empty() || !delta.is_finite() || delta < 0.0 {
            stats.dropped += 1;
            stats.dropped_ns += dt;
            // A bad interval breaks the chain: what was pending stands alone if it carries
            // energy; a zero-energy stretch is dropped (it loses no energy).
            if let Some(p) = pending.take() {
                if p.energy_uj > 0.0 {
                    out.push(p);
                } else {
                    stats.dropped_ns += p.len_ns();
                }
            }
            continue;
        }
        let piece = Interval {
            start_ns: prev.ts_ns,
            end_ns: cur.ts_ns,
            energy_uj: delta,
            gpu_util_ns: cur
                .gpu_processes
                .iter()
                .map(|g| (g.pid, f64::from(g.sm_util) * dt as f64))
                .collect(),
            pieces: 1,
        };
        let current = match pending.take() {
            Some(mut p) => {
                stats.merged += 1;
                p.absorb(piece);
                p
            }
            None => piece,
        };
        // An interval that began where the last kept one ended starts at a reading that saw
        // an update, so it holds whole updates once it ends at the next reading that sees
        // one: from half a period on it closes there. Held to a whole period, it would take
        // in the reads after that update that saw nothing new (time none of its energy
        // covers) whenever two updates came a little less than a period apart, and its
        // end, and every later one, would drift further behind the updates: a counter
        // updated once a second and read every 10 ms drifted 6 ms a second, 120 ms after
        // 20 s, and busy time that far from the energy it drew biased the regression.
        let chained = out.last().is_some_and(|l| l.end_ns == current.start_ns);
        let long_enough = if chained {
            current.len_ns() >= (min_len_ns / 2).max(1)
        } else {
            current.len_ns() >= min_len_ns.max(1)
        };
        if current.energy_uj > 0.0 && long_enough {
            out.push(current);
        } else {
            pending = Some(current);
        }
    }
    if let Some(p) = pending {
        match out.last_mut() {
            // A tail the counter has not updated over holds none of its energy yet: stretching
            // the last interval over it would spread that interval's energy over time it
            // does not cover (a counter updated once a second leaves up to a second).
            _ if p.energy_uj <= 0.0 => stats.dropped_ns += p.len_ns(),
            Some(last) if last.end_ns == p.start_ns => {
                stats.merged += 1;
                last.absorb(p);
            }
            _ if p.energy_uj > 0.0 => out.push(p),
            _ => stats.dropped_ns += p.len_ns(),
        }
    }
    (out, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(ts_ns: u64, energy_uj: f64, flag: &str) -> EnergyReading {
        EnergyReading {
            ts_ns,
            energy_uj,
            flag: flag.into(),
            ..Default::default()
        }
    }

    fn spans(iv: &[Interval]) -> Vec<(u64, u64, f64)> {
        iv.iter()
            .map(|i| (i.start_ns, i.end_ns, i.energy_uj))
            .collect()
    }

    #[test]
    fn plain_intervals() {
        let rs = [r(0, 0.0, ""), r(10, 5.0, ""), r(20, 12.0, "")];
        let refs: Vec<_> = rs.iter().collect();
        let (iv, st) = cut(&refs, 1);
        assert_eq!(spans(&iv), vec![(0, 10, 5.0), (10, 20, 7.0)]);
        assert_eq!(st, IntervalStats::default());
    }

    #[test]
    fn zero_delta_merges_into_next() {
        let rs = [
            r(0, 0.0, ""),
            r(10, 0.0, ""),
            r(20, 8.0, ""),
            r(30, 9.0, ""),
        ];
        let refs: Vec<_> = rs.iter().rev().collect(); // any order
        let (iv, st) = cut(&refs, 1);
        assert_eq!(spans(&iv), vec![(0, 20, 8.0), (20, 30, 1.0)]);
        assert_eq!(iv[0].pieces, 2);
        assert_eq!(st.merged, 1);
    }

    #[test]
    fn short_intervals_merge_until_update_period() {
        // Update period 1000 ns: 300-ns windows merge until they reach it.
        let rs = [
            r(0, 0.0, ""),
            r(300, 1.0, ""),
            r(600, 1.0, ""),
            r(1100, 4.0, ""),
            r(2200, 6.0, ""),
        ];
        let refs: Vec<_> = rs.iter().collect();
        let (iv, _) = cut(&refs, 1000);
        assert_eq!(spans(&iv), vec![(0, 1100, 4.0), (1100, 2200, 2.0)]);
    }

    #[test]
    fn a_slow_counter_read_often_keeps_its_intervals_on_its_updates() {
        // Updated every 995 ns (a little under its nominal 1,000), read every 10 ns: each
        // interval must end at the first read that saw an update, not drift past it.
        let updates: Vec<u64> = (1..=40).map(|k| k * 995).collect();
        let rs: Vec<EnergyReading> = (0..=4_000u64)
            .step_by(10)
            .map(|t| r(t, updates.iter().filter(|&&u| u <= t).count() as f64, ""))
            .collect();
        let refs: Vec<_> = rs.iter().collect();
        let (iv, _) = cut(&refs, 1000);
        assert!(iv.len() >= 3, "{:?}", spans(&iv));
        for i in &iv {
            let last_update = updates.iter().rev().find(|&&u| u <= i.end_ns).copied();
            let late = last_update.map(|u| i.end_ns - u);
            assert!(late.is_some_and(|l| l < 10), "{:?}", spans(&iv));
            assert_eq!(i.energy_uj.fract(), 0.0);
        }
    }

    #[test]
    fn a_counter_read_faster_than_it_updates_shows_its_period() {
        // Updated every 1,000 ns, read every 250: start-up stated a 50-ns lower bound.
        let rs: Vec<EnergyReading> = (0..=8_000u64)
            .step_by(250)
            .map(|t| r(t, (t / 1_000) as f64, ""))
            .collect();
        let refs: Vec<_> = rs.iter().collect();
        assert_eq!(update_period_ns(50, 250, &refs), 1_000);
        // As the recorder writes them: the reads that saw no change are not there.
        let changed: Vec<&EnergyReading> = rs.iter().filter(|r| r.ts_ns % 1_000 == 0).collect();
        assert_eq!(update_period_ns(50, 250, &changed), 1_000);
        // Read as often as it updates, the readings cannot tell.
        assert_eq!(update_period_ns(50, 1_000, &changed), 50);
        // A stated period longer than the readings show is kept (it is not a lower bound).
        assert_eq!(update_period_ns(2_000, 250, &refs), 2_000);
    }

    #[test]
    fn a_slow_counter_leaves_out_the_energy_before_its_first_update() {
        // Updated once a second, read every 20 ns of 1,000: the recorder's first reading
        // (0) holds an update made before it; up to the first change is left out.
        let rs = [
            r(0, 0.0, ""),
            r(300, 9.0, ""),
            r(1_300, 14.0, ""),
            r(2_300, 19.0, ""),
        ];
        let refs: Vec<_> = rs.iter().collect();
        let (kept, head_ns) = without_stale_head(refs.clone(), 1_000, 20);
        assert_eq!(
            kept.iter().map(|r| r.ts_ns).collect::<Vec<_>>(),
            [300, 1_300, 2_300]
        );
        assert_eq!(head_ns, 300);
        // A fast counter (RAPL read every 10 of its 1) keeps it: an update is that old.
        assert_eq!(without_stale_head(refs.clone(), 1, 10), (refs.clone(), 0));
        // A live window starts at a reading that saw a change: nothing is stale.
        let window: Vec<_> = refs[1..].to_vec();
        assert_eq!(without_stale_head(window.clone(), 1_000, 20), (window, 0));
    }

    #[test]
    fn a_counter_that_changes_at_every_read_keeps_its_stated_period() {
        // RAPL: updated every 1 ns, read every 10; a few reads late under load see nothing.
        let rs: Vec<EnergyReading> = (0..=1_000u64)
            .step_by(10)
            .map(|t| {
                r(
                    t,
                    (t - if t > 0 && t % 70 == 0 { 10 } else { 0 }) as f64,
                    "",
                )
            })
            .collect();
        let refs: Vec<_> = rs.iter().collect();
        assert_eq!(update_period_ns(1, 10, &refs), 1);
        // Too few changes to time: the stated period stands.
        let rs = [
            r(0, 0.0, ""),
            r(10, 0.0, ""),
            r(20, 1.0, ""),
            r(30, 1.0, ""),
        ];
        let refs: Vec<_> = rs.iter().collect();
        assert_eq!(update_period_ns(1, 10, &refs), 1);
    }

    #[test]
    fn trailing_zero_is_left_out_not_stretched_over() {
        let rs = [r(0, 0.0, ""), r(10, 3.0, ""), r(15, 3.0, "")];
        let refs: Vec<_> = rs.iter().collect();
        let (iv, stats) = cut(&refs, 1);
        assert_eq!(spans(&iv), vec![(0, 10, 3.0)], "never a 0 W interval");
        assert_eq!(stats.dropped_ns, 5);
    }

    #[test]
    fn a_short_tail_with_energy_merges_into_previous() {
        let rs = [r(0, 0.0, ""), r(1000, 3.0, ""), r(1300, 4.0, "")];
        let refs: Vec<_> = rs.iter().collect();
        let (iv, _) = cut(&refs, 1000);
        assert_eq!(spans(&iv), vec![(0, 1300, 4.0)]);
    }

    #[test]
    fn flagged_and_backwards_intervals_are_dropped() {
        let rs = [
            r(0, 0.0, ""),
            r(10, 2.0, ""),
            r(20, 900.0, "power above bound"),
            r(30, 905.0, ""),
            r(40, 904.0, ""), // went backwards, unflagged: dropped too
            r(50, 910.0, ""),
        ];
        let refs: Vec<_> = rs.iter().collect();
        let (iv, st) = cut(&refs, 1);
        assert_eq!(spans(&iv), vec![(0, 10, 2.0), (20, 30, 5.0), (40, 50, 6.0)]);
        assert_eq!(st.dropped, 2);
        assert_eq!(st.dropped_ns, 20);
        assert!(iv.iter().all(|i| i.energy_uj >= 0.0));
    }

    #[test]
    fn gpu_utilisation_accumulates_over_merged_readings() {
        use crate::pb::v1::GpuProcessUsage;
        let mut b = r(10, 0.0, "");
        b.gpu_processes = vec![GpuProcessUsage {
            pid: 7,
            sm_util: 50,
            ..Default::default()
        }];
        let mut c = r(30, 4.0, "");
        c.gpu_processes = vec![GpuProcessUsage {
            pid: 7,
            sm_util: 20,
            ..Default::default()
        }];
        let rs = [r(0, 0.0, ""), b, c];
        let refs: Vec<_> = rs.iter().collect();
        let (iv, _) = cut(&refs, 1);
        assert_eq!(iv.len(), 1);
        assert_eq!(iv[0].gpu_util_ns, vec![(7, 50.0 * 10.0 + 20.0 * 20.0)]);
    }
}
