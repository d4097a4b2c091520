//! Pushing each thread's energy down onto its stack samples.
//!
//! ALEA gives each sample the weight `pow_i × period`, so a function's energy is
//! the sum of its samples' weights. Here a thread's energy is known exactly per interval, so
//! we only have to split it over the thread's samples: within a stack window (a run of
//! consecutive intervals, ≥ `window_ns` long) each sample gets the thread's energy in the
//! window in proportion to the thread's power in the interval the sample fell in. With a
//! window of one interval that is the plain rule "interval energy divided equally over its
//! samples" (docs/ARCHITECTURE.md, "Attribution"). Windows longer than one interval matter because a 10 ms interval
//! at 99 Hz usually holds no sample of a given thread; a thread with energy but no sample in
//! a window keeps that energy at thread level (the `[no stack sample]` residual).

use std::collections::BTreeMap;

use foldhash::HashMap;

use super::split::{Occupancy, Split, ThreadKey};

#[derive(Default)]
struct Acc {
    energy_uj: f64,
    ns: f64,
    /// (sample index, thread power in its interval; NaN when the timeline had the thread
    /// off-CPU there — clock skew between sample and switch — filled with the mean).
    samples: Vec<(usize, f64)>,
    /// Whether it has anything in the current stack window (indexed threads).
    touched: bool,
}

/// Per-source splitter of thread energy over stack samples.
pub struct SampleSplitter {
    window_ns: u64,
    window_start_ns: Option<u64>,
    /// The window's threads in key order ([`Self::with_threads`]): their sums are kept by
    /// index, in `slots`, with the indices touched in the current stack window listed.
    keys: Vec<ThreadKey>,
    slots: Vec<Acc>,
    touched: Vec<u32>,
    /// Sums of threads without an index.
    acc: HashMap<ThreadKey, Acc>,
    /// Energy per sample, µJ.
    sample_uj: Vec<(usize, f64)>,
    /// Energy per thread that no sample carries, µJ: of threads with an index by index
    /// (a window of ten thousand threads adds to ten thousand sums per stack window, so
    /// not in an ordered map), of the others by key.
    residual_by_id: Vec<Option<f64>>,
    residual: BTreeMap<ThreadKey, f64>,
}

impl SampleSplitter {
    /// A splitter whose stack windows span at least `window_ns` (0: one interval each).
    pub fn new(window_ns: u64) -> Self {
        Self {
            window_ns,
            window_start_ns: None,
            keys: Vec::new(),
            slots: Vec::new(),
            touched: Vec::new(),
            acc: HashMap::default(),
            sample_uj: Vec::new(),
            residual_by_id: Vec::new(),
            residual: BTreeMap::new(),
        }
    }

    /// Keeps the sums of `keys` (sorted, each once: a window's threads) by their index in
    /// it, which [`Self::add_indexed`] is given, rather than in a map.
    pub fn with_threads(mut self, keys: &[ThreadKey]) -> Self {
        debug_assert!(keys.windows(2).all(|w| w[0] < w[1]));
        self.keys = keys.to_vec();
        self.slots = std::iter::repeat_with(Acc::default)
            .take(keys.len())
            .collect();
        self.residual_by_id = vec![None; keys.len()];
        self
    }

    /// The sums of `key` (`id`: its index among the threads, when the caller knows it).
    /// A thread with an index always has its sums there, whichever way it is found.
    fn acc_of(&mut self, key: ThreadKey, id: Option<u32>) -> &mut Acc {
        let id = id.or_else(|| self.keys.binary_search(&key).ok().map(|i| i as u32));
        match id {
            Some(id) => {
                debug_assert_eq!(self.keys[id as usize], key);
                let acc = &mut self.slots[id as usize];
                if !acc.touched {
                    acc.touched = true;
                    self.touched.push(id);
                }
                acc
            }
            None => self.acc.entry(key).or_default(),
        }
    }

    /// Adds one interval `[start_ns, end_ns)`: its split, its occupancy, and the samples that
    /// fell in it on the domain's CPUs, as `(sample index, thread)`. The threads are found
    /// by key; the tests check the indexed path against it.
    #[cfg(test)]
    pub fn add_interval(
        &mut self,
        start_ns: u64,
        end_ns: u64,
        split: &Split,
        occ: &Occupancy,
        samples: &[(usize, ThreadKey)],
    ) {
        self.add_indexed(start_ns, end_ns, split, occ, samples, &[]);
    }

