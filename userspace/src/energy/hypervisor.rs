//! The `hypervisor` source: inside a virtual machine, the energy the host measured for this
//! VM, read from the directory the host shares into the guest read-only (default
//! [`DEFAULT_DIR`], `--hypervisor-dir DIR`; docs/virtual-machines.md, "In the guest").
//!
//! The share is laid out like a powercap tree (`intel-rapl:0/energy_uj`, ...), so zones are
//! found by the powercap reader's own code; beside them `energy-bpf.json` carries what a
//! powercap tree cannot: the host's update interval, a `seq` that moves at every update
//! (the staleness clock), the VM's `instance`, the count of gaps the host flagged, whether
//! the host itself measured, and the static share inside each zone's energy.
//!
//! Rules, on top of the shared counter rules (`counter`):
//! - staleness is judged on this guest's clock: `seq` unchanged for [`STALE_INTERVALS`]
//!   host intervals means the host stopped updating. The source says so once (a notice),
//!   holds its last value (so nothing is counted, never old values as new, never 0 W) and,
//!   when the host resumes, flags the interval that spans the silence;
//! - a new `instance` (VM restarted or migrated), a `gaps` count that grew (host agent
//!   restarted) or a counter that went down is a flagged gap: the interval ending there is
//!   dropped and counting restarts from the new value, never a negative or doubled delta;
//! - a share that vanishes or cannot be parsed mid-run counts as stale, not as a dead source,
//!   so a host agent restart does not end the guest's measurement.
//!
//! One [`HypervisorZone`] per zone, each reading `energy-bpf.json` itself: a few small reads
//! per interval.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    EnergyError, EnergySource, RawSample, SourceKind, powercap, read_text, read_u64, source_desc,
};
use crate::{clock::monotonic_ns, pb::v1 as pb};

pub use super::args::HYPERVISOR_DIR as DEFAULT_DIR;
/// The metadata file of the share.
pub const META_FILE: &str = "energy-bpf.json";
/// Host intervals without a new `seq` after which the share is stale.
pub const STALE_INTERVALS: u64 = 2;
/// How often a zone is read at least, per host interval: five reads per update keep each
/// reading within a fifth of an interval of the host's write, at two small file reads each
/// (in a TCG guest, where a read costs most, about 25 ms). Where reads are cheap enough, the
/// reader times each update more closely in step with the host (`reader`, `PhaseLock`).
const READS_PER_UPDATE: u64 = 5;

/// One zone's figures in `energy-bpf.json`.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct ZoneMeta {
    /// Cumulative µJ (dynamic + static), as in the zone's `energy_uj`.
    #[serde(default)]
    pub energy_uj: u64,
    /// Cumulative static share inside `energy_uj`, µJ.
    #[serde(default)]
    pub static_uj: u64,
}

/// The last gap the host flagged.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct HostGap {
    /// `seq` of the write after the gap.
    #[serde(default)]
    pub seq: u64,
    /// Why, e.g. "host agent restarted".
    #[serde(default)]
    pub reason: String,
    /// Time the host was not counting, ms.
    #[serde(default)]
    pub missing_ms: u64,
}

/// `energy-bpf.json`, the share's metadata (docs/virtual-machines.md).
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
pub struct Meta {
    /// Format version (1).
    #[serde(default)]
    pub format: u32,
    /// The VM's name on the host.
    #[serde(default)]
    pub vm: String,
    /// `pid:starttime` of the VM process: a new VM of the same name has a new one.
    #[serde(default)]
    pub instance: String,
    /// +1 per write.
    #[serde(default)]
    pub seq: u64,
    /// The host's update interval, ms.
    #[serde(default)]
    pub interval_ms: u64,
    /// vCPUs the host counts for this VM.
    #[serde(default)]
    pub vcpus: u32,
    /// How the host shares its static power among VMs: `vcpus`, `busy` or `none`.
    #[serde(default)]
    pub static_policy: String,
    /// False when the host runs on the estimated model itself.
    #[serde(default = "yes")]
    pub measured: bool,
    /// The host's energy source kind, e.g. `powercap`.
    #[serde(default)]
    pub host_source: String,
    /// Per zone name (`package`, `core`, `dram`).
    #[serde(default)]
    pub zones: BTreeMap<String, ZoneMeta>,
    /// Gaps the host flagged so far.
    #[serde(default)]
    pub gaps: u64,
    /// The latest of them.
    #[serde(default)]
    pub last_gap: Option<HostGap>,
    /// Host time the counters cover, µs, cumulative (0 from hosts that do not say).
    #[serde(default)]
    pub counted_us: u64,
}

