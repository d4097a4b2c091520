//! Everything `top` remembers between frames, and how each [`Action`] changes it.
//!
//! Pure: no terminal, no clock, no channel. The run loop feeds it snapshots and actions;
//! the renderer and batch printer read it. The visible lines are rebuilt only when
//! something that decides them changes, not on every draw.

use std::collections::BTreeSet;

use super::input::{Action, Mode};
use super::snapshot::Snapshot;
use super::table::{CarbonRates, Grouping, RowKey, Sort, TableRow, ViewOptions, build_rows};

/// What the run loop should do after an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Keep running (and redraw).
    Continue,
    /// Leave `top`.
    Quit,
}

/// The state of one `top` session.
#[derive(Debug, Clone, Default)]
pub struct State {
    snapshot: Option<Snapshot>,
    snapshots_shown: u64,
    sort: Sort,
    grouping: Grouping,
    filter: String,
    /// The filter being typed after `/`; `None` when not editing.
    editing: Option<String>,
    expanded: BTreeSet<RowKey>,
    paused: bool,
    show_help: bool,
    feed_closed: bool,
    pids: Vec<u32>,
    rows: Vec<TableRow>,
    selected: usize,
    selected_key: Option<RowKey>,
    offset: usize,
    page: usize,
    /// Grams of CO2e, with `--carbon-*` flags.
    carbon: TopCarbon,
}

/// `top`'s carbon: the source, the intensity of the last window and grams since start.
#[derive(Debug, Clone, Default)]
struct TopCarbon {
    source: Option<std::sync::Arc<std::sync::Mutex<crate::carbon::Carbon>>>,
    intensity: Option<crate::carbon::Intensity>,
    /// Grams and joules per process over the windows `top` saw: their ratio is the rate
    /// the gCO2e column applies to the process's energy column.
    grams: std::collections::HashMap<u32, (f64, f64)>,
    rates: CarbonRates,
    /// Grams since start in total (measured, idle included) and of the idle/static row.
    total_g: f64,
    idle_g: f64,
}

impl State {
    /// Shows grams of CO2e at the intensity `carbon` gives at each refresh.
    pub fn set_carbon(&mut self, carbon: crate::carbon::Carbon) {
        self.carbon.source = Some(std::sync::Arc::new(std::sync::Mutex::new(carbon)));
    }

    /// The intensity of the last refresh, when carbon is shown.
    pub fn intensity(&self) -> Option<&crate::carbon::Intensity> {
        self.carbon.intensity.as_ref()
    }

    /// Grams of CO2e of `joules` of process `pid` (its energy column), when carbon is
    /// shown: the same figure as the table's gCO2e column.
    pub fn co2e_g(&self, pid: u32, joules: f64) -> Option<f64> {
        self.carbon.intensity.as_ref()?;
        Some(joules * self.carbon.rates.of(pid))
    }

    /// `carbon: 0.0123 gCO2e since start (idle/static 0.0012) at 33.0 gCO2e/kWh (...)`.
    pub fn carbon_line(&self) -> Option<String> {
        let i = self.carbon.intensity.as_ref()?;
        Some(format!(
            "carbon: {:.6} gCO2e since start (idle/static {:.6}) at {}",
            self.carbon.total_g,
            self.carbon.idle_g,
            i.describe()
        ))
    }

    /// Adds a window's grams (per window, never per event).
    fn add_carbon(&mut self, snapshot: &Snapshot) {
        let Some(source) = &self.carbon.source else {
            return;
        };
        let i = source
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .now();
        let total = snapshot.totals.total_j;
        let c = &mut self.carbon;
        for p in &snapshot.rows {
            let joules = p.share * total;
            let (g, j) = c.grams.entry(p.pid).or_default();
            *g += i.grams(joules);
            *j += joules;
            if *j > 0.0 {
                c.rates.by_pid.insert(p.pid, *g / *j);
            }
        }
        c.rates.latest = i.g_per_joule();
        c.total_g += i.grams(total);
        c.idle_g += i.grams(snapshot.totals.idle_j.max(0.0));
        c.intensity = Some(i);
    }

    /// A fresh session showing only `pids` (all processes when empty), sorted by power.
    pub fn new(pids: Vec<u32>) -> State {
        State {
            pids,
            page: 1,
            ..State::default()
        }
    }

    /// Takes a new snapshot; ignored (returns false) while paused.
    pub fn push_snapshot(&mut self, snapshot: Snapshot) -> bool {
        if self.paused {
            return false;
        }
        self.add_carbon(&snapshot);
        self.snapshot = Some(snapshot);
        self.snapshots_shown += 1;
        self.rebuild();
        true
    }

    /// Records that the feed ended (the collector stopped); the screen says so.
    pub fn set_feed_closed(&mut self) {
        self.feed_closed = true;
    }

    /// Sets how many table lines fit on screen (for PgUp/PgDn and scrolling).
    pub fn set_page_size(&mut self, lines: usize) {
        self.page = lines.max(1);
        self.fix_offset();
    }

