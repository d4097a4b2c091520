//! The clocks: CLOCK_MONOTONIC is the one every timestamp uses (it is the clock of
//! `bpf_ktime_get_ns`, so probe events, energy readings and windows line up); the others
//! convert to and from it.

/// CLOCK_MONOTONIC now, in ns: the clock of `bpf_ktime_get_ns`, so userspace stamps
/// (energy readings, capture window) line up with probe timestamps.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// CLOCK_REALTIME now, in ns since the Unix epoch.
pub(crate) fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

/// CLOCK_BOOTTIME now, in ns (what /proc/PID/stat start times count from).
pub(crate) fn boottime_ns() -> u64 {
    clock_ns(libc::CLOCK_BOOTTIME)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; these clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}
