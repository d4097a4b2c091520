//! `report --by function --roofline`: the machine's balance points from the calibration
//! file's `roofline` section, then each hot function's intensity proxy (instructions per
//! LLC-miss byte, from the run counters of `record --activity-events`) placed against
//! them, labelled compute- or memory-bound in time and in energy, with race-or-slow advice
//! ([`crate::roofline::place`]).
//!
//! Where the recording has no instruction or LLC-miss counts (no `--activity-events`, or a
//! machine without a hardware PMU), it says which event is missing and why, and shows the
//! machine-level result only: that is not a failure.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use crate::{
    analysis::Analysis,
    attribute::domain_name,
    calibration::{CalibrationFile, DEFAULT_PATH},
    output::table::Format,
    record::Recording,
    roofline::{
        Roofline, Summary,
        per_function::{self, FunctionCounts},
        place::{self, LINE_BYTES, Placement},
    },
};

/// Events the per-function view needs, as `record --activity-events` names them.
const INSTRUCTIONS: &str = "instructions";
const LLC_MISSES: &str = "llc-misses";
const CYCLES: &str = "cycles";

/// The roofline a report compares with: from which file, host and source.
struct Machine {
    roofline: Roofline,
    /// Run-count intervals the recording lost.
    dropped: u64,
    file: PathBuf,
    host: String,
    source: String,
}

/// One placed function.
#[derive(Serialize)]
struct FunctionRow {
    function: String,
    self_j: f64,
    samples: u64,
    instructions: f64,
    llc_misses: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cycles: Option<f64>,
    /// Instructions per LLC-miss byte (proxy); absent when no instruction was counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    placement: Option<Placement>,
}

/// The whole JSON document.
#[derive(Serialize)]
struct Doc<'a> {
    calibration: String,
    host: &'a str,
    source: &'a str,
    estimated: bool,
    machine: &'a Summary,
    /// Why there is no per-function result (empty when there is one).
    #[serde(skip_serializing_if = "Option::is_none")]
    per_function_unavailable: Option<String>,
    intensity_proxy: String,
    /// Counted intervals lost to a full ring buffer.
    intervals_lost: u64,
    functions: Vec<FunctionRow>,
}

/// Renders the report; `limit` rows in a table (all in JSON and CSV).
pub fn render(
    rec: &Recording,
    a: &Analysis,
    calibration: Option<&Path>,
    format: Format,
    limit: Option<usize>,
) -> anyhow::Result<Vec<u8>> {
    let machine = machine(rec, calibration)?;
    let events: Vec<String> = rec
        .header
        .run_counters
        .iter()
        .map(|c| c.event.clone())
        .collect();
    let unavailable = why_not_per_function(rec);
    let functions = match &unavailable {
        Some(why) => {
            eprintln!("energy-bpf: warning: no per-function roofline: {why}");
            Vec::new()
        }
        None => rows(rec, a, &machine.roofline.all, &events),
    };
    let proxy = format!(
        "intensity = instructions / (LLC misses x {LINE_BYTES} B): a proxy for flop/byte \
         (instructions are not flops; misses stand for memory traffic)"
    );
    let mut out = Vec::new();
    match format {
        Format::Json => {
            let doc = Doc {
                calibration: machine.file.display().to_string(),
                host: &machine.host,
                source: &machine.source,
                estimated: machine.roofline.estimated,
                machine: &machine.roofline.all,
                per_function_unavailable: unavailable,
                intervals_lost: machine.dropped,
                intensity_proxy: proxy,
                functions,
            };
            out.extend(format!("{:#}\n", serde_json::to_value(doc)?).into_bytes());
        }
        Format::Csv => {
            out.extend(b"function,self_j,samples,instructions,llc_misses,intensity_proxy,time_bound,energy_bound,advice\n");
            for f in &functions {
                let (i, t, e, adv) = match &f.placement {
                    Some(p) => (
                        fmt_i(p.intensity),
                        p.time.name(),
                        p.energy.name(),
                        p.advice.short(),
                    ),
                    None => ("-".into(), "-", "-", "-"),
                };
                out.extend(
                    format!(
                        "\"{}\",{:.6},{},{:.0},{:.0},{i},{t},{e},{adv}\n",
                        f.function.replace('"', "\"\""),
                        f.self_j,
                        f.samples,
                        f.instructions,
                        f.llc_misses
                    )
                    .into_bytes(),
                );
            }
        }
        Format::Table => {
            let text = table(&machine, unavailable.as_deref(), &proxy, &functions, limit);
            out.extend(text.into_bytes());
        }
    }
    Ok(out)
}

