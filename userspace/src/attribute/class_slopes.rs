//! The zero-load fit's line with a slope per large process: `P ≈ static + w·busy +
//! Σ_k δ_k·busy_k`, where `busy` is all busy CPUs and `busy_k` those of one of the largest
//! processes, whose own watts per CPU are `w + δ_k`.
//!
//! One slope for every busy CPU-second is right only when every process draws the same
//! power per CPU-second. A process that draws much less (a profiler's own bookkeeping, a
//! thread that mostly waits) adds busy time without power; where its time varies from row
//! to row, the common slope is diluted and the intercept biased (errors in the regressor).
//! A 10 ms duty cycle beside a spinner, with the recorder's own busy time drawing nothing,
//! fitted 5.5 W per CPU for a true 10 and static 11.7 W for a true 6. Slopes per process
//! remove that bias where each process's time varies; the zero-load fit keeps them only
//! where they predict held-out rows clearly better than one slope
//! ([`super::zero_load::fit_zero_load_classes`]), since a process whose time never varies
//! (a pinned spinner) cannot be told from static power by any row.

use super::linalg::{Matrix, invert};

/// The design of one fit row: busy CPUs of the domain, then busy CPUs of each class.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassRow {
    /// Mean power, W.
    pub power_w: f64,
    /// Mean busy CPUs (threads + unknown time).
    pub busy_cpus: f64,
    /// Mean busy CPUs of each class (one of the largest processes), in class order.
    pub class_cpus: Vec<f64>,
}

/// Processes given a slope of their own, at most.
pub const MAX_CLASSES: usize = 8;
/// Share of the rows' busy time a process needs to get a slope of its own.
pub const MIN_CLASS_SHARE: f64 = 0.02;
/// Ridge on each class's deviation, per unit of row weight: only keeps the system
/// invertible where the classes make up all busy time (then the split between the common
/// slope and the deviations is arbitrary, and predictions and the intercept do not depend
/// on it).
const RIDGE: f64 = 1e-9;
/// Held-out folds for choosing between one slope and a slope per class.
const FOLDS: usize = 5;
/// A slope per class is kept only when its held-out squared error is below this share of
/// one slope's.
pub const KEEP_CLASSES_BELOW: f64 = 0.9;

/// A weighted ridge least-squares line through the rows: intercept, then the coefficients
/// of `busy` and of the classes given a slope of their own.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    /// Power at zero busy CPUs, W.
    pub intercept_w: f64,
    /// Common watts per busy CPU.
    pub slope_w: f64,
    /// The classes given a slope of their own (indices into [`ClassRow::class_cpus`]).
    pub classes: Vec<usize>,
    /// Each of those classes' deviation from `slope_w`, W per CPU.
    pub deviation_w: Vec<f64>,
}

impl Line {
    /// Watts per busy CPU over the rows, all processes together: the common slope, moved
    /// by each class's deviation in proportion to its share of the busy time. Power rises
    /// with load when this is positive, even where the processes left on the common slope
    /// draw nothing.
    pub fn mean_slope_w(&self, rows: &[ClassRow]) -> f64 {
        let busy: f64 = rows.iter().map(|r| r.busy_cpus).sum();
        if busy <= 0.0 {
            return self.slope_w;
        }
        self.slope_w
            + self
                .deviation_w
                .iter()
                .zip(&self.classes)
                .map(|(d, &k)| {
                    d * rows
                        .iter()
                        .map(|r| r.class_cpus.get(k).copied().unwrap_or(0.0))
                        .sum::<f64>()
                        / busy
                })
                .sum::<f64>()
    }

    /// Residual of a row, W.
    pub fn residual(&self, r: &ClassRow) -> f64 {
        r.power_w
            - self.intercept_w
            - self.slope_w * r.busy_cpus
            - self
                .deviation_w
                .iter()
                .zip(&self.classes)
                .map(|(d, &k)| d * r.class_cpus.get(k).copied().unwrap_or(0.0))
                .sum::<f64>()
    }
}

/// Weighted sums of products of the columns `[1, busy, class 0, …, class K−1, power]` over
/// a block of rows: all a least-squares fit on any set of classes needs, so the held-out
/// errors of every candidate set cost one pass over the rows.
fn moments(rows: &[ClassRow], w: &[f64], range: std::ops::Range<usize>, k: usize) -> Matrix {
    let q = k + 3;
    let mut m = vec![vec![0.0; q]; q];
    let mut z = vec![0.0; q];
    for i in range {
        let r = &rows[i];
        z[0] = 1.0;
        z[1] = r.busy_cpus;
        for (c, zc) in z[2..q - 1].iter_mut().enumerate() {
            *zc = r.class_cpus.get(c).copied().unwrap_or(0.0);
        }
        z[q - 1] = r.power_w;
        for (row, za) in m.iter_mut().zip(&z) {
            for (v, zb) in row.iter_mut().zip(&z) {
                *v += w[i] * za * zb;
            }
        }
    }
    m
}

