//! The table's view model: which lines are visible, in which order.
//!
//! A pure function of a snapshot's rows and the view options (sort, filter, grouping,
//! expanded entries, `-p` PIDs). Both the full-screen renderer and the batch printer draw
//! the same [`TableRow`]s, so what `top -b` prints is what the screen shows.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::snapshot::{ProcessRow, ThreadRow};
use crate::pipeline::rollup::{self, GroupBy};

/// A column the table can be sorted by, in display order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SortColumn {
    /// Process or thread id (ascending by default).
    Pid,
    /// Power over the interval.
    Power,
    /// Energy since start.
    Energy,
    /// CPU use over the interval.
    Cpu,
    /// Share of machine power.
    Share,
    /// Command line, alphabetically (ascending by default).
    Command,
}

impl SortColumn {
    /// All columns, left to right.
    pub const ALL: [SortColumn; 6] = [
        SortColumn::Pid,
        SortColumn::Power,
        SortColumn::Energy,
        SortColumn::Cpu,
        SortColumn::Share,
        SortColumn::Command,
    ];

    /// Lower-case name used in the status line.
    pub fn name(self) -> &'static str {
        match self {
            SortColumn::Pid => "pid",
            SortColumn::Power => "power",
            SortColumn::Energy => "energy",
            SortColumn::Cpu => "cpu",
            SortColumn::Share => "share",
            SortColumn::Command => "command",
        }
    }

    /// Whether a fresh sort on this column puts the largest first: numbers that mean
    /// "cost" are read biggest first, identifiers in natural order (like top).
    fn default_descending(self) -> bool {
        !matches!(self, SortColumn::Pid | SortColumn::Command)
    }

    fn index(self) -> usize {
        Self::ALL.iter().position(|c| *c == self).unwrap_or(0)
    }

    /// The column to the right, wrapping around.
    pub fn next(self) -> SortColumn {
        Self::ALL[(self.index() + 1) % Self::ALL.len()]
    }

    /// The column to the left, wrapping around.
    pub fn prev(self) -> SortColumn {
        Self::ALL[(self.index() + Self::ALL.len() - 1) % Self::ALL.len()]
    }
}

/// Sort column and direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sort {
    /// The column.
    pub column: SortColumn,
    /// Largest (or last) first.
    pub descending: bool,
}

impl Sort {
    /// Sort on `column` in its natural direction.
    pub fn by(column: SortColumn) -> Sort {
        Sort {
            column,
            descending: column.default_descending(),
        }
    }
}

impl Default for Sort {
    fn default() -> Self {
        Sort::by(SortColumn::Power)
    }
}

/// What the top-level rows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Grouping {
    /// One row per process, expandable to its threads.
    #[default]
    Process,
    /// One row per cgroup, expandable to its processes.
    Cgroup,
    /// One row per container (or Kubernetes pod; `[host]` for the rest), expandable.
    Container,
    /// One row per virtual machine and thread class (`NAME vcpu`, `NAME emulator`;
    /// `[host]` for every other process), expandable to the VM's process.
    Vm,
}

/// Identity of a line, stable across snapshots (selection and expansion follow it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RowKey {
    /// A cgroup group (full cgroup path).
    Group(String),
    /// A process.
    Process(u32),
    /// A thread of a process.
    Thread {
        /// Owning process.
        pid: u32,
        /// The thread.
        tid: u32,
    },
}

/// One visible line of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRow {
    /// Identity of the line.
    pub key: RowKey,
    /// Nesting depth: 0 top level, 1 child, 2 grandchild.
    pub depth: u8,
    /// First column: PID, TID, or `[n]` processes of a group.
    pub id: String,
    /// Power over the interval, W.
    pub power_w: f64,
    /// Energy since start, J.
    pub energy_j: f64,
    /// CPU use, percent of one CPU.
    pub cpu_pct: f64,
    /// Share of machine power, 0..=1.
    pub share: f64,
    /// Grams of CO2e of [`TableRow::energy_j`], when an intensity is configured.
    pub co2e_g: Option<f64>,
    /// Command line (process), thread name (thread), or cgroup label (group).
    pub command: String,
    /// Has children that can be shown.
    pub expandable: bool,
    /// Children are shown below.
    pub expanded: bool,
}