/// The calibration's roofline for the recording's host: `--calibration FILE`, else the
/// default file.
fn machine(rec: &Recording, calibration: Option<&Path>) -> anyhow::Result<Machine> {
    let file = calibration.map_or_else(|| PathBuf::from(DEFAULT_PATH), Path::to_path_buf);
    let cal = CalibrationFile::load(&file).with_context(|| {
        "`--roofline` compares with the machine's roofline: run `sudo energy-bpf calibrate \
         --roofline` first, or pass --calibration FILE"
            .to_string()
    })?;
    let host = &rec.header.hostname;
    // The recording's host; else the only host with a roofline.
    let with_roofline =
        |h: &crate::calibration::HostCalibration| h.sources.values().any(|s| s.roofline.is_some());
    let (host, h) = match cal.hosts.get(host).filter(|h| with_roofline(h)) {
        Some(h) => (host.clone(), h),
        None => {
            let mut any = cal.hosts.iter().filter(|(_, h)| with_roofline(h));
            match (any.next(), any.next()) {
                (Some((name, h)), None) => {
                    eprintln!(
                        "energy-bpf: warning: {} has no roofline for {host}; using {name}'s",
                        file.display()
                    );
                    (name.clone(), h)
                }
                _ => anyhow::bail!(
                    "{} has no roofline for host {host}: run `sudo energy-bpf calibrate \
                     --roofline --calibration {}` on it",
                    file.display(),
                    file.display()
                ),
            }
        }
    };
    // A measured source before an estimated one; the package before other domains.
    let (source, roofline) = h
        .sources
        .iter()
        .filter_map(|(k, s)| Some((k, s.roofline.as_ref()?)))
        .min_by_key(|(k, r)| (r.estimated, !k.contains("package"), (*k).clone()))
        .context("no roofline in the calibration")?;
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

fn fmt_i(i: f64) -> String {
    if i >= f64::MAX {
        "inf".into()
    } else if i >= 1e4 {
        format!("{i:.2e}")
    } else {
        format!("{i:.3}")
    }
}

fn table(
    m: &Machine,
    unavailable: Option<&str>,
    proxy: &str,
    functions: &[FunctionRow],
    limit: Option<usize>,
) -> String {
    let s = &m.roofline.all;
    let mut t = format!(
        "energy roofline of {} ({}, {}{}; {} thread(s))\n",
        m.host,
        m.source,
        m.file.display(),
        if m.roofline.estimated {
            ", estimated: the model, not the machine"
        } else {
            ""
        },
        s.threads
    );
    t += &format!(
        "  time balance B_τ = {:.3} flop/byte, energy balance B_ε = {:.3}, effective B̂_ε(B_τ) = {:.3}, constant power {:.2} W\n",
        s.time_balance, s.energy_balance, s.effective_energy_balance, s.constants.const_w
    );
    t += &match (s.race_to_halt, s.balance_gap) {
        (true, _) => "  race to halt: saves energy on this machine (B_τ > B̂_ε)\n".to_string(),
        (false, Some([lo, hi])) => format!(
            "  race to halt: does not save energy here; balance gap {lo:.3}..{hi:.3} flop/byte (compute-bound in time, memory-bound in energy)\n"
        ),
        (false, None) => "  race to halt: does not save energy here\n".to_string(),
    };
    if let Some(why) = unavailable {
        t += &format!("per function: not available: {why}\n");
        return t;
    }
    t += &format!("per function (self): {proxy}\n");
    t += &format!(
        "{:<40} {:>10} {:>8} {:>14} {:>12} {:>10} {:>8} {:>8}  advice\n",
        "function",
        "self_j",
        "samples",
        "instructions",
        "llc_misses",
        "intensity",
        "time",
        "energy"
    );
    let shown = functions
        .iter()
        .filter(|f| f.placement.is_some())
        .take(limit.unwrap_or(usize::MAX));
    for f in shown {
        let Some(p) = &f.placement else { continue };
        let name: String = f.function.chars().take(40).collect();
        t += &format!(
            "{name:<40} {:>10.3} {:>8} {:>14.0} {:>12.0} {:>10} {:>8} {:>8}  {} ({})\n",
            f.self_j,
            f.samples,
            f.instructions,
            f.llc_misses,
            fmt_i(p.intensity),
            p.time.name(),
            p.energy.name(),
            p.advice.short(),
            p.advice.why()
        );
    }
    if m.dropped > 0 {
        t += &format!(
            "({} counted intervals were lost: the run-count ring buffer was full)\n",
            m.dropped
        );
    }
    let unplaced = functions.iter().filter(|f| f.placement.is_none()).count();
    if unplaced > 0 {
        t += &format!("({unplaced} function(s) with no instruction counted are not placed)\n");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pb::v1::RunCounter,
        record::run_counts::CountedRun,
        roofline::{
            Constants,
            fit::{FitReport, Intervals},
        },
    };

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
    fn the_table_places_each_function_with_its_advice() {
        let constants = Constants {
            const_w: 0.0,
            j_per_flop: 25e-12,
            j_per_byte: 360e-12,
            s_per_flop: 1.0 / 515e9,
            s_per_byte: 1.0 / 144e9,
        };
        let fit = FitReport {
            kernels: 0,
            energy_residual_median: 0.0,
            energy_residual_max: 0.0,
            time_residual_median: 0.0,
            time_residual_max: 0.0,
            energy_r2: 1.0,
            intervals: Intervals {
                const_w: [0.0; 2],
                j_per_flop: [0.0; 2],
                j_per_byte: [0.0; 2],
                s_per_flop: [0.0; 2],
                s_per_byte: [0.0; 2],
            },
        };
        let m = Machine {
            roofline: Roofline {
                estimated: false,
                isa: "avx2+fma".into(),
                buffer_bytes: 0,
                all: Summary::new(4, constants, fit),
                one_thread: None,
                kernels: Vec::new(),
                dvfs: None,
            },
            dropped: 0,
            file: "cal.json".into(),
            host: "box".into(),
            source: "powercap:package-0".into(),
        };
        let row = |name: &str, instructions: f64, misses: f64| FunctionRow {
            function: name.into(),
            self_j: 1.0,
            samples: 10,
            instructions,
            llc_misses: misses,
            cycles: None,
            placement: place::intensity_proxy(instructions, misses)
                .map(|i| place::place(i, &constants)),
        };
        let rows = [
            row("stream", 64.0e6, 1.0e6),
            row("gap", 512.0e6, 1.0e6),
            row("fma", 1e10, 10.0),
            row("idle_wait", 0.0, 5.0),
        ];
        let t = table(&m, None, "proxy", &rows, None);
        let line = |name: &str| {
            t.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name}: {t}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert!(t.contains("balance gap 3.576..14.400"), "{t}");
        assert_eq!(line("stream")[5..9], ["1.000", "memory", "memory", "slow"]);
        assert_eq!(line("gap")[5..9], ["8.000", "compute", "memory", "slow"]);
        assert_eq!(line("fma")[6..9], ["compute", "compute", "race"]);
        assert!(
            t.contains("(1 function(s) with no instruction counted"),
            "{t}"
        );
        let t = table(
            &m,
            Some("instructions could not be counted"),
            "proxy",
            &rows,
            None,
        );
        assert!(t.ends_with("per function: not available: instructions could not be counted\n"));
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
            crate::commands::args::AttributeArgs::default().options(),
            &crate::commands::args::ModelArgs::default().model(),
        );
        let a = analysis::analyze(&rec, &cfg);
        let out = render(&rec, &a, Some(&cal), Format::Json, None).expect("render");
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
        let text = render(&rec, &a, Some(&cal), Format::Table, None).expect("render");
        let text = String::from_utf8(text).expect("utf-8");
        assert!(text.contains("balance gap 3.576..14.400"), "{text}");
        assert!(
            text.contains("race (compute-bound in time and energy"),
            "{text}"
        );
    }
}