    /// [`Self::add_interval`], with `ids`: the index of each of `occ`'s threads among those
    /// given to [`Self::with_threads`], in `occ`'s order (empty when not known).
    pub fn add_indexed(
        &mut self,
        start_ns: u64,
        end_ns: u64,
        split: &Split,
        occ: &Occupancy,
        samples: &[(usize, ThreadKey)],
        ids: &[u32],
    ) {
        if let Some(ws) = self.window_start_ns
            && end_ns.saturating_sub(ws) > self.window_ns
        {
            self.flush();
        }
        self.window_start_ns.get_or_insert(start_ns);
        // Power per thread is only looked up by the interval's samples: most intervals have
        // none.
        let mut power: HashMap<ThreadKey, f64> = HashMap::default();
        // `split.threads` is built from `occ.threads` in its order: walk both together,
        // looking a thread up only where they differ.
        let aligned = ids.len() == split.threads.len();
        let mut in_occ = occ.threads.iter();
        for (j, &(key, e)) in split.threads.iter().enumerate() {
            let ns = match in_occ.next() {
                Some((k, t)) if *k == key => t.ns,
                _ => occ.threads.get(&key).map_or(0.0, |t| t.ns),
            };
            let id = aligned.then(|| ids[j]);
            let acc = self.acc_of(key, id);
            acc.energy_uj += e;
            acc.ns += ns;
            if ns > 0.0 && !samples.is_empty() {
                power.insert(key, e / ns);
            }
        }
        for &(idx, key) in samples {
            let p = power.get(&key).copied().unwrap_or(f64::NAN);
            self.acc_of(key, None).samples.push((idx, p));
        }
    }

    /// Closes the current stack window.
    fn flush(&mut self) {
        self.window_start_ns = None;
        for id in std::mem::take(&mut self.touched) {
            let acc = std::mem::take(&mut self.slots[id as usize]);
            settle(
                acc,
                &mut self.sample_uj,
                &mut self.residual_by_id[id as usize],
            );
        }
        for (key, acc) in self.acc.drain() {
            let mut residual = self.residual.get(&key).copied();
            settle(acc, &mut self.sample_uj, &mut residual);
            if let Some(uj) = residual {
                self.residual.insert(key, uj);
            }
        }
    }

    /// Closes the last stack window: the energy per sample, and per thread the energy no
    /// sample carries (µJ), in key order.
    pub fn finish(mut self) -> (Vec<(usize, f64)>, BTreeMap<ThreadKey, f64>) {
        self.flush();
        let mut residual = self.residual;
        // The keys with an index never reach the map by key (`acc_of`): the two are apart.
        for (&key, uj) in self.keys.iter().zip(self.residual_by_id) {
            if let Some(uj) = uj {
                *residual.entry(key).or_insert(0.0) += uj;
            }
        }
        (self.sample_uj, residual)
    }
}

