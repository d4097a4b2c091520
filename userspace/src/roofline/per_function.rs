//! Run counts per stack sample and per function (`report --by function --roofline`).
//!
//! The probes read the run counters at every switch and every sampler tick, so counts
//! come per interval of a run, at most one sampling period long. A sample is taken just
//! after its tick's read, so it opens an interval: it gets the counts of the first
//! interval on its CPU that ends at or after it, if that interval is its thread's (several
//! samples in one interval, which only missing reads allow, share it evenly). Counts of
//! intervals with no sample stay with their thread (`[no stack sample]`), so no count is
//! lost or made up: per counter, samples plus residuals equal the counted busy intervals.
//!
//! PURE but for symbolizing: a function of the recording and its analysis.

use std::collections::HashMap;

use crate::{
    analysis::{self, Analysis},
    profile::{self, Filter, Profile, Residual, SampleValues, ValueType},
    record::{Recording, run_counts::MAX_COUNTERS},
};

/// Value-type name of run counter `event` in a profile (`count_instructions`).
pub fn value_name(event: &str) -> String {
    format!("count_{event}")
}

/// Each sample's share of its run's counts, and the counts no sample carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SampleCounts {
    /// Per `rec.samples[i]`: its share of counter k's count (0 when not counted).
    pub per_sample: Vec<[f64; MAX_COUNTERS]>,
    /// Per (tgid, tid): counts of its runs without a sample.
    pub residual: HashMap<(u32, u32), [f64; MAX_COUNTERS]>,
    /// Samples that fell in a counted run.
    pub samples_counted: usize,
}

/// Splits `rec.run_counts` over the samples (see the module docs).
pub fn sample_counts(rec: &Recording) -> SampleCounts {
    let mut per_cpu: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, r) in rec.run_counts.iter().enumerate() {
        per_cpu.entry(r.cpu).or_default().push(i);
    }
    for runs in per_cpu.values_mut() {
        runs.sort_by_key(|&i| rec.run_counts[i].ts_ns);
    }
    // Run of each sample, and samples per run.
    let mut run_of = vec![None; rec.samples.len()];
    let mut samples_in = vec![0u32; rec.run_counts.len()];
    for (s, sample) in rec.samples.iter().enumerate() {
        let Some(runs) = per_cpu.get(&sample.cpu) else {
            continue;
        };
        let at = runs.partition_point(|&i| rec.run_counts[i].ts_ns < sample.ts_ns);
        if let Some(&i) = runs.get(at)
            && rec.run_counts[i].tid == sample.tid
            && sample.tid != 0
        {
            run_of[s] = Some(i);
            samples_in[i] = samples_in[i].saturating_add(1);
        }
    }
    let as_f64 = |c: &[Option<u64>; MAX_COUNTERS]| c.map(|v| v.map_or(0.0, |n| n as f64));
    let mut out = SampleCounts {
        per_sample: Vec::with_capacity(rec.samples.len()),
        ..SampleCounts::default()
    };
    for run in run_of {
        out.per_sample.push(match run {
            Some(i) => {
                out.samples_counted += 1;
                let n = f64::from(samples_in[i].max(1));
                as_f64(&rec.run_counts[i].counts).map(|c| c / n)
            }
            None => [0.0; MAX_COUNTERS],
        });
    }
    for (i, r) in rec.run_counts.iter().enumerate() {
        if samples_in[i] > 0 || r.tid == 0 {
            continue;
        }
        let tgid = rec.threads.get(&r.tid).map_or(r.tid, |t| t.tgid);
        let slot = out.residual.entry((tgid, r.tid)).or_default();
        for (s, c) in slot.iter_mut().zip(as_f64(&r.counts)) {
            *s += c;
        }
    }
    out
}

/// The analysis's per-sample weights ([`analysis::sample_values`]) with the first `events`
/// run counters appended as `count_EVENT` values.
pub(crate) fn with_counts(
    mut weights: SampleValues,
    counts: &SampleCounts,
    events: &[String],
) -> SampleValues {
    let k = events.len().min(MAX_COUNTERS);
    let width = weights.value_types.len();
    weights.value_types.extend(
        events[..k]
            .iter()
            .map(|e| ValueType::new(&value_name(e), "count")),
    );
    let rows = weights.values.len() / width.max(1);
    let mut values = Vec::with_capacity(rows * (width + k));
    for (i, row) in weights.values.chunks(width.max(1)).enumerate() {
        values.extend_from_slice(row);
        let c = counts.per_sample.get(i).copied().unwrap_or_default();
        values.extend_from_slice(&c[..k]);
    }
    weights.values = values;
    for r in &mut weights.residuals {
        r.values.extend(std::iter::repeat_n(0.0, k));
    }
    let mut residual: Vec<_> = counts.residual.iter().collect();
    residual.sort_by_key(|(key, _)| **key);
    weights
        .residuals
        .extend(residual.into_iter().map(|(&(tgid, tid), c)| {
            Residual {
                tgid,
                tid,
                values: std::iter::repeat_n(0.0, width)
                    .chain(c[..k].iter().copied())
                    .collect(),
            }
        }));
    weights
}

/// One function's self (leaf) figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionCounts {
    /// Function name as `report --by function` shows it.
    pub function: String,
    /// Self energy of the headline domains, J.
    pub self_j: f64,
    /// Self samples.
    pub samples: u64,
    /// Self count of each run counter.
    pub counts: Vec<f64>,
}

/// The symbolized profile of `rec` with energy and run counts per sample.
pub fn profile(rec: &Recording, a: &Analysis, events: &[String]) -> Profile {
    let weights = with_counts(analysis::sample_values(rec, a), &sample_counts(rec), events);
    profile::build(
        rec,
        &weights,
        &mut analysis::symbolizer_for(rec),
        &Filter::default(),
    )
}

