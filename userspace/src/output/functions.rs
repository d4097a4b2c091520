//! `report --by function`: self and total (inclusive) energy per function name from a
//! [`Profile`], with 95% confidence intervals from the per-sample weights.
//!
//! Interval (ALEA, §"Bounds and Confidence", eq. 9-17): a function's energy is
//! E = N·p·w̄ with p = n/N its share of the N samples and w̄ the mean weight of its n
//! samples. The bounds multiply the interval of p (Wilson score, which stays sane for rare
//! functions where eq. 9's normal approximation does not) by the interval of the mean
//! weight w̄ ± z·s/√n (eq. 13-15).

use std::collections::HashMap;

use super::table::{By, EnergyCell, Report, ReportRow, RowKey};
use crate::profile::Profile;

/// z for a two-sided 95% interval.
const Z95: f64 = 1.959_963_984_540_054;

/// Wilson score interval of a proportion `n / total` (two-sided, `z`).
pub(crate) fn wilson(n: u64, total: u64, z: f64) -> (f64, f64) {
    if total == 0 {
        return (0.0, 0.0);
    }
    let (n, t) = (n as f64, total as f64);
    let p = n / t;
    let z2 = z * z;
    let denom = 1.0 + z2 / t;
    let centre = (p + z2 / (2.0 * t)) / denom;
    let half = z * (p * (1.0 - p) / t + z2 / (4.0 * t * t)).sqrt() / denom;
    // At n = 0 the lower bound is 0 exactly (the formula leaves rounding noise).
    let lo = if n == 0.0 {
        0.0
    } else {
        (centre - half).max(0.0)
    };
    (lo, (centre + half).min(1.0))
}

/// Running sums of one function's sample weights in one domain.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct WeightSums {
    /// Samples.
    pub n: u64,
    /// Σ w.
    pub sum: f64,
    /// Σ w².
    pub sum_sq: f64,
    /// Energy known exactly (residual thread energy without a stack sample): no sampling
    /// error, added to both ends of the interval.
    pub exact: f64,
}

impl WeightSums {
    /// Adds one sample's weight.
    pub fn add(&mut self, w: f64) {
        self.n += 1;
        self.sum += w;
        self.sum_sq += w * w;
    }

    /// Adds energy that was not sampled.
    fn add_exact(&mut self, w: f64) {
        self.exact += w;
    }

    /// Estimate: sampled plus exact energy.
    pub fn total(&self) -> f64 {
        self.sum + self.exact
    }

    /// The 95% interval of the energy of these `n` samples out of `total_samples`
    /// (ALEA eq. 17); equal to `sum` at both ends when every sample was charged.
    pub fn interval(&self, total_samples: u64) -> (f64, f64) {
        if self.n == 0 {
            return (self.exact, self.exact);
        }
        let n = self.n as f64;
        let mean = self.sum / n;
        let var = if self.n > 1 {
            ((self.sum_sq - n * mean * mean) / (n - 1.0)).max(0.0)
        } else {
            0.0
        };
        let half = Z95 * var.sqrt() / n.sqrt();
        let (p_lo, p_hi) = wilson(self.n, total_samples, Z95);
        let t = total_samples as f64;
        (
            self.exact + t * p_lo * (mean - half).max(0.0),
            self.exact + t * p_hi * (mean + half),
        )
    }
}

/// A 95% interval `[lo, hi]` around `joules` widened by the estimated model's error (the
/// power table row's median absolute error, %; 0 leaves it): that error moves every
/// function's energy alike, independent of sampling, so the half-widths add in quadrature
/// (σ = median / 0.6745, as `attribute::uncertainty::with_model_error`).
fn with_model_error(joules: f64, lo: f64, hi: f64, model_error_pct: f64) -> (f64, f64) {
    if !(model_error_pct.is_finite() && model_error_pct > 0.0) {
        return (lo, hi);
    }
    let half = Z95 * joules.abs() * model_error_pct / 100.0 / 0.6745;
    let widen = |h: f64| (h * h + half * half).sqrt();
    (
        (joules - widen(joules - lo)).max(0.0),
        joules + widen(hi - joules),
    )
}

struct Acc {
    module: String,
    cpu_ns: f64,
    self_w: Vec<WeightSums>,
    total_w: Vec<WeightSums>,
}

