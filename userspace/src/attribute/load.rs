//! Load rows of one window per CPU energy source: measured power against busy CPUs over
//! spans of at least a row length, with the span's time and activity. The agent keeps the
//! quietest of them over hours to learn static power (`agent::learn`); the fit is the one
//! attribution uses ([`super::zero_load`]). PURE.

use crate::pb::v1::EnergyDomain;

use super::Input;
use super::interval;
use super::split::Occupancy;
use super::static_power::source_key;
use super::zero_load::merge_spans;

/// One span of one source.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoadRow {
    /// End of the span, CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// Length, ns.
    pub len_ns: u64,
    /// Mean power, W.
    pub power_w: f64,
    /// Mean busy CPUs (threads + unknown time) of the source's CPUs.
    pub busy_cpus: f64,
    /// Activity events per second (cycles where the PMU has them) of the runs that carried
    /// a count, when any did.
    pub activity_per_s: Option<f64>,
}

/// The rows of one source.
#[derive(Clone, Debug, PartialEq)]
pub struct SourceLoad {
    /// [`source_key`] of the source: stable across runs.
    pub key: String,
    /// Source name, for metrics and logs.
    pub name: String,
    /// CPUs whose busy time counts.
    pub cpus: usize,
    /// Spans of at least `row_ns`.
    pub rows: Vec<LoadRow>,
}

/// Rows of every measured (not modelled) CPU source in `input`, merged to at least
/// `row_ns`. GPU sources have no busy CPUs and modelled ones no static power to learn.
pub fn load_rows(input: &Input<'_>, row_ns: u64) -> Vec<SourceLoad> {
    let mut out = Vec::new();
    for source in input.sources {
        if source.estimated || source.domain() == EnergyDomain::Gpu {
            continue;
        }
        let interval::Timed {
            readings,
            period_ns: period,
            ..
        } = interval::timed(source, input.readings);
        let (intervals, _) = interval::cut(&readings, period);
        let cpus = super::apportion::domain_cpus(input, source);
        // The weight is the run's raw count per ns, so `weighted_ns` sums counts. The rows
        // read busy and weighted totals only: no thread is listed per interval.
        let count_rate = |_: u32, run: &crate::timeline::Run| {
            run.activity
                .filter(|_| run.len_ns() > 0)
                .map_or(0.0, |c| c as f64 / run.len_ns() as f64)
        };
        let occs: Vec<Occupancy> = intervals
            .iter()
            .map(|iv| Occupancy::totals(input.timeline, &cpus, iv.start_ns, iv.end_ns, &count_rate))
            .collect();
        let rows = merge_spans(&intervals, &occs, row_ns)
            .iter()
            .map(|s| {
                let p = s.power_row();
                let len_ns = s.end_ns - s.start_ns;
                LoadRow {
                    end_ns: s.end_ns,
                    len_ns,
                    power_w: p.power_w,
                    busy_cpus: p.busy_cpus,
                    activity_per_s: (s.weighted_ns > 0.0)
                        .then(|| s.weighted_ns / (len_ns.max(1) as f64 * 1e-9)),
                }
            })
            .collect();
        out.push(SourceLoad {
            key: source_key(source),
            name: source.name.clone(),
            cpus: cpus.len(),
            rows,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::tests::input;
    use crate::testing::scenarios::one_cpu_always_busy;
    use crate::testing::sim::simulate;

    #[test]
    fn rows_span_the_row_length_and_follow_the_load() {
        let out = simulate(&one_cpu_always_busy(1));
        let inp = input(
            &out.timeline,
            &out.samples,
            &out.sources,
            &out.readings,
            &out.cpus,
        );
        let loads = load_rows(&inp, 1_000_000_000);
        assert_eq!(loads.len(), out.sources.len(), "{loads:?}");
        let load = &loads[0];
        assert_eq!(load.key, source_key(&out.sources[0]));
        assert!(load.rows.len() >= 5, "{load:?}");
        for r in &load.rows {
            assert!(r.len_ns >= 1_000_000_000, "{r:?}");
            // One CPU never idle: at least one busy CPU, never more than the source has.
            assert!(
                r.busy_cpus >= 0.99 && r.busy_cpus <= load.cpus as f64 + 1e-9,
                "{r:?}"
            );
            // 6 W static plus something for the busy CPUs.
            assert!(r.power_w > 6.0, "{r:?}");
        }
        // Spans are in order and do not overlap.
        assert!(
            load.rows
                .windows(2)
                .all(|w| w[0].end_ns <= w[1].end_ns - w[1].len_ns)
        );
    }
}
