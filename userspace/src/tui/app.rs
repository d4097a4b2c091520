//! The run loops: full-screen (keys + snapshots) and batch (snapshots only).
//!
//! Collection never blocks drawing: snapshots arrive over an mpsc channel from whatever
//! thread builds them, and the loop only waits on key input with a short timeout, then
//! takes whatever snapshots are queued without blocking. It redraws only after a snapshot,
//! a key or a resize, so an idle `top` costs a few wakeups per second and nothing else.

use std::io::{self, IsTerminal, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::Backend;
use ratatui::crossterm::event::{self, Event};

use super::TuiError;
use super::batch::{FrameFormat, write_frame, write_json_frame};
use super::input::action_for;
use super::render::{render, table_capacity};
use super::snapshot::Snapshot;
use super::state::{Control, State};
use super::terminal::{StopSignals, TerminalGuard, panicked};

/// How long one wait for a key lasts: bounds the delay before a queued snapshot or a
/// caught signal is noticed, and the wakeups per second when nothing happens.
pub const TICK: Duration = Duration::from_millis(100);

/// Why a run loop ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The user quit (q, Esc, Ctrl-C).
    Quit,
    /// The requested number of frames (`-n`) was shown.
    Iterations,
    /// A stop signal arrived (its number).
    Signal(i32),
    /// The terminal went away (window or pane closed, ssh dropped).
    Hangup,
    /// Batch mode only: the feed ended before the requested number of frames.
    FeedClosed,
}

/// Where key and resize events come from (the terminal, or a script in tests).
pub trait EventSource {
    /// The next event, waiting at most `timeout`; `None` when none arrived.
    fn next_event(&mut self, timeout: Duration) -> io::Result<Option<Event>>;
}

/// Events of the controlling terminal.
///
/// crossterm 0.29 spins forever inside `event::poll` once the terminal is gone (the tty
/// stays readable and `read` returns 0; crossterm-rs/crossterm#793), and a job of a closed
/// pane gets no SIGHUP. So we wait on the tty ourselves with `poll(2)` and only ask
/// crossterm for an event when the tty is alive; a hang-up ends `top` cleanly.
#[derive(Debug)]
pub struct TerminalEvents {
    /// `/dev/tty` when stdin is not the terminal (crossterm reads the same device).
    tty: Option<std::fs::File>,
}

impl TerminalEvents {
    /// Watches stdin when it is a terminal, else `/dev/tty`.
    pub fn open() -> io::Result<TerminalEvents> {
        let tty = if io::stdin().is_terminal() {
            None
        } else {
            Some(std::fs::File::open("/dev/tty")?)
        };
        Ok(TerminalEvents { tty })
    }

    fn fd(&self) -> RawFd {
        self.tty
            .as_ref()
            .map_or(libc::STDIN_FILENO, AsRawFd::as_raw_fd)
    }
}

impl EventSource for TerminalEvents {
    fn next_event(&mut self, timeout: Duration) -> io::Result<Option<Event>> {
        // Checking for a hang-up first keeps crossterm away from a dead tty.
        wait_tty(self.fd(), Duration::ZERO)?;
        if event::poll(Duration::ZERO)? {
            return event::read().map(Some);
        }
        if timeout.is_zero() || !wait_tty(self.fd(), timeout)? {
            return Ok(None);
        }
        if event::poll(Duration::ZERO)? {
            event::read().map(Some)
        } else {
            Ok(None)
        }
    }
}

/// Waits until `fd` is readable or `timeout` passes: `Ok(true)` when there may be input
/// (or a signal interrupted the wait), `Ok(false)` on timeout, and an `UnexpectedEof`
/// error when the terminal hung up.
pub fn wait_tty(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let err = io::Error::last_os_error();
        // A signal (SIGWINCH, SIGTERM) ends the wait early; the loop looks at it next.
        return if err.kind() == io::ErrorKind::Interrupted {
            Ok(true)
        } else {
            Err(err)
        };
    }
    if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the terminal hung up",
        ));
    }
    Ok(n > 0)
}

/// Counters of the loop's work, for tests and the CPU-cost measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoopStats {
    /// Frames drawn.
    pub draws: u64,
    /// Times the loop woke up (key wait returned).
    pub wakeups: u64,
}

