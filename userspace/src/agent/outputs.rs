//! The Unix-socket snapshot server ([`crate::remote`]) as a [`Sink`], beside the metrics
//! and the recorder ([`crate::record::Recorder`], which is a sink of its own).

use super::sink::{Sink, SinkError};
use crate::{pb::v1 as pb, pipeline::Window, remote::Server};

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
