//! The energy sources survey `energy-bpf sources` prints: every energy source kind on this
//! machine, whether it can be read and why not, its domains with measured update period
//! and read cost, and which will be used; with no counter, the estimated model's
//! parameters and how to set them; and the activity counter runs are weighed by.

use serde::Serialize;

use crate::capture::activity::ActivityCounters;
use crate::energy::{
    EnergyArgs, EnergyError, EnergySource,
    counter::MAX_PLAUSIBLE_W,
    detect, domain_name, model,
    reader::{self, Measurement},
    topology,
};

/// Why the survey could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SurveyError {
    /// The sources could not be chosen (a bad `--energy-source` or model file).
    #[error("choosing energy sources")]
    Plan(#[source] EnergyError),
    /// The model could not cover the packages no counter counts.
    #[error(transparent)]
    Model(#[from] EnergyError),
}

impl Survey {
    /// What would be used, e.g. `powercap intel-rapl:0 (package-0)`; empty when nothing can
    /// give energy.
    pub fn in_use(&self) -> &[String] {
        &self.in_use
    }
}

/// What `sources` prints: every kind probed, its counters, what would be used, and the
/// activity counter.
#[derive(Serialize)]
pub struct Survey {
    sysfs_root: String,
    dev_cpu_root: String,
    energy_source: String,
    kinds: Vec<KindReport>,
    /// Present when the estimated model covers the CPU packages.
    model: Option<ModelReport>,
    in_use: Vec<String>,
    /// The activity counter `record` and `top` weigh runs by (`--activity-event auto`).
    activity: ActivityReport,
    /// CPython versions of the running processes, and whether their frames are walked.
    python: Vec<crate::python::census::Running>,
}

#[derive(Serialize)]
struct ActivityReport {
    /// `cycles`, or `None`: dynamic energy is split by time.
    event: Option<String>,
    /// Why there is no counter.
    reason: Option<String>,
}

#[derive(Serialize)]
struct KindReport {
    kind: String,
    present: bool,
    readable: bool,
    reason: Option<String>,
    /// What the source is, where it says more than its counters (a hypervisor share:
    /// "measured by the host, shared at DIR, updated every 1 s ...").
    note: Option<String>,
    counters: Vec<CounterReport>,
}

#[derive(Serialize)]
struct CounterReport {
    name: String,
    domain: String,
    package: u32,
    update_period_ns: u64,
    /// True when the counter did not change often enough to measure: the period is at least
    /// `update_period_ns`.
    period_is_lower_bound: bool,
    read_cost_ns: u64,
    read_interval_ns: u64,
    /// Why the read interval is shorter than the update period asks, when the wrap cap
    /// lowered it.
    read_interval_note: Option<String>,
    used: bool,
    error: Option<String>,
}

#[derive(Serialize)]
struct ModelReport {
    estimated: bool,
    packages: Vec<ModelPackage>,
    how_to_set: String,
}

#[derive(Serialize)]
struct ModelPackage {
    package: u32,
    idle_w: f64,
    max_w: f64,
    origin: String,
    /// The power-table row and its error, % (empty, 0: parameters not from the table).
    model_row: String,
    model_error: f64,
    /// Load curve exponent γ (1: linear).
    curve_gamma: f64,
}

/// Probes every energy source kind under `args`' roots, measures each counter's update
/// period and read cost, and says which would be used (the model where none counts).
pub fn survey(args: &EnergyArgs) -> Result<Survey, SurveyError> {
    let cpus = topology::cpus(&args.sysfs_root);
    let mut plan = detect::plan(args, &cpus, true).map_err(SurveyError::Plan)?;
    let mut kinds = Vec::new();
    let mut in_use = Vec::new();
    let mut package_counted = false;
    for (pi, probe) in plan.probes.iter_mut().enumerate() {
        let measured = reader::measure(&mut probe.counters, reader::patience_ns(args));
        let counters = probe
            .counters
            .iter()
            .zip(measured)
            .enumerate()
            .map(|(ci, (counter, m))| {
                let used = plan.used.contains(&(pi, ci));
                let report = counter_report(args, counter.as_ref(), m, used);
                if used && report.error.is_none() {
                    in_use.push(format!("{} {}", probe.kind, report.name));
                    package_counted |= detect::is_cpu_package(&counter.describe());
                }
                report
            })
            .collect();
        let note = (probe.kind == crate::energy::SourceKind::Hypervisor && probe.readable())
            .then(|| crate::energy::hypervisor::read_meta(&args.hypervisor_dir).ok())
            .flatten()
            .map(|m| m.describe(&args.hypervisor_dir));
        kinds.push(KindReport {
            kind: probe.kind.to_string(),
            present: probe.present,
            readable: probe.readable(),
            reason: probe.reason.clone(),
            note,
            counters,
        });
    }
    // As the reader does: a package counter that counts nothing leaves the model in charge.
    plan.cover_packages(args, &cpus, package_counted)?;
    let model = (!plan.model.is_empty()).then(|| ModelReport {
        estimated: true,
        packages: plan
            .model
            .iter()
            .map(|s| ModelPackage {
                package: s.package,
                idle_w: s.model_idle_w,
                max_w: s.model_max_w,
                origin: s.model_origin.clone(),
                model_row: s.model_row.clone(),
                model_error: s.model_error_pct,
                curve_gamma: s.model_curve_gamma,
            })
            .collect(),
        how_to_set: model::HOW_TO_SET.to_owned(),
    });
    for s in &plan.model {
        in_use.push(format!("model package {} (estimated)", s.package));
    }
    let online = aya::util::online_cpus().unwrap_or_else(|_| cpus.iter().map(|c| c.id).collect());
    let activity = match ActivityCounters::auto_choice(&online) {
        Ok(event) => ActivityReport {
            event: Some(event.name().to_owned()),
            reason: None,
        },
        Err(err) => ActivityReport {
            event: None,
            reason: Some(err.to_string()),
        },
    };
    Ok(Survey {
        activity,
        sysfs_root: args.sysfs_root.display().to_string(),
        dev_cpu_root: args.dev_cpu_root.display().to_string(),
        energy_source: args.energy_source.to_string(),
        kinds,
        model,
        in_use,
        python: crate::python::census::running(),
    })
}

fn counter_report(
    args: &EnergyArgs,
    counter: &dyn EnergySource,
    m: Result<Measurement, crate::energy::EnergyError>,
    used: bool,
) -> CounterReport {
    let d = counter.describe();
    let interval = m
        .as_ref()
        .ok()
        .map(|m| reader::read_interval_of(args, m, counter));
    let (m, error) = match m {
        Ok(m) => (m, None),
        Err(e) => (
            Measurement {
                update_period_ns: 0,
                period_is_lower_bound: false,
                read_cost_ns: 0,
                changes: 0,
                period_is_known: false,
            },
            Some(e.to_string()),
        ),
    };
    let error = error.or_else(|| used.then(|| reader::silent(args, &m)).flatten());
    CounterReport {
        domain: domain_name(d.domain()).to_owned(),
        name: d.name,
        package: d.package,
        update_period_ns: m.update_period_ns,
        period_is_lower_bound: m.period_is_lower_bound,
        read_cost_ns: m.read_cost_ns,
        read_interval_ns: interval.map_or(0, |i| i.ns),
        read_interval_note: interval.and_then(|i| interval_note(&i)),
        used: used && error.is_none(),
        error,
    }
}

/// Says why the wrap cap lowered an interval, e.g. "capped from 250.00 ms: wraps in
/// 100.00 ms at 2000 W".
fn interval_note(i: &reader::ReadInterval) -> Option<String> {
    let (from, wrap) = (i.uncapped_ns?, i.wrap_period_ns?);
    let floor = if wrap / 2 < reader::MIN_INTERVAL_NS {
        " (the minimum; faster wraps are flagged)"
    } else {
        ""
    };
    Some(format!(
        "capped from {}: wraps in {} at {MAX_PLAUSIBLE_W:.0} W{floor}",
        duration(from),
        duration(wrap)
    ))
}

fn duration(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", ns as f64 / 1e6)
    } else {
        format!("{:.1} µs", ns as f64 / 1e3)
    }
}

