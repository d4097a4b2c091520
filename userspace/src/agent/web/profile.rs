//! "Which code" and "compare" for the web view: a time range of the agent's rotating
//! recordings (`--record-dir`) read, analysed and folded into energy stacks with the same
//! library code as `flamegraph --format collapsed --pid`, and two ranges compared with
//! `diff`'s code (rows with their 95% intervals and significance, stacks of both sides).
//! Without recordings, the stacks come from the recent windows kept in memory
//! ([`super::recent`]), weighted by each window's own attribution, and two ranges or
//! processes are compared by their stacks alone.
//! A request reads at most [`super::api::MAX_PROFILE_RANGE_S`] of recordings and answers
//! with at most [`super::api::MAX_STACKS`] stacks.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use serde::Serialize;

use super::api::{MAX_READ_BYTES, MAX_STACKS, ProfileQuery};
use super::recent;
use crate::agent::stacks::Batch;
use crate::{
    analysis::{self, ModelOverride},
    attribute::Options,
    diff::{self, By, Input, Per, side::StacksOf},
    output::collapsed,
    profile::{self, Filter, Profile},
    record::{Recording, TimeRange, files_in_range, read_files_in},
    symbolize::Symbolizer,
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
    /// Where they came from: `recordings`, or `memory` (the recent windows' stacks).
    pub from: &'static str,
    /// The time the stacks in memory cover, ms since the epoch (with `from: memory`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_ms: Option<[u64; 2]>,
    /// `[read, in the range]` when the range's recordings were over the bytes a request
    /// reads and only files spread evenly over it were read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<[usize; 2]>,
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
    /// Where they came from: `recordings`, or `memory` (stacks only, no rows).
    pub from: &'static str,
    /// Per side, `[read, in the range]` when only files spread over it were read.
    #[serde(skip_serializing_if = "is_whole")]
    pub files: [Option<[usize; 2]>; 2],
}

fn is_whole(files: &[Option<[usize; 2]>; 2]) -> bool {
    files.iter().all(Option::is_none)
}

/// `q`'s range, ns since the epoch: `[from, to)`.
pub fn range_ns(q: &ProfileQuery) -> (u64, u64) {
    (
        q.from_ms.saturating_mul(1_000_000),
        q.to_ms.saturating_mul(1_000_000),
    )
}

fn range(q: &ProfileQuery) -> TimeRange {
    TimeRange {
        from_unix_ns: Some(q.from_ms.saturating_mul(1_000_000)),
        to_unix_ns: Some(q.to_ms.saturating_mul(1_000_000)),
    }
}

/// Reads `q`'s range of the recordings in `dir`, at most [`MAX_READ_BYTES`] of them: when
/// the range's files are larger, files spread evenly over it. Also says what was read when
/// it was not everything: `(files read, files in the range)`.
fn read(dir: &Path, q: &ProfileQuery) -> Result<(Recording, Option<[usize; 2]>), String> {
    let range = range(q);
    let no = |e: crate::record::ReadError| format!("no recording of that range: {e}");
    let files = files_in_range(dir, &range).map_err(no)?;
    let (picked, partial) = spread(&files, MAX_READ_BYTES);
    let rec = read_files_in(dir, &picked, &range).map_err(no)?;
    Ok((rec, partial.then_some([picked.len(), files.len()])))
}

/// Files of `files` (oldest first) spread evenly over them, at most `cap` bytes in all
/// (at least one file, whatever its size); true when some were left out.
fn spread<T: Clone>(files: &[(T, u64)], cap: u64) -> (Vec<(T, u64)>, bool) {
    let total: u64 = files.iter().map(|(_, len)| len).sum();
    if total <= cap {
        return (files.to_vec(), false);
    }
    // Every k-th file, from the middle of each stride, growing k until they fit.
    let mut k = (total / cap.max(1)).max(1) as usize;
    loop {
        let picked: Vec<(T, u64)> = files.iter().skip(k / 2).step_by(k).cloned().collect();
        let bytes: u64 = picked.iter().map(|(_, len)| len).sum();
        if bytes <= cap || picked.len() <= 1 {
            let picked = if picked.is_empty() {
                files[..1].to_vec()
            } else {
                picked
            };
            return (picked, true);
        }
        k += 1;
    }
}

fn estimated(rec: &Recording) -> bool {
    rec.sources.iter().any(crate::energy::model::is_model)
}

/// Folded stacks of `rec`, of `pid` or every process: (value name, unit, stacks).
fn stacks(rec: &Recording, pids: Vec<u32>) -> (String, &'static str, BTreeMap<String, f64>) {
    let cfg = analysis::config(rec, Options::default(), &ModelOverride::default());
    let analysis = analysis::analyze(rec, &cfg);
    folded(&analysis::profile(rec, &analysis, &filter(pids)))
}

fn filter(pids: Vec<u32>) -> Filter {
    Filter {
        pids,
        comms: Vec::new(),
    }
}

/// A profile's package energy (CPU time where it has none), folded: (value name, unit,
/// stacks).
fn folded(prof: &Profile) -> (String, &'static str, BTreeMap<String, f64>) {
    let (value, unit, scale) = match prof.value_index("energy_package") {
        Some(i) => (i, "J", 1e-6),
        None => (prof.value_index(profile::CPU).unwrap_or(0), "s", 1e-9),
    };
    let name = prof
        .value_types
        .get(value)
        .map_or_else(String::new, |v| v.name.clone());
    let folded = collapsed::fold(prof, value)
        .into_iter()
        .map(|(s, v)| (s, v * scale))
        .collect();
    (name, unit, folded)
}