/// The options that decide the visible lines.
#[derive(Debug, Clone, Copy)]
pub struct ViewOptions<'a> {
    /// Sort column and direction (applies at every level).
    pub sort: Sort,
    /// Case-insensitive substring of comm, command line or cgroup; empty shows all.
    pub filter: &'a str,
    /// Process or cgroup rows at the top level.
    pub grouping: Grouping,
    /// Processes and groups whose children are shown.
    pub expanded: &'a BTreeSet<RowKey>,
    /// Only these PIDs (`-p`); empty shows all.
    pub pids: &'a [u32],
    /// Grams per joule of each process, for the gCO2e column; `None` hides it.
    pub carbon: Option<&'a CarbonRates>,
}

/// Grams of CO2e per joule of each process: the grams its windows cost at their intensity
/// over their joules, so a row's grams are its energy column × its own rate (exactly
/// energy × intensity when the intensity is fixed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CarbonRates {
    /// The rate of each process that had energy.
    pub by_pid: HashMap<u32, f64>,
    /// The rate of the others: the latest window's intensity.
    pub latest: f64,
}

impl CarbonRates {
    /// Grams per joule of process `pid`.
    pub fn of(&self, pid: u32) -> f64 {
        self.by_pid.get(&pid).copied().unwrap_or(self.latest)
    }
}

/// Builds the visible lines from a snapshot's process rows.
pub fn build_rows(processes: &[ProcessRow], opts: &ViewOptions<'_>) -> Vec<TableRow> {
    let needle = opts.filter.to_lowercase();
    let selected: Vec<&ProcessRow> = processes
        .iter()
        .filter(|p| opts.pids.is_empty() || opts.pids.contains(&p.pid))
        .filter(|p| matches_filter(p, &needle))
        .collect();
    let mut out = Vec::with_capacity(selected.len());
    match opts.grouping {
        Grouping::Process => push_processes(&mut out, selected, 0, opts),
        Grouping::Vm => {
            let mut rows: Vec<(TableRow, Vec<&ProcessRow>)> =
                crate::vm::rows::grouped_with_members(&selected)
                    .into_iter()
                    .map(|(g, members)| (group_row(&g, &members, opts), members))
                    .collect();
            rows.sort_by(|a, b| compare(&a.0, &b.0, opts.sort));
            for (row, members) in rows {
                let expanded = row.expanded;
                out.push(row);
                if expanded {
                    push_processes(&mut out, members, 1, opts);
                }
            }
        }
        Grouping::Cgroup | Grouping::Container => {
            // The sums are the pipeline's rollup; only the members shown under an
            // expanded group are gathered here.
            let by = match opts.grouping {
                Grouping::Container => GroupBy::Container,
                _ => GroupBy::Cgroup,
            };
            let mut members: BTreeMap<String, Vec<&ProcessRow>> = BTreeMap::new();
            for p in &selected {
                members.entry(rollup::group_key(p, by)).or_default().push(p);
            }
            let mut rows: Vec<(TableRow, Vec<&ProcessRow>)> =
                rollup::group(selected.iter().copied(), by)
                    .into_iter()
                    .map(|g| {
                        let members = members.remove(&g.comm).unwrap_or_default();
                        (group_row(&g, &members, opts), members)
                    })
                    .collect();
            rows.sort_by(|a, b| compare(&a.0, &b.0, opts.sort));
            for (row, members) in rows {
                let expanded = row.expanded;
                out.push(row);
                if expanded {
                    push_processes(&mut out, members, 1, opts);
                }
            }
        }
    }
    out
}

fn matches_filter(p: &ProcessRow, needle: &str) -> bool {
    needle.is_empty()
        || p.comm.to_lowercase().contains(needle)
        || p.cmdline.to_lowercase().contains(needle)
        || p.cgroup.to_lowercase().contains(needle)
}

fn push_processes(
    out: &mut Vec<TableRow>,
    processes: Vec<&ProcessRow>,
    depth: u8,
    opts: &ViewOptions<'_>,
) {
    let mut rows: Vec<(TableRow, &ProcessRow)> = processes
        .into_iter()
        .map(|p| (process_row(p, depth, opts), p))
        .collect();
    rows.sort_by(|a, b| compare(&a.0, &b.0, opts.sort));
    for (row, p) in rows {
        let expanded = row.expanded;
        out.push(row);
        if expanded {
            let mut threads: Vec<TableRow> = p
                .threads
                .iter()
                .map(|t| thread_row(p.pid, t, depth + 1, opts))
                .collect();
            threads.sort_by(|a, b| compare(a, b, opts.sort));
            out.extend(threads);
        }
    }
}

