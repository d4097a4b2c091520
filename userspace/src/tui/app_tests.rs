use std::collections::VecDeque;
use std::sync::mpsc;

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::*;
use crate::tui::fixtures::snapshot;
use crate::tui::table::SortColumn;

/// Plays a fixed list of events: `None` is a key wait that timed out.
struct Script(VecDeque<Option<Event>>);

impl Script {
    fn new(events: Vec<Option<Event>>) -> Script {
        Script(events.into())
    }
}

impl EventSource for Script {
    fn next_event(&mut self, timeout: Duration) -> io::Result<Option<Event>> {
        if timeout.is_zero() {
            // A non-blocking drain only takes events that are already queued.
            if matches!(self.0.front(), Some(Some(_))) {
                return Ok(self.0.pop_front().flatten());
            }
            return Ok(None);
        }
        match self.0.pop_front() {
            Some(event) => Ok(event),
            None => panic!("event script exhausted: the loop did not stop when expected"),
        }
    }
}

fn key(c: char) -> Option<Event> {
    Some(Event::Key(KeyEvent::new(
        KeyCode::Char(c),
        KeyModifiers::NONE,
    )))
}

fn terminal() -> Terminal<TestBackend> {
    Terminal::new(TestBackend::new(120, 20)).expect("test backend")
}

fn screen_text(terminal: &Terminal<TestBackend>) -> String {
    let buffer = terminal.backend().buffer();
    buffer.content().iter().map(|c| c.symbol()).collect()
}

#[test]
fn idle_loop_draws_once_and_only_wakes_per_tick() {
    let (_tx, rx) = mpsc::channel::<Snapshot>();
    let mut state = State::new(Vec::new());
    let mut script = Script::new(vec![None, None, None, None, None, key('q')]);
    let (exit, stats) = event_loop(
        &mut terminal(),
        &mut script,
        &rx,
        &mut state,
        &StopSignals::none(),
        None,
    )
    .expect("loop runs");
    assert_eq!(exit, Exit::Quit);
    assert_eq!(
        stats,
        LoopStats {
            draws: 1,
            wakeups: 6
        }
    );
}

#[test]
fn snapshots_and_keys_each_cause_one_redraw() {
    let (tx, rx) = mpsc::channel();
    // Two queued snapshots: only the newest is drawn.
    tx.send(snapshot(false)).expect("receiver alive");
    tx.send(snapshot(true)).expect("receiver alive");
    let mut state = State::new(Vec::new());
    let mut term = terminal();
    let mut script = Script::new(vec![None, key('N'), None, key('q')]);
    let (exit, stats) = event_loop(
        &mut term,
        &mut script,
        &rx,
        &mut state,
        &StopSignals::none(),
        None,
    )
    .expect("loop runs");
    assert_eq!(exit, Exit::Quit);
    // Initial frame, the snapshot, the sort key; the last tick changed nothing.
    assert_eq!(stats.draws, 3);
    assert_eq!(state.snapshots_shown(), 1);
    assert_eq!(state.sort().column, SortColumn::Pid);
    assert!(screen_text(&term).contains("Power W (estimated)"));
}

#[test]
fn queued_keys_are_handled_before_one_redraw() {
    let (_tx, rx) = mpsc::channel::<Snapshot>();
    let mut state = State::new(Vec::new());
    let enter = Some(Event::Key(KeyEvent::new(
        KeyCode::Enter,
        KeyModifiers::NONE,
    )));
    let mut script = Script::new(vec![key('/'), key('a'), key('b'), None, enter, key('q')]);
    let (_, stats) = event_loop(
        &mut terminal(),
        &mut script,
        &rx,
        &mut state,
        &StopSignals::none(),
        None,
    )
    .expect("loop runs");
    // '/' 'a' 'b' arrive together: one redraw for all three.
    assert_eq!(stats.draws, 2);
    assert_eq!(state.filter(), "ab");
}

#[test]
fn closed_feed_is_shown_and_the_view_stays_up() {
    let (tx, rx) = mpsc::channel();
    tx.send(snapshot(false)).expect("receiver alive");
    drop(tx);
    let mut state = State::new(Vec::new());
    let mut term = terminal();
    let mut script = Script::new(vec![None, None, None, key('q')]);
    let (exit, _) = event_loop(
        &mut term,
        &mut script,
        &rx,
        &mut state,
        &StopSignals::none(),
        None,
    )
    .expect("loop runs");
    assert_eq!(exit, Exit::Quit);
    assert!(state.feed_closed());
    assert!(screen_text(&term).contains("live feed stopped"));
    assert_eq!(state.rows().len(), 4);
}

