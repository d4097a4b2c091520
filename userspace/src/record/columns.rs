//! Switch events on disk, packed by column (`SwitchColumns` in `proto/energy_bpf.proto`).
//!
//! Context-switch-heavy machines produce hundreds of thousands of switch events a second;
//! as columns of small varints (per-CPU timestamp deltas, thread ids predicted from the
//! CPU's previous event) they encode several times faster and smaller than as messages.
//! The conversion is lossless and keeps the events' order.

use crate::pb::v1::{SwitchColumns, SwitchEvent};

const PREEMPTED: u32 = 1;
const NEXT_KNOWN: u32 = 2;
/// (tid, tgid) is the CPU's previous (next_tid, next_tgid): no tid entry.
const PREV_IS_LAST_NEXT: u32 = 4;
/// (next_tid, next_tgid) is the CPU's previous (tid, tgid): no next_tid entry.
const NEXT_IS_LAST_PREV: u32 = 8;
/// The event has an activity count: one `activity` entry.
const HAS_ACTIVITY: u32 = 16;

/// What the columns of an event are relative to: its CPU's previous event in the chunk.
#[derive(Clone, Copy, Default)]
struct Last {
    ts_ns: u64,
    tid: u32,
    tgid: u32,
    next_tid: u32,
    next_tgid: u32,
}

/// The per-CPU [`Last`] states while walking a chunk's events in order.
#[derive(Default)]
struct Walk {
    /// With a fast hasher: the CPU changes every few events.
    per_cpu: foldhash::HashMap<u32, Last>,
    cpu: Option<u32>,
    last: Last,
    prev_ts_ns: u64,
}

impl Walk {
    /// The state of `cpu` for its next event. Events come in runs of one CPU, so the map is
    /// only touched when the CPU changes.
    fn last(&mut self, cpu: u32) -> Last {
        if self.cpu != Some(cpu) {
            if let Some(old) = self.cpu {
                self.per_cpu.insert(old, self.last);
            }
            self.last = self.per_cpu.get(&cpu).copied().unwrap_or(Last {
                ts_ns: self.prev_ts_ns,
                ..Last::default()
            });
            self.cpu = Some(cpu);
        }
        self.last
    }

    fn push(&mut self, e: &SwitchEvent) {
        self.last = Last {
            ts_ns: e.ts_ns,
            tid: e.tid,
            tgid: e.tgid,
            next_tid: e.next_tid,
            next_tgid: e.next_tgid,
        };
        self.prev_ts_ns = e.ts_ns;
    }
}

/// Wrapping differences, stored as zigzag varints (`sint32`/`sint64`).
fn diff64(a: u64, b: u64) -> i64 {
    a.wrapping_sub(b) as i64
}

fn diff32(a: u32, b: u32) -> i32 {
    a.wrapping_sub(b) as i32
}

fn add64(b: u64, d: i64) -> u64 {
    b.wrapping_add(d as u64)
}

fn add32(b: u32, d: i32) -> u32 {
    b.wrapping_add(d as u32)
}

/// Packs `events` into columns.
pub fn to_columns(events: &[SwitchEvent]) -> SwitchColumns {
    let mut c = SwitchColumns {
        ts_delta_ns: Vec::with_capacity(events.len()),
        flags: Vec::with_capacity(events.len()),
        ..SwitchColumns::default()
    };
    let mut walk = Walk::default();
    for (i, e) in events.iter().enumerate() {
        match (c.cpu.last(), c.cpu_run_length.last_mut()) {
            (Some(&cpu), Some(run)) if cpu == e.cpu => *run += 1,
            _ => {
                c.cpu.push(e.cpu);
                c.cpu_run_length.push(1);
            }
        }
        let last = walk.last(e.cpu);
        c.ts_delta_ns.push(diff64(e.ts_ns, last.ts_ns));
        let mut flags = 0;
        if e.preempted {
            flags |= PREEMPTED;
        }
        if e.next_known {
            flags |= NEXT_KNOWN;
        }
        if (e.tid, e.tgid) == (last.next_tid, last.next_tgid) {
            flags |= PREV_IS_LAST_NEXT;
        } else {
            c.tid.push(e.tid);
            c.tgid_minus_tid.push(diff32(e.tgid, e.tid));
        }
        if (e.next_tid, e.next_tgid) == (last.tid, last.tgid) {
            flags |= NEXT_IS_LAST_PREV;
        } else {
            c.next_tid.push(e.next_tid);
            c.next_tgid_minus_tid.push(diff32(e.next_tgid, e.next_tid));
        }
        if let Some(count) = e.activity {
            flags |= HAS_ACTIVITY;
            c.activity.push(count);
        }
        c.flags.push(flags);
        if e.cgroup_id != 0 {
            // A chunk is one protobuf message, far below 2^32 events.
            c.cgroup_event.push(i as u32);
            c.cgroup_id.push(e.cgroup_id);
        }
        walk.push(e);
    }
    c
}