/// Per thread, its most sampled Python or JIT function (the leaf-most such frame of each
/// sample), named with its source: what `report --by thread` shows beside a runtime's
/// thread name. Threads with no such frame are absent.
pub(crate) fn top_managed_by_thread(profile: &Profile) -> HashMap<u32, String> {
    let mut counts: HashMap<(u32, u32), u64> = HashMap::new();
    for s in &profile.samples {
        let managed = s.frames.iter().copied().find(|&f| {
            profile
                .frames
                .get(f as usize)
                .is_some_and(|fr| fr.kind.is_managed())
        });
        if let Some(f) = managed {
            *counts.entry((s.labels.tid, f)).or_default() += 1;
        }
    }
    let mut best: HashMap<u32, (u64, u32)> = HashMap::new();
    for ((tid, f), n) in counts {
        let e = best.entry(tid).or_insert((n, f));
        // Most samples; ties to the lower frame id, so the pick is stable.
        if n > e.0 || (n == e.0 && f < e.1) {
            *e = (n, f);
        }
    }
    best.into_iter()
        .filter_map(|(tid, (_, f))| {
            Some((
                tid,
                profile.frames.get(f as usize)?.display_name().into_owned(),
            ))
        })
        .collect()
}

/// Per-function rows of `profile` for the energy values named in `domains` (e.g.
/// `["package", "dram"]` for `energy_package`, `energy_dram`); energies in J.
///
/// Self energy comes from samples whose leaf is the function; total energy from samples
/// with the function anywhere on the stack (counted once per sample under recursion).
pub fn by_function(profile: &Profile, domains: &[String]) -> Report {
    rollup(profile, domains, true)
}

/// [`by_function`]'s self energy alone: a row for each function that is some sample's
/// leaf (its cells exactly [`by_function`]'s), no totals (`total_energy` is `None`), and
/// no row for a function only ever seen as a caller (whose self energy is 0). For a
/// profile with deep stacks, a fraction of the work.
pub fn self_by_function(profile: &Profile, domains: &[String]) -> Report {
    rollup(profile, domains, false)
}

