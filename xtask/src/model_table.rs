//! `model-table build|check`: the CPU power table of the estimated model, from
//! SPECpower_ssj2008 results (`userspace/data/specpower/`, provenance in its README.md).
//!
//! - `build` fits the table from the results submitted before 2020-01-01 and writes
//!   `userspace/data/specpower/power-table.tsv`.
//! - `check` fails when the checked-in table is not what `build` makes; states the fit's
//!   leave-one-server-out error on the 2016–2019 servers; and runs the real binary
//!   (`energy-bpf model --cpu … --threads … --chips … --memory-gb … --nodes … --format
//!   json`, `ENERGY_BPF_BIN` or a debug build) over every result submitted from 2020 on,
//!   which the table never saw, and fails unless its median error is ≤ 10% at full load
//!   and ≤ 25% at active idle. The old default (1 W idle, 4 W busy per thread) is scored
//!   on the same servers beside it.
use std::{collections::BTreeMap, path::PathBuf, process::Command};

// The same file the binary compiles: the fit written here is the one the model reads.
#[path = "../../userspace/src/energy/power_table.rs"]
#[allow(dead_code)] // the lookup half of the module is the binary's, not this task's
mod power_table;

use power_table::{
    ARCHS, Fit, Level, Row, Server, Table, Vendor, arch_named, arch_of_name, normalise_name,
};

use crate::util::{self, Result};

/// Results submitted before this date build the table; later ones only check it.
const CUT_OFF: (i32, u32, u32) = (2020, 1, 1);
/// Held-out targets (median absolute error, %).
const TARGET_FULL_PCT: f64 = 10.0;
const TARGET_IDLE_PCT: f64 = 25.0;
/// A row's own error needs this many servers; fewer borrow the next level's.
const MIN_SERVERS_FOR_ERROR: usize = 3;

fn data_dir() -> PathBuf {
    util::root().join("userspace/data/specpower")
}

/// One SPECpower result.
#[derive(Clone, Debug)]
struct Result_ {
    date: (i32, u32, u32),
    cpu: String,
    server: Server,
    idle_w: f64,
    full_w: f64,
}

/// Runs `model-table <build|check>`.
pub fn run(args: &[String]) -> Result {
    match args.first().map(String::as_str) {
        Some("build") => {
            let (text, _) = build()?;
            let path = data_dir().join("power-table.tsv");
            std::fs::write(&path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
            eprintln!("xtask: wrote {}", path.display());
            Ok(())
        }
        Some("check") => check(),
        _ => Err("usage: cargo xtask model-table build|check".into()),
    }
}

fn parse_date(s: &str) -> Option<(i32, u32, u32)> {
    // "Dec 11, 2007"
    let mut w = s.split_whitespace();
    let month = w.next()?;
    let day: u32 = w.next()?.trim_end_matches(',').parse().ok()?;
    let year: i32 = w.next()?.parse().ok()?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|x| month.starts_with(x))? as u32 + 1;
    (1990..2100).contains(&year).then_some((year, m, day))
}

fn read_results() -> Result<Vec<Result_>> {
    let path = data_dir().join("SPECpower-full-results.csv");
    let mut reader =
        csv::Reader::from_path(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let headers = reader
        .headers()
        .map_err(|e| format!("{}: {e}", path.display()))?
        .clone();
    let col = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| format!("{}: no column {name:?}", path.display()))
    };
    let c = [
        col("Date Submitted")?,
        col("CPU Description")?,
        col("Chips")?,
        col("Total Threads")?,
        col("Total Memory (GB)")?,
        col("Nodes")?,
        col("avg. watts @ 100%")?,
        col("avg. watts @ active idle")?,
    ];
    let mut out = Vec::new();
    for record in reader.records() {
        let r = record.map_err(|e| format!("{}: {e}", path.display()))?;
        let f = |i: usize| -> Option<f64> {
            let v: f64 = r.get(c[i])?.replace(',', "").trim().parse().ok()?;
            (v.is_finite() && v > 0.0).then_some(v)
        };
        let (
            Some(date),
            Some(chips),
            Some(threads),
            Some(mem),
            Some(nodes),
            Some(full),
            Some(idle),
        ) = (
            r.get(c[0]).and_then(parse_date),
            f(2),
            f(3),
            f(4),
            f(5),
            f(6),
            f(7),
        )
        else {
            continue;
        };
        out.push(Result_ {
            date,
            cpu: r.get(c[1]).unwrap_or("").to_string(),
            server: Server {
                chips,
                threads,
                memory_gb: mem,
                nodes,
            },
            idle_w: idle,
            full_w: full,
        });
    }
    Ok(out)
}

