//! The recent windows' stacks, in memory: what the web view's flamegraphs are drawn from
//! when the agent keeps no recordings (`--record-dir`). Every window's samples come with
//! their weights from the window's own attribution; samples with one stack in one thread
//! are folded into one (their weights summed), and windows are gathered into batches of
//! [`BATCH_NS`] whose tables hold only the processes sampled. The store is bounded twice:
//! by [`CAP_BYTES`] of batches and by [`MAX_AGE_NS`]; the oldest batch goes first.
//! Symbolizing waits for a request, and is done on the request's thread.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::agent::stacks::{self, Batch};
use crate::pb::v1 as pb;

/// Windows gathered into one batch, ns.
pub const BATCH_NS: u64 = 10_000_000_000;
/// What the store holds at most, bytes (about half an hour of a 2-CPU machine at 49 Hz).
pub const CAP_BYTES: usize = 48 << 20;
/// How far back it keeps, ns (an hour: the longest range a request may ask for).
pub const MAX_AGE_NS: u64 = 3_600_000_000_000;

/// The store.
#[derive(Default)]
pub struct Recent {
    /// Sealed batches with their size in bytes.
    done: VecDeque<(Arc<Batch>, usize)>,
    bytes: usize,
    pending: Option<Batch>,
    cap_bytes: usize,
}

impl Recent {
    /// A store of at most `cap_bytes`.
    pub fn new(cap_bytes: usize) -> Self {
        Self {
            cap_bytes,
            ..Self::default()
        }
    }

    /// Adds a window's batch.
    pub fn push(&mut self, batch: Batch) {
        let batch = folded(batch);
        let rest = stacks::gather(&mut self.pending, batch);
        if let Some(batch) = rest {
            self.seal();
            self.pending = Some(batch);
        }
        if self
            .pending
            .as_ref()
            .is_some_and(|p| p.end_ns.saturating_sub(p.start_ns) >= BATCH_NS)
        {
            self.seal();
        }
    }

    fn seal(&mut self) {
        let Some(batch) = self.pending.take() else {
            return;
        };
        let bytes = batch.bytes();
        self.bytes += bytes;
        let end_ns = batch.end_ns;
        self.done.push_back((Arc::new(batch), bytes));
        while let Some((old, old_bytes)) = self.done.front()
            && (self.bytes > self.cap_bytes || end_ns.saturating_sub(old.end_ns) > MAX_AGE_NS)
        {
            self.bytes -= old_bytes;
            self.done.pop_front();
        }
    }

    /// The bytes held by sealed batches.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The batches that overlap `[from_unix_ns, to_unix_ns)`, oldest first (the one still
    /// gathering copied), and the time the store covers, `(from, to)` unix ns.
    pub fn overlapping(
        &self,
        from_unix_ns: u64,
        to_unix_ns: u64,
    ) -> (Vec<Arc<Batch>>, Option<(u64, u64)>) {
        let all: Vec<Arc<Batch>> = self
            .done
            .iter()
            .map(|(b, _)| Arc::clone(b))
            .chain(self.pending.clone().map(Arc::new))
            .collect();
        let covered = all
            .first()
            .zip(all.last())
            .map(|(a, b)| (a.start_unix_ns, end_unix_ns(b)));
        let hits = all
            .into_iter()
            .filter(|b| b.start_unix_ns < to_unix_ns && end_unix_ns(b) > from_unix_ns)
            .collect();
        (hits, covered)
    }
}

/// A batch's end on the epoch clock.
pub fn end_unix_ns(b: &Batch) -> u64 {
    b.start_unix_ns + b.end_ns.saturating_sub(b.start_ns)
}