fn rollup(profile: &Profile, domains: &[String], totals: bool) -> Report {
    let value_idx: Vec<Option<usize>> = domains
        .iter()
        .map(|d| profile.value_index(&format!("energy_{d}")))
        .collect();
    let cpu_idx = profile.value_index(crate::profile::CPU);
    let nd = domains.len();
    // One slot per function name; frames map to slots once, so the per-sample loop only
    // touches integers.
    // Python and JIT functions are named with their source file and line.
    let mut slot_of_name: foldhash::HashMap<std::borrow::Cow<'_, str>, usize> =
        foldhash::HashMap::default();
    let mut accs: Vec<(std::borrow::Cow<'_, str>, Acc)> = Vec::new();
    // Without totals only leaves are counted: the other frames get no slot.
    let mut counted = vec![totals; profile.frames.len()];
    if !totals {
        for s in &profile.samples {
            if let Some(c) = s.frames.first().and_then(|&f| counted.get_mut(f as usize)) {
                *c = true;
            }
        }
    }
    let frame_slot: Vec<usize> = profile
        .frames
        .iter()
        .zip(&counted)
        .map(|(f, &counted)| {
            if !counted {
                return usize::MAX;
            }
            let name = f.display_name();
            *slot_of_name.entry(name.clone()).or_insert_with(|| {
                accs.push((
                    name,
                    Acc {
                        module: f.module.rsplit('/').next().unwrap_or(&f.module).to_string(),
                        cpu_ns: 0.0,
                        self_w: vec![WeightSums::default(); nd],
                        total_w: vec![WeightSums::default(); nd],
                    },
                ));
                accs.len() - 1
            })
        })
        .collect();
    // last_seen[slot] = 1 + index of the last sample that counted the slot's total.
    let mut last_seen = vec![0usize; accs.len()];
    let mut total_samples = 0u64;
    let count_idx = profile.value_index(crate::profile::SAMPLES);
    let mut weights = vec![0.0; nd];
    for (i, s) in profile.samples.iter().enumerate() {
        // Residual entries (count 0) carry exact energy, not a sample.
        let sampled = count_idx
            .and_then(|i| s.values.get(i))
            .is_none_or(|&c| c > 0.0);
        total_samples += u64::from(sampled);
        for (w, idx) in weights.iter_mut().zip(&value_idx) {
            *w = idx.and_then(|i| s.values.get(i)).copied().unwrap_or(0.0) / 1e6;
        }
        let add = |sums: &mut [WeightSums], weights: &[f64]| {
            for (ws, &w) in sums.iter_mut().zip(weights) {
                if sampled { ws.add(w) } else { ws.add_exact(w) }
            }
        };
        let depth_limit = if totals { usize::MAX } else { 1 };
        for (depth, &fid) in s.frames.iter().enumerate().take(depth_limit) {
            let Some(&slot) = frame_slot.get(fid as usize).filter(|&&s| s != usize::MAX) else {
                continue;
            };
            let acc = &mut accs[slot].1;
            if depth == 0 {
                acc.cpu_ns += cpu_idx
                    .and_then(|i| s.values.get(i))
                    .copied()
                    .unwrap_or(0.0);
                add(&mut acc.self_w, &weights);
            }
            // Recursion: a function counts once per sample in its total.
            if last_seen[slot] != i + 1 {
                last_seen[slot] = i + 1;
                add(&mut acc.total_w, &weights);
            }
        }
    }
    let first_total = value_idx
        .first()
        .copied()
        .flatten()
        .and_then(|i| profile.meta.totals.get(i))
        .map_or(0.0, |t| t / 1e6);
    let secs = profile.meta.duration_ns as f64 / 1e9;
    let cell = |ws: &WeightSums| {
        let (ci_low, ci_high) = ws.interval(total_samples);
        let joules = ws.total();
        let (ci_low, ci_high) =
            with_model_error(joules, ci_low, ci_high, profile.meta.model_error_pct);
        EnergyCell {
            joules,
            ci_low,
            ci_high,
        }
    };
    let rows = accs
        .into_iter()
        .filter(|(_, acc)| {
            let counted = if totals { &acc.total_w } else { &acc.self_w };
            counted.first().is_none_or(|w| w.n > 0 || w.exact > 0.0)
        })
        .map(|(name, acc)| {
            let energy: Vec<EnergyCell> = acc.self_w.iter().map(cell).collect();
            let first = energy.first().map_or(0.0, |e| e.joules);
            ReportRow {
                key: RowKey::Function {
                    name: name.to_string(),
                    module: acc.module,
                },
                cpu_ns: acc.cpu_ns,
                samples: acc.self_w.first().map_or(0, |w| w.n),
                total_energy: totals.then(|| acc.total_w.iter().map(cell).collect()),
                energy,
                power_w: if secs > 0.0 { first / secs } else { 0.0 },
                share: if first_total > 0.0 {
                    first / first_total
                } else {
                    0.0
                },
                cpu_share: Vec::new(),
            }
        })
        .collect();
    Report {
        by: By::Function,
        domains: domains.to_vec(),
        rows,
        estimated: profile.meta.estimated,
        title: profile.meta.title.clone(),
        notes: Vec::new(),
        cpus: Vec::new(),
        duration_ns: 0,
        footer: Vec::new(),
        model_row: Some(profile.meta.model_row.clone())
            .filter(|r| !r.is_empty())
            .map(|r| (r, profile.meta.model_error_pct)),
        co2e_g_per_j: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::table::{Format, RenderOptions, render};
    use crate::output::testdata;

    #[test]
    fn busiest_managed_function_per_thread() {
        use crate::symbolize::{Frame, JitRuntime};
        let mut p = testdata::profile();
        assert!(top_managed_by_thread(&p).is_empty(), "native code only");
        p.frames[1] = Frame::jit("hot_heavy", JitRuntime::V8)
            .with_source(Some("/app/burn.js".into()), Some(4));
        let top = top_managed_by_thread(&p);
        assert!(!top.is_empty());
        assert!(
            top.values().all(|f| f == "hot_heavy (burn.js:4)"),
            "{top:?}"
        );
    }

    #[test]
    fn self_rows_are_by_function_self_cells_of_the_leaves() {
        let p = testdata::profile();
        let domains = ["package".to_string()];
        let all = by_function(&p, &domains);
        let own = self_by_function(&p, &domains);
        assert!(!own.rows.is_empty());
        for r in &own.rows {
            let same = all
                .rows
                .iter()
                .find(|a| a.key == r.key)
                .expect("row in by_function");
            assert_eq!(
                (&r.energy, r.samples, r.cpu_ns),
                (&same.energy, same.samples, same.cpu_ns)
            );
            assert!(r.total_energy.is_none());
        }
        // Every function left out carries no self energy (a caller only).
        for a in &all.rows {
            if !own.rows.iter().any(|r| r.key == a.key) {
                assert_eq!(a.energy[0].joules, 0.0, "{:?}", a.key);
                assert_eq!(a.samples, 0);
            }
        }
        assert!(own.rows.len() < all.rows.len(), "main is only a caller");
    }

    #[test]
    fn wilson_matches_known_values() {
        // 10 of 100 at 95%: (0.0552, 0.1744), e.g. from R's prop.test without correction.
        let (lo, hi) = wilson(10, 100, Z95);
        assert!(
            (lo - 0.05523).abs() < 1e-4 && (hi - 0.17437).abs() < 1e-4,
            "{lo} {hi}"
        );
        assert_eq!(wilson(0, 0, Z95), (0.0, 0.0));
        let (lo, hi) = wilson(0, 50, Z95);
        assert_eq!(lo, 0.0);
        assert!(hi > 0.0 && hi < 0.1);
    }

    #[test]
    fn the_model_error_widens_a_function_interval() {
        assert_eq!(with_model_error(10.0, 9.0, 11.0, 0.0), (9.0, 11.0));
        let (lo, hi) = with_model_error(10.0, 9.0, 11.0, 12.0);
        let half = Z95 * 10.0 * 0.12 / 0.6745;
        let w = (1.0 + half * half).sqrt();
        assert!((lo - (10.0 - w)).abs() < 1e-12 && (hi - (10.0 + w)).abs() < 1e-12);
    }

    #[test]
    fn interval_brackets_the_estimate() {
        let mut ws = WeightSums::default();
        for w in [1.0, 1.2, 0.8, 1.0] {
            ws.add(w);
        }
        let (lo, hi) = ws.interval(40);
        assert!(lo < ws.sum && ws.sum < hi, "{lo} {} {hi}", ws.sum);
        assert_eq!(WeightSums::default().interval(40), (0.0, 0.0));
        ws.add_exact(2.0);
        let (lo2, hi2) = ws.interval(40);
        assert!((lo2 - lo - 2.0).abs() < 1e-12 && (hi2 - hi - 2.0).abs() < 1e-12);
    }

    #[test]
    fn self_and_total_energy_per_function() {
        let p = testdata::profile();
        let report = by_function(&p, &["package".to_string()]);
        let row = |name: &str| {
            report
                .rows
                .iter()
                .find(|r| matches!(&r.key, RowKey::Function { name: n, .. } if n == name))
                .unwrap_or_else(|| panic!("no row for {name}"))
        };
        let heavy = row("hot_heavy");
        // Self: only the sample whose leaf is hot_heavy; total: both stacks through it.
        assert!((heavy.energy[0].joules - 0.2999998).abs() < 1e-9);
        let total = heavy.total_energy.as_ref().expect("total")[0].joules;
        assert!((total - 0.6000002).abs() < 1e-9);
        assert_eq!(heavy.samples, 1);
        assert!((row("hot_light").energy[0].joules - 0.2).abs() < 1e-9);
        assert!(
            (row("main").total_energy.as_ref().expect("total")[0].joules - 0.8000002).abs() < 1e-9
        );
        assert_eq!(row("main").energy[0].joules, 0.0);
        assert!((heavy.power_w - 0.1499999).abs() < 1e-6);
        assert!(report.estimated);
        // Residual energy is exact: no interval, no sample.
        let residual = row(crate::profile::NO_STACK_SAMPLE);
        assert_eq!(residual.samples, 0);
        assert_eq!(
            (residual.energy[0].ci_low, residual.energy[0].ci_high),
            (0.05, 0.05)
        );

        let mut out = Vec::new();
        let opts = RenderOptions {
            sort: Some("total_package".into()),
            limit: Some(3),
        };
        render(&report, &opts, Format::Table, &mut out).expect("render");
        testdata::assert_golden("functions_table.txt", &out);
        let mut out = Vec::new();
        render(&report, &RenderOptions::default(), Format::Csv, &mut out).expect("render");
        testdata::assert_golden("functions.csv", &out);
    }
}