/// Why columns could not be unpacked: they disagree in length, or refer past their ends.
#[derive(Debug, thiserror::Error)]
#[error("switch columns are inconsistent: {0}")]
pub struct ColumnsError(&'static str);

/// Unpacks columns into events, in their recorded order.
pub fn from_columns(c: &SwitchColumns) -> Result<Vec<SwitchEvent>, ColumnsError> {
    let n = c.ts_delta_ns.len();
    if c.flags.len() != n {
        return Err(ColumnsError("flags and timestamps differ in length"));
    }
    if c.cpu.len() != c.cpu_run_length.len()
        || c.cpu_run_length.iter().map(|&r| u64::from(r)).sum::<u64>() != n as u64
    {
        return Err(ColumnsError("CPU runs do not cover the events"));
    }
    if c.tid.len() != c.tgid_minus_tid.len()
        || c.next_tid.len() != c.next_tgid_minus_tid.len()
        || c.cgroup_event.len() != c.cgroup_id.len()
    {
        return Err(ColumnsError("paired columns differ in length"));
    }
    let mut cpus = c
        .cpu
        .iter()
        .zip(&c.cpu_run_length)
        .flat_map(|(&cpu, &run)| std::iter::repeat_n(cpu, run as usize));
    let mut prevs = c.tid.iter().zip(&c.tgid_minus_tid);
    let mut nexts = c.next_tid.iter().zip(&c.next_tgid_minus_tid);
    let mut cgroups = c.cgroup_event.iter().zip(&c.cgroup_id).peekable();
    let mut activities = c.activity.iter();
    let mut walk = Walk::default();
    let mut events = Vec::with_capacity(n);
    for (i, (&delta, &flags)) in c.ts_delta_ns.iter().zip(&c.flags).enumerate() {
        let cpu = cpus.next().ok_or(ColumnsError("CPU runs end early"))?;
        let last = walk.last(cpu);
        let (tid, tgid) = if flags & PREV_IS_LAST_NEXT != 0 {
            (last.next_tid, last.next_tgid)
        } else {
            let (&tid, &d) = prevs.next().ok_or(ColumnsError("tid column ends early"))?;
            (tid, add32(tid, d))
        };
        let (next_tid, next_tgid) = if flags & NEXT_IS_LAST_PREV != 0 {
            (last.tid, last.tgid)
        } else {
            let (&tid, &d) = nexts
                .next()
                .ok_or(ColumnsError("next_tid column ends early"))?;
            (tid, add32(tid, d))
        };
        let cgroup_id = match cgroups.next_if(|&(&at, _)| at as usize == i) {
            Some((_, &id)) => id,
            None => 0,
        };
        let activity = if flags & HAS_ACTIVITY != 0 {
            Some(
                *activities
                    .next()
                    .ok_or(ColumnsError("activity column ends early"))?,
            )
        } else {
            None
        };
        let e = SwitchEvent {
            ts_ns: add64(last.ts_ns, delta),
            cpu,
            tid,
            tgid,
            cgroup_id,
            preempted: flags & PREEMPTED != 0,
            next_known: flags & NEXT_KNOWN != 0,
            next_tid,
            next_tgid,
            activity,
        };
        walk.push(&e);
        events.push(e);
    }
    if prevs.next().is_some() || nexts.next().is_some() {
        return Err(ColumnsError("thread id columns have entries left over"));
    }
    if activities.next().is_some() {
        return Err(ColumnsError("activity column has entries left over"));
    }
    if cgroups.next().is_some() {
        return Err(ColumnsError(
            "cgroup indices are not ascending event indices",
        ));
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    fn event(cpu: u32, ts_ns: u64, tid: u32, next_tid: u32) -> SwitchEvent {
        SwitchEvent {
            ts_ns,
            cpu,
            tid,
            tgid: tid,
            next_known: true,
            next_tid,
            next_tgid: next_tid,
            ..SwitchEvent::default()
        }
    }

    #[test]
    fn ping_pong_needs_only_flags_and_deltas() {
        let events: Vec<_> = (0..100u32)
            .map(|i| {
                let (a, b) = if i % 2 == 0 { (10, 11) } else { (11, 10) };
                event(0, 1_000_000 + u64::from(i) * 3_000, a, b)
            })
            .collect();
        let c = to_columns(&events);
        // Only the first event has nothing to refer to.
        assert_eq!((c.tid.len(), c.next_tid.len()), (1, 1));
        assert_eq!(
            (c.cpu.as_slice(), c.cpu_run_length.as_slice()),
            (&[0][..], &[100][..])
        );
        assert!(c.cgroup_event.is_empty());
        assert_eq!(from_columns(&c).expect("columns"), events);
    }

    #[test]
    fn inconsistent_columns_are_errors() {
        let events = vec![event(0, 5, 1, 2), event(1, 7, 3, 4), event(0, 9, 2, 1)];
        let good = to_columns(&events);
        let mut bad = good.clone();
        bad.flags.pop();
        assert!(from_columns(&bad).is_err());
        let mut bad = good.clone();
        bad.cpu_run_length[0] = u32::MAX;
        assert!(from_columns(&bad).is_err());
        let mut bad = good.clone();
        bad.flags[2] &= !PREV_IS_LAST_NEXT;
        assert!(from_columns(&bad).is_err(), "tid column too short");
        let mut bad = good.clone();
        bad.tid.push(1);
        bad.tgid_minus_tid.push(0);
        assert!(from_columns(&bad).is_err(), "tid entries left over");
        let mut bad = good.clone();
        bad.cgroup_event.push(7);
        bad.cgroup_id.push(1);
        assert!(from_columns(&bad).is_err(), "cgroup index past the end");
        let mut bad = good.clone();
        bad.activity.push(5);
        assert!(from_columns(&bad).is_err(), "activity entry left over");
        let mut bad = good;
        bad.flags[1] |= HAS_ACTIVITY;
        assert!(from_columns(&bad).is_err(), "activity column too short");
    }

    /// Interleaved runs of a few CPUs, each CPU mostly forward in time with some events
    /// going back, tasks from a small pool so predictions both hit and miss, and extreme
    /// values.
    fn chunk() -> impl Strategy<Value = Vec<SwitchEvent>> {
        let run = (
            0u32..4,
            prop::collection::vec(
                (
                    -50_000i64..2_000_000,
                    prop::sample::select(vec![0u32, 1, 7, 8, 1_000, 4_194_304, u32::MAX]),
                    prop::sample::select(vec![0u32, 1, 7, 8, 1_000, u32::MAX]),
                    0u32..16,
                    prop::sample::select(vec![0u64, 0, 0, 0, 1, u64::MAX]),
                    prop::sample::select(vec![
                        None,
                        None,
                        Some(0u64),
                        Some(3_000_000),
                        Some(u64::MAX),
                    ]),
                ),
                1..20,
            ),
        );
        (
            prop::sample::select(vec![0u64, 1 << 40, u64::MAX - 1_000_000]),
            prop::collection::vec(run, 0..12),
        )
            .prop_map(|(start, runs)| {
                let mut ts = HashMap::new();
                let mut last: HashMap<u32, SwitchEvent> = HashMap::new();
                let mut out = Vec::new();
                for (cpu, events) in runs {
                    for (step, tid, other, bits, cgroup_id, activity) in events {
                        let ts_ns = ts.entry(cpu).or_insert(start);
                        *ts_ns = add64(*ts_ns, step);
                        // Mostly continue from the CPU's previous switch, like a real one.
                        let prev = last.get(&cpu);
                        let (tid, tgid) = match prev {
                            Some(p) if bits & 4 != 0 => (p.next_tid, p.next_tgid),
                            _ => (tid, if bits & 8 != 0 { other } else { tid }),
                        };
                        let (next_tid, next_tgid) = match prev {
                            Some(p) if bits & 8 != 0 => (p.tid, p.tgid),
                            _ => (other, other ^ (bits & 1)),
                        };
                        let e = SwitchEvent {
                            ts_ns: *ts_ns,
                            cpu,
                            tid,
                            tgid,
                            cgroup_id,
                            preempted: bits & 1 != 0,
                            next_known: bits & 2 != 0,
                            next_tid,
                            next_tgid,
                            activity,
                        };
                        last.insert(cpu, e);
                        out.push(e);
                    }
                }
                out
            })
    }

    proptest! {
        #[test]
        fn columns_round_trip(events in chunk()) {
            let c = to_columns(&events);
            prop_assert_eq!(from_columns(&c).expect("columns"), events);
        }
    }
}
