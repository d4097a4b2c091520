//! Key bindings: which key press means which [`Action`].
//!
//! Pure mapping from crossterm key events; the help overlay and help line are generated
//! from [`BINDINGS`] so they cannot drift from the code.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::table::SortColumn;

/// Something the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Leave `top`.
    Quit,
    /// Sort by a column in its natural direction.
    SortBy(SortColumn),
    /// Sort by the column to the right.
    SortNext,
    /// Sort by the column to the left.
    SortPrev,
    /// Reverse the sort direction.
    Reverse,
    /// Open the filter prompt.
    FilterStart,
    /// A character typed into the filter prompt.
    FilterInput(char),
    /// Backspace in the filter prompt.
    FilterBackspace,
    /// Close the prompt keeping the filter.
    FilterApply,
    /// Close the prompt and clear the filter.
    FilterCancel,
    /// Freeze or resume the display.
    TogglePause,
    /// Expand or collapse the selected process or group.
    ToggleExpand,
    /// Cycle the rows: processes, cgroups, containers, VMs.
    ToggleGrouping,
    /// Selection up one line.
    Up,
    /// Selection down one line.
    Down,
    /// Selection up one screen.
    PageUp,
    /// Selection down one screen.
    PageDown,
    /// Selection to the first line.
    Home,
    /// Selection to the last line.
    End,
    /// Show or hide the help overlay.
    ToggleHelp,
    /// Hide the help overlay.
    CloseHelp,
}

/// Where key presses go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The table has the keys.
    Normal,
    /// The help overlay is open: Esc closes it instead of quitting.
    Help,
    /// The `/` filter prompt is open: printable keys are text.
    Filter,
}

/// Keys and what they do, for the help overlay (key, description).
pub const BINDINGS: &[(&str, &str)] = &[
    (
        "P E C S N A",
        "sort by power, energy, cpu, share, pid, command",
    ),
    ("< >", "sort by the column left / right"),
    ("r", "reverse the sort"),
    ("/", "filter by name (Enter keeps, Esc clears)"),
    ("space", "pause / resume"),
    ("Enter e", "expand / collapse the selected process or group"),
    ("g", "group by process / cgroup / container (or pod) / VM"),
    ("Up Down PgUp PgDn Home End", "move the selection"),
    ("?", "this help"),
    ("q Esc Ctrl-C", "quit"),
];

/// The one-line reminder at the bottom of the screen.
pub const HELP_LINE: &str = "q quit  ? help  P/E/C/S/N/A sort  </> column  r reverse  \
                             / filter  space pause  e expand  g cgroups";

/// The action for a key press in `mode`, if any.
pub fn action_for(key: KeyEvent, mode: Mode) -> Option<Action> {
    if key.kind != KeyEventKind::Press {
        return None;
    }
    // Raw mode turns Ctrl-C into a key: it must quit from everywhere.
    if key.modifiers.contains(KeyModifiers::CONTROL) {
        return match key.code {
            KeyCode::Char('c') | KeyCode::Char('C') => Some(Action::Quit),
            _ => None,
        };
    }
    match mode {
        Mode::Filter => filter_key(key.code),
        Mode::Help if key.code == KeyCode::Esc => Some(Action::CloseHelp),
        Mode::Help | Mode::Normal => normal_key(key.code),
    }
}

fn filter_key(code: KeyCode) -> Option<Action> {
    match code {
        KeyCode::Enter => Some(Action::FilterApply),
        KeyCode::Esc => Some(Action::FilterCancel),
        KeyCode::Backspace => Some(Action::FilterBackspace),
        KeyCode::Char(c) => Some(Action::FilterInput(c)),
        _ => None,
    }
}

