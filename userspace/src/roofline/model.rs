//! The energy roofline model (Choi's thesis, ch. 3): time, energy and their
//! balance points from five machine constants. PURE: plain arithmetic, no I/O.
//!
//! T = max(W·τ_flop, Q·τ_mem), E = W·ε_flop + Q·ε_mem + π_0·T. From them the time balance
//! B_τ = τ_mem/τ_flop, the energy balance B_ε = ε_mem/ε_flop and, once constant power
//! counts, the effective energy balance B̂_ε(I) = η·B_ε + (1 − η)·max(0, B_τ − I) with
//! η = ε_flop/(ε_flop + π_0·τ_flop) (thesis eqs 1–6).

/// A machine's constants (SI units: W, J/flop, J/byte, s/flop, s/byte).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Constants {
    /// Constant power π_0, W.
    pub const_w: f64,
    /// ε_flop, J per flop.
    pub j_per_flop: f64,
    /// ε_mem, J per byte.
    pub j_per_byte: f64,
    /// τ_flop, s per flop (1 / peak flop rate).
    pub s_per_flop: f64,
    /// τ_mem, s per byte (1 / peak bandwidth).
    pub s_per_byte: f64,
}

impl Constants {
    /// B_τ = τ_mem/τ_flop, flop/byte.
    pub fn time_balance(&self) -> f64 {
        ratio(self.s_per_byte, self.s_per_flop)
    }

    /// B_ε = ε_mem/ε_flop, flop/byte.
    pub fn energy_balance(&self) -> f64 {
        ratio(self.j_per_byte, self.j_per_flop)
    }

    /// η_flop = ε_flop/(ε_flop + π_0·τ_flop): the share of a compute-bound flop's energy
    /// that is the flop itself; 1 when π_0 = 0.
    pub fn eta_flop(&self) -> f64 {
        let hat = self.j_per_flop + self.const_w * self.s_per_flop;
        if hat > 0.0 {
            self.j_per_flop / hat
        } else {
            1.0
        }
    }

    /// B̂_ε(I), flop/byte (thesis eq. 6).
    pub fn effective_energy_balance(&self, intensity: f64) -> f64 {
        let eta = self.eta_flop();
        // η = 0 (no flop energy at all) leaves only the constant-power term.
        let flop_part = if eta > 0.0 {
            eta * self.energy_balance()
        } else {
            0.0
        };
        flop_part + (1.0 - eta) * (self.time_balance() - intensity).max(0.0)
    }

    /// Time of `flops` and `bytes` with perfect overlap, s.
    pub fn time(&self, flops: f64, bytes: f64) -> f64 {
        (flops * self.s_per_flop).max(bytes * self.s_per_byte)
    }

    /// Energy of `flops` and `bytes`, J.
    pub fn energy(&self, flops: f64, bytes: f64) -> f64 {
        flops * self.j_per_flop + bytes * self.j_per_byte + self.const_w * self.time(flops, bytes)
    }

    /// Normalised time roofline W·τ_flop/T = min(1, I/B_τ).
    pub fn roofline(&self, intensity: f64) -> f64 {
        (intensity / self.time_balance()).min(1.0)
    }

    /// Normalised energy arch line W·ε̂_flop/E = 1/(1 + B̂_ε(I)/I).
    pub fn arch(&self, intensity: f64) -> f64 {
        1.0 / (1.0 + self.effective_energy_balance(intensity) / intensity)
    }

    /// Whether racing to halt saves energy: time efficiency implies energy efficiency when
    /// B_τ > B̂_ε, evaluated where a code becomes time-efficient (I = B_τ, where
    /// B̂_ε = η·B_ε). Thesis §3.3 and the conclusions of ch. 4.
    pub fn race_to_halt(&self) -> bool {
        let bt = self.time_balance();
        bt > self.effective_energy_balance(bt)
    }

