//! The stack sampler: a cpu-clock perf event on every online CPU that runs `sample_stack`,
//! at a rate that wanders around the one asked for.
//!
//! A fixed period aliases with periodic work. A loop whose period is close to a multiple of
//! `1/F` (a 2 ms loop at 999 Hz) meets the timer at almost the same phase for seconds on
//! end, and the code at that phase gets more than its share: the Java test's two methods,
//! 3:1 in CPU time, came out anywhere from 2.84 to 3.32 at 999 Hz, and within 3% of 3.00
//! at 797 Hz (`tests/jit.rs`). So each CPU's rate is drawn anew every [`REDRAW`]
//! ([`REDRAW_ALWAYS_ON`] in the agent and `top`, where each draw's cost counts), uniformly
//! within ±[`SPREAD`] of `F`: with a rate `f` the phase moves by `|1/f − T/k|` per sample
//! against a loop of period `T`, and it sweeps the loop many times over in each stretch
//! unless `f` lands in a band a few thousandths wide. The draws are stratified: each CPU
//! takes its rates from the [`STRATA`] equal parts of the band in a shuffled order, one
//! uniform draw in each, so over every [`STRATA`] stretches its mean rate is `F` within a
//! fraction of a percent (plain uniform draws leave 4 s at 999 Hz 3.6% off `F` as one
//! standard deviation, and `-F` is a rate people count on). `PERF_EVENT_IOC_PERIOD` also
//! restarts the CPU's timer from the moment of the call, so the phase jumps at each draw.
//!
//! Samples of a stretch count alike. Which stretch a sample fell in does not depend on
//! what ran, so the shares of a thread's stacks stay unbiased; the rate changing within a
//! stack window only adds a little variance.

use std::{
    io,
    os::fd::{AsRawFd, OwnedFd},
    time::{Duration, Instant},
};

use rand::{RngExt as _, SeedableRng as _, rngs::ChaCha8Rng, seq::SliceRandom as _};

use super::activity::cpu_clock_sampler_open;

/// How far each CPU's rate wanders from the one asked for, as a fraction of it.
pub const SPREAD: f64 = 0.25;

/// How often each CPU's rate is drawn anew by default, at most (the caller's drains set
/// the pace): often enough that a few seconds of `record` count `-F` samples per second.
pub const REDRAW: Duration = Duration::from_millis(250);

/// How often the agent and `top` draw each CPU's rate anew. A new period is an
/// inter-processor call to the event's CPU: about 24 µs here (a nested VM), which at
/// [`REDRAW`] on two CPUs was 14% of the idle agent's own CPU (`perf record` of the agent,
/// all of it in `smp_call_function_single` under `_perf_event_period`). A stretch of 2 s
/// at 49 Hz still holds about 100 samples, and the phase still jumps at each draw.
pub const REDRAW_ALWAYS_ON: Duration = Duration::from_secs(2);

/// Sampling periods a stretch lasts at least, whatever the redraw interval: below 64 Hz it
/// is what sets the pace (16 s at 1 Hz).
pub const MIN_STRETCH: f64 = 16.0;

/// Parts of the band each CPU's rates are drawn from in turn.
pub const STRATA: usize = 8;

/// `PERF_EVENT_IOC_ENABLE`, `PERF_EVENT_IOC_PERIOD` and `PERF_EVENT_IOC_SET_BPF`
/// (include/uapi/linux/perf_event.h: `_IO('$', 0)`, `_IOW('$', 4, __u64)`,
/// `_IOW('$', 8, __u32)`).
const IOC_ENABLE: libc::c_ulong = 0x2400;
const IOC_PERIOD: libc::c_ulong = 0x4008_2404;
const IOC_SET_BPF: libc::c_ulong = 0x4004_2408;

/// Why the sampler could not start on a CPU.
#[derive(Debug, thiserror::Error)]
#[error("cannot start the stack sampler on CPU {cpu} ({call}): {source}")]
pub struct SamplerError {
    /// The CPU.
    pub cpu: u32,
    /// The call that failed.
    pub call: &'static str,
    /// What the kernel said.
    #[source]
    pub source: io::Error,
}

