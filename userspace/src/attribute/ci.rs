//! Confidence intervals for energy carried by a subset of stack samples (a function, a
//! stack, a group of threads).
//!
//! ALEA estimates a block's energy as the sum of its samples' weights; its
//! variance is `≈ n·s²` of the per-sample weights `Y_j = w_j·1[j ∈ f]`. Our thread energies
//! are exact (from the switch timeline), so the only sampling uncertainty is *which* of a
//! thread's samples hit `f`: stratifying by thread, `Var = Σ_θ p̂_θ(1−p̂_θ) Σ_{j∈θ} w_j²`,
//! which is ALEA's `n·s²` when weights are equal, and zero for a set of whole threads (a
//! process, cgroup or command) — their energy carries no sampling error. Rare subsets
//! (fewer than 10 hits or misses) use the Wilson interval, as the Wald interval fails there
//! (ALEA digest, "Observed 4").

use std::collections::HashMap;

use crate::pb::v1::EnergyDomain;

use super::attribution::Attribution;
use super::split::ThreadKey;

pub use super::linalg::Z95;

/// An energy estimate with its 95% confidence interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Estimate {
    /// Point estimate, µJ.
    pub energy_uj: f64,
    /// Lower bound, µJ.
    pub lo_uj: f64,
    /// Upper bound, µJ.
    pub hi_uj: f64,
    /// Samples in the subset.
    pub samples: u64,
}

impl Estimate {
    /// Shifts the estimate and its bounds by energy known exactly (no sampling error).
    pub fn plus_exact(mut self, uj: f64) -> Self {
        self.energy_uj += uj;
        self.lo_uj += uj;
        self.hi_uj += uj;
        self
    }
}

/// Wilson score interval for `k` successes in `n` trials.
pub fn wilson(k: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

#[derive(Default)]
struct Stratum {
    n: u64,
    k: u64,
    sum_w2: f64,
}

/// Energy over `domains` of the samples for which `selected(index)` holds, with its 95% CI.
pub fn estimate_samples(
    attr: &Attribution,
    domains: &[EnergyDomain],
    selected: impl Fn(usize) -> bool,
) -> Estimate {
    let mut strata: HashMap<ThreadKey, Stratum> = HashMap::new();
    let mut energy = 0.0;
    for (idx, (e, key)) in attr
        .sample_energy
        .iter()
        .zip(&attr.sample_thread)
        .enumerate()
    {
        let w = e.sum_of(domains);
        let s = strata.entry(*key).or_default();
        s.n += 1;
        s.sum_w2 += w * w;
        if selected(idx) {
            s.k += 1;
            energy += w;
        }
    }
    let (mut var, mut hits, mut trials) = (0.0, 0u64, 0u64);
    for s in strata.values().filter(|s| s.k > 0) {
        let p = s.k as f64 / s.n as f64;
        var += p * (1.0 - p) * s.sum_w2;
        hits += s.k;
        trials += s.n;
    }
    let misses = trials - hits;
    let (lo, hi) = if hits == 0 || misses == 0 {
        (energy, energy)
    } else if hits < 10 || misses < 10 {
        // Rare: scale the Wilson interval of the pooled hit rate.
        let p = hits as f64 / trials as f64;
        let (pl, ph) = wilson(hits, trials, Z95);
        (energy * pl / p, energy * ph / p)
    } else {
        let half = Z95 * var.sqrt();
        ((energy - half).max(0.0), energy + half)
    };
    Estimate {
        energy_uj: energy,
        lo_uj: lo,
        hi_uj: hi,
        samples: hits,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::attribution::PerDomain;

    fn attr_with(weights: &[(f64, ThreadKey)]) -> Attribution {
        Attribution {
            sources: Vec::new(),
            threads: Vec::new(),
            idle: PerDomain::default(),
            unknown: PerDomain::default(),
            measured: PerDomain::default(),
            sample_energy: weights
                .iter()
                .map(|&(w, _)| {
                    let mut e = PerDomain::default();
                    e.add(EnergyDomain::Package, w);
                    e
                })
                .collect(),
            sample_thread: weights.iter().map(|&(_, k)| k).collect(),
            headline: vec![EnergyDomain::Package],
            estimated: false,
        }
    }

    #[test]
    fn reproduces_alea_time_interval() {
        // Seed 001 digest vector: n = 1000 samples over 10 s, 200 in the block → t̂ = 2.0 s,
        // 95% CI [1.7521, 2.2479] s. With weights of 10 ms "per sample" the estimator is the
        // same one.
        let a = attr_with(&vec![(0.01, (1, 1)); 1000]);
        let e = estimate_samples(&a, &[EnergyDomain::Package], |i| i < 200);
        assert!((e.energy_uj - 2.0).abs() < 1e-9);
        assert!((e.lo_uj - 1.7521).abs() < 1e-4, "{e:?}");
        assert!((e.hi_uj - 2.2479).abs() < 1e-4, "{e:?}");
        assert_eq!(e.samples, 200);
    }

    #[test]
    fn whole_threads_have_no_sampling_error() {
        let a = attr_with(&[(1.0, (1, 1)), (2.0, (1, 1)), (5.0, (2, 2))]);
        let e = estimate_samples(&a, &[EnergyDomain::Package], |i| i < 2);
        assert_eq!((e.energy_uj, e.lo_uj, e.hi_uj), (3.0, 3.0, 3.0));
    }

    #[test]
    fn rare_subsets_use_wilson() {
        let a = attr_with(&vec![(1.0, (1, 1)); 100]);
        let e = estimate_samples(&a, &[EnergyDomain::Package], |i| i == 0);
        let (pl, ph) = wilson(1, 100, Z95);
        assert!((e.lo_uj - pl * 100.0).abs() < 1e-9 && (e.hi_uj - ph * 100.0).abs() < 1e-9);
        assert!(e.lo_uj > 0.0 && e.hi_uj > 4.0, "{e:?}");
    }

    #[test]
    fn wilson_known_value() {
        // 1 of 10 at 95%: [0.0179, 0.4042] (standard tables).
        let (lo, hi) = wilson(1, 10, Z95);
        assert!(
            (lo - 0.0179).abs() < 1e-4 && (hi - 0.4042).abs() < 1e-4,
            "{lo} {hi}"
        );
    }
}
