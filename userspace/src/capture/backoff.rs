//! When to look again at something that may have changed, per process: its mappings after a
//! stack walk met code outside them, a perf map that was not there. A look that found
//! nothing new doubles the wait before the next, up to a ceiling; one that found something
//! brings it back to the first wait.
//!
//! Without it, a process whose walks keep meeting an unmapped PC (a stack the walker lost
//! leaves a stray one) had its `/proc/PID/maps` read twice a second for as long as it ran,
//! and every sampled native process had its perf map looked for four times a second: on a
//! saturated redis, the agent's largest cost that did not come from new processes.

use std::time::{Duration, Instant};

/// The first and the longest wait of a [`Backoff`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    /// The wait after a look that found something new (and before the second look).
    pub first: Duration,
    /// The longest wait.
    pub most: Duration,
}

/// One process's schedule: when it was last looked at, and the wait before the next look.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Backoff {
    last: Instant,
    wait: Duration,
}

impl Backoff {
    /// Looked at `now` for the first time: the next look is due `schedule.first` later.
    pub fn new(now: Instant, schedule: Schedule) -> Self {
        Self {
            last: now,
            wait: schedule.first,
        }
    }

    /// Whether the next look is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.last) >= self.wait
    }

    /// Looked again at `now`: `found` says whether the look found anything new.
    pub fn looked(&mut self, now: Instant, found: bool, schedule: Schedule) {
        self.last = now;
        self.wait = if found {
            schedule.first
        } else {
            (self.wait * 2).clamp(schedule.first, schedule.most)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Schedule = Schedule {
        first: Duration::from_millis(500),
        most: Duration::from_secs(4),
    };

    #[test]
    fn waits_double_while_nothing_is_found_and_reset_when_something_is() {
        let t0 = Instant::now();
        let mut b = Backoff::new(t0, S);
        assert!(!b.due(t0 + Duration::from_millis(499)));
        assert!(b.due(t0 + Duration::from_millis(500)));
        let mut t = t0;
        let mut waits = Vec::new();
        for _ in 0..5 {
            t += Duration::from_millis(500);
            while !b.due(t) {
                t += Duration::from_millis(10);
            }
            waits.push(t);
            b.looked(t, false, S);
        }
        let gaps: Vec<u128> = waits
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(
            gaps,
            [1_000, 2_000, 4_000, 4_000],
            "doubling up to the ceiling"
        );
        b.looked(t, true, S);
        assert!(b.due(t + S.first), "something new: back to the first wait");
        assert!(!b.due(t + S.first - Duration::from_millis(1)));
    }
}