/// The samples of `batches` within `[from_unix_ns, to_unix_ns)` as one batch; residual
/// values (threads' energy with no sample) count by how much of their batch's time is in
/// the range. `None` when no batch overlaps.
pub fn merged(batches: &[Arc<Batch>], from_unix_ns: u64, to_unix_ns: u64) -> Option<Batch> {
    let mut out: Option<Batch> = None;
    for b in batches {
        let offset = b.start_unix_ns.wrapping_sub(b.start_ns);
        let k = b.weights.value_types.len();
        let w = &b.weights;
        let mut part = Batch {
            hostname: b.hostname.clone(),
            sample_hz: b.sample_hz,
            start_ns: b.start_ns,
            start_unix_ns: b.start_unix_ns,
            end_ns: b.end_ns,
            samples: Vec::new(),
            threads: b.threads.clone(),
            mappings: b.mappings.clone(),
            jit_symbols: b.jit_symbols.clone(),
            python_frames: b.python_frames.clone(),
            weights: crate::profile::SampleValues {
                value_types: w.value_types.clone(),
                values: Vec::new(),
                residuals: Vec::new(),
                estimated: w.estimated,
                source: w.source.clone(),
                model_row: w.model_row.clone(),
                model_error_pct: w.model_error_pct,
            },
        };
        for (i, s) in b.samples.iter().enumerate() {
            let at = s.ts_ns.wrapping_add(offset);
            if (from_unix_ns..to_unix_ns).contains(&at) {
                part.samples.push(s.clone());
                part.weights
                    .values
                    .extend_from_slice(&b.weights.values[i * k..(i + 1) * k]);
            }
        }
        let len = b.end_ns.saturating_sub(b.start_ns).max(1);
        let inside = end_unix_ns(b)
            .min(to_unix_ns)
            .saturating_sub(b.start_unix_ns.max(from_unix_ns));
        let share = inside.min(len) as f64 / len as f64;
        part.weights.residuals = b
            .weights
            .residuals
            .iter()
            .map(|r| crate::profile::Residual {
                values: r.values.iter().map(|v| v * share).collect(),
                ..r.clone()
            })
            .collect();
        match &mut out {
            None => out = Some(part),
            Some(acc) => {
                if let Some(part) = acc.absorb(part) {
                    // The zones changed within the range: the later ones are shown.
                    out = Some(part);
                }
            }
        }
    }
    out
}