    /// The intensities at which a code is compute-bound in time but memory-bound in energy:
    /// `(B_τ, B̂_ε)`, or `None` when that band is empty (racing to halt works).
    pub fn balance_gap_band(&self) -> Option<(f64, f64)> {
        let bt = self.time_balance();
        let be = self.effective_energy_balance(bt);
        (be > bt).then_some((bt, be))
    }
}

/// a/b, finite (JSON has no infinity): 0 when a = 0, `f64::MAX` when only b = 0.
fn ratio(a: f64, b: f64) -> f64 {
    if a <= 0.0 {
        0.0
    } else if b > 0.0 {
        (a / b).min(f64::MAX)
    } else {
        f64::MAX
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thesis Table 2 (Fermi, literature values), π_0 = 0.
    fn fermi() -> Constants {
        Constants {
            const_w: 0.0,
            j_per_flop: 25e-12,
            j_per_byte: 360e-12,
            s_per_flop: 1.0 / 515e9,
            s_per_byte: 1.0 / 144e9,
        }
    }

    #[test]
    fn fermi_anchors_of_table_2() {
        let c = fermi();
        assert!(
            (c.time_balance() - 3.576).abs() < 0.01,
            "{}",
            c.time_balance()
        );
        assert!((c.energy_balance() - 14.4).abs() < 1e-9);
        // The arch line is 1/2 where flop and memory energy are equal (π_0 = 0).
        assert!((c.arch(14.4) - 0.5).abs() < 1e-12);
        assert_eq!(c.roofline(100.0), 1.0);
        assert!((c.roofline(1.0) - 1.0 / c.time_balance()).abs() < 1e-12);
        // B_ε > B_τ: a balance gap, racing does not save energy.
        assert!(!c.race_to_halt());
        let (lo, hi) = c.balance_gap_band().expect("gap");
        assert!((lo - 3.576).abs() < 0.01 && (hi - 14.4).abs() < 1e-9);
    }

    #[test]
    fn constant_power_lowers_the_effective_balance_until_racing_pays() {
        let mut c = fermi();
        // π_0 = 122 W (the thesis's GTX 580 fit): ε_0 = π_0·τ_flop ≈ 237 pJ ≫ 25 pJ.
        c.const_w = 122.0;
        assert!(c.eta_flop() < 0.1, "{}", c.eta_flop());
        assert!(c.effective_energy_balance(c.time_balance()) < c.energy_balance());
        assert!(c.race_to_halt());
        assert_eq!(c.balance_gap_band(), None);
    }

    #[test]
    fn degenerate_constants_stay_finite() {
        let mut c = fermi();
        c.j_per_flop = 0.0;
        c.const_w = 5.0;
        assert_eq!(c.energy_balance(), f64::MAX);
        assert!(c.effective_energy_balance(1.0).is_finite());
        c.j_per_byte = 0.0;
        assert_eq!(c.energy_balance(), 0.0);
        assert!(c.race_to_halt());
    }

    #[test]
    fn energy_identity_holds_for_random_constants() {
        use rand::{RngExt, SeedableRng, rngs::ChaCha8Rng};
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for _ in 0..500 {
            let c = Constants {
                const_w: rng.random_range(0.0..200.0),
                j_per_flop: rng.random_range(1e-12..1e-9),
                j_per_byte: rng.random_range(1e-12..1e-8),
                s_per_flop: rng.random_range(1e-12..1e-9),
                s_per_byte: rng.random_range(1e-12..1e-9),
            };
            let (w, q) = (rng.random_range(1e6..1e12), rng.random_range(1e6..1e12));
            let i = w / q;
            // E = W·ε̂_flop·(1 + B̂_ε(I)/I), thesis eq. 5.
            let hat = c.j_per_flop + c.const_w * c.s_per_flop;
            let e = w * hat * (1.0 + c.effective_energy_balance(i) / i);
            let rel = (e - c.energy(w, q)).abs() / c.energy(w, q);
            assert!(rel < 1e-9, "{rel} for {c:?}");
        }
    }
}