/// Ordinary least squares through the normal equations (6 unknowns), solved by
/// Gauss–Jordan elimination with partial pivoting.
fn least_squares(rows: &[[f64; 6]], y: &[f64]) -> Result<[f64; 6]> {
    let mut a = [[0.0f64; 7]; 6];
    for (x, &yi) in rows.iter().zip(y) {
        for (row, &xi) in a.iter_mut().zip(x) {
            for (cell, &xj) in row.iter_mut().zip(x) {
                *cell += xi * xj;
            }
            row[6] += xi * yi;
        }
    }
    for col in 0..6 {
        let pivot = (col..6)
            .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        let p = a[col];
        if p[col].abs() < 1e-12 {
            return Err(format!(
                "the fit is singular at {}",
                power_table::COEFFICIENTS[col]
            ));
        }
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let k = row[col] / p[col];
                for (cell, pv) in row.iter_mut().zip(p).skip(col) {
                    *cell -= k * pv;
                }
            }
        }
    }
    let mut out = [0.0; 6];
    for (i, (o, row)) in out.iter_mut().zip(&a).enumerate() {
        *o = row[6] / row[i];
    }
    Ok(out)
}

/// A training result with its microarchitecture.
struct Train<'a> {
    r: &'a Result_,
    arch: &'static power_table::Arch,
}

fn fit(train: &[&Train], idle: bool) -> Result<Fit> {
    let x: Vec<[f64; 6]> = train
        .iter()
        .map(|t| power_table::features(&t.r.server, Some(t.arch.vendor), t.arch.server))
        .collect();
    let y: Vec<f64> = train
        .iter()
        .map(|t| {
            let w = if idle { t.r.idle_w } else { t.r.full_w };
            (w / t.r.server.nodes.max(1.0)).ln()
        })
        .collect();
    Ok(Fit {
        coef: least_squares(&x, &y)?,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn rel_err(pred: f64, measured: f64) -> f64 {
    100.0 * (pred - measured).abs() / measured
}

/// Leave-one-out absolute errors (idle, full) of every training result, %.
fn leave_one_out(train: &[Train]) -> Result<Vec<(f64, f64)>> {
    let mut out = Vec::with_capacity(train.len());
    for i in 0..train.len() {
        let rest: Vec<&Train> = train
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, t)| t)
            .collect();
        let t = &train[i];
        let (vi, vs) = (Some(t.arch.vendor), t.arch.server);
        let idle = fit(&rest, true)?.watts(&t.r.server, vi, vs);
        let full = fit(&rest, false)?.watts(&t.r.server, vi, vs);
        out.push((rel_err(idle, t.r.idle_w), rel_err(full, t.r.full_w)));
    }
    Ok(out)
}

/// γ of P(u) = P_idle + (P_100 − P_idle)·u^γ, least squares over every curve's 10%..100%
/// points (a grid over 0.3..3); and the range of each curve's own γ.
fn fit_curve() -> Result<(f64, String)> {
    let path = data_dir().join("load-curves.csv");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let mut curves = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#')).skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        let v: Vec<f64> = fields
            .iter()
            .skip(2)
            .filter_map(|f| f.trim().parse().ok())
            .collect();
        if v.len() != 11 || v[10] <= v[0] {
            return Err(format!("{}: bad curve line {line:?}", path.display()));
        }
        let norm: Vec<(f64, f64)> = (1..=10)
            .map(|k| (k as f64 / 10.0, (v[k] - v[0]) / (v[10] - v[0])))
            .collect();
        curves.push(norm);
    }
    let sse = |g: f64, cs: &[Vec<(f64, f64)>]| -> f64 {
        cs.iter()
            .flatten()
            .map(|(u, f)| (u.powf(g) - f).powi(2))
            .sum()
    };
    let best = |cs: &[Vec<(f64, f64)>]| -> f64 {
        (300..=3000)
            .map(|k| k as f64 / 1000.0)
            .min_by(|&a, &b| sse(a, cs).total_cmp(&sse(b, cs)))
            .unwrap_or(1.0)
    };
    let gamma = best(&curves);
    let own: Vec<f64> = curves
        .iter()
        .map(|c| best(std::slice::from_ref(c)))
        .collect();
    let lo = own.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = own.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    Ok((
        gamma,
        format!(
            "u^gamma fitted to {} SPECpower load curves (10%..100%); their own gamma {lo:.2}..{hi:.2}",
            curves.len()
        ),
    ))
}

