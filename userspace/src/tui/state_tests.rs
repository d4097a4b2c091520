use super::*;
use crate::tui::fixtures::snapshot;
use crate::tui::table::SortColumn;

fn ids(state: &State) -> Vec<&str> {
    state.rows().iter().map(|r| r.id.as_str()).collect()
}

fn loaded() -> State {
    let mut state = State::new(Vec::new());
    assert!(state.push_snapshot(snapshot(false)));
    state.set_page_size(10);
    state
}

fn type_filter(state: &mut State, text: &str) {
    state.apply(Action::FilterStart);
    for c in text.chars() {
        state.apply(Action::FilterInput(c));
    }
}

#[test]
fn starts_sorted_by_power_descending() {
    let state = loaded();
    assert_eq!(state.sort(), Sort::by(SortColumn::Power));
    assert!(state.sort().descending);
    assert_eq!(ids(&state), ["300", "20", "4000", "1"]);
}

#[test]
fn sort_actions_reorder_rows() {
    let mut state = loaded();
    let cases = [
        (SortColumn::Energy, ["4000", "1", "20", "300"]),
        (SortColumn::Cpu, ["20", "4000", "300", "1"]),
        (SortColumn::Share, ["300", "20", "4000", "1"]),
        (SortColumn::Pid, ["1", "20", "300", "4000"]),
        (SortColumn::Command, ["4000", "20", "300", "1"]),
        (SortColumn::Power, ["300", "20", "4000", "1"]),
    ];
    for (column, expected) in cases {
        assert_eq!(state.apply(Action::SortBy(column)), Control::Continue);
        assert_eq!(ids(&state), expected, "{column:?}");
    }
    state.apply(Action::Reverse);
    assert_eq!(ids(&state), ["1", "4000", "20", "300"]);
    // Moving the column picks the neighbour in its natural direction.
    state.apply(Action::SortNext);
    assert_eq!(state.sort(), Sort::by(SortColumn::Energy));
    state.apply(Action::SortPrev);
    state.apply(Action::SortPrev);
    assert_eq!(state.sort(), Sort::by(SortColumn::Pid));
    assert_eq!(ids(&state), ["1", "20", "300", "4000"]);
}

#[test]
fn filter_applies_while_typing_and_esc_clears_it() {
    let mut state = loaded();
    type_filter(&mut state, "post");
    assert_eq!(state.mode(), Mode::Filter);
    assert_eq!(state.editing(), Some("post"));
    assert_eq!(ids(&state), ["300"]);
    state.apply(Action::FilterBackspace);
    assert_eq!(state.filter(), "pos");
    state.apply(Action::FilterApply);
    assert_eq!(state.mode(), Mode::Normal);
    assert_eq!(state.filter(), "pos");
    assert_eq!(ids(&state), ["300"]);
    // The filter survives new snapshots.
    state.push_snapshot(snapshot(false));
    assert_eq!(ids(&state), ["300"]);
    type_filter(&mut state, "x");
    state.apply(Action::FilterCancel);
    assert_eq!(state.filter(), "");
    assert_eq!(state.rows().len(), 4);
}

#[test]
fn expand_and_collapse_the_selected_process() {
    let mut state = loaded();
    assert_eq!(state.selected(), 0);
    state.apply(Action::ToggleExpand);
    assert_eq!(ids(&state), ["300", "301", "302", "20", "4000", "1"]);
    // Expansion is kept across snapshots.
    state.push_snapshot(snapshot(false));
    assert_eq!(state.rows().len(), 6);
    state.apply(Action::ToggleExpand);
    assert_eq!(ids(&state), ["300", "20", "4000", "1"]);
    // A process without threads does not expand.
    state.apply(Action::End);
    state.apply(Action::ToggleExpand);
    assert_eq!(state.rows().len(), 4);
}

#[test]
fn grouping_cycles_through_processes_cgroups_and_containers() {
    let mut state = loaded();
    state.apply(Action::ToggleGrouping);
    assert_eq!(state.grouping(), Grouping::Cgroup);
    let labels: Vec<&str> = state.rows().iter().map(|r| r.command.as_str()).collect();
    assert_eq!(labels, ["docker:0123456789ab", "/user.slice"]);
    state.apply(Action::ToggleExpand);
    assert_eq!(ids(&state), ["[2]", "300", "20", "[2]"]);
    state.apply(Action::ToggleGrouping);
    assert_eq!(state.grouping(), Grouping::Container);
    let mut labels: Vec<String> = state.rows().iter().map(|r| r.command.clone()).collect();
    labels.sort();
    assert_eq!(labels.len(), 2, "{labels:?}");
    assert!(labels.iter().any(|l| l.contains("[host]")), "{labels:?}");
    state.apply(Action::ToggleGrouping);
    assert_eq!(state.grouping(), Grouping::Vm);
    let labels: Vec<&str> = state.rows().iter().map(|r| r.command.as_str()).collect();
    assert!(
        labels.iter().all(|l| l.contains("[host]")),
        "no VMs here: {labels:?}"
    );
    state.apply(Action::ToggleGrouping);
    assert_eq!(state.grouping(), Grouping::Process);
    assert_eq!(ids(&state), ["300", "20", "4000", "1"]);
}

#[test]
fn snapshots_are_ignored_while_paused() {
    let mut state = loaded();
    state.apply(Action::TogglePause);
    assert!(state.paused());
    let mut changed = snapshot(false);
    changed.rows.truncate(1);
    assert!(!state.push_snapshot(changed.clone()));
    assert_eq!(state.rows().len(), 4);
    assert_eq!(state.snapshots_shown(), 1);
    state.apply(Action::TogglePause);
    assert!(state.push_snapshot(changed));
    assert_eq!(state.rows().len(), 1);
    assert_eq!(state.snapshots_shown(), 2);
}

#[test]
fn selection_follows_the_process_when_the_order_changes() {
    let mut state = loaded();
    state.apply(Action::Down);
    assert_eq!(state.rows()[state.selected()].id, "20");
    state.apply(Action::SortBy(SortColumn::Pid));
    assert_eq!(state.selected(), 1);
    state.apply(Action::SortBy(SortColumn::Energy));
    assert_eq!(state.rows()[state.selected()].id, "20");
    assert_eq!(state.selected(), 2);
}

#[test]
fn selection_is_clamped_and_pages_scroll_the_window() {
    let mut state = loaded();
    state.set_page_size(2);
    state.apply(Action::Up);
    assert_eq!(state.selected(), 0);
    state.apply(Action::PageDown);
    assert_eq!(state.selected(), 2);
    assert_eq!(state.offset(), 1);
    state.apply(Action::PageDown);
    assert_eq!(state.selected(), 3);
    assert_eq!(state.offset(), 2);
    state.apply(Action::PageUp);
    assert_eq!(state.selected(), 1);
    assert_eq!(state.offset(), 1);
    state.apply(Action::Home);
    assert_eq!((state.selected(), state.offset()), (0, 0));
}

#[test]
fn help_toggles_and_quit_is_reported() {
    let mut state = loaded();
    state.apply(Action::ToggleHelp);
    assert_eq!(state.mode(), Mode::Help);
    state.apply(Action::CloseHelp);
    assert_eq!(state.mode(), Mode::Normal);
    assert_eq!(state.apply(Action::Quit), Control::Quit);
}

#[test]
fn pid_filter_from_the_command_line_applies() {
    let mut state = State::new(vec![20]);
    state.push_snapshot(snapshot(false));
    assert_eq!(ids(&state), ["20"]);
}
