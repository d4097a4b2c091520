//! Report tables a person reads (`report --by process|thread|function`): a small row model
//! the report command fills, rendered as an aligned table, JSON or CSV, sorted by any
//! column, with confidence intervals and an `estimated` tag when energy is modelled.

use std::cmp::Ordering;
use std::io::Write;

use serde_json::{Map, Value, json};

use super::OutputError;

/// What a row stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// One row per process.
    Process,
    /// One row per thread.
    Thread,
    /// One row per cgroup (container, service): its processes summed.
    Cgroup,
    /// One row per command name: its processes summed.
    Command,
    /// One row per container (or Kubernetes pod; `[host]` for the rest), from the cgroup.
    Container,
    /// One row per function (self and total energy).
    Function,
    /// One row per virtual machine and thread class (`NAME vcpu`, `NAME emulator`), and
    /// `[host]` for every other process.
    Vm,
}

/// How to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns for a terminal.
    Table,
    /// One JSON document (what `report --help` lists).
    Json,
    /// Comma-separated values with a header line.
    Csv,
}

/// Energy of one domain in one row, with its confidence interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EnergyCell {
    /// Joules.
    pub joules: f64,
    /// Lower end of the 95% interval, J.
    pub ci_low: f64,
    /// Upper end of the 95% interval, J.
    pub ci_high: f64,
}

/// The identifying columns of a row.
#[derive(Clone, Debug, PartialEq)]
pub enum RowKey {
    /// A process.
    Process {
        /// Process id.
        pid: u32,
        /// Process name.
        comm: String,
    },
    /// A thread.
    Thread {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
        /// Thread name.
        comm: String,
    },
    /// A group of processes: a cgroup or a command name.
    Group(String),
    /// A function.
    Function {
        /// Function name (or `module+0xOFFSET`).
        name: String,
        /// File name of the module it lives in.
        module: String,
    },
    /// A summary line (`[idle/static]`, `[total]`): its name in the name column.
    Label(String),
}

/// One row of a report.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportRow {
    /// Who or what the row is about.
    pub key: RowKey,
    /// On-CPU time, ns.
    pub cpu_ns: f64,
    /// Stack samples.
    pub samples: u64,
    /// Energy per domain (self energy for functions), in [`Report::domains`] order.
    pub energy: Vec<EnergyCell>,
    /// Functions only: inclusive energy (self + callees) per domain.
    pub total_energy: Option<Vec<EnergyCell>>,
    /// Average power over the report's duration, W: headline energy (all domains that do
    /// not overlap) for processes and threads, the first domain for functions.
    pub power_w: f64,
    /// Share of the measured energy, 0..1 (same energy as `power_w`).
    pub share: f64,
    /// Busy share of each of [`Report::cpus`], 0..1 (empty: not shown).
    pub cpu_share: Vec<f64>,
}

/// A whole report: rows plus what a reader must know to trust them.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Row kind.
    pub by: By,
    /// Energy domains of the energy columns (`package`, `dram`, ...); may be empty.
    pub domains: Vec<String>,
    /// The rows, in any order.
    pub rows: Vec<ReportRow>,
    /// True when any energy is modelled: shown as `estimated`.
    pub estimated: bool,
    /// Title line (host, duration, source).
    pub title: String,
    /// More header lines (energy totals, idle/static, lost events); the table prints them
    /// under the title, JSON as `notes`.
    pub notes: Vec<String>,
    /// CPUs with a busy-share column each (`cpu0_pct`, ...); empty: none.
    pub cpus: Vec<u32>,
    /// Capture length, ns; non-zero adds a `cpu_pct` column (CPU time / duration).
    pub duration_ns: u64,
    /// Rows printed after the sorted and limited ones, unsorted (idle, totals).
    pub footer: Vec<ReportRow>,
    /// The estimated model's power-table row and its error (%), when its parameters came
    /// from the table: JSON `model_row` and `model_error` (absent otherwise).
    pub model_row: Option<(String, f64)>,
    /// Grams of CO2e per joule of the intensity in force (PUE included), when carbon is
    /// shown: a `co2e_g` column after the energy ones (the notes say which intensity).
    pub co2e_g_per_j: Option<f64>,
}

