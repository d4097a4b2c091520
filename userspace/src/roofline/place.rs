//! Where a function sits against the machine's balance points (`report --by function
//! --roofline`). PURE: arithmetic on counts and [`Constants`].
//!
//! A function's intensity comes from the run counters, not from its flops and bytes, which
//! no portable counter gives: instructions per LLC-miss byte, I ≈ N_instr / (N_miss · 64 B),
//! with each last-level miss taken as one 64-byte line from memory. It is a PROXY for
//! flop/byte: an instruction is not a flop (a vector FMA is 8–32 flops, a load none), and
//! misses leave out prefetched and written-back lines. Placed against B_τ and B̂_ε(I) in
//! flop/byte, it says on which side of each balance point a function most likely is.
//!
//! The labels and the advice follow the thesis (the energy roofline thesis, §1.4): time-bound by memory when
//! I < B_τ, energy-bound by memory when I < B̂_ε(I). Racing (the fastest clock, then halt)
//! saves energy only where time efficiency implies energy efficiency: compute-bound in both.
//! Memory-bound in time, the clock barely sets the run time, so a lower clock saves energy;
//! compute-bound in time but memory-bound in energy (the balance gap) racing buys time,
//! not energy.

use serde::Serialize;

use super::model::Constants;

/// Bytes moved per last-level cache miss: one cache line.
pub const LINE_BYTES: f64 = 64.0;

/// Which resource bounds a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    /// Flops (instructions) bound it: I ≥ the balance point.
    Compute,
    /// Memory traffic bounds it: I < the balance point.
    Memory,
}

impl Bound {
    /// `compute` or `memory`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Compute => "compute",
            Self::Memory => "memory",
        }
    }
}

/// Whether racing or slowing saves a function's energy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Advice {
    /// Compute-bound in time and energy: finishing sooner saves energy.
    Race,
    /// Memory-bound in time: a lower clock costs little time and saves energy.
    SlowMemoryBound,
    /// Compute-bound in time, memory-bound in energy (the balance gap): racing saves time,
    /// not energy; a lower clock or fewer bytes moved does.
    SlowBalanceGap,
}

impl Advice {
    /// Short form for a table cell.
    pub fn short(self) -> &'static str {
        match self {
            Self::Race => "race",
            Self::SlowMemoryBound | Self::SlowBalanceGap => "slow",
        }
    }

    /// One line saying why.
    pub fn why(self) -> &'static str {
        match self {
            Self::Race => "compute-bound in time and energy: racing to halt saves energy",
            Self::SlowMemoryBound => {
                "memory-bound in time: a lower clock costs little time and saves energy"
            }
            Self::SlowBalanceGap => {
                "in the balance gap: racing saves time, not energy; a lower clock saves energy"
            }
        }
    }
}

/// One function against the balance points.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Placement {
    /// Instructions per LLC-miss byte (the proxy for flop/byte), capped at `f64::MAX` when
    /// no miss was counted.
    pub intensity: f64,
    /// B̂_ε at this intensity, flop/byte.
    pub effective_energy_balance: f64,
    /// Bound in time: I against B_τ.
    pub time: Bound,
    /// Bound in energy: I against B̂_ε(I).
    pub energy: Bound,
    /// Race or slow.
    pub advice: Advice,
}

/// The intensity proxy of `instructions` and `llc_misses`: instructions per 64-byte line
/// missed; `None` without instructions (nothing ran that the counters saw).
pub fn intensity_proxy(instructions: f64, llc_misses: f64) -> Option<f64> {
    // NaN is no count either.
    if instructions.is_nan() || instructions <= 0.0 {
        return None;
    }
    let bytes = llc_misses.max(0.0) * LINE_BYTES;
    Some(if bytes > 0.0 {
        (instructions / bytes).min(f64::MAX)
    } else {
        f64::MAX
    })
}