/// `b` with the samples of one thread and one stack folded into the first of them, their
/// weights summed (a hot loop's samples are mostly one stack).
fn folded(mut b: Batch) -> Batch {
    type Key = (
        u32,
        u32,
        u64,
        Vec<u64>,
        Vec<u64>,
        Vec<u64>,
        Vec<u32>,
        i32,
        i32,
        i32,
    );
    let key = |s: &pb::Sample| -> Key {
        (
            s.tid,
            s.tgid,
            s.cgroup_id,
            s.kernel_stack.clone(),
            s.user_stack.clone(),
            s.python_stack.clone(),
            s.python_groups.clone(),
            s.unwind_method,
            s.unwind_stop,
            s.python_stop,
        )
    };
    let k = b.weights.value_types.len();
    let mut index: HashMap<Key, usize> = HashMap::new();
    let mut samples = Vec::new();
    let mut values: Vec<f64> = Vec::new();
    for (i, s) in b.samples.drain(..).enumerate() {
        let w = &b.weights.values[i * k..(i + 1) * k];
        let next = samples.len();
        let at = *index.entry(key(&s)).or_insert(next);
        if at == next {
            samples.push(s);
            values.extend_from_slice(w);
        } else {
            for (acc, v) in values[at * k..(at + 1) * k].iter_mut().zip(w) {
                *acc += v;
            }
        }
    }
    b.samples = samples;
    b.weights.values = values;
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{Residual, SampleValues, ValueType};

    const S: u64 = 1_000_000_000;
    /// The epoch time of monotonic 0 in these batches.
    const EPOCH: u64 = 1_700_000_000 * S;

    /// A window `[start, start + 1 s)` with one sample per (tid, leaf address, µJ) at its
    /// middle, and a residual of 5 µJ for thread 9.
    fn window(start: u64, samples: &[(u32, u64, f64)]) -> Batch {
        let mut b = Batch {
            hostname: "h".into(),
            sample_hz: 49,
            start_ns: start,
            start_unix_ns: EPOCH + start,
            end_ns: start + S,
            samples: Vec::new(),
            threads: HashMap::new(),
            mappings: HashMap::new(),
            jit_symbols: HashMap::new(),
            python_frames: Default::default(),
            weights: SampleValues {
                value_types: vec![ValueType::new("energy_package", "microjoules")],
                residuals: vec![Residual {
                    tgid: 9,
                    tid: 9,
                    values: vec![5.0],
                }],
                ..SampleValues::default()
            },
        };
        for &(tid, leaf, uj) in samples {
            b.samples.push(pb::Sample {
                ts_ns: start + S / 2,
                tid,
                tgid: tid,
                user_stack: vec![leaf, 0x1000],
                ..Default::default()
            });
            b.weights.values.push(uj);
        }
        b
    }

    fn total(b: &Batch) -> f64 {
        b.weights.values.iter().sum::<f64>()
            + b.weights
                .residuals
                .iter()
                .flat_map(|r| &r.values)
                .sum::<f64>()
    }

    #[test]
    fn one_stack_of_one_thread_folds_into_one_sample_and_keeps_its_energy() {
        let w = window(
            0,
            &[(1, 0xa, 2.0), (1, 0xa, 3.0), (2, 0xa, 4.0), (1, 0xb, 1.0)],
        );
        let before = total(&w);
        let f = folded(w);
        assert_eq!(
            f.samples.len(),
            3,
            "thread 1 at 0xa, thread 2 at 0xa, thread 1 at 0xb"
        );
        assert_eq!(f.weights.values, vec![5.0, 4.0, 1.0]);
        assert_eq!(total(&f), before);
    }

    #[test]
    fn a_range_takes_its_windows_samples_and_a_share_of_residuals() {
        let mut r = Recent::new(CAP_BYTES);
        for i in 0..25u64 {
            r.push(window(i * S, &[(1, 0xa, 10.0)]));
        }
        // 25 windows: two sealed batches of 10 s, five still gathering.
        let (all, covered) = r.overlapping(0, u64::MAX);
        assert_eq!(all.len(), 3);
        assert_eq!(covered, Some((EPOCH, EPOCH + 25 * S)));
        // Seconds 5 to 15: ten windows' samples, and half of each batch's residuals.
        let (hits, _) = r.overlapping(EPOCH + 5 * S, EPOCH + 15 * S);
        assert_eq!(hits.len(), 2);
        let m = merged(&hits, EPOCH + 5 * S, EPOCH + 15 * S).expect("merged");
        assert_eq!(m.weights.values.iter().sum::<f64>(), 100.0);
        let residual: f64 = m.weights.residuals.iter().flat_map(|r| &r.values).sum();
        assert!((residual - 2.0 * 0.5 * 50.0).abs() < 1e-9, "{residual}");
        assert_eq!(
            (m.start_unix_ns, m.end_ns),
            (EPOCH, 20 * S),
            "the batches' span"
        );
        assert!(
            merged(&hits, EPOCH + 100 * S, EPOCH + 200 * S).is_none_or(|m| m.samples.is_empty())
        );
    }

    #[test]
    fn the_store_stays_within_its_bytes_and_drops_the_oldest_first() {
        let one = {
            let mut r = Recent::new(usize::MAX);
            for t in 0..10 {
                r.push(window(t * S, &[(1, 0xa, 1.0), (2, 0xb, 1.0)]));
            }
            r.bytes()
        };
        assert!(one > 0, "ten windows make one sealed batch");
        let cap = 5 * one + one / 2;
        let mut r = Recent::new(cap);
        for i in 0..200u64 {
            r.push(window(i * S, &[(1, 0xa, 1.0), (2, 0xb, 1.0)]));
            assert!(r.bytes() <= cap, "{} bytes over a cap of {cap}", r.bytes());
        }
        let (all, covered) = r.overlapping(0, u64::MAX);
        // The newest five batches of ten windows (the 200th window sealed the last).
        assert_eq!(all.len(), 5);
        assert_eq!(covered, Some((EPOCH + 150 * S, EPOCH + 200 * S)));
    }
}