/// Sorting and truncation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RenderOptions {
    /// Column to sort by (descending for numbers, ascending for text); default: first energy
    /// column, else CPU time.
    pub sort: Option<String>,
    /// Keep at most this many rows.
    pub limit: Option<usize>,
}

#[derive(Clone, Debug, PartialEq)]
enum Cell {
    Text(String),
    Int(u64),
    Num(f64, usize),
    Interval(f64, f64),
}

impl Cell {
    fn text(&self) -> String {
        match self {
            Cell::Text(s) => s.clone(),
            Cell::Int(n) => n.to_string(),
            Cell::Num(x, d) => format!("{x:.d$}"),
            Cell::Interval(lo, hi) => format!("[{lo:.3}, {hi:.3}]"),
        }
    }

    fn compare(&self, other: &Cell) -> Ordering {
        match (self, other) {
            (Cell::Text(a), Cell::Text(b)) => a.cmp(b),
            (a, b) => b.number().total_cmp(&a.number()),
        }
    }

    /// Ascending order, for ties.
    fn ascending(&self, other: &Cell) -> Ordering {
        match (self, other) {
            (Cell::Text(a), Cell::Text(b)) => a.cmp(b),
            (a, b) => a.number().total_cmp(&b.number()),
        }
    }

    fn number(&self) -> f64 {
        match self {
            Cell::Int(n) => *n as f64,
            Cell::Num(x, _) | Cell::Interval(x, _) => *x,
            Cell::Text(_) => 0.0,
        }
    }
}

fn columns(report: &Report) -> Vec<String> {
    let mut cols: Vec<String> = match report.by {
        By::Process => vec!["pid".into(), "comm".into()],
        By::Thread => vec!["pid".into(), "tid".into(), "comm".into()],
        By::Cgroup => vec!["cgroup".into()],
        By::Command => vec!["command".into()],
        By::Container => vec!["container".into()],
        By::Vm => vec!["vm".into()],
        By::Function => vec!["function".into(), "module".into()],
    };
    cols.push("cpu_s".to_string());
    if report.duration_ns > 0 {
        cols.push("cpu_pct".to_string());
    }
    cols.extend(report.cpus.iter().map(|c| format!("cpu{c}_pct")));
    cols.push("samples".to_string());
    let prefix = if report.by == By::Function {
        "self_"
    } else {
        ""
    };
    for d in &report.domains {
        cols.push(format!("{prefix}{d}_j"));
        cols.push(format!("{prefix}{d}_ci95"));
    }
    if report.by == By::Function {
        for d in &report.domains {
            cols.push(format!("total_{d}_j"));
        }
    }
    if !report.domains.is_empty() {
        cols.extend(["power_w".to_string(), "share_pct".to_string()]);
    }
    if report.co2e_g_per_j.is_some() {
        cols.push("co2e_g".to_string());
    }
    cols
}