fn normal_key(code: KeyCode) -> Option<Action> {
    let action = match code {
        KeyCode::Char('q') | KeyCode::Esc => Action::Quit,
        KeyCode::Char('P') => Action::SortBy(SortColumn::Power),
        KeyCode::Char('E') => Action::SortBy(SortColumn::Energy),
        KeyCode::Char('C') => Action::SortBy(SortColumn::Cpu),
        KeyCode::Char('S') => Action::SortBy(SortColumn::Share),
        KeyCode::Char('N') => Action::SortBy(SortColumn::Pid),
        KeyCode::Char('A') => Action::SortBy(SortColumn::Command),
        KeyCode::Char('<') => Action::SortPrev,
        KeyCode::Char('>') => Action::SortNext,
        KeyCode::Char('r') | KeyCode::Char('R') => Action::Reverse,
        KeyCode::Char('/') => Action::FilterStart,
        KeyCode::Char(' ') => Action::TogglePause,
        KeyCode::Enter | KeyCode::Char('e') => Action::ToggleExpand,
        KeyCode::Char('g') => Action::ToggleGrouping,
        KeyCode::Up | KeyCode::Char('k') => Action::Up,
        KeyCode::Down | KeyCode::Char('j') => Action::Down,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::Home => Action::Home,
        KeyCode::End => Action::End,
        KeyCode::Char('?') | KeyCode::Char('h') => Action::ToggleHelp,
        _ => return None,
    };
    Some(action)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn sort_keys_map_to_their_columns() {
        let cases = [
            ('P', SortColumn::Power),
            ('E', SortColumn::Energy),
            ('C', SortColumn::Cpu),
            ('S', SortColumn::Share),
            ('N', SortColumn::Pid),
            ('A', SortColumn::Command),
        ];
        for (key, column) in cases {
            assert_eq!(
                action_for(press(KeyCode::Char(key)), Mode::Normal),
                Some(Action::SortBy(column)),
                "key {key}"
            );
        }
    }

    #[test]
    fn ctrl_c_quits_in_every_mode() {
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        for mode in [Mode::Normal, Mode::Help, Mode::Filter] {
            assert_eq!(action_for(ctrl_c, mode), Some(Action::Quit), "{mode:?}");
        }
    }

    #[test]
    fn filter_mode_takes_letters_as_text() {
        assert_eq!(
            action_for(press(KeyCode::Char('q')), Mode::Filter),
            Some(Action::FilterInput('q'))
        );
        assert_eq!(
            action_for(press(KeyCode::Esc), Mode::Filter),
            Some(Action::FilterCancel)
        );
        assert_eq!(
            action_for(press(KeyCode::Enter), Mode::Filter),
            Some(Action::FilterApply)
        );
    }

    #[test]
    fn esc_closes_help_before_quitting() {
        assert_eq!(
            action_for(press(KeyCode::Esc), Mode::Help),
            Some(Action::CloseHelp)
        );
        assert_eq!(
            action_for(press(KeyCode::Esc), Mode::Normal),
            Some(Action::Quit)
        );
        assert_eq!(
            action_for(press(KeyCode::Char('q')), Mode::Normal),
            Some(Action::Quit)
        );
    }

    #[test]
    fn navigation_and_toggles() {
        let cases = [
            (KeyCode::Char(' '), Action::TogglePause),
            (KeyCode::Enter, Action::ToggleExpand),
            (KeyCode::Char('e'), Action::ToggleExpand),
            (KeyCode::Char('g'), Action::ToggleGrouping),
            (KeyCode::Char('r'), Action::Reverse),
            (KeyCode::Char('<'), Action::SortPrev),
            (KeyCode::Char('>'), Action::SortNext),
            (KeyCode::Char('/'), Action::FilterStart),
            (KeyCode::Up, Action::Up),
            (KeyCode::Down, Action::Down),
            (KeyCode::PageUp, Action::PageUp),
            (KeyCode::PageDown, Action::PageDown),
            (KeyCode::Char('?'), Action::ToggleHelp),
        ];
        for (code, action) in cases {
            assert_eq!(
                action_for(press(code), Mode::Normal),
                Some(action),
                "{code:?}"
            );
        }
        assert_eq!(action_for(press(KeyCode::Char('x')), Mode::Normal), None);
    }

    #[test]
    fn key_releases_are_ignored() {
        let mut release = press(KeyCode::Char('q'));
        release.kind = KeyEventKind::Release;
        assert_eq!(action_for(release, Mode::Normal), None);
    }
}
