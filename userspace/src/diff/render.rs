//! A [`Diff`] as a table for a terminal, one JSON document, or CSV. Every value is in the
//! diff's unit (`J/run`, `W`, `J/unit`); `estimated` is said wherever modelled energy is
//! shown, and a mismatch between the sides is printed before the numbers.

use std::io::{self, Write};

use super::{Diff, describe, pct};

/// Writes the header and the first `limit` rows (all when `None`) as aligned columns.
pub fn table(d: &Diff, limit: Option<usize>, out: &mut dyn Write) -> io::Result<()> {
    let est = if d.estimated { " (estimated)" } else { "" };
    writeln!(
        out,
        "energy-bpf diff: by {}, {}{est}; normalised {}",
        d.by, d.unit, d.normalised
    )?;
    for (label, s) in [("base", &d.base), ("new", &d.new)] {
        writeln!(
            out,
            "{label:<4}: {} run{} from {} on {}; source {}{}; mean run {:.3} s ({:.1} s in all); total {:.4} {}, idle/static {:.4}",
            s.runs,
            if s.runs == 1 { "" } else { "s" },
            s.facts.files.join(", "),
            s.facts.hostnames.join(", "),
            s.facts.source,
            if s.facts.estimated {
                " (estimated)"
            } else {
                ""
            },
            s.duration_s,
            s.total_duration_s,
            s.total_j,
            d.unit,
            s.idle_j,
        )?;
        for w in &s.facts.warnings {
            writeln!(out, "      warning: {w}")?;
        }
    }
    writeln!(out, "total: {}", describe(&d.total, &d.unit))?;
    for m in &d.mismatch {
        writeln!(out, "WARNING: sides do not match: {m}")?;
    }
    writeln!(out, "method: {}", d.method)?;
    writeln!(out)?;
    let width = d
        .rows
        .iter()
        .take(limit.unwrap_or(usize::MAX))
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(4)
        .clamp(4, 60);
    writeln!(
        out,
        "{:<width$}  {:>11}  {:>11}  {:>11}  {:>8}  {:>25}  {:>4}  {:>6}",
        "name", "base", "new", "delta", "delta%", "95% CI of delta", "sig", "share"
    )?;
    for r in d.rows.iter().take(limit.unwrap_or(usize::MAX)) {
        let name: String = if r.name.chars().count() > width {
            let mut s: String = r.name.chars().take(width.saturating_sub(1)).collect();
            s.push('…');
            s
        } else {
            r.name.clone()
        };
        writeln!(
            out,
            "{name:<width$}  {:>11.4}  {:>11.4}  {:>+11.4}  {:>8}  {:>25}  {:>4}  {:>5.1}%",
            r.base_j,
            r.new_j,
            r.delta_j,
            pct(r.delta_pct),
            format!("[{:+.4}, {:+.4}]", r.ci95[0], r.ci95[1]),
            if r.significant { "yes" } else { "no" },
            100.0 * r.share.max(r.base_share),
        )?;
    }
    if let Some(l) = limit
        && d.rows.len() > l
    {
        writeln!(
            out,
            "({} more rows; --limit N or --format json for all)",
            d.rows.len() - l
        )?;
    }
    Ok(())
}

/// The whole diff as one JSON document (`gate` added when a gate ran).
pub fn json(d: &Diff, gate: Option<&super::gate::Verdict>, out: &mut dyn Write) -> io::Result<()> {
    let mut value = serde_json::to_value(d).map_err(io::Error::other)?;
    if let (Some(g), Some(obj)) = (gate, value.as_object_mut()) {
        obj.insert(
            "gate".into(),
            serde_json::to_value(g).map_err(io::Error::other)?,
        );
    }
    writeln!(out, "{value:#}")
}

/// One CSV row per diff row, with a header; the machine total comes first as `[total]`.
pub fn csv(d: &Diff, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "name,unit,base_j,new_j,delta_j,delta_pct,ci95_low,ci95_high,significant,base_share,share,estimated"
    )?;
    for r in std::iter::once(&d.total).chain(&d.rows) {
        writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{}",
            csv_field(&r.name),
            d.unit,
            r.base_j,
            r.new_j,
            r.delta_j,
            r.delta_pct.map_or(String::new(), |p| p.to_string()),
            r.ci95[0],
            r.ci95[1],
            r.significant,
            r.base_share,
            r.share,
            d.estimated,
        )?;
    }
    Ok(())
}

/// Quotes a field that holds a comma, quote or line break (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}