/// Builds the table's text and returns it with the results (for `check`).
fn build() -> Result<(String, Vec<Result_>)> {
    let results = read_results()?;
    let train: Vec<Train> = results
        .iter()
        .filter(|r| r.date < CUT_OFF)
        .filter_map(|r| arch_of_name(&r.cpu).map(|arch| Train { r, arch }))
        .collect();
    let all: Vec<&Train> = train.iter().collect();
    let (idle, full) = (fit(&all, true)?, fit(&all, false)?);
    let loo = leave_one_out(&train)?;
    let (curve_gamma, curve_note) = fit_curve()?;

    // Groups of training results per row key.
    let stats = |members: &[usize], recent_only: bool| -> [f64; 6] {
        let pick: Vec<&usize> = members
            .iter()
            .filter(|&&i| !recent_only || train[i].r.date >= (CUT_OFF.0 - 2, 1, 1))
            .collect();
        let pick = if pick.is_empty() {
            members.iter().collect()
        } else {
            pick
        };
        let m = |f: &dyn Fn(&Train) -> f64| median(pick.iter().map(|&&i| f(&train[i])).collect());
        [
            m(&|t| t.r.idle_w / t.r.server.threads),
            m(&|t| t.r.full_w / t.r.server.threads),
            median(members.iter().map(|&i| loo[i].0).collect()),
            median(members.iter().map(|&i| loo[i].1).collect()),
            m(&|t| t.r.server.threads / t.r.server.chips),
            m(&|t| t.r.server.memory_gb / t.r.server.threads),
        ]
    };
    let mut by_vendor: BTreeMap<(&str, bool), Vec<usize>> = BTreeMap::new();
    let mut by_arch: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut by_cpu: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, t) in train.iter().enumerate() {
        by_vendor
            .entry((t.arch.vendor.as_str(), t.arch.server))
            .or_default()
            .push(i);
        by_arch.entry(t.arch.name).or_default().push(i);
        by_cpu.entry(normalise_name(&t.r.cpu)).or_default().push(i);
    }
    let mut rows = Vec::new();
    let mut vendor_rows = BTreeMap::new();
    for ((vendor, server), members) in &by_vendor {
        // A vendor row stands in for hosts of unknown or newer CPUs: its typical server is
        // that of the last two years before the cut-off.
        let s = stats(members, true);
        let row = Row {
            level: Level::Vendor,
            key: format!("{vendor} {}", if *server { "server" } else { "desktop" }),
            arch: None,
            vendor: if *vendor == "AMD" {
                Vendor::Amd
            } else {
                Vendor::Intel
            },
            server: *server,
            servers: members.len() as u32,
            idle_w_per_thread: s[0],
            full_w_per_thread: s[1],
            idle_error_pct: s[2],
            full_error_pct: s[3],
            threads_per_chip: s[4],
            gb_per_thread: s[5],
        };
        vendor_rows.insert((*vendor, *server), row.clone());
        rows.push(row);
    }
    let mut arch_rows = BTreeMap::new();
    for arch in ARCHS {
        let members = by_arch.get(arch.name).cloned().unwrap_or_default();
        let Some(vrow) = vendor_rows.get(&(arch.vendor.as_str(), arch.server)) else {
            continue;
        };
        let mut row = vrow.clone();
        row.level = Level::Arch;
        row.key = arch.name.to_string();
        row.arch = Some(arch.name.to_string());
        row.servers = members.len() as u32;
        if !members.is_empty() {
            let s = stats(&members, false);
            (row.idle_w_per_thread, row.full_w_per_thread) = (s[0], s[1]);
            (row.threads_per_chip, row.gb_per_thread) = (s[4], s[5]);
            if members.len() >= MIN_SERVERS_FOR_ERROR {
                (row.idle_error_pct, row.full_error_pct) = (s[2], s[3]);
            }
        }
        arch_rows.insert(arch.name, row.clone());
        rows.push(row);
    }
    for (key, members) in &by_cpu {
        let arch = train[members[0]].arch;
        let Some(arow) = arch_rows.get(arch.name) else {
            continue;
        };
        let s = stats(members, false);
        let mut row = arow.clone();
        row.level = Level::Cpu;
        row.key = key.clone();
        row.servers = members.len() as u32;
        (row.idle_w_per_thread, row.full_w_per_thread) = (s[0], s[1]);
        (row.threads_per_chip, row.gb_per_thread) = (s[4], s[5]);
        if members.len() >= MIN_SERVERS_FOR_ERROR {
            (row.idle_error_pct, row.full_error_pct) = (s[2], s[3]);
        }
        rows.push(row);
    }
    let table = Table {
        provenance: Vec::new(),
        idle,
        full,
        curve_gamma,
        curve_note,
        rows,
    };
    let header = vec![
        "energy-bpf CPU power table: generated by `cargo xtask model-table build`, do not edit.".to_string(),
        "source: SPECpower_ssj2008 results (https://www.spec.org/power_ssj2008/results/), as collected in data/SPECpower-full-results.csv of github.com/cloud-carbon-footprint/cloud-carbon-coefficients".to_string(),
        "commit: dda7621f8ab227dcb45096af6ccc2227aaf92b3e (2023-05-08)".to_string(),
        "licence: Apache-2.0 (cloud-carbon-coefficients); the figures are SPEC's published results".to_string(),
        format!(
            "built: from the {} results submitted before {}-{:02}-{:02} whose CPU names a known microarchitecture; later results only check it",
            train.len(),
            CUT_OFF.0,
            CUT_OFF.1,
            CUT_OFF.2
        ),
        "fit: ln(W per node) = coefficients . (ln chips, ln memory GB, ln threads, 1, AMD, server class), per node; idle and full separately".to_string(),
        "rows: error_pct = median |leave-one-server-out error| of the fit over the row's servers (< 3 servers: the next level's)".to_string(),
    ];
    Ok((table.to_text(&header), results))
}

