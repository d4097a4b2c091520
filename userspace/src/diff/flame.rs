//! The differential flamegraph: widths are the NEW side's energy, each frame's colour is
//! its function's change — red for more, blue for less, saturated by the size of the
//! change when it is significant, grey when it is not — and its tooltip shows base, new,
//! delta and the 95% interval. Drawn by inferno, the frames coloured through its palette
//! map and titled through its frame attributes.
//!
//! Also the two-column collapsed stacks `stack BASE NEW` that inferno's `difffolded`
//! writes and its `flamegraph` reads (µJ of the normalised values, integers).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use inferno::flamegraph::{self, FuncFrameAttrsMap, color::Color, color::PaletteMap};

use super::{Diff, Per, Row, Side};
use crate::output::OutputError;

/// Mean folded stacks of a side's runs, normalised like the rows, J.
pub fn mean_stacks(side: &Side, per: Per, is_new: bool) -> BTreeMap<String, f64> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    let k = side.runs.len().max(1) as f64;
    for r in &side.runs {
        let d = per.divisor(r, is_new);
        let d = if d > 0.0 && d.is_finite() { d } else { 1.0 };
        for (stack, j) in &r.stacks {
            *out.entry(stack.clone()).or_insert(0.0) += j / d / k;
        }
    }
    out
}

/// `stack BASE NEW` lines (µJ), every stack of either side, sorted.
pub fn collapsed(
    base: &BTreeMap<String, f64>,
    new: &BTreeMap<String, f64>,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut stacks: Vec<&String> = base.keys().chain(new.keys()).collect();
    stacks.sort_unstable();
    stacks.dedup();
    for s in stacks {
        let uj = |m: &BTreeMap<String, f64>| (m.get(s).copied().unwrap_or(0.0) * 1e6).round();
        let (b, n) = (uj(base), uj(new));
        if b >= 1.0 || n >= 1.0 {
            writeln!(out, "{s} {b:.0} {n:.0}")?;
        }
    }
    Ok(())
}

/// The function name a flame frame stands for (kernel and inline marks removed).
fn function_of(frame: &str) -> &str {
    frame
        .strip_suffix("_[k]")
        .or_else(|| frame.strip_suffix("_[i]"))
        .unwrap_or(frame)
}

/// Colour of a row: red (more) or blue (less), stronger for larger changes (full at
/// ±50%), when significant; grey when not.
pub fn colour(row: &Row) -> Color {
    if !row.significant {
        return Color {
            r: 200,
            g: 200,
            b: 200,
        };
    }
    let size = row.delta_pct.map_or(1.0, |p| (p.abs() / 50.0).min(1.0));
    // 0.25 floor: a significant change is never mistaken for grey.
    let pale = (215.0 * (1.0 - (0.25 + 0.75 * size))).round() as u8;
    if row.delta_j > 0.0 {
        Color {
            r: 255,
            g: pale,
            b: pale,
        }
    } else {
        Color {
            r: pale,
            g: pale,
            b: 255,
        }
    }
}

fn tooltip(name: &str, row: &Row, unit: &str) -> String {
    let text = format!(
        "{name}: base {:.6}, new {:.6}, delta {:+.6} {unit} ({}), 95% CI [{:+.6}, {:+.6}], {}",
        row.base_j,
        row.new_j,
        row.delta_j,
        row.delta_pct
            .map_or_else(|| "new".into(), |p| format!("{p:+.1}%")),
        row.ci95[0],
        row.ci95[1],
        if row.significant {
            "significant"
        } else {
            "not significant"
        }
    );
    // The attribute file format is tab- and line-separated.
    text.replace(['\t', '\n', '\r'], " ")
}

/// Writes the differential SVG of a function diff.
pub fn svg(
    d: &Diff,
    new: &BTreeMap<String, f64>,
    width: Option<usize>,
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let lines: Vec<String> = new
        .iter()
        .filter_map(|(s, j)| {
            let uj = (j * 1e6).round();
            (uj >= 1.0).then(|| format!("{s} {uj:.0}"))
        })
        .collect();
    if lines.is_empty() {
        return Err(OutputError::Empty);
    }
    let rows: HashMap<&str, &Row> = d.rows.iter().map(|r| (r.name.as_str(), r)).collect();
    let mut palette = PaletteMap::default();
    let mut attrs = String::new();
    // Hashed, then only the distinct names sorted.
    let frames: foldhash::HashSet<&str> = lines
        .iter()
        .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s))
        .flat_map(|s| s.split(';'))
        .collect();
    let mut frames: Vec<&str> = frames.into_iter().collect();
    frames.sort_unstable();
    for frame in frames {
        let Some(row) = rows.get(function_of(frame)) else {
            palette.insert(
                frame,
                Color {
                    r: 235,
                    g: 235,
                    b: 235,
                },
            );
            continue;
        };
        palette.insert(frame, colour(row));
        attrs.push_str(frame);
        attrs.push_str("\ttitle=");
        attrs.push_str(&tooltip(function_of(frame), row, &d.unit));
        attrs.push('\n');
    }
    let mut opts = flamegraph::Options::default();
    opts.title = format!(
        "Energy diff by function: width = new {}, red = more, blue = less, grey = not significant{}",
        d.unit,
        if d.estimated { " (estimated)" } else { "" }
    );
    opts.subtitle = Some(format!(
        "total {}; base {}, new {}{}",
        super::describe(&d.total, &d.unit),
        d.base.facts.files.join(", "),
        d.new.facts.files.join(", "),
        if d.mismatch.is_empty() {
            String::new()
        } else {
            format!("; WARNING: {}", d.mismatch.join("; "))
        }
    ));
    opts.count_name = "µJ".into();
    opts.image_width = width;
    opts.deterministic = true;
    opts.func_frameattrs = FuncFrameAttrsMap::from_reader(attrs.as_bytes())?;
    opts.palette_map = Some(&mut palette);
    flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)?;
    Ok(())
}
