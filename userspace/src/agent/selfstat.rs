//! The agent's own CPU time and memory, for its self-metrics and the benchmark.

/// CPU and memory use of this process.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// User + system CPU time since start, s.
    pub cpu_seconds: f64,
    /// Resident memory now, bytes.
    pub rss_bytes: u64,
    /// Peak resident memory, bytes.
    pub peak_rss_bytes: u64,
}

/// This process's usage now (zeros where the kernel would not say).
pub fn now() -> Usage {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer to a rusage.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } == 0;
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let (cpu_seconds, peak_rss_bytes) = if ok {
        (
            secs(ru.ru_utime) + secs(ru.ru_stime),
            // ru_maxrss is in KiB on Linux.
            u64::try_from(ru.ru_maxrss).unwrap_or(0) * 1024,
        )
    } else {
        (0.0, 0)
    };
    Usage {
        cpu_seconds,
        rss_bytes: rss_bytes().unwrap_or(0),
        peak_rss_bytes,
    }
}

/// Resident pages from `/proc/self/statm` (its second field), in bytes.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

/// Whether a process with this pid exists (a lost exit event must not keep a series
/// forever).
pub fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_usage() {
        let u = super::now();
        assert!(
            u.rss_bytes > 0 && u.peak_rss_bytes >= u.rss_bytes / 2,
            "{u:?}"
        );
        assert!(super::pid_alive(std::process::id()));
    }
}