/// Folded stacks of a batch from memory, of `pid` or every process.
fn batch_stacks(b: &Batch, pids: Vec<u32>) -> (String, &'static str, BTreeMap<String, f64>) {
    let mut symbolizer = Symbolizer::with_kallsyms(Some("/proc/kallsyms".into()));
    folded(&profile::build(
        b.stacks(),
        &b.weights,
        &mut symbolizer,
        &filter(pids),
    ))
}

/// What the store held for one request: the batches that overlap it, and the time the
/// store covers.
pub type Found = (Vec<Arc<Batch>>, Option<(u64, u64)>);

/// `q`'s range of the batches `found`, merged; an error that says what the store holds
/// when nothing of it is there.
fn from_memory(found: Found, q: &ProfileQuery) -> Result<(Batch, Option<[u64; 2]>), String> {
    let (batches, covered) = found;
    let (from, to) = range_ns(q);
    let held_ms = covered.map(|(a, b)| [a / 1_000_000, b / 1_000_000]);
    let held = match held_ms {
        Some([a, b]) => format!(
            "it holds {} s of stacks, from {a} to {b} ms since the epoch",
            (b - a) / 1000
        ),
        None => "it holds none yet".into(),
    };
    let batch = recent::merged(&batches, from, to).ok_or_else(|| {
        format!(
            "no stacks of that range in memory ({held}); for older ranges start the agent \
             with --record-dir DIR"
        )
    })?;
    Ok((batch, held_ms))
}

/// The energy stacks of `q`'s range of the recent windows kept in memory.
pub fn recent(found: Found, q: &ProfileQuery) -> Result<ProfileResponse, String> {
    let (batch, held_ms) = from_memory(found, q)?;
    let (value, unit, folded) = batch_stacks(&batch, q.processes());
    let stacks = capped(folded);
    Ok(ProfileResponse {
        value,
        unit,
        estimated: batch.weights.estimated,
        total: stacks.iter().map(|(_, v)| v).sum(),
        stacks,
        from: "memory",
        held_ms,
        files: None,
    })
}

/// Compares two ranges or processes of the recent windows kept in memory, by their stacks
/// (per second of each range; the rows with intervals need recordings).
pub fn compare_recent(
    a_found: Found,
    a: &ProfileQuery,
    b_found: Found,
    b: &ProfileQuery,
) -> Result<DiffResponse, String> {
    let (ba, _) = from_memory(a_found, a)?;
    let (bb, _) = from_memory(b_found, b)?;
    let (_, unit, mut sa) = batch_stacks(&ba, a.processes());
    let (_, _, mut sb) = batch_stacks(&bb, b.processes());
    let mut unit = unit.to_string();
    if a.processes().is_empty() && b.processes().is_empty() {
        // Two ranges: per second of each, as `diff` compares them.
        for (m, q) in [(&mut sa, a), (&mut sb, b)] {
            let secs = (q.to_ms.saturating_sub(q.from_ms) as f64 / 1e3).max(1e-3);
            m.values_mut().for_each(|v| *v /= secs);
        }
        unit = if unit == "J" {
            "W".into()
        } else {
            format!("{unit}/s")
        };
    }
    Ok(DiffResponse {
        unit,
        estimated: ba.weights.estimated || bb.weights.estimated,
        rows: Vec::new(),
        stacks: pair(&sa, &sb),
        from: "memory",
        files: [None, None],
    })
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
    let (rec, files) = read(dir, q)?;
    let (value, unit, folded) = stacks(&rec, q.processes());
    let stacks = capped(folded);
    Ok(ProfileResponse {
        value,
        unit,
        estimated: estimated(&rec),
        total: stacks.iter().map(|(_, v)| v).sum(),
        stacks,
        from: "recordings",
        held_ms: None,
        files,
    })
}

/// Compares two ranges (by function, per second, with `diff`'s intervals), or two
/// processes (stacks only).
pub fn compare(dir: &Path, a: &ProfileQuery, b: &ProfileQuery) -> Result<DiffResponse, String> {
    let ((ra, fa), (rb, fb)) = (read(dir, a)?, read(dir, b)?);
    let files = [fa, fb];
    let est = estimated(&ra) || estimated(&rb);
    if !a.processes().is_empty() || !b.processes().is_empty() {
        let (_, unit, sa) = stacks(&ra, a.processes());
        let (_, _, sb) = stacks(&rb, b.processes());
        return Ok(DiffResponse {
            unit: unit.into(),
            estimated: est,
            rows: Vec::new(),
            stacks: pair(&sa, &sb),
            from: "recordings",
            files,
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
        from: "recordings",
        files,
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

#[cfg(test)]
mod tests {
    use super::spread;

    #[test]
    fn a_range_over_the_read_cap_reads_files_spread_evenly_within_it() {
        let files: Vec<(u32, u64)> = (0..100).map(|i| (i, 10)).collect();
        assert_eq!(spread(&files, 1000), (files.clone(), false));
        let (picked, partial) = spread(&files, 250);
        let bytes: u64 = picked.iter().map(|(_, len)| len).sum();
        assert!(partial && bytes <= 250, "{bytes} bytes");
        assert!(picked.len() >= 20, "{} files", picked.len());
        // Evenly: the same stride everywhere, from early to late in the range.
        let strides: Vec<u32> = picked.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert!(strides.iter().all(|&s| s == strides[0]), "{strides:?}");
        assert!(picked[0].0 < 5 && picked.last().expect("files").0 > 90);
        // One file over the cap is still read: a range always shows something.
        assert_eq!(spread(&[(7u32, 500)], 100), (vec![(7, 500)], true));
    }
}
