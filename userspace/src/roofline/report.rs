//! The per-function roofline report (`report --by function --roofline`): the machine's
//! balance points from the calibration file's `roofline` section, then each hot function's
//! intensity proxy (instructions per LLC-miss byte, from the run counters of
//! `record --activity-events`) placed against them, labelled compute- or memory-bound in
//! time and in energy, with race-or-slow advice ([`super::place`]).
//!
//! Where the recording has no instruction or LLC-miss counts (no `--activity-events`, or a
//! machine without a hardware PMU), [`Report::unavailable`] says which event is missing
//! and why, and the report holds the machine-level result only: that is not a failure.
//!
//! Pure apart from reading the calibration file; nothing is printed here: warnings are
//! returned in [`Report::warnings`], and [`Report::render`] (in `render.rs`) writes the
//! table, JSON or CSV.

mod render;

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{
    Roofline, Summary,
    per_function::{self, FunctionCounts},
    place::{self, Placement},
};
use crate::{
    analysis::Analysis,
    attribute::domain_name,
    calibration::{CalibrationError, CalibrationFile, DEFAULT_PATH, HostCalibration},
    record::Recording,
};

/// Events the per-function view needs, as `record --activity-events` names them.
const INSTRUCTIONS: &str = "instructions";
const LLC_MISSES: &str = "llc-misses";
const CYCLES: &str = "cycles";

/// Why the report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The calibration file could not be loaded.
    #[error(
        "`--roofline` compares with the machine's roofline: run `sudo energy-bpf calibrate \
         --roofline` first, or pass --calibration FILE"
    )]
    Calibration {
        /// Why.
        source: CalibrationError,
    },
    /// No host in the calibration file has a roofline.
    #[error(
        "{} has no roofline for host {host}: run `sudo energy-bpf calibrate --roofline \
         --calibration {}` on it",
        file.display(),
        file.display()
    )]
    NoHost {
        /// The calibration file.
        file: PathBuf,
        /// The recording's host.
        host: String,
    },
    /// The chosen host has no source with a roofline.
    #[error("no roofline in the calibration")]
    NoRoofline {
        /// The host looked at.
        host: String,
    },
    /// The JSON document could not be built.
    #[error(transparent)]
    Json {
        /// Why.
        #[from]
        source: serde_json::Error,
    },
}

/// The roofline a report compares with: from which file, host and source.
#[derive(Debug)]
pub struct Machine {
    /// The calibration's roofline.
    pub roofline: Roofline,
    /// Run-count intervals the recording lost.
    pub dropped: u64,
    /// The calibration file.
    pub file: PathBuf,
    /// The host whose roofline it is.
    pub host: String,
    /// The energy source it was measured with.
    pub source: String,
}

/// One placed function.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionRow {
    /// The function (leaf not inlined).
    pub function: String,
    /// Self energy, J.
    pub self_j: f64,
    /// Self samples.
    pub samples: u64,
    /// Instructions counted in its samples' intervals.
    pub instructions: f64,
    /// LLC misses counted in its samples' intervals.
    pub llc_misses: f64,
    /// Cycles, when counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cycles: Option<f64>,
    /// Instructions per LLC-miss byte (proxy) placed; absent when no instruction was
    /// counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placement: Option<Placement>,
}

/// A recording's functions against the machine's roofline.
#[derive(Debug)]
pub struct Report {
    /// The roofline compared with.
    pub machine: Machine,
    /// Why there is no per-function result (`None` when there is one).
    pub unavailable: Option<String>,
    /// Every function with self samples, most energy first (empty when unavailable).
    pub functions: Vec<FunctionRow>,
    /// What the user should hear about, in order (without the `warning:` prefix).
    pub warnings: Vec<String>,
}

impl Report {
    /// Places `rec`'s functions against the roofline of `calibration` (else the default
    /// calibration file) for the recording's host.
    pub fn new(
        rec: &Recording,
        a: &Analysis,
        calibration: Option<&Path>,
    ) -> Result<Self, ReportError> {
        let mut warnings = Vec::new();
        let machine = machine(rec, calibration, &mut warnings)?;
        let events: Vec<String> = rec
            .header
            .run_counters
            .iter()
            .map(|c| c.event.clone())
            .collect();
        let unavailable = why_not_per_function(rec);
        let functions = match &unavailable {
            Some(why) => {
                warnings.push(format!("no per-function roofline: {why}"));
                Vec::new()
            }
            None => rows(rec, a, &machine.roofline.all, &events),
        };
        Ok(Self {
            machine,
            unavailable,
            functions,
            warnings,
        })
    }
}