/// Self figures per function of `profile` (the leaf function that is not inlined into
/// another), most energy first; `energy` names the energy values summed
/// (`energy_package`, ...).
pub fn by_function(profile: &Profile, energy: &[String], events: &[String]) -> Vec<FunctionCounts> {
    let energy_idx: Vec<usize> = energy
        .iter()
        .filter_map(|e| profile.value_index(e))
        .collect();
    let count_idx: Vec<Option<usize>> = events
        .iter()
        .map(|e| profile.value_index(&value_name(e)))
        .collect();
    let samples_idx = profile.value_index(profile::SAMPLES);
    let mut by_name: HashMap<String, FunctionCounts> = HashMap::new();
    for s in &profile.samples {
        // The leaf function whose code ran: inlined frames (`mul_add` in a kernel) are
        // part of it, and the counts are the machine code's.
        let mut frames = s
            .frames
            .iter()
            .filter_map(|&f| profile.frames.get(f as usize));
        let Some(frame) = frames
            .clone()
            .find(|f| !f.inlined)
            .or_else(|| frames.next())
        else {
            continue;
        };
        let name = frame.display_name();
        let f = by_name
            .entry(name.to_string())
            .or_insert_with(|| FunctionCounts {
                function: name.into_owned(),
                counts: vec![0.0; events.len()],
                ..FunctionCounts::default()
            });
        let value = |i: usize| s.values.get(i).copied().unwrap_or(0.0);
        f.self_j += energy_idx.iter().map(|&i| value(i)).sum::<f64>() * 1e-6;
        f.samples += samples_idx.map_or(0, |i| value(i) as u64);
        for (c, idx) in f.counts.iter_mut().zip(&count_idx) {
            *c += idx.map_or(0.0, value);
        }
    }
    let mut rows: Vec<FunctionCounts> = by_name.into_values().collect();
    rows.sort_by(|a, b| {
        b.self_j
            .total_cmp(&a.self_j)
            .then(a.function.cmp(&b.function))
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pb::v1::{Sample, ThreadInfo},
        record::run_counts::CountedRun,
    };

    fn run(cpu: u32, ts_ns: u64, tid: u32, n: u64) -> CountedRun {
        CountedRun {
            ts_ns,
            cpu,
            tid,
            counts: [Some(n), Some(2 * n), None],
        }
    }

    fn sample(cpu: u32, ts_ns: u64, tid: u32) -> Sample {
        Sample {
            ts_ns,
            cpu,
            tid,
            tgid: tid,
            ..Sample::default()
        }
    }

    #[test]
    fn runs_split_over_their_samples_and_the_rest_stays_with_the_thread() {
        let mut rec = Recording {
            // CPU 0: tid 5 runs to 100 (two samples), tid 6 to 200 (none), idle to 300;
            // CPU 1: tid 5 runs to 150 (one sample).
            run_counts: vec![
                run(0, 100, 5, 1000),
                run(1, 150, 5, 30),
                run(0, 200, 6, 70),
                run(0, 300, 0, 9),
            ],
            samples: vec![
                sample(0, 40, 5),
                sample(0, 90, 5),
                sample(1, 120, 5),
                // In tid 6's run but tagged with another thread: not matched.
                sample(0, 150, 7),
                // After every counted run on its CPU.
                sample(1, 400, 5),
            ],
            ..Recording::default()
        };
        rec.threads.insert(
            6,
            ThreadInfo {
                tid: 6,
                tgid: 60,
                ..ThreadInfo::default()
            },
        );
        let c = sample_counts(&rec);
        assert_eq!(c.samples_counted, 3);
        assert_eq!(c.per_sample[0], [500.0, 1000.0, 0.0]);
        assert_eq!(c.per_sample[1], [500.0, 1000.0, 0.0]);
        assert_eq!(c.per_sample[2], [30.0, 60.0, 0.0]);
        assert_eq!(c.per_sample[3], [0.0; 3]);
        assert_eq!(c.per_sample[4], [0.0; 3]);
        assert_eq!(c.residual.len(), 1);
        assert_eq!(c.residual[&(60, 6)], [70.0, 140.0, 0.0]);
        // Conservation: every busy run's count is on a sample or a residual.
        let total: f64 = c.per_sample.iter().map(|s| s[0]).sum::<f64>()
            + c.residual.values().map(|r| r[0]).sum::<f64>();
        assert_eq!(total, 1100.0);
    }

    #[test]
    fn counts_are_appended_to_the_weights() {
        let weights = SampleValues {
            value_types: vec![ValueType::new("cpu", "nanoseconds")],
            values: vec![10.0, 20.0],
            residuals: vec![Residual {
                tgid: 1,
                tid: 1,
                values: vec![5.0],
            }],
            ..SampleValues::default()
        };
        let counts = SampleCounts {
            per_sample: vec![[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
            residual: HashMap::from([((9, 9), [7.0, 8.0, 9.0])]),
            samples_counted: 2,
        };
        let w = with_counts(
            weights,
            &counts,
            &["instructions".into(), "llc-misses".into()],
        );
        assert_eq!(w.value_types.len(), 3);
        assert_eq!(w.value_types[1].name, "count_instructions");
        assert_eq!(w.values, [10.0, 1.0, 2.0, 20.0, 4.0, 5.0]);
        assert_eq!(w.residuals[0].values, [5.0, 0.0, 0.0]);
        assert_eq!(w.residuals[1].values, [0.0, 7.0, 8.0]);
    }
}