/// The line on `classes` from moments `s` (see [`moments`]), as coefficients of the columns
/// `[1, busy, classes…]`; `None` when busy CPUs do not vary or the system is singular.
fn solve_moments(s: &Matrix, classes: &[usize]) -> Option<Vec<f64>> {
    let y = s.len() - 1;
    let cols: Vec<usize> = std::iter::once(1)
        .chain(classes.iter().map(|c| c + 2))
        .collect();
    let sw = s[0][0];
    if sw <= 0.0 {
        return None;
    }
    let p = cols.len();
    let cov = |a: usize, b: usize| s[a][b] - s[0][a] * s[0][b] / sw;
    let mut gram: Matrix = (0..p)
        .map(|i| (0..p).map(|j| cov(cols[i], cols[j])).collect())
        .collect();
    if gram[0][0] <= 1e-12 * sw {
        return None;
    }
    for (j, row) in gram.iter_mut().enumerate().skip(1) {
        row[j] += RIDGE * sw;
    }
    let rhs: Vec<f64> = cols.iter().map(|&c| cov(c, y)).collect();
    let inv = invert(&gram)?;
    let beta: Vec<f64> = (0..p)
        .map(|i| (0..p).map(|j| inv[i][j] * rhs[j]).sum())
        .collect();
    let intercept = (s[0][y]
        - beta
            .iter()
            .zip(&cols)
            .map(|(b, &c)| b * s[0][c])
            .sum::<f64>())
        / sw;
    Some(std::iter::once(intercept).chain(beta).collect())
}

/// Weighted squared error of each fold's rows predicted by the line fitted on the other
/// folds (contiguous folds: neighbouring rows are correlated).
fn heldout_sse(folds: &[Matrix], classes: &[usize]) -> f64 {
    let Some(first) = folds.first() else {
        return f64::INFINITY;
    };
    let q = first.len();
    let y = q - 1;
    let cols: Vec<usize> = [0, 1]
        .into_iter()
        .chain(classes.iter().map(|c| c + 2))
        .collect();
    let mut sse = 0.0;
    for (f, test) in folds.iter().enumerate() {
        let mut train = vec![vec![0.0; q]; q];
        for (_, m) in folds.iter().enumerate().filter(|&(g, _)| g != f) {
            for (t, r) in train.iter_mut().zip(m) {
                for (tv, rv) in t.iter_mut().zip(r) {
                    *tv += rv;
                }
            }
        }
        let Some(theta) = solve_moments(&train, classes) else {
            return f64::INFINITY;
        };
        // Σ w (y − θᵀz)² = S_yy − 2 θᵀ S_zy + θᵀ S_zz θ over the held-out rows.
        let mut e = test[y][y];
        for (i, &a) in cols.iter().enumerate() {
            e -= 2.0 * theta[i] * test[a][y];
            for (j, &b) in cols.iter().enumerate() {
                e += theta[i] * theta[j] * test[a][b];
            }
        }
        sse += e.max(0.0);
    }
    sse
}

