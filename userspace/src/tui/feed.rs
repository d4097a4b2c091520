//! Where `top`'s snapshots come from: a live capture ([`live`], on the one capture path,
//! [`Capture`]) or a recording played back ([`replay`]). Both push events into the
//! pipeline and turn each closed window into a [`Snapshot`]
//! ([`Snapshot::from_window`]); neither computes a number of its own, so live and offline
//! agree.
//!
//! Snapshots go to the display over a channel, so rendering never waits on collection.

use std::{
    sync::mpsc::{self, Receiver, Sender},
    thread,
    time::{Duration, Instant},
};

use super::Snapshot;
use crate::{
    attribute::Options,
    capture::{Capture, LiveConfig},
    pipeline::{self, Config},
    record::Recording,
};

/// Why a live feed or a replay could not start.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// Capture could not start (probes, privileges, energy sources).
    #[error(transparent)]
    Capture(#[from] crate::capture::LiveError),
    /// The feed's thread could not be started.
    #[error("starting the {what} thread")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The capture thread ended before it said whether capture started.
    #[error("capture thread ended during start-up")]
    Ended(#[source] mpsc::RecvError),
}

/// Starts capture on its own thread and returns the snapshot channel. Start-up errors
/// (permissions, no BTF, unreadable counters) are returned here, before any screen opens.
pub fn live(cfg: LiveConfig) -> Result<Receiver<Snapshot>, FeedError> {
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), FeedError>>();
    thread::Builder::new()
        .name("energy-bpf-live".into())
        .spawn(move || match Live::start(&cfg) {
            Ok(mut live) => {
                let _ = ready_tx.send(Ok(()));
                live.run(&cfg, &tx);
            }
            Err(err) => {
                let _ = ready_tx.send(Err(err));
            }
        })
        .map_err(|source| FeedError::Thread {
            what: "capture",
            source,
        })?;
    ready_rx.recv().map_err(FeedError::Ended)??;
    Ok(rx)
}

struct Live {
    capture: Capture,
}

impl Live {
    fn start(cfg: &LiveConfig) -> Result<Self, FeedError> {
        Ok(Self {
            capture: Capture::start(cfg)?,
        })
    }

    fn run(&mut self, cfg: &LiveConfig, tx: &Sender<Snapshot>) {
        let mut next = Instant::now() + cfg.interval;
        loop {
            thread::sleep(next.saturating_duration_since(Instant::now()));
            next += cfg.interval;
            let Some(snapshot) = self.step() else {
                continue;
            };
            if tx.send(snapshot).is_err() {
                // The display is gone; dropping self detaches the probes.
                return;
            }
        }
    }

    fn step(&mut self) -> Option<Snapshot> {
        let chunk = self.capture.poll();
        self.capture.push(chunk);
        let window = self.capture.close_due(0)?;
        Some(Snapshot::from_window(&window, self.capture.sample_hz()))
    }
}

/// How a recording is played back.
#[derive(Clone, Copy, Debug)]
pub struct ReplayConfig {
    /// Recording time per frame.
    pub interval: Duration,
    /// Wait `interval` between frames (the interactive view); batch output goes as fast as
    /// it can.
    pub paced: bool,
}

/// Plays `rec` through the pipeline on its own thread, one snapshot per `interval` of
/// recording time. A paced replay keeps the channel open after the last frame, so the
/// view stays on it until the user quits; an unpaced one closes it.
pub fn replay(
    rec: Recording,
    options: Options,
    cfg: ReplayConfig,
) -> Result<Receiver<Snapshot>, FeedError> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("energy-bpf-replay".into())
        .spawn(move || {
            let sample_hz = rec.header.sample_hz;
            let config = Config {
                cpus: rec.header.cpus.clone(),
                sources: rec.sources.clone(),
                options,
                activity_event: crate::analysis::activity_event(&rec),
            };
            let mut hot = crate::hot::HotFunctions::of_recording(&rec);
            for mut window in pipeline::folded_windows(&rec, config, cfg.interval) {
                hot.annotate(&window.events.samples, &mut window.processes);
                if tx.send(Snapshot::from_window(&window, sample_hz)).is_err() {
                    return;
                }
                if cfg.paced {
                    thread::sleep(cfg.interval);
                }
            }
            // A paced replay holds the last frame (keeps the channel open) until the view
            // quits, which ends the process.
            if cfg.paced {
                loop {
                    thread::park();
                }
            }
        })
        .map_err(|source| FeedError::Thread {
            what: "replay",
            source,
        })?;
    Ok(rx)
}