fn yes() -> bool {
    true
}

/// The hint on a share that cannot be read.
const HINT: &str =
    "the host's share is read-only and root-owned (mode 0750): run as root in the guest";

/// Reads and parses `DIR/energy-bpf.json`.
pub fn read_meta(dir: &Path) -> Result<Meta, EnergyError> {
    let path = dir.join(META_FILE);
    let text = read_text(&path, HINT)?;
    serde_json::from_str(&text).map_err(|e| EnergyError::Parse {
        path,
        expected: "the host's energy-bpf.json (format 1)",
        found: format!("{e}"),
    })
}

impl Meta {
    /// The host's interval, ns (1 s when the host did not say).
    pub fn interval_ns(&self) -> u64 {
        if self.interval_ms == 0 {
            1_000_000_000
        } else {
            self.interval_ms * 1_000_000
        }
    }

    /// What `sources` says about the share, e.g. "measured by the host, shared at
    /// /run/energy-bpf/host, updated every 1 s (VM web-1, 2 vCPUs, host source powercap,
    /// static share by vcpus)".
    pub fn describe(&self, dir: &Path) -> String {
        let how = if self.measured {
            "measured by the host".to_owned()
        } else {
            format!(
                "ESTIMATED by the host (the host itself has no energy counter: its source is {})",
                or_unknown(&self.host_source)
            )
        };
        format!(
            "{how}, shared at {}, updated every {} (VM {}, {} vCPUs, host source {}, static \
             share by {})",
            dir.display(),
            seconds(self.interval_ns()),
            or_unknown(&self.vm),
            self.vcpus,
            or_unknown(&self.host_source),
            or_unknown(&self.static_policy),
        )
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown" } else { s }
}

fn seconds(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.3} s")
    }
}

/// The metadata's key of a zone's name (`package-0` → `package`).
fn zone_key(name: &str) -> &str {
    if name.starts_with("package-") {
        "package"
    } else {
        name
    }
}

/// Waits up to [`STALE_INTERVALS`] host intervals (on this clock) for `seq` to move past
/// `first`'s. `None` when it did not: the share is stale.
fn next_update(dir: &Path, first: &Meta) -> Result<Option<(Meta, u64)>, EnergyError> {
    let start = monotonic_ns();
    let cap = STALE_INTERVALS * first.interval_ns();
    loop {
        // A file caught mid-replacement by a host that does not rename (the contract says
        // it does) is read again at the next poll.
        if let Ok(meta) = read_meta(dir)
            && meta.seq != first.seq
        {
            return Ok(Some((meta, monotonic_ns() - start)));
        }
        if monotonic_ns() - start > cap {
            return Ok(None);
        }
        // A hundredth of the interval: the static share is timed by these polls.
        let poll_ns = (first.interval_ns() / 100).clamp(2_000_000, 20_000_000);
        std::thread::sleep(Duration::from_nanos(poll_ns));
    }
}