/// The sampling events, one per CPU, with the program attached. Closing them detaches it.
pub struct Sampler {
    events: Vec<(u32, OwnedFd)>,
    /// Per event, the strata of the band not yet drawn from in this round.
    strata: Vec<Vec<usize>>,
    hz: f64,
    rng: ChaCha8Rng,
    redraw: Duration,
    next_draw: Instant,
    /// Cleared when the kernel refuses a new period: the rate then stays where it is.
    redraws: bool,
}

impl Sampler {
    /// Opens a cpu-clock sampling event on each of `cpus` at a rate drawn around `hz`, and
    /// attaches the loaded `perf_event` program `prog_fd` to each.
    pub fn attach(prog_fd: libc::c_int, cpus: &[u32], hz: u64) -> Result<Self, SamplerError> {
        let mut sampler = Self {
            events: Vec::with_capacity(cpus.len()),
            strata: vec![Vec::new(); cpus.len()],
            hz: hz.max(1) as f64,
            // The draws only need to differ between CPUs and between runs.
            rng: ChaCha8Rng::seed_from_u64(
                crate::clock::realtime_ns() ^ u64::from(std::process::id()),
            ),
            redraw: REDRAW,
            next_draw: Instant::now(),
            redraws: true,
        };
        sampler.next_draw += sampler.interval();
        for (i, &cpu) in cpus.iter().enumerate() {
            let err = |call, source| SamplerError { cpu, call, source };
            let fd = cpu_clock_sampler_open(sampler.draw_period_ns(i), cpu)
                .map_err(|e| err("perf_event_open(cpu-clock)", e))?;
            ioctl(&fd, IOC_SET_BPF, prog_fd as libc::c_ulong)
                .map_err(|e| err("PERF_EVENT_IOC_SET_BPF", e))?;
            ioctl(&fd, IOC_ENABLE, 0).map_err(|e| err("PERF_EVENT_IOC_ENABLE", e))?;
            sampler.events.push((cpu, fd));
        }
        Ok(sampler)
    }

    /// A period, ns, for event `i`'s next rate: uniform within the next of its strata of
    /// ±[`SPREAD`] around the rate asked for.
    fn draw_period_ns(&mut self, i: usize) -> u64 {
        let left = &mut self.strata[i];
        if left.is_empty() {
            left.extend(0..STRATA);
            left.shuffle(&mut self.rng);
        }
        let k = left.pop().unwrap_or(0) as f64;
        let width = 2.0 * SPREAD / STRATA as f64;
        let from = 1.0 - SPREAD + k * width;
        let hz = self.hz * self.rng.random_range(from..from + width);
        (1e9 / hz).round().max(1.0) as u64
    }

    /// Draws the rates anew every `every` from now on ([`REDRAW`] until told).
    pub fn set_redraw(&mut self, every: Duration) {
        let last = self.next_draw - self.interval();
        self.redraw = every;
        self.next_draw = last + self.interval();
    }

    /// Time between draws: the redraw interval, but never under [`MIN_STRETCH`] periods (at
    /// 1 Hz, `calibrate`'s timeline, which measures idle power, a draw every 250 ms would
    /// only wake CPUs).
    fn interval(&self) -> Duration {
        self.redraw
            .max(Duration::from_secs_f64(MIN_STRETCH / self.hz))
    }

    /// Draws every CPU's rate anew when the redraw interval has passed since the last draw.
    pub fn redraw_if_due(&mut self, now: Instant) {
        if !self.redraws || now < self.next_draw {
            return;
        }
        self.next_draw = now + self.interval();
        for i in 0..self.events.len() {
            let period = self.draw_period_ns(i);
            let (cpu, fd) = &self.events[i];
            if let Err(e) = ioctl(fd, IOC_PERIOD, std::ptr::from_ref(&period) as libc::c_ulong) {
                tracing::warn!(
                    "the stack sampler's rate on CPU {cpu} cannot change ({e}); it stays fixed, \
                     and work periodic at a multiple of its period may be sampled unevenly"
                );
                self.redraws = false;
                return;
            }
        }
    }
}

