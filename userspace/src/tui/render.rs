//! Draws a [`State`] into a ratatui [`Frame`]: header, process table, help line, help
//! overlay. Pure (no I/O): tested with ratatui's `TestBackend`.
//!
//! Only the lines that fit on screen are turned into widgets, so a frame costs the same
//! with 50 or 5,000 processes.

use ratatui::Frame;
use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table};

use super::format::{
    column_titles, command_cell, estimated, numeric_cells, power_line, summary_line, view_line,
    warning_lines,
};
use super::input::{BINDINGS, HELP_LINE};
use super::state::State;
use super::table::SortColumn;

/// Lines above the table: summary, power, view, then one per warning.
const HEADER_LINES: u16 = 3;
/// Lines below the table: the help line or filter prompt.
const FOOTER_LINES: u16 = 1;

/// Header height for `state`: the fixed lines and its warnings.
fn header_lines(state: &State) -> u16 {
    HEADER_LINES + u16::try_from(warning_lines(state).len()).unwrap_or(u16::MAX)
}

/// How many table lines fit in a screen of this size (for paging and scrolling).
pub fn table_capacity(area: Rect, state: &State) -> usize {
    // One more line for the column titles.
    usize::from(
        area.height
            .saturating_sub(header_lines(state).saturating_add(FOOTER_LINES + 1)),
    )
}

/// Draws the whole screen.
pub fn render(frame: &mut Frame<'_>, state: &State) {
    let [header, table, footer] = Layout::vertical([
        Constraint::Length(header_lines(state)),
        Constraint::Min(1),
        Constraint::Length(FOOTER_LINES),
    ])
    .areas(frame.area());
    render_header(frame, header, state);
    render_table(frame, table, state);
    render_footer(frame, footer, state);
    if state.show_help() {
        render_help(frame, frame.area());
    }
}

fn render_header(frame: &mut Frame<'_>, area: Rect, state: &State) {
    let lines = vec![
        Line::styled(
            summary_line(state),
            Style::new().add_modifier(Modifier::BOLD),
        ),
        Line::raw(power_line(state)),
    ];
    let warnings = warning_lines(state)
        .into_iter()
        .map(|w| Line::styled(w, Style::new().add_modifier(Modifier::BOLD)));
    let lines: Vec<Line<'_>> = lines
        .into_iter()
        .chain(warnings)
        .chain([Line::raw(view_line(state))])
        .collect();
    frame.render_widget(Paragraph::new(lines), area);
}

fn render_table(frame: &mut Frame<'_>, area: Rect, state: &State) {
    let est = estimated(state);
    let sort = state.sort();
    let columns = column_titles(est, state.intensity().is_some());
    let titles = columns.iter().map(|&(column, title)| {
        let text = if column == Some(sort.column) {
            let arrow = if sort.descending { '▼' } else { '▲' };
            format!("{title}{arrow}")
        } else {
            title.to_string()
        };
        if column == Some(SortColumn::Command) {
            Cell::from(text)
        } else {
            Cell::from(Line::from(text).alignment(Alignment::Right))
        }
    });
    let widths = columns.iter().map(|&(column, title)| match column {
        Some(SortColumn::Command) => Constraint::Fill(1),
        // Room for the title and its sort arrow; numbers are shorter than the titles.
        Some(_) => Constraint::Length(title.chars().count().max(6) as u16 + 1),
        // Grams take up to nine decimals (`~0.000001234`).
        None => Constraint::Length(title.chars().count().max(12) as u16),
    });

    let visible = table_capacity(frame.area(), state);
    let start = state.offset().min(state.rows().len());
    let end = (start + visible).min(state.rows().len());
    let rows = state.rows()[start..end].iter().enumerate().map(|(i, row)| {
        let mut cells: Vec<Cell<'_>> = numeric_cells(row, est)
            .into_iter()
            .map(|text| Cell::from(Line::from(text).alignment(Alignment::Right)))
            .collect();
        cells.push(Cell::from(command_cell(row, false)));
        let line = Row::new(cells);
        if start + i == state.selected() {
            line.style(Style::new().add_modifier(Modifier::REVERSED))
        } else {
            line
        }
    });
    let table = Table::new(rows, widths)
        .header(
            Row::new(titles)
                .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED)),
        )
        .column_spacing(1);
    frame.render_widget(table, area);
}

fn render_footer(frame: &mut Frame<'_>, area: Rect, state: &State) {
    let line = match state.editing() {
        Some(text) => Line::raw(format!("Filter: {text}_   (Enter keep, Esc clear)")),
        None => Line::styled(HELP_LINE, Style::new().add_modifier(Modifier::DIM)),
    };
    frame.render_widget(Paragraph::new(line), area);
}

fn render_help(frame: &mut Frame<'_>, screen: Rect) {
    let key_width = BINDINGS.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut lines: Vec<Line<'_>> = BINDINGS
        .iter()
        .map(|(keys, what)| Line::raw(format!(" {keys:<key_width$}  {what}")))
        .collect();
    lines.push(Line::raw(""));
    lines.push(Line::raw(format!(
        " Values marked {} come from a model (estimated), not a counter.",
        super::format::ESTIMATED_MARK
    )));
    let width = lines.iter().map(Line::width).max().unwrap_or(0) as u16 + 3;
    let height = lines.len() as u16 + 2;
    let area = centered(screen, width, height);
    frame.render_widget(Clear, area);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::new()
                .borders(Borders::ALL)
                .title(" energy-bpf top: keys (? or Esc closes) "),
        ),
        area,
    );
}

fn centered(screen: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(screen.width);
    let height = height.min(screen.height);
    Rect {
        x: screen.x + (screen.width - width) / 2,
        y: screen.y + (screen.height - height) / 2,
        width,
        height,
    }
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
