//! Liveness and readiness of the agent, for `/healthz` and `/readyz` (Kubernetes probes,
//! systemd watchdogs). Three atomics the capture thread sets as it goes and the HTTP server
//! reads: answering a probe takes no lock and does no scrape or window work.
//!
//! - ready: the probes are attached and the first window has closed (metrics have values);
//! - healthy: attached, and the capture loop finished a poll within [`STALL`]; a loop
//!   stuck in a window or a dead capture thread turns `/healthz` to 503 so the kubelet
//!   restarts the pod.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// A capture loop silent this long is stuck: it polls at least every second
/// ([`super::collect`]), and closing a busy window takes well under a second.
pub const STALL: Duration = Duration::from_secs(30);

/// What the probes read.
#[derive(Debug)]
pub struct Health {
    base: Instant,
    attached: AtomicBool,
    windows: AtomicU64,
    /// Milliseconds after `base` of the loop's latest poll.
    last_poll_ms: AtomicU64,
}

/// One probe's answer: whether it passes, and a line saying why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// 200 when true, 503 otherwise.
    pub ok: bool,
    /// A line for the body (people read it with curl).
    pub reason: String,
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

impl Health {
    /// Nothing attached, no window yet.
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            attached: AtomicBool::new(false),
            windows: AtomicU64::new(0),
            last_poll_ms: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The probes are attached and the loop is about to start.
    pub fn attached(&self) {
        self.polled();
        self.attached.store(true, Ordering::Release);
    }

    /// The capture loop finished a poll.
    pub fn polled(&self) {
        self.last_poll_ms.store(self.now_ms(), Ordering::Release);
    }

    /// A window was closed and handed to the sinks.
    pub fn window_closed(&self) {
        self.windows.fetch_add(1, Ordering::AcqRel);
    }

    /// The capture loop has ended (stop, or a panic unwinding through it).
    pub fn detached(&self) {
        self.attached.store(false, Ordering::Release);
    }

    /// `/healthz`.
    pub fn live(&self) -> Verdict {
        self.live_at(self.now_ms())
    }

    fn live_at(&self, now_ms: u64) -> Verdict {
        if !self.attached.load(Ordering::Acquire) {
            return Verdict {
                ok: false,
                reason: "capture not running (starting, or stopped)".into(),
            };
        }
        let silent =
            Duration::from_millis(now_ms.saturating_sub(self.last_poll_ms.load(Ordering::Acquire)));
        if silent > STALL {
            return Verdict {
                ok: false,
                reason: format!(
                    "capture loop stalled: no poll for {:.0} s",
                    silent.as_secs_f64()
                ),
            };
        }
        Verdict {
            ok: true,
            reason: format!("ok: last poll {} ms ago", silent.as_millis()),
        }
    }

    /// `/readyz`.
    pub fn ready(&self) -> Verdict {
        if !self.attached.load(Ordering::Acquire) {
            return Verdict {
                ok: false,
                reason: "probes not attached yet".into(),
            };
        }
        let windows = self.windows.load(Ordering::Acquire);
        if windows == 0 {
            return Verdict {
                ok: false,
                reason: "waiting for the first window to close".into(),
            };
        }
        Verdict {
            ok: true,
            reason: format!("ok: {windows} windows closed"),
        }
    }
}

/// Marks the capture as ended when dropped, so a panicking loop fails `/healthz` too.
pub struct DetachOnDrop<'a>(pub &'a Health);

impl Drop for DetachOnDrop<'_> {
    fn drop(&mut self) {
        self.0.detached();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states() {
        let h = Health::new();
        assert!(!h.live().ok && !h.ready().ok, "nothing before attach");
        h.attached();
        assert!(h.live().ok, "{:?}", h.live());
        assert!(!h.ready().ok && h.ready().reason.contains("first window"));
        h.window_closed();
        assert!(h.ready().ok, "{:?}", h.ready());
        // A loop silent past STALL is not live; a poll revives it.
        let later = h.now_ms() + u64::try_from(STALL.as_millis()).unwrap_or(0) + 1_000;
        let v = h.live_at(later);
        assert!(!v.ok && v.reason.contains("stalled"), "{v:?}");
        {
            let _guard = DetachOnDrop(&h);
        }
        assert!(!h.live().ok && !h.ready().ok, "detached");
    }
}