/// `ioctl(fd, request, arg)`.
fn ioctl(fd: &OwnedFd, request: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: `fd` is an open perf event; each request used here takes an integer or a
    // pointer to a live `u64`, which is all the kernel reads.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sampler with `cpus` events' draws and no fd.
    fn draws(cpus: usize) -> Sampler {
        Sampler {
            events: Vec::new(),
            strata: vec![Vec::new(); cpus],
            hz: 999.0,
            rng: ChaCha8Rng::seed_from_u64(7),
            redraw: REDRAW,
            next_draw: Instant::now(),
            redraws: true,
        }
    }

    /// The draws stay within the spread, cover it evenly, and every round of [`STRATA`]
    /// draws averages to the rate asked for, on each CPU apart.
    #[test]
    fn drawn_rates_cover_the_spread_and_each_round_averages_to_the_rate_asked_for() {
        let mut s = draws(2);
        let rounds = 10_000;
        let (lo, hi) = (999.0 * (1.0 - SPREAD), 999.0 * (1.0 + SPREAD));
        let mut all = Vec::new();
        for cpu in 0..2 {
            for _ in 0..rounds {
                let round: Vec<f64> = (0..STRATA)
                    .map(|_| 1e9 / s.draw_period_ns(cpu) as f64)
                    .collect();
                let mean = round.iter().sum::<f64>() / STRATA as f64;
                // Each stratum is 6.25% of F wide and the strata's centres average to F,
                // so a round's mean is F within half a stratum at the very worst (3.125%),
                // 0.64% as one standard deviation.
                assert!(
                    (mean / 999.0 - 1.0).abs() < 0.03,
                    "a round's mean rate {mean}: {round:?}"
                );
                all.extend(round);
            }
        }
        assert!(
            all.iter().all(|&f| (lo - 0.01..=hi + 0.01).contains(&f)),
            "a rate outside [{lo}, {hi}]"
        );
        let n = all.len() as f64;
        let mean = all.iter().sum::<f64>() / n;
        assert!((mean / 999.0 - 1.0).abs() < 0.001, "mean rate {mean}");
        for k in 0..10 {
            let a = lo + (hi - lo) * k as f64 / 10.0;
            let b = a + (hi - lo) / 10.0;
            let share = all.iter().filter(|&&f| f >= a && f < b).count() as f64 / n;
            assert!(
                (share - 0.1).abs() < 0.005,
                "tenth {k} of the band: {share}"
            );
        }
        // The order within rounds is shuffled: the first draw of a round is not always
        // from the same stratum.
        let mut s = draws(1);
        let firsts: std::collections::HashSet<u64> = (0..50)
            .map(|_| {
                let first = s.draw_period_ns(0);
                for _ in 1..STRATA {
                    s.draw_period_ns(0);
                }
                ((1e9 / first as f64 / 999.0 - (1.0 - SPREAD)) / (2.0 * SPREAD) * STRATA as f64)
                    as u64
            })
            .collect();
        assert!(firsts.len() >= 4, "first strata of 50 rounds: {firsts:?}");
    }

    /// Draws come every redraw interval, but never under [`MIN_STRETCH`] periods.
    #[test]
    fn draws_never_come_faster_than_min_stretch_periods() {
        let mut s = draws(1);
        assert_eq!(s.interval(), REDRAW, "at 999 Hz the interval rules");
        s.set_redraw(REDRAW_ALWAYS_ON);
        assert_eq!(s.interval(), REDRAW_ALWAYS_ON);
        s.hz = 1.0;
        assert_eq!(s.interval(), Duration::from_secs(16), "at 1 Hz, 16 periods");
    }
}