/// Opens every zone of the share at `dir`. `Ok(empty)` when there is no share there. A share
/// whose `seq` does not move within [`STALE_INTERVALS`] intervals is an error: its numbers
/// are old. The static power the host assigns is measured over one update (so opening takes
/// up to two host intervals).
pub fn open(dir: &Path) -> Result<Vec<HypervisorZone>, EnergyError> {
    let meta_path = dir.join(META_FILE);
    if !meta_path.exists() {
        return Ok(Vec::new());
    }
    let first = read_meta(dir)?;
    if first.format != 1 {
        return Err(EnergyError::Parse {
            path: meta_path,
            expected: "format 1 (a newer host agent? update energy-bpf in the guest)",
            found: first.format.to_string(),
        });
    }
    let Some((next, _)) = next_update(dir, &first)? else {
        return Err(EnergyError::Unavailable {
            kind: SourceKind::Hypervisor,
            reason: format!(
                "the host's share at {} is stale: seq {} did not change in {} (its interval is \
                 {}); is the host agent running?",
                dir.display(),
                first.seq,
                seconds(STALE_INTERVALS * first.interval_ns()),
                seconds(first.interval_ns())
            ),
        });
    };
    // The static share per second. Timed by the host's own clock where the host says how
    // much time its counters cover (`counted_us`): exact, whatever the guest's scheduling.
    // Otherwise between two updates both seen as they happened (the time between them is
    // the host's real interval, longer than nominal on a loaded host, give or take a poll);
    // when the second does not come in time, over the nominal interval of the first.
    let (a, b, host_s) = if next.counted_us > first.counted_us && next.seq == first.seq + 1 {
        let host_s = (next.counted_us - first.counted_us) as f64 / 1e6;
        (first, next, host_s)
    } else {
        match next_update(dir, &next)? {
            Some((second, _)) if second.counted_us > next.counted_us => {
                let host_s = (second.counted_us - next.counted_us) as f64 / 1e6;
                (next, second, host_s)
            }
            Some((second, waited_ns)) => (next, second, waited_ns as f64 / 1e9),
            None => {
                let host_s = (next.seq - first.seq) as f64 * next.interval_ns() as f64 / 1e9;
                (first, next, host_s)
            }
        }
    };
    let infos = powercap::zones_in(dir)?;
    let mut out = Vec::new();
    for info in infos {
        let key = zone_key(&info.name);
        let static_w = match (a.zones.get(key), b.zones.get(key)) {
            (Some(a), Some(b)) if host_s > 0.0 => {
                b.static_uj.saturating_sub(a.static_uj) as f64 / 1e6 / host_s
            }
            _ => 0.0,
        };
        out.push(HypervisorZone::open(dir, &info, &b, static_w)?);
    }
    Ok(out)
}

/// One zone of the host's share.
#[derive(Debug)]
pub struct HypervisorZone {
    dir: PathBuf,
    energy_path: PathBuf,
    desc: pb::EnergySource,
    interval_ns: u64,
    instance: String,
    gaps: u64,
    seq: u64,
    /// Guest time `seq` last moved.
    seq_moved_ns: u64,
    /// The value handed out last (held while stale).
    count: u64,
    /// Guest time the share went stale, while it is.
    stale_since_ns: Option<u64>,
    gap: Option<String>,
    notice: Option<String>,
}

impl HypervisorZone {
    fn open(
        dir: &Path,
        info: &powercap::ZoneInfo,
        meta: &Meta,
        static_w: f64,
    ) -> Result<Self, EnergyError> {
        let energy_path = info.dir.join("energy_uj");
        let count = read_u64(&energy_path, HINT)?;
        let mut desc = source_desc(
            SourceKind::Hypervisor,
            info.domain,
            info.package,
            format!("{} ({})", info.id, info.name),
        );
        desc.estimated = !meta.measured;
        if !meta.measured {
            desc.model_origin = format!(
                "estimated by the host's model (the host's source is {})",
                or_unknown(&meta.host_source)
            );
        }
        desc.host_static_w = static_w;
        desc.update_period_ns = meta.interval_ns();
        Ok(Self {
            dir: dir.to_owned(),
            energy_path,
            desc,
            interval_ns: meta.interval_ns(),
            instance: meta.instance.clone(),
            gaps: meta.gaps,
            seq: meta.seq,
            seq_moved_ns: monotonic_ns(),
            count,
            stale_since_ns: None,
            gap: None,
            notice: None,
        })
    }

