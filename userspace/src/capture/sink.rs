//! The seam every consumer of a live capture plugs into: the recorder
//! ([`crate::record::Recorder`], for `record` and `agent --record`), the Prometheus
//! metrics and the Unix-socket snapshot server all implement [`Sink`]. It lives with the
//! capture, below its users.
//!
//! Sinks run on the capture thread, in the order given, between two polls: a sink that
//! does slow work (disk, clients) hands it to a thread or task of its own and reports its
//! backlog through [`Sink::queue_depth`]. A failing sink is logged and counted; the others
//! and the capture go on.

use crate::{pb::v1 as pb, pipeline::Window};

/// Why a sink could not take a chunk or a window.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Anything else, said in words.
    #[error("{0}")]
    Failed(String),
}

/// A consumer of the agent's capture.
pub trait Sink: Send {
    /// Short name for logs and the `sink` label of the self-metrics.
    fn name(&self) -> &'static str;

    /// Called once, before any chunk: the capture's recording header (topology, sample
    /// rate, start time).
    fn start(&mut self, header: &pb::Header) -> Result<(), SinkError> {
        let _ = header;
        Ok(())
    }

    /// Every drained chunk, exactly as `record` writes it (the first one carries the energy
    /// sources, each carries its readings and the cumulative loss counters), before the
    /// pipeline consumes it.
    fn chunk(&mut self, chunk: &pb::Chunk) -> Result<(), SinkError> {
        let _ = chunk;
        Ok(())
    }

    /// Every closed window (`header` as given to [`Self::start`], for the sample rate).
    /// [`crate::tui::Snapshot::from_window`] turns it into what `top` shows.
    fn window(&mut self, window: &Window, header: &pb::Header) -> Result<(), SinkError> {
        let _ = (window, header);
        Ok(())
    }

    /// Items waiting to be exported (exported as `energy_bpf_export_queue_depth{sink}`).
    /// Totals of an exporter that sends elsewhere: (sent, dropped, failed) so far.
    fn export_counts(&self) -> Option<(u64, u64, u64)> {
        None
    }

    /// Windows queued and not yet sent, for an exporter with a queue.
    fn queue_depth(&self) -> usize {
        0
    }

    /// Called once at shutdown, after the last window: flush and close.
    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}
