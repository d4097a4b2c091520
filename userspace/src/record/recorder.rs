//! The one recorder: every recording's chunks, stored names and trailer are written here,
//! for `record` (one file, names stored at the end) and for `agent --record` (rotating
//! files). Both push chunks through the capture's [`Sink`] seam; `record` also hands its
//! live capture to [`Recorder::drain`], the drain loop (poll, the command's runs, energy
//! faults, stop conditions).

use std::{
    path::{Path, PathBuf},
    process::ExitStatus,
    sync::atomic::{AtomicBool, Ordering},
    thread,
    time::{Duration, Instant},
};

use super::{
    WriteError, Writer,
    early::{self, Kept},
    rotate::{RotatingWriter, Rotation},
};
use crate::{
    capture::{
        Live,
        command_runs::{RunError, Runs},
        sink::{Sink, SinkError},
    },
    clock,
    pb::v1::{Chunk, Header, LossCounters, Trailer},
    symbolize::{Collector, Stored},
};

/// Where a recorder writes.
#[derive(Clone, Debug)]
pub enum Target {
    /// One file; the names of every sampled address are stored in it at the end.
    File(PathBuf),
    /// Files in a directory, rotated and pruned; no names stored (reports name live).
    Rotating(PathBuf, Rotation),
}

enum Out {
    /// Not started, or closed after a failed write.
    None,
    File(Writer),
    Rotating(Box<RotatingWriter>),
}

/// Why recording stopped before a clean finish. The message says what the file keeps.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// A write failed; the file was closed as well as it could be.
    #[error("recording stopped early because {why}; {kept}")]
    Write {
        /// "the disk is full" or "writing failed".
        why: &'static str,
        /// What the file keeps.
        kept: String,
        /// The write error.
        #[source]
        source: WriteError,
    },
    /// The recorded command could not run.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The output could not be created.
    #[error(transparent)]
    Create(WriteError),
}

/// What a clean finish wrote.
#[derive(Debug)]
pub struct Finished {
    /// The trailer's end time, CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// The file's size (0 for rotating files).
    pub bytes: u64,
    /// The stored names and how long naming took (one file only).
    pub names: Option<(Stored, Duration)>,
}

/// Why the drain loop stopped.
#[derive(Debug)]
pub struct Ended {
    /// Said in the trailer: "signal", "duration", or how the command ended.
    pub reason: String,
    /// The command's last exit status, when the command's end stopped it.
    pub status: Option<ExitStatus>,
}

/// Writes one recording: chunks as they come, then names and a trailer.
pub struct Recorder {
    target: Target,
    out: Out,
    start_ns: u64,
    names: Option<Collector>,
    losses: Option<LossCounters>,
}

impl Recorder {
    /// A recorder for `target`; nothing is written before [`Recorder::open`].
    pub fn new(target: Target) -> Self {
        let names = matches!(target, Target::File(_)).then(Collector::default);
        Self {
            target,
            out: Out::None,
            start_ns: 0,
            names,
            losses: None,
        }
    }

    /// Creates the file (or the first rotating file) with `header`.
    pub fn open(&mut self, header: &Header) -> Result<(), RecordError> {
        self.start_ns = header.start_ns;
        self.out = match &self.target {
            Target::File(path) => {
                Out::File(Writer::create(path, header).map_err(RecordError::Create)?)
            }
            Target::Rotating(dir, rotation) => Out::Rotating(Box::new(
                RotatingWriter::create(dir, header.clone(), *rotation)
                    .map_err(RecordError::Create)?,
            )),
        };
        Ok(())
    }

    /// Writes one chunk (flushed: a recorder killed later keeps it). After a failed write
    /// the file is closed as well as it can be and later chunks are dropped.
    pub fn push(&mut self, chunk: Chunk) -> Result<(), RecordError> {
        if chunk.losses.is_some() {
            self.losses = chunk.losses;
        }
        if let Some(names) = self.names.as_mut() {
            names.add(&chunk);
        }
        let written = match &mut self.out {
            Out::None => return Ok(()),
            Out::File(w) => w.chunk(chunk),
            Out::Rotating(w) => w.chunk(chunk, clock::monotonic_ns()),
        };
        written.map_err(|err| self.fail(err))
    }

