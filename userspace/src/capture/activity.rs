//! The activity counter `sched_switch` reads at every switch: one perf event per online CPU,
//! opened here and stored in the probes' `ACTIVITY` map (a `PERF_EVENT_ARRAY`) at the CPU's
//! index, so the probe reads its own CPU's counter with `bpf_perf_event_read_value`.
//!
//! Cycles where the PMU has them (they capture DVFS, turbo and stalls: power follows them
//! more closely than time); otherwise a software event the user names, which exercises the
//! same path, or none (the split is then by time and every output says so).

use std::{
    io,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
};

/// Which counter weighs runs (`--activity-event`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ActivityEvent {
    /// Cycles where the PMU has them, else none.
    #[default]
    Auto,
    /// Hardware CPU cycles.
    Cycles,
    /// Hardware retired instructions (legacy Kepler's choice).
    Instructions,
    /// Software task-clock (ns; the same as time, for testing the path).
    TaskClock,
    /// Software cpu-clock (ns; the same as time, for testing the path).
    CpuClock,
    /// No counter: split by time.
    None,
}

impl ActivityEvent {
    /// The name outputs and recordings use ("none" for no counter).
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cycles => "cycles",
            Self::Instructions => "instructions",
            Self::TaskClock => "task-clock",
            Self::CpuClock => "cpu-clock",
            Self::None => "none",
        }
    }

    /// `(perf type, config)` of the event.
    fn perf_type_config(self) -> Option<(u32, u64)> {
        // include/uapi/linux/perf_event.h: PERF_TYPE_HARDWARE = 0, PERF_TYPE_SOFTWARE = 1;
        // PERF_COUNT_HW_CPU_CYCLES = 0, _INSTRUCTIONS = 1; PERF_COUNT_SW_CPU_CLOCK = 0,
        // _TASK_CLOCK = 1.
        match self {
            Self::Cycles => Some((0, 0)),
            Self::Instructions => Some((0, 1)),
            Self::CpuClock => Some((1, 0)),
            Self::TaskClock => Some((1, 1)),
            Self::Auto | Self::None => None,
        }
    }
}

/// Why an activity counter the user asked for could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ActivityError {
    /// perf_event_open refused the event (no PMU, or not permitted).
    #[error(
        "cannot open the {event} counter on CPU {cpu}: {source} (this machine may have no hardware counters; pass --activity-event none or a software event)"
    )]
    Open {
        /// Event name.
        event: &'static str,
        /// CPU.
        cpu: u32,
        /// The kernel's error.
        source: io::Error,
    },
    /// The counter could not be stored in the probes' map.
    #[error("cannot store the {event} counter of CPU {cpu} in the probes' map: {source}")]
    Store {
        /// Event name.
        event: &'static str,
        /// CPU.
        cpu: u32,
        /// The kernel's error.
        source: io::Error,
    },
}

/// Open counters, one per CPU; closing them (drop) stops counting.
#[derive(Debug)]
pub struct ActivityCounters {
    event: ActivityEvent,
    per_cpu: Vec<(u32, OwnedFd)>,
}

impl ActivityCounters {
    /// Opens `choice` on every CPU. `Auto` falls back to `Ok(None)` when cycles cannot be
    /// opened; an explicit event that cannot be opened is an error; `None` opens nothing.
    pub fn open(choice: ActivityEvent, cpus: &[u32]) -> Result<Option<Self>, ActivityError> {
        let event = match choice {
            ActivityEvent::None => return Ok(None),
            ActivityEvent::Auto => ActivityEvent::Cycles,
            other => other,
        };
        match Self::open_event(event, cpus) {
            Ok(counters) => Ok(Some(counters)),
            Err(err) if choice == ActivityEvent::Auto => {
                tracing::info!("{err}; splitting by time");
                Ok(None)
            }
            Err(err) => Err(err),
        }
    }

