//! The estimated model for machines with no energy counter (VMs, like ours: see
//! docs/estimated-energy.md): per package P = P_idle + (P_max − P_idle)·u^γ, with u the
//! exact busy share of the package's CPUs from the switch timeline and γ the load curve's
//! shape (1 with `--model-curve linear`). Every source it makes has `estimated = true` and
//! says where its parameters came from (`model_origin`, `model_row`, `model_error_pct`).
//!
//! Parameters, per package, first match wins: `--model-idle-w`/`--model-max-w`; a config
//! file (`--model-config`) of `key = value` lines — `idle_w`, `max_w`, `#` comments, `[..]`
//! section lines ignored, so a TOML `[model]` table works; else the power table's estimate
//! for this machine ([`super::machine`]): the wall power of the machine, or of a VM's
//! share of its host (vCPUs over host threads), split over packages by their CPUs. The
//! table's figures are wall (`platform`) power, not a RAPL package: the zone keeps the
//! package domain so attribution still splits per package, and its name says platform.
//! `calibrate` results, applied later as the static power, win over all of these.
//!
//! [`readings`] is pure: the same timeline always gives the same readings, so `report` and
//! `top` recompute them and a recording can be re-reported with other parameters.

use std::path::Path;

use super::{EnergyArgs, EnergyError, ModelCurve, SourceKind, machine, source_desc};
use crate::{pb::v1 as pb, timeline::Timeline};

/// Interval of modelled readings when the caller has no other choice, ns.
pub const DEFAULT_INTERVAL_NS: u64 = 10_000_000;

/// The most modelled readings [`readings`] makes, all sources together: an hour at
/// [`DEFAULT_INTERVAL_NS`] for one package (about 26 MiB). Longer captures get longer
/// intervals, so memory never grows with a time span read from a file.
pub const MAX_READINGS: u64 = 360_000;

/// The most (interval, CPU) busy-time lookups [`readings`] makes: bounds its time on
/// machines with many CPUs the same way.
pub(crate) const MAX_CPU_STEPS: u64 = 200_000_000;

/// How users set the parameters (printed by `sources`).
pub(crate) const HOW_TO_SET: &str = "set per-package watts with --model-idle-w W --model-max-w W, or \
     --model-config FILE with lines `idle_w = W` and `max_w = W`";

/// Model parameters from a config file.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ModelConfig {
    /// Idle watts per package.
    pub idle_w: Option<f64>,
    /// Full-load watts per package.
    pub max_w: Option<f64>,
}

/// Parses a model config file's text (see the module docs for the format).
pub(crate) fn parse_config(text: &str, path: &Path) -> Result<ModelConfig, EnergyError> {
    let mut config = ModelConfig::default();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() || line.starts_with('[') {
            continue;
        }
        let bad = |why: &str| {
            EnergyError::Model(format!("{}:{}: {why}: {line:?}", path.display(), n + 1))
        };
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| bad("expected `key = value`"))?;
        let value: f64 = value
            .trim()
            .parse()
            .map_err(|_| bad("expected a number of watts"))?;
        match key.trim() {
            "idle_w" => config.idle_w = Some(value),
            "max_w" => config.max_w = Some(value),
            _ => return Err(bad("unknown key (known: idle_w, max_w)")),
        }
    }
    Ok(config)
}