    /// Applies one user action.
    pub fn apply(&mut self, action: Action) -> Control {
        match action {
            Action::Quit => return Control::Quit,
            Action::SortBy(column) => {
                self.sort = Sort::by(column);
                self.rebuild();
            }
            Action::SortNext => {
                self.sort = Sort::by(self.sort.column.next());
                self.rebuild();
            }
            Action::SortPrev => {
                self.sort = Sort::by(self.sort.column.prev());
                self.rebuild();
            }
            Action::Reverse => {
                self.sort.descending = !self.sort.descending;
                self.rebuild();
            }
            Action::FilterStart => self.editing = Some(self.filter.clone()),
            Action::FilterInput(c) => {
                if let Some(text) = &mut self.editing {
                    text.push(c);
                    // Filter as you type, like less and htop.
                    self.filter = text.clone();
                    self.rebuild();
                }
            }
            Action::FilterBackspace => {
                if let Some(text) = &mut self.editing {
                    text.pop();
                    self.filter = text.clone();
                    self.rebuild();
                }
            }
            Action::FilterApply => self.editing = None,
            Action::FilterCancel => {
                // Esc while typing clears the filter entirely.
                self.editing = None;
                self.filter.clear();
                self.rebuild();
            }
            Action::TogglePause => self.paused = !self.paused,
            Action::ToggleExpand => self.toggle_expand(),
            Action::ToggleGrouping => {
                self.grouping = match self.grouping {
                    Grouping::Process => Grouping::Cgroup,
                    Grouping::Cgroup => Grouping::Container,
                    Grouping::Container => Grouping::Vm,
                    Grouping::Vm => Grouping::Process,
                };
                self.rebuild();
            }
            Action::Up => self.select(self.selected.saturating_sub(1)),
            Action::Down => self.select(self.selected.saturating_add(1)),
            Action::PageUp => self.select(self.selected.saturating_sub(self.page)),
            Action::PageDown => self.select(self.selected.saturating_add(self.page)),
            Action::Home => self.select(0),
            Action::End => self.select(usize::MAX),
            Action::ToggleHelp => self.show_help = !self.show_help,
            Action::CloseHelp => self.show_help = false,
        }
        Control::Continue
    }

    fn toggle_expand(&mut self) {
        let Some(row) = self.rows.get(self.selected) else {
            return;
        };
        if !row.expandable {
            return;
        }
        let key = row.key.clone();
        if !self.expanded.remove(&key) {
            self.expanded.insert(key);
        }
        self.rebuild();
    }

    fn select(&mut self, index: usize) {
        self.selected = index.min(self.rows.len().saturating_sub(1));
        self.selected_key = self.rows.get(self.selected).map(|r| r.key.clone());
        self.fix_offset();
    }

    /// Recomputes the visible lines and keeps the selection on the same entry when it is
    /// still visible (otherwise on the same position).
    fn rebuild(&mut self) {
        let opts = ViewOptions {
            sort: self.sort,
            filter: &self.filter,
            grouping: self.grouping,
            expanded: &self.expanded,
            pids: &self.pids,
            carbon: self.carbon.intensity.as_ref().map(|_| &self.carbon.rates),
        };
        self.rows = match &self.snapshot {
            Some(s) => build_rows(&s.rows, &opts),
            None => Vec::new(),
        };
        let by_key = self
            .selected_key
            .as_ref()
            .and_then(|key| self.rows.iter().position(|r| &r.key == key));
        self.select(by_key.unwrap_or(self.selected));
    }

    /// Keeps the selected line inside the window of `page` lines starting at `offset`.
    fn fix_offset(&mut self) {
        if self.selected < self.offset {
            self.offset = self.selected;
        } else if self.selected >= self.offset + self.page {
            self.offset = self.selected + 1 - self.page;
        }
        // Do not leave empty space below the last line after shrinking.
        let max_offset = self.rows.len().saturating_sub(self.page);
        self.offset = self.offset.min(max_offset);
    }

    /// Where key presses go now.
    pub fn mode(&self) -> Mode {
        if self.editing.is_some() {
            Mode::Filter
        } else if self.show_help {
            Mode::Help
        } else {
            Mode::Normal
        }
    }
    /// The latest accepted snapshot.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.snapshot.as_ref()
    }
    /// How many snapshots have been accepted (not counting those ignored while paused).
    pub fn snapshots_shown(&self) -> u64 {
        self.snapshots_shown
    }
    /// The visible lines, in order.
    pub fn rows(&self) -> &[TableRow] {
        &self.rows
    }
    /// Index of the selected line in [`State::rows`].
    pub fn selected(&self) -> usize {
        self.selected
    }
    /// Index of the first line on screen.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// Current sort.
    pub fn sort(&self) -> Sort {
        self.sort
    }
    /// Current grouping.
    pub fn grouping(&self) -> Grouping {
        self.grouping
    }
    /// The filter in effect.
    pub fn filter(&self) -> &str {
        &self.filter
    }
    /// The filter being typed, when the filter prompt is open.
    pub fn editing(&self) -> Option<&str> {
        self.editing.as_deref()
    }
    /// Whether new snapshots are ignored.
    pub fn paused(&self) -> bool {
        self.paused
    }
    /// Whether the help overlay is shown.
    pub fn show_help(&self) -> bool {
        self.show_help
    }
    /// Whether the feed has ended.
    pub fn feed_closed(&self) -> bool {
        self.feed_closed
    }
    /// PIDs given with `-p` (empty: all).
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