/// Runs the full-screen view on the terminal until quit, signal, panic or `max_frames`
/// snapshots. Restores the terminal on every path.
pub fn run_interactive(
    feed: &Receiver<Snapshot>,
    state: &mut State,
    max_frames: Option<u64>,
) -> Result<(Exit, LoopStats), TuiError> {
    let signals = StopSignals::register()?;
    let mut events = TerminalEvents::open().map_err(|source| TuiError::Terminal { source })?;
    let mut guard = TerminalGuard::enter()?;
    let result = event_loop(
        guard.terminal(),
        &mut events,
        feed,
        state,
        &signals,
        max_frames,
    );
    drop(guard);
    result
}

/// The full-screen loop on any backend and event source.
pub fn event_loop<B: Backend, E: EventSource>(
    terminal: &mut Terminal<B>,
    events: &mut E,
    feed: &Receiver<Snapshot>,
    state: &mut State,
    signals: &StopSignals,
    max_frames: Option<u64>,
) -> Result<(Exit, LoopStats), TuiError> {
    let mut stats = LoopStats::default();
    let mut dirty = true;
    let mut feed_open = true;
    loop {
        if let Some(signal) = signals.caught() {
            return Ok((Exit::Signal(signal), stats));
        }
        if panicked() {
            return Err(TuiError::Panicked);
        }
        if dirty {
            let size = terminal.size().map_err(draw_error)?;
            state.set_page_size(table_capacity(size.into(), state));
            terminal
                .draw(|frame| render(frame, state))
                .map_err(draw_error)?;
            stats.draws += 1;
            dirty = false;
            if max_frames.is_some_and(|n| state.snapshots_shown() >= n) {
                return Ok((Exit::Iterations, stats));
            }
        }

        let Some(mut next) = next_input(events, TICK)? else {
            return Ok((Exit::Hangup, stats));
        };
        stats.wakeups += 1;
        // Handle every event already queued before drawing once (key repeat, paste).
        while let Some(ev) = next {
            match ev {
                Event::Key(key) => {
                    if let Some(action) = action_for(key, state.mode()) {
                        if state.apply(action) == Control::Quit {
                            return Ok((Exit::Quit, stats));
                        }
                        dirty = true;
                    }
                }
                Event::Resize(..) => {
                    terminal.autoresize().map_err(draw_error)?;
                    dirty = true;
                }
                _ => {}
            }
            let Some(queued) = next_input(events, Duration::ZERO)? else {
                return Ok((Exit::Hangup, stats));
            };
            next = queued;
        }

        if feed_open {
            // Snapshots carry energy since start, so only the newest queued one matters.
            let mut newest = None;
            loop {
                match feed.try_recv() {
                    Ok(snapshot) => newest = Some(snapshot),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        feed_open = false;
                        state.set_feed_closed();
                        dirty = true;
                        break;
                    }
                }
            }
            if let Some(snapshot) = newest {
                dirty |= state.push_snapshot(snapshot);
            }
        }
    }
}

/// The next event (`Some(None)`: none within `timeout`), or `None` when the terminal hung up.
fn next_input<E: EventSource>(
    events: &mut E,
    timeout: Duration,
) -> Result<Option<Option<Event>>, TuiError> {
    match events.next_event(timeout) {
        Ok(event) => Ok(Some(event)),
        Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(source) => Err(TuiError::Input { source }),
    }
}

fn draw_error<E: std::fmt::Display>(err: E) -> TuiError {
    TuiError::Draw(err.to_string())
}

/// Prints a frame per snapshot to `out` until `max_frames` frames, the feed ends, or the
/// reader goes away (a closed pipe ends the run quietly, like `top -b | head`).
pub fn run_batch(
    feed: &Receiver<Snapshot>,
    out: &mut impl Write,
    state: &mut State,
    max_frames: Option<u64>,
    format: FrameFormat,
) -> Result<Exit, TuiError> {
    let mut frames = 0u64;
    loop {
        if max_frames.is_some_and(|n| frames >= n) {
            return Ok(Exit::Iterations);
        }
        let Ok(snapshot) = feed.recv() else {
            return Ok(Exit::FeedClosed);
        };
        state.push_snapshot(snapshot);
        let written = match format {
            FrameFormat::Text => write_frame(out, state),
            FrameFormat::Json => write_json_frame(out, state),
        };
        match written {
            Ok(()) => frames += 1,
            Err(err) if err.kind() == io::ErrorKind::BrokenPipe => return Ok(Exit::Quit),
            Err(source) => return Err(TuiError::Output { source }),
        }
    }
}

#[cfg(test)]
#[path = "app_tests.rs"]
mod tests;
