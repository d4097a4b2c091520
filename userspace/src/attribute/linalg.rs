//! The little dense linear algebra the per-class power fit needs: systems of a handful of
//! classes (K ≤ ~20), so plain `Vec<Vec<f64>>` and textbook algorithms are enough and keep
//! the crate free of a linear-algebra dependency.

/// z for a two-sided 95% interval (the regression's significance test and every CI).
pub const Z95: f64 = 1.959_963_984_540_054;

/// A small dense square matrix, row-major.
pub type Matrix = Vec<Vec<f64>>;

/// Minimises `½xᵀAx − bᵀx` subject to `x ≥ 0` for symmetric positive-definite `A`, by
/// projected Gauss–Seidel (cyclic coordinate descent with clamping). For SPD `A` each sweep
/// decreases the objective and the iteration converges to the bounded least-squares optimum;
/// this is StarPU's "bounded least squares" on the normal equations.
pub fn solve_nonneg(a: &Matrix, b: &[f64], start: &[f64]) -> Vec<f64> {
    let k = b.len();
    let mut x: Vec<f64> = start.iter().map(|v| v.max(0.0)).collect();
    for _sweep in 0..10_000 {
        let mut change = 0.0f64;
        let mut scale = 0.0f64;
        for i in 0..k {
            if a[i][i] <= 0.0 {
                continue;
            }
            let off: f64 = (0..k).filter(|&j| j != i).map(|j| a[i][j] * x[j]).sum();
            let new = ((b[i] - off) / a[i][i]).max(0.0);
            change = change.max((new - x[i]).abs());
            scale = scale.max(new.abs());
            x[i] = new;
        }
        if change <= 1e-12 * scale.max(1e-300) {
            break;
        }
    }
    x
}

/// Inverse by Gauss–Jordan elimination with partial pivoting; `None` when singular.
pub fn invert(a: &Matrix) -> Option<Matrix> {
    let n = a.len();
    let mut m: Vec<Vec<f64>> = a
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let mut r = row.clone();
            r.extend((0..n).map(|j| if i == j { 1.0 } else { 0.0 }));
            r
        })
        .collect();
    let norm = a.iter().flatten().fold(0.0f64, |acc, v| acc.max(v.abs()));
    for col in 0..n {
        let pivot = (col..n).max_by(|&p, &q| m[p][col].abs().total_cmp(&m[q][col].abs()))?;
        if m[pivot][col].abs() <= 1e-14 * norm.max(1e-300) {
            return None;
        }
        m.swap(col, pivot);
        let p = m[col][col];
        for v in m[col].iter_mut() {
            *v /= p;
        }
        for row in 0..n {
            if row != col {
                let f = m[row][col];
                if f != 0.0 {
                    let pivot_row = m[col].clone();
                    for (v, pv) in m[row].iter_mut().zip(&pivot_row) {
                        *v -= f * pv;
                    }
                }
            }
        }
    }
    Some(m.into_iter().map(|r| r[n..].to_vec()).collect())
}

/// Eigenvalues of a symmetric matrix by cyclic Jacobi rotations, ascending.
pub fn sym_eigenvalues(a: &Matrix) -> Vec<f64> {
    let n = a.len();
    let mut m = a.clone();
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| m[i][j] * m[i][j])
            .sum();
        let diag: f64 = (0..n).map(|i| m[i][i] * m[i][i]).sum();
        if off <= 1e-24 * diag.max(1e-300) {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                if m[p][q].abs() < 1e-300 {
                    continue;
                }
                let theta = (m[q][q] - m[p][p]) / (2.0 * m[p][q]);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                // Columns p and q, then rows p and q: m ← Jᵀ m J.
                for row in m.iter_mut() {
                    let (mkp, mkq) = (row[p], row[q]);
                    row[p] = c * mkp - s * mkq;
                    row[q] = s * mkp + c * mkq;
                }
                let (row_p, row_q) = (m[p].clone(), m[q].clone());
                for (k, (mpk, mqk)) in row_p.iter().zip(&row_q).enumerate() {
                    m[p][k] = c * mpk - s * mqk;
                    m[q][k] = s * mpk + c * mqk;
                }
            }
        }
    }
    let mut ev: Vec<f64> = (0..n).map(|i| m[i][i]).collect();
    ev.sort_by(f64::total_cmp);
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonneg_solver_matches_unconstrained_when_interior() {
        // A = [[2,1],[1,3]], b = [3,5] → x = A⁻¹b = [0.8, 1.4].
        let a = vec![vec![2.0, 1.0], vec![1.0, 3.0]];
        let x = solve_nonneg(&a, &[3.0, 5.0], &[0.0, 0.0]);
        assert!(
            (x[0] - 0.8).abs() < 1e-9 && (x[1] - 1.4).abs() < 1e-9,
            "{x:?}"
        );
    }

    #[test]
    fn nonneg_solver_clamps_at_the_bound() {
        // Unconstrained optimum is [2.2, -1.4]; with x ≥ 0 it is [1.5, 0].
        let a = vec![vec![2.0, 1.0], vec![1.0, 3.0]];
        let x = solve_nonneg(&a, &[3.0, -2.0], &[1.0, 1.0]);
        assert!((x[0] - 1.5).abs() < 1e-9 && x[1] == 0.0, "{x:?}");
    }

    #[test]
    fn inverse_and_singular() {
        let inv = invert(&vec![vec![4.0, 7.0], vec![2.0, 6.0]]).expect("invertible");
        let want = [[0.6, -0.7], [-0.2, 0.4]];
        for i in 0..2 {
            for j in 0..2 {
                assert!((inv[i][j] - want[i][j]).abs() < 1e-12);
            }
        }
        assert!(invert(&vec![vec![1.0, 2.0], vec![2.0, 4.0]]).is_none());
    }

    #[test]
    fn eigenvalues_of_known_matrix() {
        // [[2,1],[1,2]] has eigenvalues 1 and 3.
        let ev = sym_eigenvalues(&vec![vec![2.0, 1.0], vec![1.0, 2.0]]);
        assert!(
            (ev[0] - 1.0).abs() < 1e-12 && (ev[1] - 3.0).abs() < 1e-12,
            "{ev:?}"
        );
        let ev = sym_eigenvalues(&vec![
            vec![4.0, 1.0, 0.0],
            vec![1.0, 3.0, 1.0],
            vec![0.0, 1.0, 2.0],
        ]);
        // Trace 9 and determinant 18 are preserved.
        assert!((ev.iter().sum::<f64>() - 9.0).abs() < 1e-10);
        assert!((ev.iter().product::<f64>() - 18.0).abs() < 1e-9);
    }
}
