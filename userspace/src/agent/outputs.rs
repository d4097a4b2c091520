//! The two per-window consumers beside the metrics, as [`Sink`]s: the Unix-socket snapshot
//! server ([`crate::remote`]) and the rotating recorder ([`crate::record::rotate`]).

use std::path::PathBuf;

use super::sink::{Sink, SinkError};
use crate::{
    clock,
    pb::v1 as pb,
    pipeline::Window,
    record::rotate::{RotatingWriter, Rotation},
    remote::Server,
};

/// Publishes each window's snapshot to `top` clients on the socket.
pub struct SocketSink {
    server: Server,
}

impl SocketSink {
    /// Serves snapshots through a bound server.
    pub fn new(server: Server) -> Self {
        Self { server }
    }
}

impl Sink for SocketSink {
    fn name(&self) -> &'static str {
        "socket"
    }

    fn window(&mut self, window: &Window, header: &pb::Header) -> Result<(), SinkError> {
        // The server hands the frame to its own client threads; this only encodes.
        self.server
            .publish(&crate::tui::Snapshot::from_window(window, header.sample_hz));
        Ok(())
    }
}

/// Writes every chunk into rotating recording files.
pub struct RecordSink {
    dir: PathBuf,
    rotation: Rotation,
    writer: Option<RotatingWriter>,
    losses: Option<pb::LossCounters>,
}

impl RecordSink {
    /// Files go to `dir`, rotated and pruned by `rotation`.
    pub fn new(dir: PathBuf, rotation: Rotation) -> Self {
        Self {
            dir,
            rotation,
            writer: None,
            losses: None,
        }
    }
}

impl Sink for RecordSink {
    fn name(&self) -> &'static str {
        "record"
    }

    fn start(&mut self, header: &pb::Header) -> Result<(), SinkError> {
        let writer = RotatingWriter::create(&self.dir, header.clone(), self.rotation)
            .map_err(|e| SinkError::Failed(e.to_string()))?;
        self.writer = Some(writer);
        Ok(())
    }

    fn chunk(&mut self, chunk: &pb::Chunk) -> Result<(), SinkError> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(()); // start failed and was reported
        };
        if chunk.losses.is_some() {
            self.losses = chunk.losses;
        }
        w.chunk(chunk.clone(), clock::monotonic_ns())
            .map_err(|e| SinkError::Failed(e.to_string()))
    }

    fn finish(&mut self) -> Result<(), SinkError> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        w.finish(pb::Trailer {
            end_ns: clock::monotonic_ns(),
            stop_reason: "agent stopped".into(),
            losses: self.losses,
        })
        .map_err(|e| SinkError::Failed(e.to_string()))
    }
}
