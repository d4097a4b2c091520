//! Owning the terminal: raw mode and the alternate screen, and giving them back on every
//! way out — normal return, panic (panic hook) and SIGTERM/SIGINT/SIGHUP (signal-hook).
//!
//! Signals only set a flag (the only safe thing in a handler); the run loop sees it within
//! one poll tick and returns, and dropping [`TerminalGuard`] restores the terminal.

use std::io::{self, Stdout, Write};
use std::panic::PanicHookInfo;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::{cursor, execute, terminal};
use signal_hook::SigId;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use super::TuiError;

type PanicHook = Box<dyn Fn(&PanicHookInfo<'_>) + Sync + Send + 'static>;

/// Signals that end `top` cleanly, recorded by number.
#[derive(Debug)]
pub struct StopSignals {
    caught: Arc<AtomicUsize>,
    ids: Vec<SigId>,
}

impl StopSignals {
    /// Catches SIGTERM, SIGINT and SIGHUP until dropped.
    pub fn register() -> Result<StopSignals, TuiError> {
        let caught = Arc::new(AtomicUsize::new(0));
        let mut ids = Vec::new();
        for signal in [SIGTERM, SIGINT, SIGHUP] {
            let id =
                signal_hook::flag::register_usize(signal, Arc::clone(&caught), signal as usize)
                    .map_err(|source| TuiError::Signals { source })?;
            ids.push(id);
        }
        Ok(StopSignals { caught, ids })
    }

    /// A set that never fires (for tests).
    #[cfg(test)]
    pub fn none() -> StopSignals {
        StopSignals {
            caught: Arc::new(AtomicUsize::new(0)),
            ids: Vec::new(),
        }
    }

    /// The signal caught so far, if any.
    pub fn caught(&self) -> Option<i32> {
        match self.caught.load(Ordering::SeqCst) {
            0 => None,
            n => i32::try_from(n).ok(),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        // Removes our actions. signal-hook keeps its own (now empty) handler installed, so
        // a caller that keeps running after `top` and cares installs its own handling.
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Set when any thread panics while the terminal is ours: the run loop then stops.
static PANICKED: AtomicBool = AtomicBool::new(false);

/// Whether a panic happened since the terminal was taken.
pub fn panicked() -> bool {
    PANICKED.load(Ordering::SeqCst)
}

/// Raw mode + alternate screen + hidden cursor, undone on drop and on panic.
pub struct TerminalGuard {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    previous_hook: Arc<PanicHook>,
}

impl TerminalGuard {
    /// Takes the terminal on stdout.
    pub fn enter() -> Result<TerminalGuard, TuiError> {
        let previous_hook: Arc<PanicHook> = Arc::new(std::panic::take_hook());
        let chained = Arc::clone(&previous_hook);
        // Restore first so the panic message lands on a normal screen, then report it.
        std::panic::set_hook(Box::new(move |info| {
            PANICKED.store(true, Ordering::SeqCst);
            restore();
            chained(info);
        }));
        PANICKED.store(false, Ordering::SeqCst);
        let setup = || -> io::Result<Terminal<CrosstermBackend<Stdout>>> {
            terminal::enable_raw_mode()?;
            let mut stdout = io::stdout();
            execute!(stdout, terminal::EnterAlternateScreen, cursor::Hide)?;
            Terminal::new(CrosstermBackend::new(stdout))
        };
        match setup() {
            Ok(terminal) => Ok(TerminalGuard {
                terminal,
                previous_hook,
            }),
            Err(source) => {
                restore();
                reinstall(previous_hook);
                Err(TuiError::Terminal { source })
            }
        }
    }

    /// The ratatui terminal to draw on.
    pub fn terminal(&mut self) -> &mut Terminal<CrosstermBackend<Stdout>> {
        &mut self.terminal
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore();
        reinstall(Arc::clone(&self.previous_hook));
    }
}

/// Puts back the panic hook that was there before ours.
fn reinstall(previous: Arc<PanicHook>) {
    // Dropping our hook here is fine: it only holds another Arc of `previous`.
    drop(std::panic::take_hook());
    std::panic::set_hook(Box::new(move |info| previous(info)));
}

/// Leaves the alternate screen, shows the cursor and leaves raw mode. Best effort: called
/// while unwinding or after a failure, where nothing better can be done with an error.
fn restore() {
    let mut stdout = io::stdout();
    let _ = execute!(stdout, terminal::LeaveAlternateScreen, cursor::Show);
    let _ = terminal::disable_raw_mode();
    let _ = stdout.flush();
}
