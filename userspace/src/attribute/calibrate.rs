//! Static power measured on a quiet machine (`energy-bpf calibrate`; seed 002's constant
//! power π0, DESIGN.md §6a). PURE: a function of a short timeline and its readings.
//!
//! The machine must be quiet (a bounded share of CPU time busy), but never is entirely:
//! daemons and the agent itself run. What ran is subtracted at the measured power per busy
//! CPU (the slope of the zero-load fit) when the window shows enough utilisation levels to
//! measure it; otherwise the median power of the idle intervals is the static power, and
//! nothing needs subtracting. With a load phase (spinning 1..N CPUs in turn), the fit
//! spans the whole range and also gives watts per busy CPU.

use crate::pb::v1::{EnergyDomain, EnergyReading, EnergySource};
use crate::timeline::Timeline;

use super::interval::{self, Interval};
use super::split::Occupancy;
use super::static_power::source_key;
use super::zero_load::{fit_zero_load, merge_rows};

/// What calibration measured for one source.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Measured {
    /// [`source_key`] of the source.
    pub key: String,
    /// Human-readable name.
    pub name: String,
    /// Static (all-idle) power, W.
    pub static_w: f64,
    /// Power per busy CPU, W, when the window had enough utilisation levels to fit it.
    pub per_busy_cpu_w: Option<f64>,
    /// Share of the source's CPU time that was busy (the caller's own load excluded), 0..1.
    pub busy_share: f64,
    /// How static power was obtained: `fit` (what ran subtracted at `per_busy_cpu_w`),
    /// `idle_median` or `mean` (too few idle intervals and no fit; the least trusted).
    pub method: String,
    /// Kept reading intervals.
    pub intervals: usize,
}

/// Why calibration refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CalibrateError {
    /// Too much ran for a static measurement.
    #[error(
        "the machine is not quiet: {busy_pct:.1}% of {name}'s CPU time was busy (limit {max_pct:.1}%){}; stop the load or raise --max-busy",
        busiest_note(busiest)
    )]
    TooBusy {
        /// Source name.
        name: String,
        /// Busy share, %.
        busy_pct: f64,
        /// Limit, %.
        max_pct: f64,
        /// The busiest processes, `(pid, % of CPU time)`.
        busiest: Vec<(u32, f64)>,
    },
    /// A CPU source produced fewer than two readings.
    #[error("{name} gave no energy readings during calibration")]
    NoReadings {
        /// Source name.
        name: String,
    },
}

fn busiest_note(busiest: &[(u32, f64)]) -> String {
    if busiest.is_empty() {
        return String::new();
    }
    let list: Vec<String> = busiest
        .iter()
        .map(|(pid, pct)| format!("pid {pid} {pct:.1}%"))
        .collect();
    format!(" (busiest: {})", list.join(", "))
}

/// Measures every CPU-domain source (GPUs: the mean power of the window). `own_tgid` is the
/// calibrating process: its load phase does not count against `max_busy` (0..1).
pub fn measure(
    timeline: &Timeline,
    sources: &[EnergySource],
    readings: &[EnergyReading],
    max_busy: f64,
    own_tgid: Option<u32>,
    row_ns: u64,
) -> Result<Vec<Measured>, CalibrateError> {
    let cpus: Vec<u32> = timeline.cpus.iter().map(|c| c.cpu).collect();
    let mut out = Vec::new();
    for source in sources {
        let rs: Vec<&EnergyReading> = readings
            .iter()
            .filter(|r| r.source_id == source.id)
            .collect();
        let (intervals, _) = interval::cut(&rs, source.update_period_ns);
        if intervals.is_empty() {
            return Err(CalibrateError::NoReadings {
                name: source.name.clone(),
            });
        }
        let gpu = source.domain() == EnergyDomain::Gpu;
        let occs: Vec<Occupancy> = if gpu {
            Vec::new()
        } else {
            intervals
                .iter()
                .map(|iv| Occupancy::tally(timeline, &cpus, iv.start_ns, iv.end_ns, &|_, _| 1.0))
                .collect()
        };
        let (busy_share, busiest) = busy_share(&intervals, &occs, cpus.len(), own_tgid);
        if busy_share > max_busy {
            return Err(CalibrateError::TooBusy {
                name: source.name.clone(),
                busy_pct: busy_share * 100.0,
                max_pct: max_busy * 100.0,
                busiest,
            });
        }
        let (static_w, per_busy_cpu_w, method) = static_of(&intervals, &occs, cpus.len(), row_ns);
        out.push(Measured {
            key: source_key(source),
            name: source.name.clone(),
            static_w,
            per_busy_cpu_w,
            busy_share,
            method: method.into(),
            intervals: intervals.len(),
        });
    }
    Ok(out)
}

