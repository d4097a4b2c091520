//! Facts about the host a recording needs: kernel release, host name, CPU topology,
//! and the privilege and kernel checks that run before any probe is loaded.

use std::{fs, path::Path};

use crate::clock::{boottime_ns, monotonic_ns};

/// `uname -r` and `uname -n`.
pub(crate) fn uname() -> (String, String) {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return (String::new(), String::new());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.release), field(&u.nodename))
}

/// What stops capture before it starts; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    /// Neither root nor the capabilities needed to load and attach probes; names the
    /// capabilities that are missing.
    #[error(
        "permission denied: loading eBPF probes needs root or CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN); missing {missing}; run with sudo or add the capability"
    )]
    NotPrivileged {
        /// `CAP_BPF`, `CAP_PERFMON` or both, joined with `+`.
        missing: String,
    },
    /// The kernel exposes no BTF.
    #[error(
        "this kernel has no BTF ({0} is missing): energy-bpf needs a kernel built with CONFIG_DEBUG_INFO_BTF=y"
    )]
    NoBtf(String),
    /// The kernel predates ring buffers and BTF tracepoints.
    #[error("kernel {0} is too old: energy-bpf needs Linux 5.8 or newer (BPF ring buffer, tp_btf)")]
    KernelTooOld(String),
}

const CAP_SYS_ADMIN: u32 = 21;
/// Read other users' `/proc/<pid>/maps` and `/proc/<pid>/root` (unwind tables, symbols).
pub const CAP_SYS_PTRACE: u32 = 19;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Whether this process holds capability `cap` (a `CAP_*` number) in its effective set.
pub(crate) fn has_capability(cap: u32) -> bool {
    cap < 64 && effective_caps() & (1 << cap) != 0
}

/// Effective capability bits of this process.
fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        })
        .unwrap_or(0)
}