fn binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ENERGY_BPF_BIN") {
        return Ok(PathBuf::from(bin));
    }
    util::cargo(&["build", "--locked", "-p", "energy-bpf"])?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| util::root().join("target"));
    Ok(target.join("debug/energy-bpf"))
}

fn check() -> Result {
    let (text, results) = build()?;
    let path = data_dir().join("power-table.tsv");
    let checked_in =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    if checked_in != text {
        return Err(format!(
            "{} is not what `cargo xtask model-table build` makes: rebuild it",
            path.display()
        ));
    }
    let table = Table::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "table: {} rows, curve gamma {:.3}",
        table.rows.len(),
        table.curve_gamma
    );

    // Leave one server out, 2016–2019.
    let train: Vec<Train> = results
        .iter()
        .filter(|r| r.date < CUT_OFF)
        .filter_map(|r| arch_of_name(&r.cpu).map(|arch| Train { r, arch }))
        .collect();
    let loo = leave_one_out(&train)?;
    let recent: Vec<(f64, f64)> = train
        .iter()
        .zip(&loo)
        .filter(|(t, _)| t.r.date >= (2016, 1, 1))
        .map(|(_, e)| *e)
        .collect();
    println!(
        "leave-one-server-out, {} servers submitted 2016-2019: median error {:.1}% at active idle, {:.1}% at full load",
        recent.len(),
        median(recent.iter().map(|e| e.0).collect()),
        median(recent.iter().map(|e| e.1).collect())
    );

    // Held out: every result from the cut-off on, through the real binary.
    let bin = binary()?;
    let held: Vec<&Result_> = results.iter().filter(|r| r.date >= CUT_OFF).collect();
    let (mut idle_err, mut full_err, mut old_idle, mut old_full) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    println!("held out ({} results submitted from 2020 on):", held.len());
    for r in &held {
        let s = &r.server;
        let args = [
            "model".to_string(),
            "--cpu".into(),
            r.cpu.clone(),
            "--threads".into(),
            s.threads.to_string(),
            "--chips".into(),
            s.chips.to_string(),
            "--memory-gb".into(),
            s.memory_gb.to_string(),
            "--nodes".into(),
            s.nodes.to_string(),
            "--format".into(),
            "json".into(),
        ];
        let out = Command::new(&bin)
            .args(&args)
            .output()
            .map_err(|e| format!("running {}: {e}", bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} {args:?} failed: {}",
                bin.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("{} {args:?}: bad JSON: {e}", bin.display()))?;
        let get = |k: &str| v.get(k).and_then(serde_json::Value::as_f64);
        let (Some(idle), Some(full)) = (get("idle_w"), get("full_w")) else {
            return Err(format!("{args:?}: no idle_w/full_w in {v}"));
        };
        let row = v.get("row").and_then(|x| x.as_str()).unwrap_or("?");
        idle_err.push(rel_err(idle, r.idle_w));
        full_err.push(rel_err(full, r.full_w));
        // The old default: 1 W idle and 4 W at full load per hardware thread.
        old_idle.push(rel_err(s.threads, r.idle_w));
        old_full.push(rel_err(4.0 * s.threads, r.full_w));
        println!(
            "  {:<34} {:>3} chips {:>5} threads {:>5} GB: idle {:>6.1} W (measured {:>6.1}), full {:>7.1} W (measured {:>7.1})  [{row}]",
            r.cpu, s.chips, s.threads, s.memory_gb, idle, r.idle_w, full, r.full_w
        );
    }
    let (mi, mf) = (median(idle_err), median(full_err));
    println!(
        "held out, {} servers: median error {mi:.1}% at active idle, {mf:.1}% at full load (old default 1 W/4 W per thread: {:.1}% and {:.1}%)",
        held.len(),
        median(old_idle),
        median(old_full)
    );
    if mf > TARGET_FULL_PCT || mi > TARGET_IDLE_PCT {
        return Err(format!(
            "held-out median error over target: {mi:.1}% idle (≤ {TARGET_IDLE_PCT}%), {mf:.1}% full (≤ {TARGET_FULL_PCT}%)"
        ));
    }
    // The rows the check relies on exist.
    for arch in ["Cascade Lake-SP", "Zen 2 (Rome)"] {
        if arch_named(arch).is_none() || table.row(Level::Arch, arch).is_none() {
            return Err(format!("no arch row {arch}"));
        }
    }
    Ok(())
}