fn cells(report: &Report, row: &ReportRow) -> Vec<Cell> {
    let mut c = match &row.key {
        RowKey::Process { pid, comm } => vec![Cell::Int(u64::from(*pid)), Cell::Text(comm.clone())],
        RowKey::Thread { pid, tid, comm } => vec![
            Cell::Int(u64::from(*pid)),
            Cell::Int(u64::from(*tid)),
            Cell::Text(comm.clone()),
        ],
        RowKey::Group(name) => vec![Cell::Text(name.clone())],
        RowKey::Function { name, module } => {
            vec![Cell::Text(name.clone()), Cell::Text(module.clone())]
        }
        RowKey::Label(label) => {
            let ids = match report.by {
                By::Process => 1,
                By::Thread => 2,
                By::Cgroup | By::Command | By::Container | By::Function | By::Vm => 0,
            };
            let mut c = vec![Cell::Text("-".into()); ids];
            c.push(Cell::Text(label.clone()));
            if report.by == By::Function {
                c.push(Cell::Text(String::new()));
            }
            c
        }
    };
    let label = matches!(row.key, RowKey::Label(_));
    let blank = || Cell::Text(String::new());
    c.push(if label {
        blank()
    } else {
        Cell::Num(row.cpu_ns / 1e9, 3)
    });
    if report.duration_ns > 0 {
        c.push(if label {
            blank()
        } else {
            Cell::Num(100.0 * row.cpu_ns / report.duration_ns as f64, 1)
        });
    }
    for i in 0..report.cpus.len() {
        c.push(match row.cpu_share.get(i) {
            Some(v) if !label => Cell::Num(v * 100.0, 1),
            _ => blank(),
        });
    }
    c.push(if label {
        blank()
    } else {
        Cell::Int(row.samples)
    });
    for i in 0..report.domains.len() {
        let e = row.energy.get(i).copied().unwrap_or_default();
        c.push(Cell::Num(e.joules, 3));
        c.push(Cell::Interval(e.ci_low, e.ci_high));
    }
    if report.by == By::Function {
        for i in 0..report.domains.len() {
            let total = row
                .total_energy
                .as_ref()
                .and_then(|t| t.get(i))
                .copied()
                .unwrap_or_default();
            c.push(Cell::Num(total.joules, 3));
        }
    }
    if !report.domains.is_empty() {
        c.push(Cell::Num(row.power_w, 2));
        c.push(Cell::Num(row.share * 100.0, 1));
    }
    if let Some(g_per_j) = report.co2e_g_per_j {
        // The row's headline energy: a function's self energy of the first domain, else
        // its average power over the report's duration.
        let joules = if report.by == By::Function {
            row.energy.first().map_or(0.0, |e| e.joules)
        } else {
            row.power_w * report.duration_ns as f64 / 1e9
        };
        c.push(Cell::Num(joules * g_per_j, 6));
    }
    c
}

/// Finds the column `name` names: exact, else the only column starting with it.
fn sort_column(cols: &[String], name: &str) -> Result<usize, OutputError> {
    let name = name.to_ascii_lowercase();
    if let Some(i) = cols.iter().position(|c| *c == name) {
        return Ok(i);
    }
    let matches: Vec<usize> = (0..cols.len())
        .filter(|&i| cols[i].starts_with(&name))
        .collect();
    match matches.as_slice() {
        [i] => Ok(*i),
        _ => Err(OutputError::NoSuchColumn {
            name,
            available: cols.join(", "),
        }),
    }
}

/// Renders `report` to `out`.
pub fn render(
    report: &Report,
    opts: &RenderOptions,
    format: Format,
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let cols = columns(report);
    let default_sort = cols
        .iter()
        .position(|c| c.ends_with("_j"))
        .or_else(|| cols.iter().position(|c| c == "cpu_s"));
    let sort = match &opts.sort {
        Some(name) => Some(sort_column(&cols, name)?),
        None => default_sort,
    };
    let mut rows: Vec<Vec<Cell>> = report.rows.iter().map(|r| cells(report, r)).collect();
    if let Some(k) = sort {
        // Ties keep a stable, readable order: by the first column.
        rows.sort_by(|a, b| a[k].compare(&b[k]).then_with(|| a[0].ascending(&b[0])));
    }
    let all = rows.len();
    rows.truncate(opts.limit.unwrap_or(usize::MAX));
    let shown = rows.len();
    rows.extend(report.footer.iter().map(|r| cells(report, r)));
    match format {
        // A cut table says so under its ranked rows, and how to see the rest.
        Format::Table => table(report, &cols, &rows, (shown, all), out),
        Format::Json => json_doc(report, &cols, &rows, out),
        Format::Csv => csv(report, &cols, &rows, out),
    }
}

