//! The capture loop, on a blocking thread of its own: poll the probes once a second (sooner
//! when their rings fill faster, see [`next_poll`]), hand each chunk to the sinks and the
//! pipeline, close a window every interval and hand it to the sinks. Control messages
//! (stop, reload) wake it between polls.

use std::{
    collections::BTreeMap,
    sync::{Arc, mpsc},
    time::{Duration, Instant},
};

use super::{
    health::Health,
    learn::{self, Learner},
    metrics::Metrics,
    sink::Sink,
};
use crate::{attribute, capture::Capture, clock, pb::v1 as pb, pipeline::Window};

/// Drains at least this often. A poll costs the same syscalls, wake-ups and folding
/// whatever it drains: on the quiet 2-vCPU VM the loop's thread took 1.1 ms of CPU a
/// second polling four times a second, 0.47 ms once a second.
const MAX_POLL: Duration = Duration::from_secs(1);

/// Drains at most this often, however fast the rings fill.
const MIN_POLL: Duration = Duration::from_millis(100);

/// The share of a ring buffer a poll lets fill before the next, at the rate it filled
/// since the last: a burst four times that rate still fits. A poll also holds what it
/// drained until the pipeline has folded it (at 256 CPUs streaming a million switches a
/// second, a second's chunk is 56 MiB of switch events): the streaming ring (8 MiB) keeps
/// such a machine near [`MIN_POLL`].
const RING_SHARE: f64 = 0.25;

/// Time from one poll to the next, so that the rings fill to at most [`RING_SHARE`] at the
/// rate they filled over the last `since`, when the fullest took `fill` of its ring;
/// between [`MIN_POLL`] and [`MAX_POLL`].
fn next_poll(since: Duration, fill: f64) -> Duration {
    if fill.is_nan() || fill <= 0.0 {
        return MAX_POLL;
    }
    let secs = since.as_secs_f64() * RING_SHARE / fill;
    Duration::from_secs_f64(secs.clamp(MIN_POLL.as_secs_f64(), MAX_POLL.as_secs_f64()))
}

/// The poll period for windows `interval` long when the rings allow `pace`: the longest
/// that divides the interval evenly, so polls land on window ends.
fn poll_period(interval: Duration, pace: Duration) -> Duration {
    let polls = (interval.as_secs_f64() / pace.as_secs_f64().max(1e-3))
        .ceil()
        .max(1.0);
    interval.div_f64(polls)
}

/// What the runtime tells the capture loop.
#[derive(Debug)]
pub enum Control {
    /// Finish the current window, flush every sink, return.
    Stop,
    /// New window length and series limit (the settings a reload can change live).
    Reload {
        /// Window length.
        interval: Duration,
        /// `--max-process-series`.
        max_series: usize,
    },
}

/// The loop's state.
pub struct Collector {
    capture: Capture,
    out: Outputs,
    interval: Duration,
    learner: Option<Learner>,
    health: Arc<Health>,
    /// How long the rings allow until the next poll ([`next_poll`]).
    pace: Duration,
    /// When the probes were last drained.
    drained: Instant,
}

/// The sinks and the metrics the loop reports to.
struct Outputs {
    header: pb::Header,
    /// Calibrated static power per source key (the drift metric compares with it).
    calibrated: BTreeMap<String, attribute::Calibrated>,
    sinks: Vec<Box<dyn Sink>>,
    metrics: Arc<Metrics>,
}

impl Collector {
    /// A loop over a started capture; the sinks are told the header now.
    pub fn new(
        capture: Capture,
        mut sinks: Vec<Box<dyn Sink>>,
        metrics: Arc<Metrics>,
        interval: Duration,
    ) -> Self {
        let header = capture.header().clone();
        let calibrated = capture.pipeline().config().options.calibrated.clone();
        for sink in &mut sinks {
            if let Err(err) = sink.start(&header) {
                tracing::warn!(sink = sink.name(), "cannot start: {err}");
                metrics.sink_error(sink.name());
            }
        }
        Self {
            capture,
            out: Outputs {
                header,
                calibrated,
                sinks,
                metrics,
            },
            interval,
            learner: None,
            health: Arc::new(Health::new()),
            pace: MAX_POLL,
            drained: Instant::now(),
        }
    }

    /// Reports polls and windows to `health` (the `/healthz` and `/readyz` endpoints).
    pub fn health(mut self, health: Arc<Health>) -> Self {
        self.health = health;
        self
    }

    /// Learns static power from every window (see [`super::learn`]).
    pub fn learning(mut self, learner: Learner) -> Self {
        self.learner = Some(learner);
        self
    }

