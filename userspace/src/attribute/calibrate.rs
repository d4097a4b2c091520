//! Static power measured on a quiet machine (`energy-bpf calibrate`; the energy roofline thesis's constant
//! power π0, docs/ARCHITECTURE.md, "Attribution": static power). PURE: a function of a short timeline and its readings.
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
    /// With `--load`: mean power at each step, spinners placed on distinct physical cores
    /// first, then on their SMT siblings. Empty without a load phase.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub load_curve: Vec<LoadStep>,
}

/// One step of a load phase.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoadStep {
    /// CPUs spinning.
    pub busy_cpus: u32,
    /// Distinct physical cores among them.
    pub busy_cores: u32,
    /// Mean power of the source over the step, W.
    pub watts: f64,
}

/// The order to spin CPUs in: one CPU of each physical core (package, core) first, in CPU
/// order, then the remaining SMT siblings, so the curve's first steps measure whole cores
/// and the later ones what a sibling adds.
pub fn spin_order(cpus: &[crate::pb::v1::Cpu]) -> Vec<crate::pb::v1::Cpu> {
    let mut sorted = cpus.to_vec();
    sorted.sort_by_key(|c| c.id);
    let mut seen = std::collections::HashSet::new();
    let (first, siblings): (Vec<_>, Vec<_>) = sorted
        .into_iter()
        .partition(|c| seen.insert((c.package, c.core)));
    first.into_iter().chain(siblings).collect()
}

/// Mean power of `source_id` from the first reading at or after `from_ns` to the last at or
/// before `to_ns`, W; `None` with fewer than two readings there.
pub fn mean_power(
    readings: &[EnergyReading],
    source_id: u32,
    from_ns: u64,
    to_ns: u64,
) -> Option<f64> {
    let mut inside = readings
        .iter()
        .filter(|r| r.source_id == source_id && r.ts_ns >= from_ns && r.ts_ns <= to_ns);
    let first = inside.next()?;
    let last = inside.next_back()?;
    let dt = last.ts_ns.checked_sub(first.ts_ns).filter(|&d| d > 0)?;
    // µJ per ns is kW.
    Some((last.energy_uj - first.energy_uj) / dt as f64 * 1e3)
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
        let interval::Timed {
            readings: rs,
            period_ns: period,
            ..
        } = interval::timed(source, readings);
        let (intervals, _) = interval::cut(&rs, period);
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
            load_curve: Vec::new(),
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

    #[test]
    fn spins_whole_cores_first_then_siblings() {
        let cpu = |id, package, core| crate::pb::v1::Cpu { id, package, core };
        // Two packages of two cores with two threads each, siblings numbered apart.
        let cpus = [
            cpu(5, 1, 0),
            cpu(0, 0, 0),
            cpu(1, 0, 1),
            cpu(2, 1, 0),
            cpu(3, 1, 1),
            cpu(4, 0, 0),
            cpu(6, 0, 1),
            cpu(7, 1, 1),
        ];
        let order: Vec<u32> = spin_order(&cpus).iter().map(|c| c.id).collect();
        assert_eq!(order, [0, 1, 2, 3, 4, 5, 6, 7]);
        let one_core: Vec<u32> = spin_order(&[cpu(1, 0, 0), cpu(0, 0, 0)])
            .iter()
            .map(|c| c.id)
            .collect();
        assert_eq!(one_core, [0, 1]);
    }

    #[test]
    fn mean_power_spans_the_readings_inside_the_step() {
        let r = |ts_ns, energy_uj| EnergyReading {
            source_id: 1,
            ts_ns,
            energy_uj,
            ..EnergyReading::default()
        };
        // 16 W: 16 µJ per µs.
        let readings = [
            r(0, 0.0),
            r(1_000_000, 16_000.0),
            r(2_000_000, 32_000.0),
            r(3_000_000, 80_000.0),
        ];
        let w = mean_power(&readings, 1, 500_000, 2_000_000).expect("two readings");
        assert!((w - 16.0).abs() < 1e-9, "{w}");
        assert_eq!(mean_power(&readings, 1, 2_500_000, 2_900_000), None);
        assert_eq!(mean_power(&readings, 2, 0, 3_000_000), None, "other source");
    }

    use super::*;
    use crate::testing::sim::{SimClass, SimConfig, simulate};

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
                ghz: 0.0,
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