#[test]
fn stops_after_the_requested_frames() {
    let (tx, rx) = mpsc::channel();
    tx.send(snapshot(false)).expect("receiver alive");
    let mut state = State::new(Vec::new());
    let mut script = Script::new(vec![None]);
    let (exit, stats) = event_loop(
        &mut terminal(),
        &mut script,
        &rx,
        &mut state,
        &StopSignals::none(),
        Some(1),
    )
    .expect("loop runs");
    assert_eq!(exit, Exit::Iterations);
    assert_eq!(stats.draws, 2);
}

#[test]
fn sigterm_ends_the_loop_with_its_number() {
    let (_tx, rx) = mpsc::channel::<Snapshot>();
    let mut state = State::new(Vec::new());
    let signals = StopSignals::register().expect("signal handlers install");
    signal_hook::low_level::raise(signal_hook::consts::SIGTERM).expect("raise SIGTERM");
    let mut script = Script::new(vec![None]);
    let (exit, _) = event_loop(
        &mut terminal(),
        &mut script,
        &rx,
        &mut state,
        &signals,
        None,
    )
    .expect("loop runs");
    assert_eq!(exit, Exit::Signal(signal_hook::consts::SIGTERM));
}

#[test]
fn batch_prints_one_frame_per_snapshot_until_n() {
    let (tx, rx) = mpsc::channel();
    for _ in 0..3 {
        tx.send(snapshot(false)).expect("receiver alive");
    }
    let mut out = Vec::new();
    let mut state = State::new(Vec::new());
    let exit =
        run_batch(&rx, &mut out, &mut state, Some(2), FrameFormat::Text).expect("batch runs");
    assert_eq!(exit, Exit::Iterations);
    let text = String::from_utf8(out).expect("UTF-8");
    assert_eq!(text.matches("energy-bpf top - source: powercap").count(), 2);
    // The third snapshot is still queued: batch mode never reads ahead.
    assert!(rx.try_recv().is_ok());
}

#[test]
fn batch_reports_a_feed_that_ends_early() {
    let (tx, rx) = mpsc::channel();
    tx.send(snapshot(false)).expect("receiver alive");
    drop(tx);
    let mut out = Vec::new();
    let mut state = State::new(Vec::new());
    let exit =
        run_batch(&rx, &mut out, &mut state, Some(5), FrameFormat::Text).expect("batch runs");
    assert_eq!(exit, Exit::FeedClosed);
    assert_eq!(state.snapshots_shown(), 1);
}

/// A writer whose reader went away, like `top -b | head -1` after head exits.
struct ClosedPipe;

impl Write for ClosedPipe {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::BrokenPipe.into())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn batch_ends_quietly_on_a_closed_pipe() {
    let (tx, rx) = mpsc::channel();
    tx.send(snapshot(false)).expect("receiver alive");
    let mut state = State::new(Vec::new());
    let exit =
        run_batch(&rx, &mut ClosedPipe, &mut state, None, FrameFormat::Text).expect("not an error");
    assert_eq!(exit, Exit::Quit);
}

#[test]
fn a_closed_pseudo_terminal_reads_as_hangup() {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two fds into the provided ints; the other arguments may be null.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", io::Error::last_os_error());
    assert!(
        !wait_tty(slave, Duration::from_millis(10)).expect("a live tty waits"),
        "no input yet"
    );
    // SAFETY: `master` is an fd we own and do not use afterwards.
    unsafe { libc::close(master) };
    let err = wait_tty(slave, Duration::from_secs(1)).expect_err("hang-up is reported");
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    // SAFETY: `slave` is an fd we own and do not use afterwards.
    unsafe { libc::close(slave) };
}

/// A terminal that hangs up on the second wait.
struct HangsUp(u32);

impl EventSource for HangsUp {
    fn next_event(&mut self, _: Duration) -> io::Result<Option<Event>> {
        self.0 += 1;
        if self.0 >= 2 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        Ok(None)
    }
}

#[test]
fn hangup_ends_the_loop() {
    let (_tx, rx) = mpsc::channel::<Snapshot>();
    let mut state = State::new(Vec::new());
    let (exit, stats) = event_loop(
        &mut terminal(),
        &mut HangsUp(0),
        &rx,
        &mut state,
        &StopSignals::none(),
        None,
    )
    .expect("a hang-up is not an error");
    assert_eq!(exit, Exit::Hangup);
    assert_eq!(stats.wakeups, 1);
}
