//! perf power PMU: `<sysfs>/bus/event_source/devices/power/{type,events/energy-*}`.
//!
//! The kernel's RAPL PMU (arch/x86/events/rapl.c) exposes `energy-pkg`, `energy-cores`,
//! `energy-ram`, `energy-gpu` and `energy-psys` as `event=0xNN`, with `.scale` (joules per
//! count, typically 2^-32) and `.unit` ("Joules"). It counts system-wide per package, so one
//! event is opened per package on a CPU of that package (`pid = -1`); `energy-psys` covers
//! the platform and is opened once. The kernel keeps the count 64-bit (it unwraps the MSR
//! itself), so it is read without unwrapping. Cheapest interface: one `read(2)` per domain.

use std::{
    collections::BTreeMap,
    fs::File,
    io::Read as _,
    os::fd::{FromRawFd as _, OwnedFd},
    path::{Path, PathBuf},
};

use super::{EnergyError, EnergySource, RawSample, SourceKind, read_text, source_desc};
use crate::pb::v1 as pb;

/// One `power/energy-*` event as described in sysfs.
#[derive(Clone, Debug, PartialEq)]
pub struct EventInfo {
    /// Event name, e.g. `energy-pkg`.
    pub name: String,
    /// `perf_event_attr.config` (the `event=` value).
    pub config: u64,
    /// Joules per count.
    pub scale: f64,
    /// Unit text (`Joules`).
    pub unit: String,
    /// Domain of the event.
    pub domain: pb::EnergyDomain,
}

/// The power PMU as described in sysfs.
#[derive(Clone, Debug, PartialEq)]
pub struct PmuInfo {
    /// `perf_event_attr.type` of the PMU.
    pub pmu_type: u32,
    /// Its energy events, sorted by name.
    pub events: Vec<EventInfo>,
}

/// The PMU directory under a sysfs root.
pub fn pmu_dir(sysfs: &Path) -> PathBuf {
    sysfs.join("bus/event_source/devices/power")
}

fn domain_of(event: &str) -> Option<pb::EnergyDomain> {
    Some(match event {
        "energy-pkg" => pb::EnergyDomain::Package,
        "energy-cores" => pb::EnergyDomain::Cores,
        "energy-gpu" => pb::EnergyDomain::Uncore,
        "energy-ram" => pb::EnergyDomain::Dram,
        "energy-psys" => pb::EnergyDomain::Psys,
        _ => return None,
    })
}

fn parse_config(path: &Path, text: &str) -> Result<u64, EnergyError> {
    let bad = || EnergyError::Parse {
        path: path.to_owned(),
        expected: "`event=0xNN`",
        found: text.to_owned(),
    };
    let value = text.trim().strip_prefix("event=").ok_or_else(bad)?;
    let parsed = match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => value.parse(),
    };
    parsed.map_err(|_| bad())
}

/// Reads the PMU description. `Ok(None)` when there is no power PMU.
pub fn describe(sysfs: &Path) -> Result<Option<PmuInfo>, EnergyError> {
    let dir = pmu_dir(sysfs);
    if !dir.exists() {
        return Ok(None);
    }
    let type_path = dir.join("type");
    let type_text = read_text(&type_path, "")?;
    let pmu_type = type_text.parse().map_err(|_| EnergyError::Parse {
        path: type_path,
        expected: "a PMU type number",
        found: type_text,
    })?;
    let events_dir = dir.join("events");
    let entries =
        std::fs::read_dir(&events_dir).map_err(|e| EnergyError::from_io(&events_dir, e, ""))?;
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| !n.contains('.'))
        .collect();
    names.sort();
    let mut events = Vec::new();
    for name in names {
        let Some(domain) = domain_of(&name) else {
            continue;
        };
        let path = events_dir.join(&name);
        let config = parse_config(&path, &read_text(&path, "")?)?;
        let scale_path = events_dir.join(format!("{name}.scale"));
        let scale_text = read_text(&scale_path, "")?;
        let scale = scale_text
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .ok_or(EnergyError::Parse {
                path: scale_path,
                expected: "a positive scale",
                found: scale_text,
            })?;
        let unit = read_text(&events_dir.join(format!("{name}.unit")), "")?;
        events.push(EventInfo {
            name,
            config,
            scale,
            unit,
            domain,
        });
    }
    Ok(Some(PmuInfo { pmu_type, events }))
}

/// `struct perf_event_attr` up to `config1` (PERF_ATTR_SIZE_VER0 = 64 bytes, which every
/// kernel accepts); the flag bitfield stays 0: counting, enabled, all modes.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    type_: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// One open power event on one package.
#[derive(Debug)]
pub struct Event {
    file: File,
    unit_uj: f64,
    desc: pb::EnergySource,
    event: String,
}

fn open_event(pmu_type: u32, event: &EventInfo, cpu: u32) -> Result<File, EnergyError> {
    let attr = PerfEventAttr {
        type_: pmu_type,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: event.config,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr prefix whose `size` says how much the
    // kernel may read; pid -1 + cpu = system-wide on that CPU; no group fd.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        let source = std::io::Error::last_os_error();
        let hint = match source.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => {
                "; needs root or CAP_PERFMON (or sysctl kernel.perf_event_paranoid=0)"
            }
            Some(libc::ENOENT | libc::EINVAL | libc::ENODEV | libc::EOPNOTSUPP) => {
                "; the kernel has no such power PMU event on this CPU"
            }
            _ => "",
        };
        return Err(EnergyError::PerfOpen {
            event: event.name.clone(),
            cpu,
            source,
            hint: hint.to_owned(),
        });
    }
    // SAFETY: `fd` was just returned by perf_event_open and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    Ok(File::from(owned))
}

/// Opens every event of the PMU on the first CPU of each package (`energy-psys` once).
pub fn open(pmu: &PmuInfo, cpus: &[pb::Cpu]) -> Result<Vec<Event>, EnergyError> {
    let mut packages: BTreeMap<u32, u32> = BTreeMap::new();
    for c in cpus {
        packages.entry(c.package).or_insert(c.id);
    }
    if packages.is_empty() {
        packages.insert(0, 0);
    }
    let mut out = Vec::new();
    for (i, (&package, &cpu)) in packages.iter().enumerate() {
        for event in &pmu.events {
            if event.domain == pb::EnergyDomain::Psys && i > 0 {
                continue;
            }
            let file = open_event(pmu.pmu_type, event, cpu)?;
            let desc = source_desc(
                SourceKind::Perf,
                event.domain,
                package,
                format!("power/{}/ package {package} (cpu {cpu})", event.name),
            );
            let unit_uj = if event.unit.eq_ignore_ascii_case("joules") {
                event.scale * 1e6
            } else {
                event.scale
            };
            out.push(Event {
                file,
                unit_uj,
                desc,
                event: event.name.clone(),
            });
        }
    }
    Ok(out)
}

impl EnergySource for Event {
    fn describe(&self) -> pb::EnergySource {
        self.desc.clone()
    }

    fn unit_uj(&self) -> f64 {
        self.unit_uj
    }

    fn wrap_counts(&self) -> Option<u64> {
        None
    }

    fn read(&mut self) -> Result<RawSample, EnergyError> {
        let mut buf = [0u8; 8];
        self.file
            .read_exact(&mut buf)
            .map_err(|e| EnergyError::from_io(format!("perf event power/{}", self.event), e, ""))?;
        Ok(RawSample {
            count: u64::from_le_bytes(buf),
            gpu_processes: Vec::new(),
        })
    }
}

#[cfg(test)]
#[path = "perf_tests.rs"]
mod tests;
