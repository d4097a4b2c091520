//! Text shared by the screen and the batch printer: header lines, column titles, numbers.
//!
//! One place decides how a figure reads, so `top` and `top -b` never disagree, and the
//! `estimated` label (docs/ARCHITECTURE.md, "Estimated energy": modelled energy is always labelled) is applied in one
//! spot.

use super::state::State;
use super::table::{Grouping, SortColumn, TableRow};
use crate::attribute::StaticOrigin;

/// Prefix on every modelled power or energy value ("approximately").
pub const ESTIMATED_MARK: &str = "~";

/// Title of a column; power and energy say `(estimated)` when the source is a model.
pub fn column_title(column: SortColumn, estimated: bool) -> &'static str {
    match (column, estimated) {
        (SortColumn::Pid, _) => "PID",
        (SortColumn::Power, false) => "Power W",
        (SortColumn::Power, true) => "Power W (estimated)",
        (SortColumn::Energy, false) => "Energy J",
        (SortColumn::Energy, true) => "Energy J (estimated)",
        (SortColumn::Cpu, _) => "CPU %",
        (SortColumn::Share, _) => "Share %",
        (SortColumn::Command, _) => "Command",
    }
}

/// Title of the gCO2e column; `(estimated)` when the energy is modelled.
pub fn co2e_title(estimated: bool) -> &'static str {
    if estimated {
        "gCO2e (estimated)"
    } else {
        "gCO2e"
    }
}

/// The table's columns left to right, each with the sort column it is (`None`: the gCO2e
/// column, shown after the energy when `carbon`, not sortable) and its title.
pub fn column_titles(estimated: bool, carbon: bool) -> Vec<(Option<SortColumn>, &'static str)> {
    let mut titles = Vec::with_capacity(SortColumn::ALL.len() + 1);
    for column in SortColumn::ALL {
        titles.push((Some(column), column_title(column, estimated)));
        if carbon && column == SortColumn::Energy {
            titles.push((None, co2e_title(estimated)));
        }
    }
    titles
}

/// Grams to four significant digits (`0.001234`, `12.35`, `1235`), at most nine decimals:
/// a second of a small machine is micrograms.
pub fn grams_cell(g: f64) -> String {
    let magnitude = if g == 0.0 || !g.is_finite() {
        0
    } else {
        g.abs().log10().floor() as i32
    };
    let decimals = (3 - magnitude).clamp(0, 9) as usize;
    format!("{g:.decimals$}")
}

/// Whether the figures on screen are modelled.
pub fn estimated(state: &State) -> bool {
    state.snapshot().is_some_and(|s| s.header.estimated)
}

/// The cells of a table line except the command, in column order (PID, power, energy,
/// gCO2e when the row has grams, CPU, share).
pub fn numeric_cells(row: &TableRow, estimated: bool) -> Vec<String> {
    let mark = if estimated { ESTIMATED_MARK } else { "" };
    let mut cells = vec![
        row.id.clone(),
        format!("{mark}{:.2}", row.power_w),
        format!("{mark}{:.1}", row.energy_j),
    ];
    if let Some(g) = row.co2e_g {
        cells.push(format!("{mark}{}", grams_cell(g)));
    }
    cells.push(format!("{:.1}", row.cpu_pct));
    cells.push(format!("{:.1}", row.share * 100.0));
    cells
}

/// The command cell with tree markers: `▸`/`▾` (or `+`/`-` in ASCII) on expandable lines,
/// indentation and `└` (or `` ` ``) on children.
pub fn command_cell(row: &TableRow, ascii: bool) -> String {
    let indent = "  ".repeat(usize::from(row.depth));
    let branch = match (row.depth, ascii) {
        (0, _) => "",
        (_, false) => "└ ",
        (_, true) => "`-",
    };
    let fold = match (row.expandable, row.expanded, ascii) {
        (false, _, _) => "",
        (true, false, false) => "▸ ",
        (true, true, false) => "▾ ",
        (true, false, true) => "+ ",
        (true, true, true) => "- ",
    };
    format!("{indent}{branch}{fold}{}", row.command)
}