/// One model source per package of `cpus`, ids from `first_id`.
pub fn sources(
    args: &EnergyArgs,
    cpus: &[pb::Cpu],
    first_id: u32,
) -> Result<Vec<pb::EnergySource>, EnergyError> {
    let config = match &args.model_config {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| {
                EnergyError::Model(format!("reading --model-config {}: {e}", path.display()))
            })?;
            Some((parse_config(&text, path)?, path))
        }
        None => None,
    };
    let file = config.as_ref().map(|(c, _)| c.clone()).unwrap_or_default();
    let given = |flag: Option<f64>, file: Option<f64>| flag.or(file);
    // The table is read only when a parameter is left to it.
    let need_table = given(args.model_idle_w, file.idle_w).is_none()
        || given(args.model_max_w, file.max_w).is_none();
    let estimate = if need_table {
        let table = machine::table()?;
        let here = machine::read(&args.proc_root, &args.sysfs_root)?;
        Some(machine::estimate(table, &here))
    } else {
        None
    };
    let gamma = match args.model_curve {
        ModelCurve::Linear => 1.0,
        ModelCurve::Fitted => machine::table()?.curve_gamma,
    };
    let mut packages: Vec<u32> = cpus.iter().map(|c| c.package).collect();
    packages.sort_unstable();
    packages.dedup();
    if packages.is_empty() {
        packages.push(0);
    }
    let total_cpus = cpus.len().max(1);
    let mut out = Vec::new();
    for (i, package) in packages.into_iter().enumerate() {
        let n = cpus.iter().filter(|c| c.package == package).count().max(1);
        let fraction = n as f64 / total_cpus.max(n) as f64;
        let pick = |flag: Option<f64>, file: Option<f64>, table_w: Option<f64>, key: &str| {
            if let Some(w) = flag {
                (
                    w,
                    format!(
                        "{key} from --model-{} (wins over the table)",
                        key.replace('_', "-")
                    ),
                )
            } else if let (Some(w), Some((_, path))) = (file, &config) {
                (
                    w,
                    format!("{key} from {} (wins over the table)", path.display()),
                )
            } else {
                let w = table_w.unwrap_or(0.0) * fraction;
                (
                    w,
                    format!("{key} {w:.2} W from the power table ({n} of {total_cpus} CPUs)"),
                )
            }
        };
        let table_idle = estimate.as_ref().map(|e| e.idle_w);
        let table_full = estimate.as_ref().map(|e| e.full_w);
        let (idle, idle_origin) = pick(args.model_idle_w, file.idle_w, table_idle, "idle_w");
        let (max, max_origin) = pick(args.model_max_w, file.max_w, table_full, "max_w");
        if !(idle.is_finite() && max.is_finite() && idle >= 0.0 && max >= idle) {
            return Err(EnergyError::Model(format!(
                "need 0 <= idle_w <= max_w, got idle_w = {idle} ({idle_origin}), max_w = {max} ({max_origin})"
            )));
        }
        let mut source = source_desc(
            SourceKind::Model,
            pb::EnergyDomain::Package,
            package,
            format!("model platform share, package-{package} (estimated)"),
        );
        source.id = first_id + i as u32;
        source.estimated = true;
        source.model_idle_w = idle;
        source.model_max_w = max;
        source.model_curve_gamma = gamma;
        source.model_origin = format!("{idle_origin}; {max_origin}; curve u^{gamma:.3}");
        if let Some(e) = &estimate {
            source.model_row = e.row.clone();
            source.model_error_pct = e.error_pct;
            source.model_origin.push_str(&format!("; {}", e.scope));
        }
        out.push(source);
    }
    Ok(out)
}

/// The power-table rows behind the model sources among `sources`, as outputs label them
/// (`Intel Xeon Platinum 8375C → Ice Lake-SP, …, ±12%`; distinct rows joined by `; `), or
/// `None` when no model source came from the table (flags, a config file, older
/// recordings).
pub fn row_label(sources: &[pb::EnergySource]) -> Option<String> {
    let mut rows: Vec<&str> = sources
        .iter()
        .filter(|s| is_model(s) && !s.model_row.is_empty())
        .map(|s| s.model_row.as_str())
        .collect();
    rows.dedup();
    (!rows.is_empty()).then(|| rows.join("; "))
}

/// The largest error of the table rows behind the model sources, % (`None`: no row).
pub fn row_error_pct(sources: &[pb::EnergySource]) -> Option<f64> {
    sources
        .iter()
        .filter(|s| is_model(s) && !s.model_row.is_empty())
        .map(|s| s.model_error_pct)
        .max_by(f64::total_cmp)
}

/// Whether a source is a model source.
pub(crate) fn is_model(source: &pb::EnergySource) -> bool {
    source.kind == SourceKind::Model.as_str()
}

