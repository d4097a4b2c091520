//! "Which code" and "compare" for the web view: a time range of the agent's rotating
//! recordings (`--record-dir`) read, analysed and folded into energy stacks with the same
//! library code as `flamegraph --format collapsed --pid`, and two ranges compared with
//! `diff`'s code (rows with their 95% intervals and significance, stacks of both sides).
//! A request reads at most [`super::api::MAX_PROFILE_RANGE_S`] of recordings and answers
//! with at most [`super::api::MAX_STACKS`] stacks.

use std::{collections::BTreeMap, path::Path};

use serde::Serialize;

use super::api::{MAX_STACKS, ProfileQuery};
use crate::{
    analysis::{self, ModelOverride},
    attribute::Options,
    diff::{self, By, Input, Per, side::StacksOf},
    output::collapsed,
    profile::{self, Filter},
    record::{Recording, TimeRange, read_path},
};

/// A profile response: folded stacks (`comm;root;...;leaf`) with their energy, J.
#[derive(Debug, Serialize)]
pub struct ProfileResponse {
    /// What the values are (`energy_package`, or `cpu` when no energy was recorded).
    pub value: String,
    /// The unit of the values (`J`, or `s` of CPU time).
    pub unit: &'static str,
    /// True when the energy is modelled.
    pub estimated: bool,
    /// Sum of every stack.
    pub total: f64,
    /// Stacks, largest first.
    pub stacks: Vec<(String, f64)>,
}

/// A diff response.
#[derive(Debug, Serialize)]
pub struct DiffResponse {
    /// The unit of every value.
    pub unit: String,
    /// True when either side is modelled.
    pub estimated: bool,
    /// Functions whose self energy changed, largest change first, with their 95% interval
    /// and whether it excludes zero (empty when two processes are compared).
    pub rows: Vec<diff::Row>,
    /// Stacks: (stack, base, new).
    pub stacks: Vec<(String, f64, f64)>,
}

fn range(q: &ProfileQuery) -> TimeRange {
    TimeRange {
        from_unix_ns: Some(q.from_ms.saturating_mul(1_000_000)),
        to_unix_ns: Some(q.to_ms.saturating_mul(1_000_000)),
    }
}

fn read(dir: &Path, q: &ProfileQuery) -> Result<Recording, String> {
    read_path(dir, &range(q)).map_err(|e| format!("no recording of that range: {e}"))
}

fn estimated(rec: &Recording) -> bool {
    rec.sources.iter().any(crate::energy::model::is_model)
}

/// Folded stacks of `rec`, of `pid` or every process: (value name, unit, stacks).
fn stacks(rec: &Recording, pid: Option<u32>) -> (String, &'static str, BTreeMap<String, f64>) {
    let cfg = analysis::config(rec, Options::default(), &ModelOverride::default());
    let analysis = analysis::analyze(rec, &cfg);
    let filter = Filter {
        pids: pid.into_iter().collect(),
        comms: Vec::new(),
    };
    let prof = analysis::profile(rec, &analysis, &filter);
    let (value, unit, scale) = match prof.value_index("energy_package") {
        Some(i) => (i, "J", 1e-6),
        None => (prof.value_index(profile::CPU).unwrap_or(0), "s", 1e-9),
    };
    let name = prof
        .value_types
        .get(value)
        .map_or_else(String::new, |v| v.name.clone());
    let folded = collapsed::fold(&prof, value)
        .into_iter()
        .map(|(s, v)| (s, v * scale))
        .collect();
    (name, unit, folded)
}

/// The largest [`MAX_STACKS`] of `folded`, the rest summed into `[other stacks]`.
fn capped(folded: BTreeMap<String, f64>) -> Vec<(String, f64)> {
    let mut all: Vec<(String, f64)> = folded.into_iter().filter(|(_, v)| *v > 0.0).collect();
    all.sort_by(|a, b| b.1.total_cmp(&a.1));
    if all.len() > MAX_STACKS {
        let rest: f64 = all.split_off(MAX_STACKS - 1).iter().map(|(_, v)| v).sum();
        all.push(("[other stacks]".into(), rest));
    }
    all
}

/// The energy stacks of `q`'s range of the recordings in `dir`.
pub fn profile(dir: &Path, q: &ProfileQuery) -> Result<ProfileResponse, String> {
    let rec = read(dir, q)?;
    let (value, unit, folded) = stacks(&rec, q.pid);
    let stacks = capped(folded);
    Ok(ProfileResponse {
        value,
        unit,
        estimated: estimated(&rec),
        total: stacks.iter().map(|(_, v)| v).sum(),
        stacks,
    })
}

/// Compares two ranges (by function, per second, with `diff`'s intervals), or two
/// processes (stacks only).
pub fn compare(dir: &Path, a: &ProfileQuery, b: &ProfileQuery) -> Result<DiffResponse, String> {
    let (ra, rb) = (read(dir, a)?, read(dir, b)?);
    let est = estimated(&ra) || estimated(&rb);
    if a.pid.is_some() || b.pid.is_some() {
        let (_, unit, sa) = stacks(&ra, a.pid);
        let (_, _, sb) = stacks(&rb, b.pid);
        return Ok(DiffResponse {
            unit: unit.into(),
            estimated: est,
            rows: Vec::new(),
            stacks: pair(&sa, &sb),
        });
    }
    let input = |label: &str, rec: Recording| {
        let cfg = analysis::config(&rec, Options::default(), &ModelOverride::default());
        Input {
            label: label.into(),
            rec,
            cfg,
        }
    };
    let (base, new) = diff::side::sides(
        vec![input("a", ra)],
        vec![input("b", rb)],
        By::Function,
        StacksOf::Both,
    );
    let d = diff::compare(&base, &new, By::Function, Per::Second);
    let sa = diff::flame::mean_stacks(&base, Per::Second, false);
    let sb = diff::flame::mean_stacks(&new, Per::Second, true);
    let mut rows = d.rows;
    rows.truncate(200);
    Ok(DiffResponse {
        unit: d.unit,
        estimated: d.estimated,
        rows,
        stacks: pair(&sa, &sb),
    })
}

fn pair(a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>) -> Vec<(String, f64, f64)> {
    let mut all: Vec<(String, f64, f64)> = a
        .keys()
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .map(|k| {
            let v = |m: &BTreeMap<String, f64>| m.get(k).copied().unwrap_or(0.0);
            (k.clone(), v(a), v(b))
        })
        .collect();
    all.sort_by(|x, y| (y.1 + y.2).total_cmp(&(x.1 + x.2)));
    all.truncate(MAX_STACKS);
    all
}
