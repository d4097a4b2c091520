use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::*;
use crate::tui::fixtures::snapshot;
use crate::tui::input::Action;
use crate::tui::table::SortColumn;

/// Draws `state` on a `width` x `height` test terminal and returns the screen's lines.
fn screen(state: &mut State, width: u16, height: u16) -> Vec<String> {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test backend");
    let capacity = table_capacity(Rect::new(0, 0, width, height), state);
    state.set_page_size(capacity);
    terminal
        .draw(|frame| render(frame, state))
        .expect("drawing on a test backend");
    let buffer = terminal.backend().buffer();
    (0..height)
        .map(|y| {
            (0..width)
                .map(|x| buffer[(x, y)].symbol())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect()
}

/// First whitespace-separated word of each table line (below the column titles).
fn first_column(lines: &[String]) -> Vec<String> {
    lines[4..lines.len() - 1]
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

fn loaded(estimated: bool) -> State {
    let mut state = State::new(Vec::new());
    state.push_snapshot(snapshot(estimated));
    state
}

#[test]
fn header_shows_source_domains_gpu_idle_rate_and_losses() {
    let lines = screen(&mut loaded(false), 160, 12);
    assert_eq!(
        lines[0],
        "energy-bpf top - source: powercap - sampling 49 Hz - lost events 7 - 2 CPUs - interval 1.00 s"
    );
    assert_eq!(
        lines[1],
        "Power: total 50.00 W | package-0 25.50 W | dram-0 3.25 W | GPU gpu-0 21.25 W | idle/static 10.00 W (20.0%) | activity none: split by time"
    );
    assert_eq!(
        lines[2],
        "Sort: power (descending) | group by: process | 4 lines, 4 processes"
    );
    assert!(!lines.concat().contains("estimated"), "{lines:#?}");
}

#[test]
fn unidentified_static_power_gets_a_header_line_saying_what_to_do() {
    let mut state = State::new(Vec::new());
    state.push_snapshot(crate::tui::fixtures::unidentified(snapshot(false)));
    let lines = screen(&mut state, 220, 14);
    assert!(
        lines[2].starts_with(
            "WARNING static power of package-0 unidentified (utilisation never varied"
        ),
        "{lines:#?}"
    );
    assert!(
        lines[2].contains("run `energy-bpf calibrate`") && lines[2].contains("--static-power-w"),
        "{}",
        lines[2]
    );
    assert!(lines[3].starts_with("Sort:"), "{}", lines[3]);
    assert!(lines[4].contains("PID"), "{}", lines[4]);
    // The table gives the warning its line: every process still fits.
    assert!(lines[8].contains("zsh"), "{lines:#?}");
}

#[test]
fn table_titles_and_rows_follow_the_sort() {
    let mut state = loaded(false);
    let lines = screen(&mut state, 120, 12);
    let titles: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(
        titles,
        [
            "PID", "Power", "W▼", "Energy", "J", "CPU", "%", "Share", "%", "Command"
        ]
    );
    assert_eq!(first_column(&lines), ["300", "20", "4000", "1"]);
    let busiest: Vec<&str> = lines[4].split_whitespace().collect();
    assert_eq!(
        busiest,
        [
            "300",
            "20.00",
            "5.0",
            "40.0",
            "40.0",
            "▸",
            "/usr/bin/postgres",
            "--run"
        ]
    );

    state.apply(Action::SortBy(SortColumn::Energy));
    let lines = screen(&mut state, 120, 12);
    assert!(lines[3].contains("Energy J▼"), "{}", lines[3]);
    assert_eq!(first_column(&lines), ["4000", "1", "20", "300"]);
    state.apply(Action::Reverse);
    let lines = screen(&mut state, 120, 12);
    assert!(lines[3].contains("Energy J▲"), "{}", lines[3]);
    assert_eq!(first_column(&lines), ["300", "20", "1", "4000"]);
}

#[test]
fn estimated_power_is_tagged_in_header_titles_and_values() {
    let lines = screen(&mut loaded(true), 160, 12);
    assert!(
        lines[0].contains("source: model (estimated)"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with("Power (estimated): total 50.00 W"),
        "{}",
        lines[1]
    );
    assert!(lines[3].contains("Power W (estimated)▼"), "{}", lines[3]);
    assert!(lines[3].contains("Energy J (estimated)"), "{}", lines[3]);
    let busiest: Vec<&str> = lines[4].split_whitespace().collect();
    assert_eq!(busiest[..3], ["300", "~20.00", "~5.0"]);
}

#[test]
fn expanded_threads_are_indented_under_their_process() {
    let mut state = loaded(false);
    state.apply(Action::ToggleExpand);
    let lines = screen(&mut state, 120, 12);
    assert_eq!(
        first_column(&lines),
        ["300", "301", "302", "20", "4000", "1"]
    );
    assert!(lines[4].contains("▾ /usr/bin/postgres"), "{}", lines[4]);
    assert!(lines[5].ends_with("  └ pg-writer"), "{}", lines[5]);
}

#[test]
fn help_line_filter_prompt_and_overlay() {
    let mut state = loaded(false);
    let lines = screen(&mut state, 120, 12);
    assert!(lines[11].starts_with("q quit  ? help"), "{}", lines[11]);

    state.apply(Action::FilterStart);
    for c in "ngi".chars() {
        state.apply(Action::FilterInput(c));
    }
    let lines = screen(&mut state, 120, 12);
    assert_eq!(lines[11], "Filter: ngi_   (Enter keep, Esc clear)");
    assert_eq!(first_column(&lines), ["20"]);
    assert!(lines[2].contains("filter: \"ngi\""), "{}", lines[2]);

    state.apply(Action::FilterApply);
    state.apply(Action::ToggleHelp);
    let lines = screen(&mut state, 120, 20).concat();
    assert!(lines.contains("energy-bpf top: keys"), "{lines}");
    assert!(lines.contains("sort by power, energy, cpu, share, pid, command"));
}

#[test]
fn only_the_window_around_the_selection_is_drawn() {
    let mut state = loaded(false);
    // 8 lines: 3 header + titles + 3 table lines + help line.
    let height = 8;
    let capacity = table_capacity(Rect::new(0, 0, 120, height), &state);
    state.set_page_size(capacity);
    state.apply(Action::End);
    let lines = screen(&mut state, 120, height);
    assert_eq!(first_column(&lines), ["20", "4000", "1"]);
}

#[test]
fn waiting_and_tiny_screens_do_not_panic() {
    let mut state = State::new(Vec::new());
    let lines = screen(&mut state, 80, 6);
    assert_eq!(lines[0], "energy-bpf top - waiting for the first interval");
    let mut state = loaded(true);
    state.apply(Action::ToggleHelp);
    let lines = screen(&mut state, 10, 3);
    assert_eq!(lines.len(), 3);
}

#[test]
fn with_an_intensity_the_table_has_a_grams_column_after_the_energy() {
    let mut state = State::new(Vec::new());
    state.set_carbon(crate::carbon::Carbon {
        source: crate::carbon::Source::Fixed(400.0),
        pue: 1.0,
    });
    state.push_snapshot(snapshot(true));
    let lines = screen(&mut state, 200, 14);
    let titles = lines
        .iter()
        .find(|l| l.trim_start().starts_with("PID"))
        .expect("title line");
    let energy = titles.find("Energy J (estimated)").expect("energy title");
    let grams = titles.find("gCO2e (estimated)").expect("grams title");
    let cpu = titles.find("CPU %").expect("cpu title");
    assert!(energy < grams && grams < cpu, "{titles}");
    assert!(
        lines.iter().any(|l| l.starts_with("carbon: ")),
        "{lines:#?}"
    );
    let without = screen(&mut loaded(true), 200, 14);
    assert!(!without.concat().contains("gCO2e"), "{without:#?}");
}