/// Busy share of the window without `own_tgid`, and the three busiest processes.
fn busy_share(
    intervals: &[Interval],
    occs: &[Occupancy],
    n_cpus: usize,
    own_tgid: Option<u32>,
) -> (f64, Vec<(u32, f64)>) {
    let total_ns: f64 = intervals.iter().map(|iv| iv.len_ns() as f64).sum::<f64>() * n_cpus as f64;
    if occs.is_empty() || total_ns <= 0.0 {
        return (0.0, Vec::new());
    }
    let mut per: std::collections::BTreeMap<u32, f64> = std::collections::BTreeMap::new();
    for occ in occs {
        for (&(tgid, _), t) in &occ.threads {
            if Some(tgid) != own_tgid {
                *per.entry(tgid).or_insert(0.0) += t.ns;
            }
        }
        *per.entry(0).or_insert(0.0) += occ.unknown.ns;
    }
    let busy: f64 = per.values().sum();
    let mut top: Vec<(u32, f64)> = per
        .into_iter()
        .filter(|&(_, ns)| ns > 0.0)
        .map(|(pid, ns)| (pid, ns / total_ns * 100.0))
        .collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(3);
    (busy / total_ns, top)
}

/// Static power, W per busy CPU, and the method used; bounded by `[0, mean power]`: what
/// ran is only ever subtracted. (Not by the quietest row as in attribution: a calibration
/// window is short and quiet, and one late counter update would pull a minimum down.)
fn static_of(
    intervals: &[Interval],
    occs: &[Occupancy],
    n_cpus: usize,
    row_ns: u64,
) -> (f64, Option<f64>, &'static str) {
    let power = |iv: &Interval| iv.energy_uj / iv.len_ns() as f64 * 1e3;
    let uj: f64 = intervals.iter().map(|iv| iv.energy_uj).sum();
    let ns: f64 = intervals.iter().map(|iv| iv.len_ns() as f64).sum();
    let mean_w = if ns > 0.0 { uj / ns * 1e3 } else { 0.0 };
    let rows = merge_rows(intervals, occs, row_ns);
    let (w, slope, method) = match fit_zero_load(&rows) {
        Ok(fit) if !occs.is_empty() => (fit.intercept_w, Some(fit.slope_w), "fit"),
        _ => {
            let mut idle: Vec<f64> = intervals
                .iter()
                .zip(occs)
                .filter(|(iv, o)| o.busy_ns() <= 0.05 * n_cpus as f64 * iv.len_ns() as f64)
                .map(|(iv, _)| power(iv))
                .collect();
            if idle.len() >= 20 {
                idle.sort_by(f64::total_cmp);
                (idle[idle.len() / 2], None, "idle_median")
            } else {
                (mean_w, None, "mean")
            }
        }
    };
    (w.clamp(0.0, mean_w.max(0.0)), slope, method)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribute::sim::{SimClass, SimConfig, simulate};

    fn quiet(busy_weight: f64, load: bool) -> SimConfig {
        SimConfig {
            seed: 5,
            cpus_per_package: 2,
            duration_ns: 5_000_000_000,
            static_w: 6.0,
            idle_weight: 1.0,
            mean_idle_ns: 20_000_000,
            never_idle_cpus: if load { vec![0] } else { Vec::new() },
            classes: vec![SimClass {
                name: "daemon".into(),
                tgid: 7,
                threads: 2,
                watts: 10.0,
                weight: busy_weight,
                mean_run_ns: 500_000,
                functions: vec![1.0],
                cpus: Vec::new(),
            }],
            ..SimConfig::default()
        }
    }

    #[test]
    fn quiet_machine_measures_static_power_with_light_load_subtracted() {
        let out = simulate(&quiet(0.02, false));
        let m = measure(
            &out.timeline,
            &out.sources,
            &out.readings,
            0.10,
            None,
            50_000_000,
        )
        .expect("quiet enough");
        assert_eq!(m.len(), 1);
        assert!((m[0].static_w - 6.0).abs() < 0.15, "{m:?}");
        assert!(
            m[0].busy_share < 0.10 && m[0].key == "sim:sim package-0",
            "{m:?}"
        );
    }

    #[test]
    fn busy_machine_is_refused_with_the_busiest_processes() {
        let mut cfg = quiet(2.0, false);
        cfg.classes[0].mean_run_ns = 20_000_000;
        let out = simulate(&cfg);
        let err = measure(
            &out.timeline,
            &out.sources,
            &out.readings,
            0.10,
            None,
            50_000_000,
        )
        .expect_err("too busy");
        let text = err.to_string();
        assert!(
            text.contains("not quiet") && text.contains("pid 7"),
            "{text}"
        );
        // Our own load does not count against the limit.
        let ok = measure(
            &out.timeline,
            &out.sources,
            &out.readings,
            0.10,
            Some(7),
            50_000_000,
        )
        .expect("own load excluded");
        assert!((ok[0].static_w - 6.0).abs() < 0.3, "{ok:?}");
        assert!(
            ok[0].per_busy_cpu_w.is_some_and(|w| (w - 10.0).abs() < 0.5),
            "{ok:?}"
        );
    }
}