/// The survey as `sources` prints it for a person.
pub fn text(r: &Survey) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Energy sources (sysfs root {}, MSR root {}, --energy-source {})\n",
        r.sysfs_root, r.dev_cpu_root, r.energy_source
    );
    for k in &r.kinds {
        let status = match (k.present, k.readable) {
            (false, _) => "absent",
            (true, false) => "unreadable",
            (true, true) => "readable",
        };
        let _ = writeln!(out, "{:<9} {status}", k.kind);
        if let Some(reason) = &k.reason {
            let _ = writeln!(out, "          why: {reason}");
        }
        if let Some(note) = &k.note {
            let _ = writeln!(out, "          {note}");
        }
        for c in &k.counters {
            let period = if c.period_is_lower_bound {
                format!(">= {} (no change seen)", duration(c.update_period_ns))
            } else {
                duration(c.update_period_ns)
            };
            let state = match (&c.error, c.used) {
                (Some(e), _) => format!("error: {e}"),
                (None, true) => "USED".to_owned(),
                (None, false) => "not used (a better source covers this domain)".to_owned(),
            };
            let note = c
                .read_interval_note
                .as_ref()
                .map_or(String::new(), |n| format!(" ({n})"));
            let _ = writeln!(
                out,
                "          {:<40} {:<7} pkg {:<2} update {period}, read {}, every {}{note}  {state}",
                c.name,
                c.domain,
                c.package,
                duration(c.read_cost_ns),
                duration(c.read_interval_ns),
            );
        }
    }
    if let Some(m) = &r.model {
        let has_counter = r.kinds.iter().any(|k| k.counters.iter().any(|c| c.used));
        let what = if has_counter {
            "No CPU package counter"
        } else {
            "No energy counter"
        };
        let _ = writeln!(
            out,
            "\n{what} on this machine: the ESTIMATED model is used for CPU packages \
             (every number it gives is labelled estimated).\n  \
             P = P_idle + (P_max - P_idle) x utilisation^gamma, utilisation = exact busy time \
             of the package's CPUs (docs/estimated-energy.md; `energy-bpf model` shows the rest)"
        );
        for p in &m.packages {
            let _ = writeln!(
                out,
                "  package {}: P_idle {:.1} W, P_max {:.1} W, gamma {:.3}  ({})",
                p.package, p.idle_w, p.max_w, p.curve_gamma, p.origin
            );
            if !p.model_row.is_empty() {
                let _ = writeln!(out, "    estimated ({})", p.model_row);
            }
        }
        let _ = writeln!(out, "  To calibrate: {}.", m.how_to_set);
    }
    let _ = match (&r.activity.event, &r.activity.reason) {
        (Some(e), _) => writeln!(
            out,
            "\nActivity weights: {e} (read per run at every switch; dynamic energy split by it)"
        ),
        (None, reason) => writeln!(
            out,
            "\nActivity weights: none: split by time{}\n  (record and top take \
             --activity-event task-clock to exercise the path with a software event)",
            reason
                .as_ref()
                .map_or(String::new(), |r| format!("\n  why: {r}"))
        ),
    };
    python_lines(r, &mut out);
    let _ = writeln!(
        out,
        "\nIn use: {}",
        if r.in_use.is_empty() {
            "nothing".to_owned()
        } else {
            r.in_use.join(", ")
        }
    );
    out
}