/// The calibration's roofline for the recording's host: `calibration`, else the default
/// file.
fn machine(
    rec: &Recording,
    calibration: Option<&Path>,
    warnings: &mut Vec<String>,
) -> Result<Machine, ReportError> {
    let file = calibration.map_or_else(|| PathBuf::from(DEFAULT_PATH), Path::to_path_buf);
    let cal = CalibrationFile::load(&file).map_err(|source| ReportError::Calibration { source })?;
    let host = &rec.header.hostname;
    // The recording's host; else the only host with a roofline.
    let with_roofline = |h: &HostCalibration| h.sources.values().any(|s| s.roofline.is_some());
    let (host, h) = match cal.hosts.get(host).filter(|h| with_roofline(h)) {
        Some(h) => (host.clone(), h),
        None => {
            let mut any = cal.hosts.iter().filter(|(_, h)| with_roofline(h));
            match (any.next(), any.next()) {
                (Some((name, h)), None) => {
                    warnings.push(format!(
                        "{} has no roofline for {host}; using {name}'s",
                        file.display()
                    ));
                    (name.clone(), h)
                }
                _ => {
                    return Err(ReportError::NoHost {
                        file,
                        host: host.clone(),
                    });
                }
            }
        }
    };
    // A measured source before an estimated one; the package before other domains.
    let (source, roofline) = h
        .sources
        .iter()
        .filter_map(|(k, s)| Some((k, s.roofline.as_ref()?)))
        .min_by_key(|(k, r)| (r.estimated, !k.contains("package"), (*k).clone()))
        .ok_or_else(|| ReportError::NoRoofline { host: host.clone() })?;
    Ok(Machine {
        roofline: roofline.clone(),
        dropped: rec.run_counts_dropped,
        file,
        host,
        source: source.clone(),
    })
}