    /// Accounts one read of the share at guest time `now_ns`; returns the value to hand out.
    /// Pure but for `self`: the tests drive it with made-up reads.
    fn account(&mut self, now_ns: u64, read: Option<(u64, Meta)>) -> u64 {
        if let Some((count, meta)) = read
            && meta.seq != self.seq
        {
            let mut why = Vec::new();
            if let Some(since) = self.stale_since_ns.take() {
                why.push(format!(
                    "the host did not update the share for {}",
                    seconds(now_ns.saturating_sub(since) + STALE_INTERVALS * self.interval_ns)
                ));
            }
            if meta.instance != self.instance {
                why.push(format!(
                    "a new instance of the VM ({} -> {}: restarted or migrated)",
                    self.instance, meta.instance
                ));
            } else if meta.gaps > self.gaps {
                let last = meta.last_gap.clone().unwrap_or_default();
                why.push(format!(
                    "the host flagged a gap ({}, {} ms not counted)",
                    or_unknown(&last.reason),
                    last.missing_ms
                ));
            }
            if count < self.count {
                why.push(format!(
                    "the counter went down ({} -> {count} µJ)",
                    self.count
                ));
            }
            if !why.is_empty() {
                self.gap = Some(format!("hypervisor share: {}", why.join("; ")));
            }
            self.interval_ns = meta.interval_ns();
            self.instance = meta.instance;
            self.gaps = meta.gaps;
            self.seq = meta.seq;
            self.seq_moved_ns = now_ns;
            self.count = count;
            return self.count;
        }
        let silent_ns = now_ns.saturating_sub(self.seq_moved_ns);
        if self.stale_since_ns.is_none() && silent_ns > STALE_INTERVALS * self.interval_ns {
            self.stale_since_ns = Some(now_ns);
            self.notice = Some(format!(
                "{} {}: the host stopped updating {} (seq {} unchanged for {}, {} intervals): \
                 no energy is counted until it resumes, and the interval spanning the silence \
                 will be flagged and dropped",
                SourceKind::Hypervisor,
                self.desc.name,
                self.dir.display(),
                self.seq,
                seconds(silent_ns),
                STALE_INTERVALS
            ));
        }
        // Unchanged seq (or an unreadable share): the last value, which the counter rules
        // merge into the next interval rather than read as 0 W.
        self.count
    }
}

impl EnergySource for HypervisorZone {
    fn describe(&self) -> pb::EnergySource {
        self.desc.clone()
    }

    fn unit_uj(&self) -> f64 {
        1.0
    }

    fn wrap_counts(&self) -> Option<u64> {
        // The host's counters are 64-bit and never wrap; a drop is a gap (see `account`).
        None
    }

    fn read(&mut self) -> Result<RawSample, EnergyError> {
        // Zone first, then the metadata the host writes last: the count is at least as new
        // as the seq it is judged by.
        let read = read_u64(&self.energy_path, HINT)
            .and_then(|count| Ok((count, read_meta(&self.dir)?)))
            .ok();
        let count = self.account(monotonic_ns(), read);
        Ok(RawSample {
            count,
            gpu_processes: Vec::new(),
        })
    }

    fn known_update_period_ns(&self) -> Option<u64> {
        Some(self.interval_ns)
    }

    fn default_read_interval_ns(&self) -> Option<u64> {
        Some(self.interval_ns / READS_PER_UPDATE)
    }

    fn take_gap(&mut self) -> Option<String> {
        self.gap.take()
    }

    fn take_notice(&mut self) -> Option<String> {
        self.notice.take()
    }
}

#[cfg(test)]
#[path = "hypervisor_tests.rs"]
mod tests;