/// First header line: source, sampling, losses, CPUs, interval, and run state.
pub fn summary_line(state: &State) -> String {
    let mut line = String::from("energy-bpf top");
    match state.snapshot() {
        None => line.push_str(" - waiting for the first interval"),
        Some(s) => {
            let h = &s.header;
            let tag = match (&h.model_row, h.estimated) {
                (Some(row), _) => format!(" (estimated: {row})"),
                (None, true) => " (estimated)".to_string(),
                (None, false) => String::new(),
            };
            line.push_str(&format!(
                " - source: {}{tag} - sampling {} Hz - lost events {} - {} CPUs - interval {:.2} s",
                h.source, h.sample_hz, h.lost_events, h.cpus, s.interval_s
            ));
        }
    }
    if state.paused() {
        line.push_str(" - PAUSED");
    }
    if state.feed_closed() {
        line.push_str(" - live feed stopped");
    }
    line
}

/// Second header line: total, per-domain and GPU power, and the idle/static share.
pub fn power_line(state: &State) -> String {
    let Some(s) = state.snapshot() else {
        return String::from("Power: -");
    };
    let h = &s.header;
    let tag = if h.estimated { " (estimated)" } else { "" };
    let mut parts = vec![format!("Power{tag}: total {:.2} W", h.total_w)];
    let (gpus, others): (Vec<_>, Vec<_>) = h.domains.iter().partition(|d| d.is_gpu());
    parts.extend(
        others
            .iter()
            .map(|d| format!("{} {:.2} W", d.name, d.watts)),
    );
    if !gpus.is_empty() {
        let gpu: Vec<String> = gpus
            .iter()
            .map(|d| format!("{} {:.2} W", d.name, d.watts))
            .collect();
        parts.push(format!("GPU {}", gpu.join(", ")));
    }
    // Guard against a zero total (no energy yet): a share of nothing is 0 %, not NaN.
    let idle_pct = if h.total_w > 0.0 {
        100.0 * h.idle_w / h.total_w
    } else {
        0.0
    };
    parts.push(format!("idle/static {:.2} W ({idle_pct:.1}%)", h.idle_w));
    parts.push(format!("activity {}", s.totals.activity.label()));
    parts.join(" | ")
}

/// Header lines after the power line, one per source whose static power could not be
/// identified: the per-process joules then include static power, and the line says what
/// fixes it. Empty in the normal case.
pub fn warning_lines(state: &State) -> Vec<String> {
    let Some(s) = state.snapshot() else {
        return Vec::new();
    };
    s.totals
        .static_power
        .iter()
        .filter_map(|p| match &p.origin {
            StaticOrigin::Unidentified { reason, .. } => Some(format!(
                "WARNING static power of {} unidentified ({}): rows include static power; run \
                 `energy-bpf calibrate` on a quiet machine or pass --static-power-w",
                p.source,
                reason.describe()
            )),
            _ => None,
        })
        .chain(s.totals.spread_lines())
        .chain(state.carbon_line())
        .collect()
}

/// Third header line: sort, grouping, filter and how many lines are shown.
pub fn view_line(state: &State) -> String {
    let sort = state.sort();
    let direction = if sort.descending {
        "descending"
    } else {
        "ascending"
    };
    let grouping = match state.grouping() {
        Grouping::Process => "process",
        Grouping::Cgroup => "cgroup",
        Grouping::Container => "container",
        Grouping::Vm => "vm",
    };
    let total = state.snapshot().map_or(0, |s| s.rows.len());
    let mut line = format!(
        "Sort: {} ({direction}) | group by: {grouping} | {} lines, {total} processes",
        sort.column.name(),
        state.rows().len()
    );
    if !state.filter().is_empty() {
        line.push_str(&format!(" | filter: \"{}\"", state.filter()));
    }
    if !state.pids().is_empty() {
        let pids: Vec<String> = state.pids().iter().map(u32::to_string).collect();
        line.push_str(&format!(" | pids: {}", pids.join(",")));
    }
    line
}