/// Cumulative modelled readings of every model source in `sources`, at `start_ns`, every
/// `interval_ns` after it, and at `end_ns` of the timeline. Non-model sources are ignored.
/// A package's CPUs are those of `cpus` with its id (every timeline CPU when `cpus` is
/// empty); its energy over [a, b) is P_idle·(b−a) + (P_max − P_idle)·busy/n, i.e.
/// ∫ P_idle + (P_max − P_idle)·u dt with u = busy / (n·(b−a)).
///
/// The interval grows when the window would otherwise need more than [`MAX_READINGS`]
/// readings or `MAX_CPU_STEPS` lookups; energy over the window is the same either way.
pub fn readings(
    timeline: &Timeline,
    cpus: &[pb::Cpu],
    sources: &[pb::EnergySource],
    interval_ns: u64,
) -> Vec<pb::EnergyReading> {
    let (start, end) = (timeline.start_ns, timeline.end_ns);
    if end <= start {
        return Vec::new();
    }
    let interval = if interval_ns == 0 {
        DEFAULT_INTERVAL_NS
    } else {
        interval_ns
    };
    let models: Vec<(&pb::EnergySource, Vec<u32>)> = sources
        .iter()
        .filter(|s| is_model(s))
        .map(|s| {
            let ids = if cpus.is_empty() {
                timeline.cpus.iter().map(|c| c.cpu).collect()
            } else {
                cpus.iter()
                    .filter(|c| c.package == s.package)
                    .map(|c| c.id)
                    .collect()
            };
            (s, ids)
        })
        .collect();
    let interval = bounded_interval(
        end - start,
        interval,
        models.len() as u64,
        models.iter().map(|(_, ids)| ids.len() as u64).sum(),
    );
    // Busy ns of each source per step: each CPU's runs walked once, in order, each run's
    // busy time added to the steps it overlaps (the same integer sums as looking every step
    // up on every CPU).
    let steps = usize::try_from((end - start).div_ceil(interval)).unwrap_or(usize::MAX);
    // Whether each entry of the thread table is a real thread: a run's busy flag without
    // building the run.
    let busy_entry: Vec<bool> = timeline.who().iter().map(|w| w.is_busy()).collect();
    let models: Vec<_> = models
        .into_iter()
        .map(|(s, ids)| {
            let n = ids.len().max(1) as f64;
            let mut busy = vec![0u64; steps];
            for ct in ids.iter().filter_map(|&c| timeline.cpu(c)) {
                let store = ct.store();
                for i in (0..store.len()).filter(|&i| busy_entry[store.id(i) as usize]) {
                    let (run_start, run_end) = (store.start(i), store.end(i));
                    let (from, to) = (run_start.max(start), run_end.min(end));
                    let mut k = ((from.saturating_sub(start)) / interval) as usize;
                    let mut a = start + k as u64 * interval;
                    while a < to && k < steps {
                        let b = a.saturating_add(interval).min(end);
                        // The run's overlap with the step (`Run::overlap_ns`).
                        busy[k] += run_end.min(b).saturating_sub(run_start.max(a));
                        k += 1;
                        a = b;
                    }
                }
            }
            (s, busy, n)
        })
        .collect();
    let mut energy = vec![0.0f64; models.len()];
    let mut out: Vec<pb::EnergyReading> = models
        .iter()
        .map(|(s, _, _)| pb::EnergyReading {
            source_id: s.id,
            ts_ns: start,
            ..Default::default()
        })
        .collect();
    out.reserve(steps * models.len());
    let mut a = start;
    let mut k = 0;
    while a < end {
        let b = a.saturating_add(interval).min(end);
        for (i, (source, busy, n)) in models.iter().enumerate() {
            let busy = busy.get(k).copied().unwrap_or(0);
            // W × ns = 1e-3 µJ.
            let dynamic_w = source.model_max_w - source.model_idle_w;
            let span = (b - a) as f64;
            let gamma = source.model_curve_gamma;
            // Linear (γ = 1, or 0 in recordings from before the curve): the exact integral
            // ∫ u dt = busy/n. Otherwise u^γ of the step's mean busy share u.
            let dynamic_ns = if gamma == 0.0 || gamma == 1.0 || span == 0.0 {
                busy as f64 / n
            } else {
                span * (busy as f64 / n / span).clamp(0.0, 1.0).powf(gamma)
            };
            energy[i] += (source.model_idle_w * span + dynamic_w * dynamic_ns) * 1e-3;
            out.push(pb::EnergyReading {
                source_id: source.id,
                ts_ns: b,
                energy_uj: energy[i],
                ..Default::default()
            });
        }
        a = b;
        k += 1;
    }
    out
}

