//! `energy-bpf top`: the live per-process power view and its `top -b` style batch output.
//!
//! Collection and display meet at one seam: the feed sends [`Snapshot`]s over a
//! `std::sync::mpsc` channel; `run_interactive` or `run_batch` consume them.
//! - `feed`: the live and replay threads: the one live capture ([`crate::capture::Capture`])
//!   or a recording, through the pipeline, into snapshots.
//! - `snapshot`: the seam types (header figures, process and thread rows), built from a
//!   pipeline window by [`Snapshot::from_window`].
//! - `table`: pure view model: filter, group by cgroup or container, sort, expand.
//! - `state`: pure session state and how each user `Action` changes it.
//! - `input`: key bindings.
//! - `render`: pure drawing into a ratatui frame (tested with `TestBackend`).
//! - `batch`: plain-text frames.
//! - `app`: the run loops; `terminal`: raw mode, alternate screen, panic hook, signals.

pub(crate) mod app;
pub(crate) mod batch;
pub(crate) mod feed;
pub(crate) mod format;
pub(crate) mod input;
pub(crate) mod render;
pub(crate) mod snapshot;
pub(crate) mod state;
pub(crate) mod table;
pub(crate) mod terminal;

#[cfg(test)]
pub(crate) mod fixtures;

pub(crate) use app::{Exit, run_batch, run_interactive};
pub(crate) use batch::FrameFormat;
pub use snapshot::{DomainPower, Header, ProcessRow, Snapshot, ThreadRow};
pub(crate) use state::State;

use std::io;

/// What can go wrong while showing `top`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TuiError {
    /// The terminal could not be put into full-screen mode.
    #[error(
        "cannot take over the terminal (raw mode / alternate screen): {source}; use --batch for plain output"
    )]
    Terminal {
        /// The underlying error.
        source: io::Error,
    },
    /// Key input could not be read.
    #[error("cannot read keys from the terminal: {source}")]
    Input {
        /// The underlying error.
        source: io::Error,
    },
    /// Drawing failed.
    #[error("cannot draw on the terminal: {0}")]
    Draw(String),
    /// Batch output could not be written.
    #[error("cannot write batch output: {source}")]
    Output {
        /// The underlying error.
        source: io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("cannot install SIGTERM/SIGINT/SIGHUP handlers: {source}")]
    Signals {
        /// The underlying error.
        source: io::Error,
    },
    /// A thread panicked while the terminal was in full-screen mode (message above).
    #[error("a thread panicked while top was running (see the message above)")]
    Panicked,
}