/// The classes that get a slope of their own, by forward selection: starting from one slope
/// for all, the class whose own slope lowers the held-out error most is added, while that
/// lowers it below [`KEEP_CLASSES_BELOW`] of the error without it. Only a process whose
/// power per CPU really differs from the rest is split off, so the others keep sharing one
/// slope (which is what identifies the intercept beside a process whose time never varies).
/// `w`: the rows' robust weights.
pub fn select(rows: &[ClassRow], w: &[f64]) -> Vec<usize> {
    let k = rows.iter().map(|r| r.class_cpus.len()).min().unwrap_or(0);
    let n = rows.len();
    if k == 0 || n < 2 * FOLDS {
        return Vec::new();
    }
    let folds: Vec<Matrix> = (0..FOLDS)
        .map(|f| moments(rows, w, f * n / FOLDS..(f + 1) * n / FOLDS, k))
        .collect();
    let mut chosen: Vec<usize> = Vec::new();
    let mut best = heldout_sse(&folds, &chosen);
    loop {
        let step = (0..k)
            .filter(|c| !chosen.contains(c))
            .map(|c| {
                let mut with = chosen.clone();
                with.push(c);
                (c, heldout_sse(&folds, &with))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        match step {
            Some((c, sse)) if sse < KEEP_CLASSES_BELOW * best => {
                chosen.push(c);
                best = sse;
            }
            _ => return chosen,
        }
    }
}

/// Weighted least squares of the rows (indices `idx`, weights `w` by index) with a slope
/// of their own for `classes`, on centred columns; `None` when busy CPUs do not vary under
/// the weights or the system is singular.
pub fn solve(rows: &[ClassRow], idx: &[usize], w: &[f64], classes: &[usize]) -> Option<Line> {
    let p = classes.len() + 1;
    let feature = |r: &ClassRow, j: usize| {
        if j == 0 {
            r.busy_cpus
        } else {
            r.class_cpus.get(classes[j - 1]).copied().unwrap_or(0.0)
        }
    };
    let sw: f64 = idx.iter().map(|&i| w[i]).sum();
    if sw <= 0.0 {
        return None;
    }
    let mean_x: Vec<f64> = (0..p)
        .map(|j| {
            idx.iter()
                .map(|&i| w[i] * feature(&rows[i], j))
                .sum::<f64>()
                / sw
        })
        .collect();
    let mean_y = idx.iter().map(|&i| w[i] * rows[i].power_w).sum::<f64>() / sw;
    let mut gram = vec![vec![0.0; p]; p];
    let mut rhs = vec![0.0; p];
    for &i in idx {
        let r = &rows[i];
        let c: Vec<f64> = (0..p).map(|j| feature(r, j) - mean_x[j]).collect();
        let dy = r.power_w - mean_y;
        for a in 0..p {
            rhs[a] += w[i] * c[a] * dy;
            for b in 0..p {
                gram[a][b] += w[i] * c[a] * c[b];
            }
        }
    }
    if gram[0][0] <= 1e-12 * sw {
        return None;
    }
    for (j, row) in gram.iter_mut().enumerate().skip(1) {
        row[j] += RIDGE * sw;
    }
    let inv = invert(&gram)?;
    let beta: Vec<f64> = (0..p)
        .map(|a| (0..p).map(|b| inv[a][b] * rhs[b]).sum())
        .collect();
    let intercept_w = mean_y - beta.iter().zip(&mean_x).map(|(b, m)| b * m).sum::<f64>();
    Some(Line {
        intercept_w,
        slope_w: beta[0],
        classes: classes.to_vec(),
        deviation_w: beta[1..].to_vec(),
    })
}

/// The classes of a set of rows: the up to [`MAX_CLASSES`] processes with the most busy
/// time, each with at least [`MIN_CLASS_SHARE`] of it (`totals`: busy ns per process).
pub fn pick_classes(totals: &std::collections::HashMap<u32, f64>) -> Vec<u32> {
    let busy: f64 = totals.values().sum();
    let mut by_time: Vec<(u32, f64)> = totals
        .iter()
        .map(|(&k, &v)| (k, v))
        .filter(|&(_, v)| busy > 0.0 && v >= MIN_CLASS_SHARE * busy)
        .collect();
    // Most time first; ties by pid so the choice is deterministic.
    by_time.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    by_time.truncate(MAX_CLASSES);
    by_time.into_iter().map(|(k, _)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 6 W static, 10 W per CPU for the two workloads, 0 W for a third process whose time
    /// varies at random: one slope is diluted, a slope per class is not, and it predicts
    /// held-out rows clearly better. The spinner varies a little (the third process runs
    /// on its CPU at times), so its slope is identified.
    #[test]
    fn a_process_without_power_does_not_dilute_the_slope() {
        use rand::{RngExt, SeedableRng, rngs::ChaCha8Rng};
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let rows: Vec<ClassRow> = (0..1000)
            .map(|i| {
                // A pinned spinner, a duty cycle beside it, and bookkeeping in the idle time.
                let duty = f64::from(i % 11) / 10.0;
                let quiet: f64 = rng.random_range(0.0..0.6);
                let spin = 1.0 - rng.random_range(0.0..0.2);
                ClassRow {
                    power_w: 6.0 + 10.0 * (spin + duty) + rng.random_range(-0.5..0.5),
                    busy_cpus: spin + duty + quiet,
                    class_cpus: vec![spin, duty, quiet],
                }
            })
            .collect();
        let idx: Vec<usize> = (0..rows.len()).collect();
        let w = vec![1.0; rows.len()];
        let one: Vec<ClassRow> = rows
            .iter()
            .map(|r| ClassRow {
                class_cpus: Vec::new(),
                ..r.clone()
            })
            .collect();
        let single = solve(&one, &idx, &w, &[]).expect("fit");
        assert!((single.intercept_w - 6.0).abs() > 0.8, "{single:?}");
        let line = solve(&rows, &idx, &w, &[0, 1, 2]).expect("fit");
        assert!((line.intercept_w - 6.0).abs() < 0.3, "{line:?}");
        assert!((line.slope_w + line.deviation_w[2]).abs() < 0.5, "{line:?}");
        // Forward selection splits off the process without power, and only it.
        assert_eq!(select(&rows, &w), vec![2]);
        let line = solve(&rows, &idx, &w, &[2]).expect("fit");
        assert!((line.intercept_w - 6.0).abs() < 0.2, "{line:?}");
    }
}
