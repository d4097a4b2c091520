//! The CI gate of `diff --fail-above PCT [--scope total|ROW]`: fails when the total (or
//! the named row) rose significantly by more than PCT percent. A rise that is not
//! significant passes: noise must not break builds.

use serde::Serialize;

use super::{Diff, Row};

/// What the gate looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The machine's measured total.
    Total,
    /// One row, by name.
    Row(String),
}

impl Scope {
    /// `total`, or any other text as a row name.
    pub fn parse(text: &str) -> Self {
        if text == "total" {
            Scope::Total
        } else {
            Scope::Row(text.to_string())
        }
    }
}

/// The gate's verdict, as the JSON summary holds it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// True when the gate fails the build.
    pub failed: bool,
    /// `total` or the row's name.
    pub scope: String,
    /// The threshold, percent.
    pub fail_above_pct: f64,
    /// The row compared.
    pub row: Row,
    /// The unit of the row's values.
    pub unit: String,
    /// One line for a CI log.
    pub line: String,
}

/// The gate cannot be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// The row named by `--scope` is in neither side.
    #[error("--scope {name}: no such {by} in either side (closest: {closest})")]
    NoRow {
        /// The name asked for.
        name: String,
        /// What rows are (`function`, ...).
        by: String,
        /// Rows whose names contain it, or the largest rows.
        closest: String,
    },
}

/// Evaluates the gate on a diff.
pub fn check(d: &Diff, scope: &Scope, fail_above_pct: f64) -> Result<Verdict, GateError> {
    let row = match scope {
        Scope::Total => d.total.clone(),
        Scope::Row(name) => d
            .rows
            .iter()
            .find(|r| &r.name == name)
            .cloned()
            .ok_or_else(|| GateError::NoRow {
                name: name.clone(),
                by: d.by.clone(),
                closest: closest(d, name),
            })?,
    };
    let rose = row.delta_pct.unwrap_or(if row.delta_j > 0.0 {
        f64::INFINITY
    } else {
        0.0
    });
    let failed = row.significant && row.delta_j > 0.0 && rose > fail_above_pct;
    let scope_name = match scope {
        Scope::Total => "total".to_string(),
        Scope::Row(n) => n.clone(),
    };
    let line = format!(
        "energy-bpf diff: {}: {scope_name} {} (limit +{fail_above_pct}%){}",
        if failed { "FAIL" } else { "PASS" },
        super::describe(&row, &d.unit),
        if d.estimated {
            ", estimated energy"
        } else {
            ""
        }
    );
    Ok(Verdict {
        failed,
        scope: scope_name,
        fail_above_pct,
        row,
        unit: d.unit.clone(),
        line,
    })
}

fn closest(d: &Diff, name: &str) -> String {
    let mut hits: Vec<&str> = d
        .rows
        .iter()
        .filter(|r| r.name.contains(name) || name.contains(r.name.as_str()))
        .map(|r| r.name.as_str())
        .take(5)
        .collect();
    if hits.is_empty() {
        hits = d.rows.iter().take(5).map(|r| r.name.as_str()).collect();
    }
    if hits.is_empty() {
        "none: the diff has no rows".into()
    } else {
        hits.join(", ")
    }
}