/// One thread's stack window: its energy onto its samples, or to its `residual` (`None`
/// until it has one) without any.
fn settle(acc: Acc, sample_uj: &mut Vec<(usize, f64)>, residual: &mut Option<f64>) {
    if acc.energy_uj == 0.0 {
        // Samples of a thread that got no energy here weigh nothing.
        sample_uj.extend(acc.samples.iter().map(|&(i, _)| (i, 0.0)));
        return;
    }
    if acc.samples.is_empty() {
        *residual.get_or_insert(0.0) += acc.energy_uj;
        return;
    }
    let mean = if acc.ns > 0.0 {
        acc.energy_uj / acc.ns
    } else {
        1.0
    };
    let p: Vec<f64> = acc
        .samples
        .iter()
        .map(|&(_, p)| if p.is_nan() { mean } else { p })
        .collect();
    let total: f64 = p.iter().sum();
    let n = p.len() as f64;
    for (&(idx, _), &pi) in acc.samples.iter().zip(&p) {
        let w = if total > 0.0 {
            acc.energy_uj * pi / total
        } else {
            acc.energy_uj / n
        };
        sample_uj.push((idx, w));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::split::ThreadTime;

    fn occ(threads: &[(ThreadKey, f64)]) -> Occupancy {
        Occupancy {
            threads: threads
                .iter()
                .map(|&(k, ns)| (k, ThreadTime { ns, weighted: ns }))
                .collect(),
            ..Default::default()
        }
    }

    fn split(threads: &[(ThreadKey, f64)]) -> Split {
        Split {
            threads: threads.to_vec(),
            ..Default::default()
        }
    }

    fn weight(sample_uj: &[(usize, f64)], idx: usize) -> f64 {
        sample_uj
            .iter()
            .filter(|(i, _)| *i == idx)
            .map(|(_, w)| w)
            .sum()
    }

    #[test]
    fn interval_energy_divided_equally_over_samples() {
        let mut s = SampleSplitter::new(0);
        let (a, b) = ((1, 1), (2, 2));
        s.add_interval(
            0,
            10,
            &split(&[(a, 90.0), (b, 10.0)]),
            &occ(&[(a, 9.0), (b, 1.0)]),
            &[(0, a), (1, a), (2, a)],
        );
        let (sample_uj, residual) = s.finish();
        for i in 0..3 {
            assert!((weight(&sample_uj, i) - 30.0).abs() < 1e-12);
        }
        assert_eq!(residual.get(&b), Some(&10.0), "b had energy but no sample");
    }

    #[test]
    fn window_spreads_energy_by_interval_power() {
        // Window spans both intervals: thread a draws 2 µJ/ns in the first, 1 in the second;
        // one sample in each: weights 2:1 of the window's 30 µJ.
        let mut s = SampleSplitter::new(100);
        let a = (1, 1);
        s.add_interval(0, 10, &split(&[(a, 20.0)]), &occ(&[(a, 10.0)]), &[(0, a)]);
        s.add_interval(10, 20, &split(&[(a, 10.0)]), &occ(&[(a, 10.0)]), &[(1, a)]);
        let (sample_uj, residual) = s.finish();
        assert!((weight(&sample_uj, 0) - 20.0).abs() < 1e-12);
        assert!((weight(&sample_uj, 1) - 10.0).abs() < 1e-12);
        assert!(residual.is_empty());
    }

    #[test]
    fn windows_close_when_long_enough() {
        let mut s = SampleSplitter::new(10);
        let a = (1, 1);
        s.add_interval(0, 10, &split(&[(a, 20.0)]), &occ(&[(a, 10.0)]), &[]);
        // This interval would make the window 20 ns long: the first window closes with no
        // sample, its energy becomes residual.
        s.add_interval(10, 20, &split(&[(a, 10.0)]), &occ(&[(a, 10.0)]), &[(0, a)]);
        let (sample_uj, residual) = s.finish();
        assert_eq!(residual.get(&a), Some(&20.0));
        assert!((weight(&sample_uj, 0) - 10.0).abs() < 1e-12);
    }

    #[test]
    fn threads_kept_by_index_give_what_the_map_gives_bit_for_bit() {
        // Three threads that run, indexed; (9, 9) is indexed but only ever shows in samples
        // (clock skew) and (8, 8) in samples without an index; windows of two intervals.
        let (a, b, c) = ((1, 1), (2, 2), (7, 7));
        let keys = [a, b, c, (9, 9)];
        let mut plain = SampleSplitter::new(20);
        let mut indexed = SampleSplitter::new(20).with_threads(&keys);
        for i in 0..6u64 {
            let x = 1.0 + i as f64 * 0.37;
            let threads = [(a, 3.0 * x), (b, x / 7.0), (c, 0.1 + x)];
            let times = [(a, 10.0 - x), (b, 2.0 * x), (c, 1.0)];
            let n = 10 * i as usize;
            let samples: Vec<(usize, ThreadKey)> = match i % 3 {
                0 => vec![(n, a), (n + 1, (9, 9)), (n + 2, (8, 8))],
                1 => vec![(n, c), (n + 1, c)],
                _ => Vec::new(),
            };
            let (t0, t1) = (10 * i, 10 * i + 10);
            let (split, occ) = (split(&threads), occ(&times));
            plain.add_interval(t0, t1, &split, &occ, &samples);
            // Without indices once: found by key, into the same sums.
            let ids: &[u32] = if i == 4 { &[] } else { &[0, 1, 2] };
            indexed.add_indexed(t0, t1, &split, &occ, &samples, ids);
        }
        let (plain, plain_residual) = plain.finish();
        let (indexed, indexed_residual) = indexed.finish();
        let sorted = |s: &[(usize, f64)]| {
            let mut v: Vec<(usize, u64)> = s.iter().map(|&(i, w)| (i, w.to_bits())).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(sorted(&plain), sorted(&indexed));
        assert_eq!(plain.len(), 10);
        let bits = |r: &BTreeMap<ThreadKey, f64>| {
            r.iter().map(|(&k, v)| (k, v.to_bits())).collect::<Vec<_>>()
        };
        assert_eq!(bits(&plain_residual), bits(&indexed_residual));
        assert!(plain_residual.contains_key(&b));
    }

    #[test]
    fn sample_of_a_thread_without_energy_weighs_nothing() {
        let mut s = SampleSplitter::new(0);
        s.add_interval(
            0,
            10,
            &split(&[((1, 1), 5.0)]),
            &occ(&[((1, 1), 10.0)]),
            &[(0, (9, 9)), (1, (1, 1))],
        );
        let (sample_uj, _) = s.finish();
        assert_eq!(weight(&sample_uj, 0), 0.0);
        assert_eq!(weight(&sample_uj, 1), 5.0);
    }
}