    fn open_event(event: ActivityEvent, cpus: &[u32]) -> Result<Self, ActivityError> {
        let Some((kind, config)) = event.perf_type_config() else {
            return Ok(Self {
                event,
                per_cpu: Vec::new(),
            });
        };
        let per_cpu = cpus
            .iter()
            .map(|&cpu| {
                perf_event_open(kind, config, cpu)
                    .map(|fd| (cpu, fd))
                    .map_err(|source| ActivityError::Open {
                        event: event.name(),
                        cpu,
                        source,
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { event, per_cpu })
    }

    /// What `--activity-event auto` picks on this machine (`sources` says it without
    /// loading probes): the event, or why there is none.
    pub fn auto_choice(cpus: &[u32]) -> Result<ActivityEvent, ActivityError> {
        Self::open_event(ActivityEvent::Cycles, cpus).map(|c| c.event)
    }

    /// The event counted.
    pub fn event(&self) -> ActivityEvent {
        self.event
    }

    /// Stores every CPU's counter at its index of the `PERF_EVENT_ARRAY` map `map`.
    pub fn install(&self, map: &aya::maps::MapData) -> Result<(), ActivityError> {
        let map_fd = map.fd().as_fd().as_raw_fd();
        for (cpu, fd) in &self.per_cpu {
            map_update(map_fd, *cpu, fd.as_raw_fd()).map_err(|source| ActivityError::Store {
                event: self.event.name(),
                cpu: *cpu,
                source,
            })?;
        }
        Ok(())
    }
}

/// The head of `struct perf_event_attr` (`PERF_ATTR_SIZE_VER0`, 64 bytes), enough for a
/// counting event; the kernel zero-extends the rest.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    /// Bit field: bit 0 `disabled`, bit 2 `pinned`, ...
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 64);

/// `attr.pinned`: always on the PMU, never multiplexed, so the probe needs no scaling by
/// enabled/running time (a pinned event that cannot stay on goes into error and reads fail).
const PINNED: u64 = 1 << 2;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// A counting event on every task of `cpu`.
pub(super) fn perf_event_open(kind: u32, config: u64, cpu: u32) -> io::Result<OwnedFd> {
    open_on_cpu(
        &PerfEventAttr {
            kind,
            config,
            flags: PINNED,
            ..PerfEventAttr::default()
        },
        cpu,
    )
}

/// `attr.disabled`: the event starts off (enabled by `PERF_EVENT_IOC_ENABLE`).
const DISABLED: u64 = 1;
/// `PERF_TYPE_SOFTWARE` and its `PERF_COUNT_SW_CPU_CLOCK`.
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;

/// A sampling cpu-clock event on every task of `cpu`, one sample per `period_ns`, opened
/// disabled (a program is attached before it is enabled).
pub(super) fn cpu_clock_sampler_open(period_ns: u64, cpu: u32) -> io::Result<OwnedFd> {
    open_on_cpu(
        &PerfEventAttr {
            kind: PERF_TYPE_SOFTWARE,
            config: PERF_COUNT_SW_CPU_CLOCK,
            sample_period: period_ns,
            flags: DISABLED,
            ..PerfEventAttr::default()
        },
        cpu,
    )
}

/// `perf_event_open(attr)` on every task of `cpu`, no group.
fn open_on_cpu(attr: &PerfEventAttr, cpu: u32) -> io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        ..*attr
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it declares and outlives the
    // call; pid -1 with a CPU counts every task there; no group.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            -1 as libc::pid_t,
            cpu as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: perf_event_open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// `BPF_MAP_UPDATE_ELEM` of one `u32 → fd` entry.
pub(super) fn map_update(map_fd: libc::c_int, key: u32, value: libc::c_int) -> io::Result<()> {
    super::bpf_sys::update_elem(map_fd, &key, &(value as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_opens_nothing_and_names_are_stable() {
        assert!(
            ActivityCounters::open(ActivityEvent::None, &[0])
                .expect("none never fails")
                .is_none()
        );
        let names: Vec<&str> = [
            ActivityEvent::Auto,
            ActivityEvent::Cycles,
            ActivityEvent::Instructions,
            ActivityEvent::TaskClock,
            ActivityEvent::CpuClock,
            ActivityEvent::None,
        ]
        .iter()
        .map(|e| e.name())
        .collect();
        assert_eq!(
            names,
            [
                "auto",
                "cycles",
                "instructions",
                "task-clock",
                "cpu-clock",
                "none"
            ]
        );
    }
}