/// `interval_ns`, or longer so that a window of `span_ns` needs at most [`MAX_READINGS`]
/// readings over `sources` sources and [`MAX_CPU_STEPS`] lookups over `cpus` CPUs.
fn bounded_interval(span_ns: u64, interval_ns: u64, sources: u64, cpus: u64) -> u64 {
    let steps = (MAX_READINGS / sources.max(1)).min(MAX_CPU_STEPS / cpus.max(1));
    interval_ns.max(span_ns.div_ceil(steps.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::SwitchEvent;

    const MS: u64 = 1_000_000;

    fn switch(ts_ns: u64, cpu: u32, tid: u32, next_tid: u32) -> SwitchEvent {
        SwitchEvent {
            ts_ns,
            cpu,
            tid,
            tgid: tid,
            next_known: true,
            next_tid,
            next_tgid: next_tid,
            ..Default::default()
        }
    }

    fn model_source(idle: f64, max: f64) -> pb::EnergySource {
        pb::EnergySource {
            id: 7,
            kind: "model".into(),
            domain: pb::EnergyDomain::Package as i32,
            estimated: true,
            model_idle_w: idle,
            model_max_w: max,
            ..Default::default()
        }
    }

    /// Two CPUs over 100 ms; `busy` of them run a thread for the whole window, and for
    /// "half" each CPU is busy 50 ms.
    fn power_at(utilisation: f64) -> f64 {
        let cpus = crate::energy::fake::cpus(1, 2);
        let switches: Vec<SwitchEvent> = if utilisation == 0.0 {
            vec![switch(0, 0, 0, 0), switch(0, 1, 0, 0)]
        } else if utilisation == 1.0 {
            vec![switch(0, 0, 0, 42), switch(0, 1, 0, 43)]
        } else {
            vec![
                switch(0, 0, 0, 42),
                switch(50 * MS, 0, 42, 0),
                switch(50 * MS, 1, 0, 43),
            ]
        };
        let timeline = Timeline::build(0, 100 * MS, &[0, 1], &switches);
        let got = readings(&timeline, &cpus, &[model_source(10.0, 30.0)], 10 * MS);
        assert_eq!(got.len(), 11, "{got:?}");
        assert_eq!(got[0].energy_uj, 0.0);
        assert!(got.iter().all(|r| r.source_id == 7 && r.flag.is_empty()));
        // Average watts over the window.
        got[10].energy_uj / 1e6 / 0.1
    }

    #[test]
    fn a_curve_bends_the_dynamic_part_only() {
        // CPU 0 busy, CPU 1 idle for 100 ms: u = 0.5 in every step.
        let cpus = crate::energy::fake::cpus(1, 2);
        let timeline = Timeline::build(0, 100 * MS, &[0, 1], &[switch(0, 0, 0, 42)]);
        let watts = |gamma: f64| {
            let mut s = model_source(10.0, 30.0);
            s.model_curve_gamma = gamma;
            let got = readings(&timeline, &cpus, &[s], 10 * MS);
            got.last().map_or(0.0, |r| r.energy_uj) / 1e6 / 0.1
        };
        // 0 (older recordings) and 1 are linear; γ = 2 gives 10 + 20·0.25.
        assert!((watts(0.0) - 20.0).abs() < 1e-9, "{}", watts(0.0));
        assert!((watts(1.0) - 20.0).abs() < 1e-9, "{}", watts(1.0));
        assert!((watts(2.0) - 15.0).abs() < 1e-9, "{}", watts(2.0));
    }

    #[test]
    fn a_window_of_centuries_makes_a_bounded_number_of_readings() {
        // A damaged end time once made this loop allocate 24 GB.
        let cpus = crate::energy::fake::cpus(1, 2);
        let end = u64::MAX / 2;
        let timeline = Timeline::build(0, end, &[0, 1], &[switch(0, 0, 0, 42)]);
        let got = readings(&timeline, &cpus, &[model_source(10.0, 30.0)], 10 * MS);
        assert!(got.len() as u64 <= MAX_READINGS + 1, "{}", got.len());
        assert_eq!(got.last().map(|r| r.ts_ns), Some(end));
        // CPU 0 busy throughout, CPU 1 idle: 20 W on average, whatever the interval.
        let watts = got.last().map_or(0.0, |r| r.energy_uj) / (end as f64 * 1e-3);
        assert!((watts - 20.0).abs() < 1e-6, "{watts}");
    }

    #[test]
    fn intervals_grow_only_past_the_caps() {
        assert_eq!(bounded_interval(3_600 * 1_000 * MS, 10 * MS, 1, 8), 10 * MS);
        assert_eq!(bounded_interval(7_200 * 1_000 * MS, 10 * MS, 1, 8), 20 * MS);
        assert_eq!(bounded_interval(3_600 * 1_000 * MS, 10 * MS, 2, 8), 20 * MS);
        assert!(bounded_interval(u64::MAX, 10 * MS, 0, 0) > 10 * MS);
        // 65536 CPUs over 1000 s: a few thousand steps, not 100 000.
        let iv = bounded_interval(1_000_000 * MS, 10 * MS, 1, 65_536);
        assert!(1_000_000 * MS / iv <= MAX_CPU_STEPS / 65_536, "{iv}");
    }

    #[test]
    fn utilisation_zero_half_full_gives_idle_mid_max() {
        assert!((power_at(0.0) - 10.0).abs() < 1e-9, "{}", power_at(0.0));
        assert!((power_at(0.5) - 20.0).abs() < 1e-9, "{}", power_at(0.5));
        assert!((power_at(1.0) - 30.0).abs() < 1e-9, "{}", power_at(1.0));
    }

    #[test]
    fn parameters_from_flags_file_or_default() {
        let cpus = crate::energy::fake::cpus(2, 1);
        let machine_dir = tempfile::tempdir().expect("tempdir");
        let proc_root = crate::energy::fake::machine(
            machine_dir.path(),
            "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
            ("GenuineIntel", 6, 106, 6),
            2,
            true,
            Some(("Amazon EC2", "c6i.large")),
        )
        .expect("fake machine");
        let here = EnergyArgs {
            proc_root,
            sysfs_root: machine_dir.path().to_owned(),
            ..Default::default()
        };
        let def = sources(&here, &cpus, 1).expect("default");
        assert_eq!(def.len(), 2);
        // The table's estimate for this VM, split over the packages by their CPUs.
        let table = machine::table().expect("table");
        let m = machine::read(&here.proc_root, &here.sysfs_root).expect("machine");
        let e = machine::estimate(table, &m);
        assert_eq!((def[1].id, def[1].package), (2, 1));
        assert!(
            (def[1].model_idle_w - e.idle_w / 2.0).abs() < 1e-9,
            "{def:?}"
        );
        assert!(
            (def[1].model_max_w - e.full_w / 2.0).abs() < 1e-9,
            "{def:?}"
        );
        assert!(
            def[0].estimated
                && def[0].model_origin.contains("power table")
                && def[0].model_row.contains("Ice Lake-SP")
                && def[0].model_error_pct > 0.0
                && def[0].model_curve_gamma == table.curve_gamma,
            "{:?}",
            def[0]
        );
        let linear = EnergyArgs {
            model_curve: ModelCurve::Linear,
            ..here.clone()
        };
        assert_eq!(
            sources(&linear, &cpus, 1).expect("linear")[0].model_curve_gamma,
            1.0
        );

        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("model.toml");
        std::fs::write(&path, "[model]\nidle_w = 12.5 # measured\nmax_w = 90\n").expect("write");
        let args = EnergyArgs {
            model_config: Some(path.clone()),
            model_max_w: Some(80.0),
            ..here.clone()
        };
        let got = sources(&args, &cpus[..1], 1).expect("config");
        assert_eq!((got[0].model_idle_w, got[0].model_max_w), (12.5, 80.0));
        assert!(
            got[0].model_origin.contains("model.toml")
                && got[0].model_origin.contains("--model-max-w")
        );

        std::fs::write(&path, "idle = 3\n").expect("write");
        let err = sources(&args, &cpus, 1)
            .expect_err("bad key accepted")
            .to_string();
        assert!(err.contains("model.toml:1: unknown key"), "{err}");
        let args = EnergyArgs {
            model_idle_w: Some(50.0),
            model_max_w: Some(10.0),
            ..Default::default()
        };
        assert!(sources(&args, &cpus, 1).is_err());
    }
}