/// Checks privileges, BTF and kernel version before anything is loaded.
pub(crate) fn preflight(btf_path: &Path) -> Result<(), PreflightError> {
    let caps = effective_caps();
    let has = |cap: u32| caps & (1 << cap) != 0;
    if !(has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))) {
        let missing: Vec<&str> = [(CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")]
            .into_iter()
            .filter(|&(cap, _)| !has(cap))
            .map(|(_, name)| name)
            .collect();
        return Err(PreflightError::NotPrivileged {
            missing: missing.join("+"),
        });
    }
    let (release, _) = uname();
    if !kernel_at_least(&release, (5, 8)) {
        return Err(PreflightError::KernelTooOld(release));
    }
    if !btf_path.exists() {
        return Err(PreflightError::NoBtf(btf_path.display().to_string()));
    }
    Ok(())
}

/// Whether a release string like `6.18.44-foo` is at least `major.minor`.
pub(crate) fn kernel_at_least(release: &str, want: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    match (parts.next(), parts.next()) {
        (Some(major), Some(minor)) => (major, minor) >= want,
        _ => false,
    }
}

/// Start of a process in CLOCK_MONOTONIC ns, from `/proc/PID/stat` (None if it vanished).
pub fn process_start_ns(tgid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    // Field 22 (starttime, clock ticks since boot) counts after the ")" closing comm,
    // which may itself contain spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    let ticks: u64 = after.split(' ').nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let boot_ns = ticks * (1_000_000_000 / hz);
    // /proc start times count from boot including suspend; shift to the monotonic clock.
    let suspend_ns = boottime_ns().saturating_sub(monotonic_ns());
    Some(boot_ns.saturating_sub(suspend_ns))
}

/// A thread's comm from `/proc/PID/task/TID/comm` (None if it vanished).
pub(crate) fn thread_comm(tgid: u32, tid: u32) -> Option<String> {
    fs::read_to_string(format!("/proc/{tgid}/task/{tid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_owned())
}

/// The cgroup v2 id of a thread (what `bpf_get_current_cgroup_id` returns: the inode of its
/// cgroup's directory under the cgroup2 mount), or `None` if it vanished or has no v2 cgroup.
pub fn cgroup_id(tgid: u32, tid: u32) -> Option<u64> {
    cgroup(tgid, tid).map(|(id, _)| id)
}

/// [`cgroup_id`] and the cgroup's path under the cgroup2 mount.
pub fn cgroup(tgid: u32, tid: u32) -> Option<(u64, String)> {
    use std::os::unix::fs::MetadataExt as _;
    let membership = fs::read_to_string(format!("/proc/{tgid}/task/{tid}/cgroup")).ok()?;
    let path = membership
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_end();
    let view = cgroup2_view();
    let path = super::cgroupns::host_path(&view.ns_root, path)?;
    let dir = format!("{}{path}", view.mount);
    fs::metadata(dir).ok().map(|m| (m.ino(), path))
}

/// The cgroup v2 mount and, inside a cgroup namespace, the host path of its root
/// ([`super::cgroupns`]; read once).
fn cgroup2_view() -> &'static super::cgroupns::View {
    static VIEW: std::sync::OnceLock<super::cgroupns::View> = std::sync::OnceLock::new();
    VIEW.get_or_init(|| {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        super::cgroupns::view(&mountinfo, &|p| {
            use std::os::unix::fs::MetadataExt as _;
            fs::metadata(p).ok().map(|m| m.ino())
        })
    })
}

/// Where the cgroup v2 hierarchy is mounted: `/sys/fs/cgroup` on unified systems,
/// `/sys/fs/cgroup/unified` on hybrid ones (read once from /proc/self/mounts).
pub fn cgroup2_mount() -> &'static str {
    static MOUNT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MOUNT.get_or_init(|| {
        fs::read_to_string("/proc/self/mounts")
            .ok()
            .and_then(|m| {
                m.lines().find_map(|l| {
                    let mut f = l.split_whitespace();
                    let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
                    (fstype == "cgroup2").then(|| dir.to_string())
                })
            })
            .unwrap_or_else(|| "/sys/fs/cgroup".to_string())
    })
}

/// A process's command line with NULs as spaces (empty for kernel threads or if it vanished).
pub fn cmdline(tgid: u32) -> String {
    fs::read(format!("/proc/{tgid}/cmdline"))
        .map(|b| {
            let s: Vec<u8> = b
                .into_iter()
                .map(|c| if c == 0 { b' ' } else { c })
                .collect();
            String::from_utf8_lossy(&s).trim_end().to_owned()
        })
        .unwrap_or_default()
}

/// The recording header of a capture starting now: this host, these CPUs, this sample
/// rate. `record` writes it first; the agent's rotating recordings start with it too.
pub fn header(
    cpus: Vec<crate::pb::v1::Cpu>,
    sample_hz: u32,
    target_pids: Vec<u32>,
) -> crate::pb::v1::Header {
    let (kernel_release, hostname) = uname();
    crate::pb::v1::Header {
        format_version: crate::record::FORMAT_VERSION,
        hostname,
        kernel_release,
        cpus,
        sample_hz,
        clock: "CLOCK_MONOTONIC".into(),
        start_ns: monotonic_ns(),
        start_unix_ns: crate::clock::realtime_ns(),
        recorder_version: env!("CARGO_PKG_VERSION").into(),
        command_line: std::env::args().collect(),
        target_pids,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_compare() {
        assert!(kernel_at_least("6.18.44-fc-v595", (5, 8)));
        assert!(kernel_at_least("5.8.0", (5, 8)));
        assert!(!kernel_at_least("5.4.0-100-generic", (5, 8)));
        assert!(!kernel_at_least("4.19.0", (5, 8)));
        assert!(!kernel_at_least("garbage", (5, 8)));
    }

    #[test]
    fn own_process_start_is_in_the_past() {
        let start = process_start_ns(std::process::id()).expect("own /proc entry");
        assert!(start <= monotonic_ns());
        assert!(
            monotonic_ns() - start < 3_600_000_000_000,
            "test started within the hour"
        );
    }
}