fn process_row(p: &ProcessRow, depth: u8, opts: &ViewOptions<'_>) -> TableRow {
    let key = RowKey::Process(p.pid);
    let expandable = !p.threads.is_empty();
    TableRow {
        expanded: expandable && opts.expanded.contains(&key),
        key,
        depth,
        id: p.pid.to_string(),
        power_w: p.power_w,
        energy_j: p.since_start_j,
        cpu_pct: p.cpu_pct,
        share: p.share,
        co2e_g: opts.carbon.map(|c| p.since_start_j * c.of(p.pid)),
        // Kernel threads have no command line; show the name in brackets like ps/top.
        command: with_function(
            if p.cmdline.is_empty() {
                format!("[{}]", p.comm)
            } else {
                p.cmdline.clone()
            },
            &p.top_function,
        ),
        expandable,
    }
}

fn thread_row(pid: u32, t: &ThreadRow, depth: u8, opts: &ViewOptions<'_>) -> TableRow {
    TableRow {
        key: RowKey::Thread { pid, tid: t.tid },
        depth,
        id: t.tid.to_string(),
        power_w: t.power_w,
        energy_j: t.since_start_j,
        cpu_pct: t.cpu_pct,
        share: t.share,
        co2e_g: opts.carbon.map(|c| t.since_start_j * c.of(pid)),
        command: with_function(t.comm.clone(), &t.top_function),
        expandable: false,
        expanded: false,
    }
}

/// A command cell followed by its hot function in brackets, when one is named.
fn with_function(command: String, function: &str) -> String {
    if function.is_empty() {
        command
    } else {
        format!("{command} [{function}]")
    }
}

fn group_row(g: &ProcessRow, members: &[&ProcessRow], opts: &ViewOptions<'_>) -> TableRow {
    let key = RowKey::Group(g.comm.clone());
    // The group's energy at its members' energy-weighted rate (a VM's vCPU and emulator
    // groups share one process, so the group's joules need not be its members' sum).
    let co2e_g = opts.carbon.map(|c| {
        let joules: f64 = members.iter().map(|p| p.since_start_j).sum();
        let grams: f64 = members.iter().map(|p| p.since_start_j * c.of(p.pid)).sum();
        let rate = if joules > 0.0 {
            grams / joules
        } else {
            c.latest
        };
        g.since_start_j * rate
    });
    TableRow {
        expanded: opts.expanded.contains(&key),
        key,
        depth: 0,
        // Bracketed so a process count never reads as a PID.
        id: format!("[{}]", members.len()),
        power_w: g.power_w,
        energy_j: g.since_start_j,
        cpu_pct: g.cpu_pct,
        share: g.share,
        co2e_g,
        command: cgroup_label(&g.comm),
        expandable: true,
    }
}

/// A readable name for a cgroup path: a container's cgroup becomes `runtime:<12-hex id>`
/// (as [`crate::container::parse`] reads it), anything else is shown as its path.
pub fn cgroup_label(cgroup: &str) -> String {
    if cgroup.is_empty() {
        return "(unknown cgroup)".to_string();
    }
    let container = crate::container::parse(cgroup);
    if let (Some(id), Some(runtime)) = (&container.container_id, container.runtime) {
        return format!("{runtime}:{}", id.get(..12).unwrap_or(id));
    }
    cgroup.to_string()
}

/// Orders two lines of the same level; ties fall back to the id so the order is stable.
fn compare(a: &TableRow, b: &TableRow, sort: Sort) -> Ordering {
    let primary = match sort.column {
        SortColumn::Pid => compare_ids(a, b),
        SortColumn::Power => a.power_w.total_cmp(&b.power_w),
        SortColumn::Energy => a.energy_j.total_cmp(&b.energy_j),
        SortColumn::Cpu => a.cpu_pct.total_cmp(&b.cpu_pct),
        SortColumn::Share => a.share.total_cmp(&b.share),
        SortColumn::Command => a.command.cmp(&b.command),
    };
    let primary = if sort.descending {
        primary.reverse()
    } else {
        primary
    };
    primary.then_with(|| compare_ids(a, b))
}

/// Numeric ids compare as numbers; groups compare by label.
fn compare_ids(a: &TableRow, b: &TableRow) -> Ordering {
    match (&a.key, &b.key) {
        (RowKey::Group(_), RowKey::Group(_)) => a.command.cmp(&b.command),
        _ => a.key.cmp(&b.key),
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