/// The CPython versions running now and whether their frames are walked.
fn python_lines(r: &Survey, out: &mut String) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "\nPython frames (walked for CPython 3.{} to 3.{}; running now):",
        crate::python::offsets::OLDEST,
        crate::python::offsets::NEWEST
    );
    if r.python.is_empty() {
        let _ = writeln!(
            out,
            "  no CPython process running (or none this user may read)"
        );
    }
    for p in &r.python {
        let pids: Vec<String> = p.pids.iter().map(u32::to_string).collect();
        let more = if p.processes > p.pids.len() {
            ", ..."
        } else {
            ""
        };
        // As `report` words it: "python 3.8: not supported, native frames only".
        let status = if p.status == "walked" {
            format!("python {}: supported, Python frames walked", p.version)
        } else {
            p.status.clone()
        };
        let _ = writeln!(
            out,
            "  {status}  ({} process{}: {}{more})",
            p.processes,
            if p.processes == 1 { "" } else { "es" },
            pids.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::{SourceKind, fake};

    fn args(root: &std::path::Path) -> EnergyArgs {
        EnergyArgs {
            sysfs_root: root.to_owned(),
            dev_cpu_root: root.join("dev/cpu"),
            energy_source: SourceKind::Auto,
            ..Default::default()
        }
    }

    #[test]
    fn empty_machine_reports_the_model() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fake::topology(tmp.path(), 1, 2).expect("topology");
        let r = survey(&args(tmp.path())).expect("survey");
        // No counter in the fake tree: none is used.
        assert!(
            r.kinds
                .iter()
                .all(|k| k.counters.iter().all(|c| !c.used || c.error.is_some())),
            "a counter is in use on an empty machine"
        );
        assert_eq!(r.in_use, ["model package 0 (estimated)"]);
        let model = r.model.as_ref().expect("the model covers the package");
        assert!(model.estimated);
        assert_eq!(model.packages.len(), 1);
        // Defaults: the power table's estimate for this machine.
        assert!(
            model.packages[0].max_w > model.packages[0].idle_w && model.packages[0].idle_w > 0.0,
            "{:?}",
            (model.packages[0].idle_w, model.packages[0].max_w)
        );
        assert!(
            model.packages[0].origin.contains("power table"),
            "{}",
            model.packages[0].origin
        );
        let shown = text(&r);
        assert!(shown.contains("ESTIMATED"), "{shown}");
        assert!(
            shown.contains("--model-idle-w"),
            "says how to set it: {shown}"
        );
        assert!(serde_json::to_string(&r).is_ok_and(|j| j.contains("\"estimated\":true")));
    }

    #[test]
    fn text_names_reasons_and_used_counters() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fake::topology(tmp.path(), 2, 1).expect("topology");
        fake::FakePowercap::two_packages(tmp.path(), 1 << 30).expect("powercap");
        let a = args(tmp.path());
        let cpus = topology::cpus(&a.sysfs_root);
        let mut plan = detect::plan(&a, &cpus, true).expect("plan");
        let probe = plan
            .probes
            .iter_mut()
            .find(|p| p.kind == SourceKind::Powercap)
            .expect("probe");
        assert_eq!(probe.counters.len(), 6);
        let m = Measurement {
            update_period_ns: 1_000_000,
            period_is_lower_bound: false,
            read_cost_ns: 3_000,
            changes: reader::MEASURE_CHANGES as u32,
            period_is_known: false,
        };
        let c = counter_report(&a, probe.counters[0].as_ref(), Ok(m), true);
        assert_eq!(
            (c.name.as_str(), c.domain.as_str(), c.read_interval_ns),
            ("intel-rapl:0 (package-0)", "package", 10_000_000)
        );
        let report = Survey {
            sysfs_root: "S".into(),
            dev_cpu_root: "D".into(),
            energy_source: "auto".into(),
            kinds: vec![
                KindReport {
                    kind: "msr".into(),
                    present: false,
                    readable: false,
                    reason: Some(
                        "D/0/msr does not exist: MSR driver not loaded: run `sudo modprobe msr`"
                            .into(),
                    ),
                    note: None,
                    counters: vec![],
                },
                KindReport {
                    kind: "powercap".into(),
                    present: true,
                    readable: true,
                    reason: None,
                    note: None,
                    counters: vec![c],
                },
            ],
            model: None,
            in_use: vec!["powercap intel-rapl:0 (package-0)".into()],
            activity: ActivityReport {
                event: None,
                reason: Some("cannot open the cycles counter on CPU 0".into()),
            },
            python: vec![crate::python::census::Running {
                version: "3.8".into(),
                status: "python 3.8: not supported, native frames only".into(),
                processes: 9,
                pids: vec![10, 11, 12, 13, 14, 15, 16, 17],
            }],
        };
        let t = text(&report);
        assert!(
            t.contains(
                "msr       absent\n          why: D/0/msr does not exist: MSR driver not loaded"
            ),
            "{t}"
        );
        assert!(
            t.contains("intel-rapl:0 (package-0)")
                && t.contains("update 1.00 ms, read 3.0 µs, every 10.00 ms  USED"),
            "{t}"
        );
        assert!(
            t.ends_with("In use: powercap intel-rapl:0 (package-0)\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "\nPython frames (walked for CPython 3.9 to 3.13; running now):\n  \
                 python 3.8: not supported, native frames only  \
                 (9 processes: 10, 11, 12, 13, 14, 15, 16, 17, ...)\n"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "Activity weights: none: split by time\n  why: cannot open the cycles counter"
            ),
            "{t}"
        );
    }

    #[test]
    fn a_wrap_capped_interval_says_why() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fake::topology(tmp.path(), 1, 1).expect("topology");
        // 200 J: wraps in 100 ms at the 2000 W bound, so read every 50 ms, not 250 ms.
        fake::FakePowercap::create(
            tmp.path(),
            &[fake::ZoneSpec::new(
                "intel-rapl:0",
                "package-0",
                200_000_000,
            )],
        )
        .expect("powercap");
        let a = args(tmp.path());
        let mut plan = detect::plan(&a, &[], false).expect("plan");
        let zone = plan.take_used().pop().expect("zone");
        // A counter updating every 50 ms is read every 250 ms unless the wrap caps it.
        let slow = Measurement {
            update_period_ns: reader::MEASURE_WINDOW_NS,
            period_is_lower_bound: false,
            read_cost_ns: 3_000,
            changes: reader::MEASURE_CHANGES as u32,
            period_is_known: false,
        };
        let c = counter_report(&a, zone.as_ref(), Ok(slow), true);
        assert_eq!(c.read_interval_ns, 50_000_000);
        // One that never changed while watched counts nothing: not used, and it says so.
        let still = Measurement {
            period_is_lower_bound: true,
            changes: 0,
            ..slow
        };
        let s = counter_report(&a, zone.as_ref(), Ok(still), true);
        assert!(!s.used);
        // One seen changing once counts, too slowly (or read too rarely) to time: used.
        let once = Measurement {
            changes: 1,
            ..still
        };
        assert!(counter_report(&a, zone.as_ref(), Ok(once), true).used);
        assert!(
            s.error
                .as_deref()
                .is_some_and(|e| e.contains("not counting")),
            "{:?}",
            s.error
        );
        let report = Survey {
            sysfs_root: "S".into(),
            dev_cpu_root: "D".into(),
            energy_source: "auto".into(),
            kinds: vec![KindReport {
                kind: "powercap".into(),
                present: true,
                readable: true,
                reason: None,
                note: None,
                counters: vec![c],
            }],
            model: None,
            in_use: vec![],
            activity: ActivityReport {
                event: Some("cycles".into()),
                reason: None,
            },
            python: Vec::new(),
        };
        let t = text(&report);
        assert!(
            t.contains(
                "every 50.00 ms (capped from 250.00 ms: wraps in 100.00 ms at 2000 W)  USED"
            ),
            "{t}"
        );
        assert!(t.contains("Activity weights: cycles (read per run"), "{t}");
        // A measured counter with a normal interval carries no note.
        let m = Measurement {
            update_period_ns: 1_000_000,
            period_is_lower_bound: false,
            read_cost_ns: 3_000,
            changes: reader::MEASURE_CHANGES as u32,
            period_is_known: false,
        };
        let c = counter_report(&a, zone.as_ref(), Ok(m), true);
        assert_eq!(
            (c.read_interval_ns, c.read_interval_note),
            (10_000_000, None)
        );
    }
}