    /// Runs until [`Control::Stop`] or until the sender is gone, then closes the last
    /// window where the capture ends and finishes every sink.
    pub fn run(mut self, control: &mpsc::Receiver<Control>) {
        let health = Arc::clone(&self.health);
        let _detach = super::health::DetachOnDrop(&health);
        health.attached();
        loop {
            match control.recv_timeout(poll_period(self.interval, self.pace)) {
                Ok(Control::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Ok(Control::Reload {
                    interval,
                    max_series,
                }) => {
                    tracing::info!(?interval, max_series, "reloaded");
                    self.interval = interval;
                    self.out.metrics.set_max_series(max_series);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            self.step();
            self.health.polled();
        }
        let Self {
            capture,
            mut out,
            mut learner,
            ..
        } = self;
        let started = Instant::now();
        let window = capture.finish(|chunk| out.chunk(chunk));
        if let Some(learner) = &mut learner {
            // No window follows to use what the last one teaches: it is only saved.
            let _ = learn(learner, &window, &out);
            learner.save();
        }
        out.window(&window, started, 0);
        for sink in &mut out.sinks {
            if let Err(err) = sink.finish() {
                tracing::warn!(sink = sink.name(), "flush failed: {err}");
                out.metrics.sink_error(sink.name());
            }
        }
        tracing::info!(
            secs = window.totals.duration_ns as f64 / 1e9,
            "last window closed and flushed"
        );
    }

    fn step(&mut self) {
        let chunk = self.capture.poll();
        let now = Instant::now();
        self.pace = next_poll(now - self.drained, self.capture.take_ring_fill());
        self.drained = now;
        let poll = poll_period(self.interval, self.pace);
        self.out.metrics.set_poll_interval(poll);
        for fault in self.capture.new_faults() {
            tracing::warn!("{fault}; the agent goes on with the other sources");
        }
        self.out.chunk(&chunk);
        if let Some(u) = self.capture.unwind_stats() {
            self.out.metrics.unwind_tables(&u);
        }
        self.capture.push(chunk);
        let started = Instant::now();
        // Asking for half a poll less than the interval makes windows the interval long
        // on average rather than a poll longer.
        let min_len = self.interval.saturating_sub(poll / 2);
        let min_len_ns = u64::try_from(min_len.as_nanos()).unwrap_or(u64::MAX);
        if let Some(window) = self.capture.close_due(min_len_ns) {
            if let Some(learner) = &mut self.learner {
                let learned = learn(learner, &window, &self.out);
                self.capture.set_learned_static(learned);
            }
            let pending = self.capture.pipeline().pending();
            self.out.window(&window, started, pending);
            self.health.window_closed();
            window.release();
        }
    }
}

/// Offers a window's load rows to the learner and gives the metrics what it learned;
/// returns the identified estimates per source key, for the next windows.
fn learn(
    learner: &mut Learner,
    window: &Window,
    out: &Outputs,
) -> BTreeMap<String, attribute::Learned> {
    let a = &window.analysis;
    let input = attribute::Input {
        timeline: &a.timeline,
        samples: &[],
        sources: &a.sources,
        readings: &a.readings,
        cpus: &out.header.cpus,
        threads: &[],
        activity: None,
    };
    let loads = attribute::load::load_rows(&input, learn::ROW_NS);
    let offset = i128::from(clock::realtime_ns()) - i128::from(clock::monotonic_ns());
    let learned = learner.observe(&loads, offset);
    out.metrics.set_learned(&learned, &out.calibrated);
    learned
        .into_iter()
        .filter_map(|s| Some((s.key, s.learned?)))
        .collect()
}

impl Outputs {
    fn chunk(&mut self, chunk: &pb::Chunk) {
        for sink in &mut self.sinks {
            if let Err(err) = sink.chunk(chunk) {
                tracing::warn!(sink = sink.name(), "dropped a chunk: {err}");
                self.metrics.sink_error(sink.name());
            }
        }
    }

    fn window(&mut self, window: &Window, started: Instant, pending: usize) {
        for sink in &mut self.sinks {
            if let Err(err) = sink.window(window, &self.header) {
                tracing::warn!(sink = sink.name(), "dropped a window: {err}");
                self.metrics.sink_error(sink.name());
            }
            self.metrics
                .set_queue_depth(sink.name(), sink.queue_depth());
            if let Some((sent, dropped, failed)) = sink.export_counts() {
                self.metrics
                    .set_export_counts(sink.name(), sent, dropped, failed);
            }
        }
        let took = started.elapsed();
        self.metrics.observe_processing(took, pending);
        let secs = window.totals.duration_ns as f64 / 1e9;
        tracing::debug!(
            secs,
            watts = window.totals.total_j / secs.max(1e-9),
            processes = window.processes.len(),
            took_ms = took.as_secs_f64() * 1e3,
            "window closed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn polls_once_a_second_unless_a_ring_fills_faster() {
        // Nothing drained, or a little: once a second.
        assert_eq!(next_poll(MAX_POLL, 0.0), MAX_POLL);
        assert_eq!(next_poll(MAX_POLL, f64::NAN), MAX_POLL);
        assert_eq!(next_poll(MAX_POLL, 0.01), MAX_POLL);
        // A ring half full after a second: a quarter is reached in half a second.
        assert_eq!(next_poll(MAX_POLL, 0.5), 500 * MS);
        // A quarter after 200 ms: 200 ms again.
        assert_eq!(next_poll(200 * MS, 0.25), 200 * MS);
        // Faster than that is held at MIN_POLL.
        assert_eq!(next_poll(100 * MS, 0.9), MIN_POLL);
    }

    #[test]
    fn polls_divide_the_window_evenly() {
        assert_eq!(poll_period(Duration::from_secs(5), MAX_POLL), MAX_POLL);
        assert_eq!(poll_period(Duration::from_millis(1200), MAX_POLL), 600 * MS);
        assert_eq!(poll_period(Duration::from_millis(500), MAX_POLL), 500 * MS);
        assert_eq!(
            poll_period(Duration::from_secs(5), 300 * MS),
            Duration::from_secs(5) / 17
        );
    }
}