    /// Polls `live` every `tick` into the recording, starting and reaping the command's
    /// runs, until `stop` is set, `deadline` passes or the command's last run ends.
    pub fn drain(
        &mut self,
        live: &mut Live,
        mut runs: Option<&mut Runs>,
        tick: Duration,
        stop: &AtomicBool,
        deadline: Option<Instant>,
    ) -> Result<Ended, RecordError> {
        loop {
            let exited = match runs.as_deref_mut() {
                Some(r) => r.tick(live, tick)?,
                None => {
                    thread::sleep(tick);
                    None
                }
            };
            let mut chunk = live.poll();
            if let Some(r) = runs.as_deref_mut() {
                chunk.runs = r.take_done();
            }
            for fault in live.new_faults() {
                eprintln!("energy-bpf: warning: {fault}; recording goes on with the other sources");
            }
            self.push(chunk)?;
            let reason = if stop.load(Ordering::Relaxed) {
                "signal".to_string()
            } else if deadline.is_some_and(|d| Instant::now() >= d) {
                "duration".to_string()
            } else if let Some(status) = exited {
                let reason = runs
                    .as_deref()
                    .map_or_else(String::new, |r| r.stop_reason(status));
                return Ok(Ended {
                    reason,
                    status: Some(status),
                });
            } else {
                continue;
            };
            return Ok(Ended {
                reason,
                status: None,
            });
        }
    }

    /// The last chunk, the stored names (one file) and the trailer; nothing is written
    /// after it.
    pub fn close(
        &mut self,
        last: Option<Chunk>,
        stop_reason: &str,
    ) -> Result<Finished, RecordError> {
        if let Some(last) = last {
            self.push(last)?;
        }
        let end_ns = clock::monotonic_ns();
        let trailer = Trailer {
            end_ns,
            stop_reason: stop_reason.into(),
            losses: self.losses,
        };
        match std::mem::replace(&mut self.out, Out::None) {
            Out::None => Ok(Finished {
                end_ns,
                bytes: 0,
                names: None,
            }),
            Out::Rotating(w) => {
                w.finish(trailer).map_err(|err| self.fail(err))?;
                Ok(Finished {
                    end_ns,
                    bytes: 0,
                    names: None,
                })
            }
            Out::File(mut w) => {
                let naming = Instant::now();
                let names = match self
                    .names
                    .as_ref()
                    .map(|n| crate::symbolize::store(n, &mut w))
                {
                    Some(Ok(stored)) => Some((stored, naming.elapsed())),
                    Some(Err(err)) => {
                        self.out = Out::File(w);
                        return Err(self.fail(err));
                    }
                    None => None,
                };
                let bytes = w.finish(trailer).map_err(|err| self.fail(err))?;
                Ok(Finished {
                    end_ns,
                    bytes,
                    names,
                })
            }
        }
    }

    /// Losses the kernel reported last (for the summary line).
    pub fn losses(&self) -> Option<LossCounters> {
        self.losses
    }

    /// A write failed: the file is closed as well as it can be ([`early`]) and the error
    /// says what it keeps.
    fn fail(&mut self, err: WriteError) -> RecordError {
        let why = if err.is_disk_full() {
            "the disk is full"
        } else {
            "writing failed"
        };
        let path = match &self.target {
            Target::File(p) | Target::Rotating(p, _) => p.clone(),
        };
        let kept = match std::mem::replace(&mut self.out, Out::None) {
            Out::File(w) => kept_text(&path, early::close_after_error(w, &err, self.start_ns)),
            _ if matches!(self.target, Target::File(_)) => kept_text(&path, Kept::CutShort),
            _ => format!(
                "the files in {} keep what was written before",
                path.display()
            ),
        };
        RecordError::Write {
            why,
            kept,
            source: err,
        }
    }
}

fn kept_text(path: &Path, kept: Kept) -> String {
    match kept {
        Kept::Closed { secs, bytes } => format!(
            "{} keeps the first {secs:.1} s ({} KiB) and reads normally",
            path.display(),
            bytes / 1024
        ),
        Kept::CutShort => format!(
            "{} keeps everything before this point (it reads as cut short)",
            path.display()
        ),
    }
}

/// The agent's `--record`: each chunk into rotating files, a trailer at shutdown.
impl Sink for Recorder {
    fn name(&self) -> &'static str {
        "record"
    }

    fn start(&mut self, header: &Header) -> Result<(), SinkError> {
        self.open(header)
            .map_err(|e| SinkError::Failed(e.to_string()))
    }

    fn chunk(&mut self, chunk: &Chunk) -> Result<(), SinkError> {
        self.push(chunk.clone())
            .map_err(|e| SinkError::Failed(e.to_string()))
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        self.close(None, "agent stopped")
            .map(drop)
            .map_err(|e| SinkError::Failed(e.to_string()))
    }
}
