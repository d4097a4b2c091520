//! The energy roofline of this machine (the energy roofline, Choi's thesis; `calibrate --roofline`):
//! time and energy per flop and per byte, constant power, the balance points they imply
//! and whether racing to halt saves energy.
//!
//! - `model`: the thesis's equations (pure).
//! - `kernels`: built-in kernels whose flops and bytes are known by construction.
//! - `fit`: constants from measured kernels, with residuals and intervals (pure).
//! - `plot`: the normalised roofline and arch line as SVG.
//! - `cpufreq`: pinning CPU frequencies for a DVFS sweep, always restored.
//! - `dvfs`: the thesis's V²-scaling fit over frequencies and the energy-optimal one
//!   per intensity band (pure).
//! - `place`: a function's intensity proxy (instructions per LLC-miss byte) against the
//!   balance points: compute- or memory-bound in time and energy, race or slow (pure).
//! - [`per_function`]: run counts (`record --activity-events`) per stack sample and per
//!   function.
//! - `report`: `report --by function --roofline`: the calibration's balance points and
//!   each function placed against them, as a table, JSON or CSV.
//!
//! - `sweep`: running the kernels while capture goes on, and one source's roofline from
//!   the runs and its readings.
//!
//! This module owns what is stored under `roofline` in the calibration file; the command
//! (`commands/roofline.rs`) maps arguments, starts capture and prints.

pub(crate) mod cpufreq;
pub(crate) mod dvfs;
pub(crate) mod fit;
pub(crate) mod kernels;
pub(crate) mod model;
pub mod per_function;
pub(crate) mod place;
pub(crate) mod plot;
pub(crate) mod points;
pub(crate) mod report;
pub(crate) mod sweep;

use std::io::Read as _;

pub(crate) use fit::{FitError, FitReport, KernelPoint};
pub use model::Constants;

/// The constants of one thread count, and what follows from them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    /// Threads the kernels ran on.
    pub threads: u32,
    /// π_0, ε, τ.
    #[serde(flatten)]
    pub constants: Constants,
    /// B_τ, flop/byte.
    pub time_balance: f64,
    /// B_ε, flop/byte.
    pub energy_balance: f64,
    /// B̂_ε at I = B_τ (= η_flop·B_ε), flop/byte.
    pub effective_energy_balance: f64,
    /// η_flop = ε_flop/(ε_flop + π_0·τ_flop).
    pub eta_flop: f64,
    /// B_τ > B̂_ε: finishing sooner saves energy.
    pub race_to_halt: bool,
    /// `[B_τ, B̂_ε]`: intensities compute-bound in time but memory-bound in energy; absent
    /// when racing to halt works.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance_gap: Option<[f64; 2]>,
    /// Residuals and intervals.
    pub fit: FitReport,
}

impl Summary {
    /// Derives the balance points from fitted constants.
    pub fn new(threads: u32, constants: Constants, fit: FitReport) -> Self {
        let bt = constants.time_balance();
        Self {
            threads,
            time_balance: bt,
            energy_balance: constants.energy_balance(),
            effective_energy_balance: constants.effective_energy_balance(bt),
            eta_flop: constants.eta_flop(),
            race_to_halt: constants.race_to_halt(),
            balance_gap: constants.balance_gap_band().map(|(a, b)| [a, b]),
            constants,
            fit,
        }
    }
}

/// What `calibrate --roofline` stores per source under `roofline`: the machine (all
/// threads) at the top level, one thread beside it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Roofline {
    /// The source is the estimated model: these numbers describe the model, not the machine.
    pub estimated: bool,
    /// Vector code the kernels ran (`avx512f`, `avx2+fma`, `scalar`).
    pub isa: String,
    /// Bytes of the kernels' buffer (larger than the last-level cache when it could be).
    pub buffer_bytes: u64,
    /// The machine: every CPU running the kernels.
    #[serde(flatten)]
    pub all: Summary,
    /// One thread, when the machine has more than one CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_thread: Option<Summary>,
    /// Every kernel run.
    pub kernels: Vec<KernelPoint>,
    /// Per-frequency constants and the V² fit, with `--frequencies`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dvfs: Option<dvfs::Dvfs>,
}

/// Fits the kernels of each thread count: the most threads is the machine.
pub(crate) fn summarize(
    points: &[KernelPoint],
    const_w: f64,
    const_w_interval: [f64; 2],
) -> Result<(Summary, Option<Summary>), FitError> {
    let most = points.iter().map(|p| p.threads).max().unwrap_or(1);
    let of = |threads: u32| -> Result<Summary, FitError> {
        let mine: Vec<KernelPoint> = points
            .iter()
            .filter(|p| p.threads == threads)
            .cloned()
            .collect();
        let (c, report) = fit::fit(&mine, const_w, const_w_interval)?;
        Ok(Summary::new(threads, c, report))
    };
    let all = of(most)?;
    let one = if most > 1 { Some(of(1)?) } else { None };
    Ok((all, one))
}

/// Reads a small sysfs text file (at most 4 KiB), trimmed.
pub(crate) fn read_small(path: &std::path::Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(4096)
        .read_to_string(&mut text)?;
    Ok(text.trim().to_owned())
}