/// `ranked`: how many of `rows` are ranked rows (the rest is the footer), of how many
/// before the limit.
fn table(
    report: &Report,
    cols: &[String],
    rows: &[Vec<Cell>],
    ranked: (usize, usize),
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let tag = if report.estimated { " [estimated]" } else { "" };
    writeln!(out, "{}{tag}", report.title)?;
    for note in &report.notes {
        writeln!(out, "{note}")?;
    }
    let header: Vec<String> = cols.iter().map(|c| c.to_ascii_uppercase()).collect();
    let texts: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(Cell::text).collect())
        .collect();
    let widths: Vec<usize> = (0..cols.len())
        .map(|i| {
            texts
                .iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: &[String], numeric: &dyn Fn(usize) -> bool| -> String {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if numeric(i) {
                    format!("{s:>w$}", w = widths[i])
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    // Numeric columns align right; summary rows hold blanks there, so ask any other row.
    let is_num = |i: usize| rows.iter().any(|r| !matches!(r[i], Cell::Text(_)));
    writeln!(out, "{}", line(&header, &is_num))?;
    let (shown, all) = ranked;
    let cut = (shown < all).then(|| {
        format!(
            "... {} more rows not shown (--limit {all} shows them all)",
            all - shown
        )
    });
    for (i, r) in texts.iter().enumerate() {
        if i == shown
            && let Some(cut) = &cut
        {
            writeln!(out, "{cut}")?;
        }
        writeln!(out, "{}", line(r, &is_num))?;
    }
    if texts.len() == shown
        && let Some(cut) = &cut
    {
        writeln!(out, "{cut}")?;
    }
    if report.estimated {
        writeln!(
            out,
            "energy is estimated (modelled, not measured); intervals are 95%"
        )?;
    }
    Ok(())
}

fn json_doc(
    report: &Report,
    cols: &[String],
    rows: &[Vec<Cell>],
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            let mut obj = Map::new();
            for (c, cell) in cols.iter().zip(r) {
                let v = match cell {
                    Cell::Text(s) => json!(s),
                    Cell::Int(n) => json!(n),
                    Cell::Num(x, _) => json!(x),
                    Cell::Interval(lo, hi) => json!([lo, hi]),
                };
                obj.insert(c.clone(), v);
            }
            Value::Object(obj)
        })
        .collect();
    let mut doc = json!({
        "title": report.title,
        "estimated": report.estimated,
        "domains": report.domains,
        "notes": report.notes,
        "rows": rows,
    });
    if let (Some((row, error)), Some(obj)) = (&report.model_row, doc.as_object_mut()) {
        obj.insert("model_row".into(), json!(row));
        obj.insert("model_error".into(), json!(error));
    }
    serde_json::to_writer_pretty(&mut *out, &doc)?;
    writeln!(out)?;
    Ok(())
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// CSV with the intervals split into `_ci_low`/`_ci_high` and, when there is energy, an
/// `estimated` column on every row, so a spreadsheet never loses the tag.
fn csv(
    report: &Report,
    cols: &[String],
    rows: &[Vec<Cell>],
    out: &mut dyn Write,
) -> Result<(), OutputError> {
    let mut header: Vec<String> = cols
        .iter()
        .flat_map(|c| match c.strip_suffix("_ci95") {
            Some(base) => vec![format!("{base}_ci_low"), format!("{base}_ci_high")],
            None => vec![c.clone()],
        })
        .collect();
    let tag = (!report.domains.is_empty()).then(|| report.estimated.to_string());
    if tag.is_some() {
        header.push("estimated".to_string());
    }
    writeln!(out, "{}", header.join(","))?;
    for r in rows {
        let fields: Vec<String> = r
            .iter()
            .flat_map(|cell| match cell {
                Cell::Interval(lo, hi) => vec![format!("{lo}"), format!("{hi}")],
                Cell::Num(x, _) => vec![format!("{x}")],
                other => vec![csv_field(&other.text())],
            })
            .chain(tag.clone())
            .collect();
        writeln!(out, "{}", fields.join(","))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