/// Why the recording cannot be placed per function, naming the event and its error.
fn why_not_per_function(rec: &Recording) -> Option<String> {
    let counters = &rec.header.run_counters;
    if counters.is_empty() {
        return Some(format!(
            "the recording has no run counters; record with `--activity-events \
             {INSTRUCTIONS},{CYCLES},{LLC_MISSES}` on a machine with a hardware PMU"
        ));
    }
    for needed in [INSTRUCTIONS, LLC_MISSES] {
        match counters.iter().find(|c| c.event == needed) {
            None => {
                return Some(format!(
                    "{needed} was not counted (recorded: {}); record with `--activity-events \
                     {INSTRUCTIONS},{CYCLES},{LLC_MISSES}`",
                    counters
                        .iter()
                        .map(|c| c.event.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            Some(c) if !c.unavailable.is_empty() => {
                return Some(format!(
                    "{needed} could not be counted when recording: {}",
                    c.unavailable
                ));
            }
            Some(_) => {}
        }
    }
    if rec.run_counts.is_empty() {
        return Some("the recording holds no run counts (no switch was counted)".into());
    }
    None
}

/// Placed rows of every function with self samples, most energy first.
fn rows(rec: &Recording, a: &Analysis, machine: &Summary, events: &[String]) -> Vec<FunctionRow> {
    let energy: Vec<String> = a
        .attribution
        .headline
        .iter()
        .map(|&d| format!("energy_{}", domain_name(d)))
        .collect();
    let profile = per_function::profile(rec, a, events);
    let at = |name: &str| events.iter().position(|e| e == name);
    let (ins, miss, cyc) = (at(INSTRUCTIONS), at(LLC_MISSES), at(CYCLES));
    per_function::by_function(&profile, &energy, events)
        .into_iter()
        .map(|f: FunctionCounts| {
            let get = |k: Option<usize>| k.and_then(|k| f.counts.get(k)).copied();
            let (instructions, llc_misses) = (get(ins).unwrap_or(0.0), get(miss).unwrap_or(0.0));
            FunctionRow {
                placement: place::intensity_proxy(instructions, llc_misses)
                    .map(|i| place::place(i, &machine.constants)),
                function: f.function,
                self_j: f.self_j,
                samples: f.samples,
                instructions,
                llc_misses,
                cycles: get(cyc),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{output::table::Format, pb::v1::RunCounter, record::run_counts::CountedRun};

    fn counter(event: &str, unavailable: &str) -> RunCounter {
        RunCounter {
            event: event.into(),
            unavailable: unavailable.into(),
        }
    }

    #[test]
    fn a_missing_event_is_named_with_why() {
        let mut rec = Recording::default();
        let why = why_not_per_function(&rec).expect("no counters");
        assert!(
            why.contains("--activity-events instructions,cycles,llc-misses"),
            "{why}"
        );
        rec.header.run_counters = vec![
            counter(
                "instructions",
                "perf_event_open(instructions) on CPU 0 failed: ENOENT",
            ),
            counter("llc-misses", ""),
        ];
        let why = why_not_per_function(&rec).expect("instructions failed");
        assert!(why.starts_with("instructions could not be counted") && why.contains("ENOENT"));
        rec.header.run_counters = vec![counter("instructions", ""), counter("cycles", "")];
        let why = why_not_per_function(&rec).expect("no llc-misses");
        assert!(why.contains("llc-misses was not counted (recorded: instructions, cycles)"));
        rec.header.run_counters.push(counter("llc-misses", ""));
        assert!(
            why_not_per_function(&rec)
                .expect("no counts")
                .contains("no run counts")
        );
        rec.run_counts.push(CountedRun::default());
        assert_eq!(why_not_per_function(&rec), None);
    }

    #[test]
    fn functions_of_a_recording_are_placed_from_their_run_counts() {
        use crate::analysis;
        let mut rec = analysis::fixture::recording();
        rec.header.run_counters = vec![
            counter("instructions", ""),
            counter("cycles", ""),
            counter("llc-misses", ""),
        ];
        // One interval per sample, opened by it: heavy streams (1 instruction per missed
        // byte), light computes (almost no misses).
        for s in &rec.samples {
            let (ins, miss) = if s.tid == 10 {
                (64e6, 1e6)
            } else {
                (1e10, 10.0)
            };
            rec.run_counts.push(CountedRun {
                ts_ns: s.ts_ns + 1_000_000,
                cpu: s.cpu,
                tid: s.tid,
                counts: [Some(ins as u64), Some(ins as u64), Some(miss as u64)],
            });
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let cal = dir.path().join("cal.json");
        let fit = serde_json::json!({"kernels": 0, "energy_residual_median": 0.0,
            "energy_residual_max": 0.0, "time_residual_median": 0.0, "time_residual_max": 0.0,
            "energy_r2": 1.0, "intervals": {"const_w": [0.0, 0.0], "j_per_flop": [0.0, 0.0],
            "j_per_byte": [0.0, 0.0], "s_per_flop": [0.0, 0.0], "s_per_byte": [0.0, 0.0]}});
        let doc = serde_json::json!({"version": 1, "hosts": {"box": {"sources": {"model:p": {
            "date": "x", "duration_s": 1.0, "key": "model:p", "name": "p", "static_w": 1.0,
            "per_busy_cpu_w": null, "busy_share": 0.0, "method": "mean", "intervals": 1,
            "roofline": {"estimated": true, "isa": "scalar", "buffer_bytes": 0, "threads": 1,
                "const_w": 0.0, "j_per_flop": 25e-12, "j_per_byte": 360e-12,
                "s_per_flop": 1.0 / 515e9, "s_per_byte": 1.0 / 144e9, "time_balance": 3.576,
                "energy_balance": 14.4, "effective_energy_balance": 14.4, "eta_flop": 1.0,
                "race_to_halt": false, "balance_gap": [3.576, 14.4], "fit": fit,
                "kernels": []}}}}}});
        std::fs::write(&cal, doc.to_string()).expect("write");
        let cfg = analysis::config(
            &rec,
            crate::attribute::Options::default(),
            &analysis::ModelOverride::default(),
        );
        let a = analysis::analyze(&rec, &cfg);
        let report = Report::new(&rec, &a, Some(&cal)).expect("report");
        let out = report.render(Format::Json, None).expect("render");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(
            v["per_function_unavailable"],
            serde_json::Value::Null,
            "{v:#}"
        );
        let row = |addr: &str| {
            v["functions"]
                .as_array()
                .and_then(|f| {
                    f.iter()
                        .find(|r| r["function"].as_str().is_some_and(|n| n.contains(addr)))
                })
                .cloned()
                .unwrap_or_else(|| panic!("no {addr}: {v:#}"))
        };
        let heavy = row("+0x100a");
        assert_eq!(heavy["instructions"], 6.0 * 64e6);
        assert_eq!(heavy["placement"]["intensity"], 1.0);
        assert_eq!(heavy["placement"]["time"], "memory");
        assert_eq!(heavy["placement"]["advice"], "slow-memory-bound");
        let light = row("+0x1014");
        assert_eq!(light["placement"]["time"], "compute");
        assert_eq!(light["placement"]["energy"], "compute");
        assert_eq!(light["placement"]["advice"], "race");
        let text = report.render(Format::Table, None).expect("render");
        let text = String::from_utf8(text).expect("utf-8");
        assert!(text.contains("balance gap 3.576..14.400"), "{text}");
        assert!(
            text.contains("race (compute-bound in time and energy"),
            "{text}"
        );
    }
}