/// Places intensity `i` against the balance points of `c`.
pub fn place(i: f64, c: &Constants) -> Placement {
    let bt = c.time_balance();
    let be = c.effective_energy_balance(i);
    let time = if i >= bt {
        Bound::Compute
    } else {
        Bound::Memory
    };
    let energy = if i >= be {
        Bound::Compute
    } else {
        Bound::Memory
    };
    let advice = match (time, energy) {
        (Bound::Compute, Bound::Compute) => Advice::Race,
        (Bound::Compute, Bound::Memory) => Advice::SlowBalanceGap,
        (Bound::Memory, _) => Advice::SlowMemoryBound,
    };
    Placement {
        intensity: i,
        effective_energy_balance: be,
        time,
        energy,
        advice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Thesis Table 2 (Fermi), π_0 = 0: B_τ ≈ 3.58, B_ε = B̂_ε = 14.4, a balance gap.
    fn gap_machine() -> Constants {
        Constants {
            const_w: 0.0,
            j_per_flop: 25e-12,
            j_per_byte: 360e-12,
            s_per_flop: 1.0 / 515e9,
            s_per_byte: 1.0 / 144e9,
        }
    }

    /// B_τ = 10, B_ε = 2, π_0 = 0: racing to halt works (B_τ > B̂_ε).
    fn racing_machine() -> Constants {
        Constants {
            const_w: 0.0,
            j_per_flop: 100e-12,
            j_per_byte: 200e-12,
            s_per_flop: 1e-11,
            s_per_byte: 1e-10,
        }
    }

    /// Counts with a known proxy: `i` instructions per byte from 1000 misses.
    fn counts(i: f64) -> (f64, f64) {
        (i * 1000.0 * LINE_BYTES, 1000.0)
    }

    #[test]
    fn proxy_is_instructions_per_missed_line_byte() {
        assert_eq!(intensity_proxy(6400.0, 10.0), Some(10.0));
        assert_eq!(intensity_proxy(0.0, 10.0), None);
        assert_eq!(intensity_proxy(5.0, 0.0), Some(f64::MAX));
    }

    #[test]
    fn each_quadrant_is_labelled_with_its_advice() {
        let gap = gap_machine();
        let race = racing_machine();
        assert!(!gap.race_to_halt() && race.race_to_halt());
        // (intensity from counts, machine, time, energy, advice)
        let cases = [
            // Memory-bound in both (a streaming loop).
            (
                counts(0.5),
                gap,
                Bound::Memory,
                Bound::Memory,
                Advice::SlowMemoryBound,
            ),
            // Compute-bound in time, memory-bound in energy: 3.58 ≤ 8 < 14.4.
            (
                counts(8.0),
                gap,
                Bound::Compute,
                Bound::Memory,
                Advice::SlowBalanceGap,
            ),
            // Compute-bound in both (an FMA loop).
            (
                counts(40.0),
                gap,
                Bound::Compute,
                Bound::Compute,
                Advice::Race,
            ),
            // Memory-bound in time, compute-bound in energy: 2 ≤ 5 < 10.
            (
                counts(5.0),
                race,
                Bound::Memory,
                Bound::Compute,
                Advice::SlowMemoryBound,
            ),
            // No miss at all: compute-bound everywhere.
            (
                (1e9, 0.0),
                race,
                Bound::Compute,
                Bound::Compute,
                Advice::Race,
            ),
        ];
        for ((instr, misses), machine, time, energy, advice) in cases {
            let i = intensity_proxy(instr, misses).expect("instructions");
            let p = place(i, &machine);
            assert_eq!(
                (p.time, p.energy, p.advice),
                (time, energy, advice),
                "I = {i} on {machine:?}"
            );
        }
    }

    #[test]
    fn constant_power_moves_the_energy_balance_point() {
        // π_0 lowers B̂_ε below B_ε: a function inside the π_0 = 0 gap becomes
        // compute-bound in energy, and racing it pays.
        let mut c = gap_machine();
        let i = intensity_proxy(counts(8.0).0, counts(8.0).1).expect("instructions");
        assert_eq!(place(i, &c).advice, Advice::SlowBalanceGap);
        c.const_w = 122.0;
        let p = place(i, &c);
        assert!(p.effective_energy_balance < 8.0, "{p:?}");
        assert_eq!((p.energy, p.advice), (Bound::Compute, Advice::Race));
    }
}
