//! What the probes' ring-buffer records mean: switch batches, stack samples and lifecycle
//! events decoded into the recording's types, each CPU's switch events delivered once.
//! Pure: bytes in, events out; the records are bounded by their own length fields.

use std::collections::HashMap;

use energy_bpf_abi::{
    ProcEvent, SWITCH_BATCH, SWITCH_BATCH_HEADER, SampleEvent, SwitchEvent, comm_bytes, proc_kind,
    switch_flags, unwind_method, unwind_stop,
};

use crate::pb::v1::{self as pb, process_event::Kind};

/// A task's `comm` as the kernel keeps it: NUL-padded bytes. Kept raw on the hot path (one
/// per switch event) and turned into a `String` only when a thread is new or renamed.
pub type Comm = [u8; energy_bpf_abi::COMM_LEN];

/// `comm` as text.
pub fn comm_string(raw: &Comm) -> String {
    String::from_utf8_lossy(comm_bytes(raw)).into_owned()
}

/// One decoded probe event, in the recording's types. A sample is boxed: a drain holds
/// every event of a poll at once, and switches (56 bytes) far outnumber samples (which
/// would make each event 192 bytes).
#[derive(Debug)]
pub enum Event {
    /// A context switch.
    Switch(pb::SwitchEvent),
    /// A stack sample.
    Sample(Box<DecodedSample>),
    /// A lifecycle event, boxed as samples are (they are rare).
    Process(Box<DecodedProc>),
}

/// A lifecycle event as decoded, with what the session needs beside it.
#[derive(Debug)]
pub struct DecodedProc {
    /// The event, as recorded.
    pub event: pb::ProcessEvent,
    /// The cgroup v2 id of the task it is about (for a fork, the parent's).
    pub cgroup_id: u64,
}

// A drain holds every event of a poll: keep an event the size of a switch.
const _: () = assert!(std::mem::size_of::<Event>() <= 64);

/// A stack sample as decoded, with what the session needs beside it.
#[derive(Debug)]
pub struct DecodedSample {
    /// The sample.
    pub sample: pb::Sample,
    /// The sampled task's raw comm.
    pub comm: Comm,
    /// The probe's `unwind` word (`SampleEvent::unwind`).
    pub unwind: u32,
    /// The CPython frames the probe read.
    pub python: crate::python::RawFrames,
}

pub(super) fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    (bytes.len() >= std::mem::size_of::<T>())
        // SAFETY: length checked; T is a Pod ABI struct valid for any bit pattern;
        // read_unaligned tolerates the ring buffer's 8-byte alignment.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

/// The CPU and events of one ring-buffer record of switches (a [`SwitchBatch`] cut after
/// its valid events), or `None` if the record is malformed.
pub(super) fn switch_batch(bytes: &[u8]) -> Option<(u32, impl Iterator<Item = SwitchEvent> + '_)> {
    batch(bytes)
}

/// The CPU and entries of one ring-buffer record of a per-CPU batch of `T` (`len`, `cpu`,
/// then the entries: [`SwitchBatch`] and the batches laid out like it), or `None` if the
/// record is malformed.
pub(super) fn batch<T: Copy + 'static>(
    bytes: &[u8],
) -> Option<(u32, impl Iterator<Item = T> + '_)> {
    let header = bytes.get(..SWITCH_BATCH_HEADER)?;
    let len = u32::from_ne_bytes(header[..4].try_into().ok()?) as usize;
    let cpu = u32::from_ne_bytes(header[4..8].try_into().ok()?);
    let size = std::mem::size_of::<T>();
    let body = bytes.get(SWITCH_BATCH_HEADER..SWITCH_BATCH_HEADER + len.checked_mul(size)?)?;
    (len <= SWITCH_BATCH).then(|| (cpu, body.chunks_exact(size).filter_map(read)))
}

/// Sends a CPU's switch events on, skipping any already delivered.
pub(super) fn deliver(
    delivered: &mut HashMap<u32, u64>,
    cpu: u32,
    events: impl IntoIterator<Item = SwitchEvent>,
    sink: &mut impl FnMut(Event),
) -> usize {
    let newest = delivered.entry(cpu).or_insert(0);
    let mut n = 0;
    for e in events {
        if e.ts_ns > *newest {
            *newest = e.ts_ns;
            sink(decode_switch(cpu, &e));
            n += 1;
        }
    }
    n
}

fn decode_switch(cpu: u32, e: &SwitchEvent) -> Event {
    Event::Switch(pb::SwitchEvent {
        ts_ns: e.ts_ns,
        cpu,
        tid: e.prev_tid,
        tgid: e.prev_tgid,
        // Filled per thread in userspace (see the ABI).
        cgroup_id: 0,
        preempted: e.prev_state == 0,
        next_known: e.flags & switch_flags::NEXT_KNOWN != 0,
        next_tid: e.next_tid,
        next_tgid: e.next_tgid,
        activity: (e.flags & switch_flags::ACTIVITY != 0).then_some(e.activity),
    })
}

pub(super) fn decode_sample(e: &SampleEvent) -> Event {
    let k = (e.kernel_depth as usize).min(e.kernel_stack.len());
    let u = (e.user_depth as usize).min(e.user_stack.len());
    let method = match e.unwind & 0xff {
        unwind_method::DWARF => pb::UnwindMethod::Dwarf,
        _ => pb::UnwindMethod::FramePointer,
    };
    let stop = match (e.unwind >> 8) & 0xff {
        unwind_stop::END_OF_STACK => pb::UnwindStop::EndOfStack,
        unwind_stop::NO_TABLE => pb::UnwindStop::NoTable,
        unwind_stop::BAD_CFA => pb::UnwindStop::BadCfa,
        unwind_stop::UNSUPPORTED => pb::UnwindStop::Unsupported,
        unwind_stop::READ_FAULT => pb::UnwindStop::ReadFault,
        unwind_stop::DEPTH_LIMIT => pb::UnwindStop::DepthLimit,
        unwind_stop::NO_PROCESS => pb::UnwindStop::NoProcessTable,
        unwind_stop::IN_KERNEL => pb::UnwindStop::InKernel,
        unwind_stop::TAIL_CALL => pb::UnwindStop::TailCall,
        _ => pb::UnwindStop::Off,
    };
    Event::Sample(Box::new(DecodedSample {
        sample: pb::Sample {
            ts_ns: e.ts_ns,
            cpu: e.cpu,
            tid: e.tid,
            tgid: e.tgid,
            cgroup_id: e.cgroup_id,
            kernel_stack: e.kernel_stack[..k].to_vec(),
            user_stack: e.user_stack[..u].to_vec(),
            unwind_method: method as i32,
            unwind_stop: stop as i32,
            ..Default::default()
        },
        comm: e.comm,
        unwind: e.unwind,
        python: crate::python::RawFrames {
            stop: e.py_stop,
            frames: e.py_frames[..(e.py_depth as usize).min(e.py_frames.len())].to_vec(),
        },
    }))
}

pub(super) fn decode_proc(e: &ProcEvent) -> Box<DecodedProc> {
    let kind = match e.kind {
        proc_kind::EXEC => Kind::Exec,
        proc_kind::FORK => Kind::Fork,
        proc_kind::EXIT => Kind::Exit,
        _ => Kind::Unspecified,
    };
    Box::new(DecodedProc {
        event: pb::ProcessEvent {
            ts_ns: e.ts_ns,
            kind: kind as i32,
            tid: e.tid,
            tgid: e.tgid,
            child_tid: e.child_tid,
            child_tgid: e.child_tgid,
            comm: comm_string(&e.comm),
        },
        cgroup_id: e.cgroup_id,
    })
}

#[cfg(test)]
mod tests {
    use energy_bpf_abi::SwitchBatch;

    use super::*;

    fn event(ts_ns: u64, prev_tid: u32, next_tid: u32) -> SwitchEvent {
        SwitchEvent {
            ts_ns,
            prev_tid,
            prev_tgid: prev_tid,
            next_tid,
            next_tgid: next_tid,
            prev_state: 1,
            flags: switch_flags::NEXT_KNOWN,
            activity: 0,
        }
    }

    /// The bytes the probe sends: the batch cut after its `len` events.
    fn wire(cpu: u32, events: &[SwitchEvent]) -> Vec<u8> {
        let mut batch = SwitchBatch {
            len: events.len() as u32,
            cpu,
            events: [event(0, 0, 0); SWITCH_BATCH],
        };
        batch.events[..events.len()].copy_from_slice(events);
        let size = SWITCH_BATCH_HEADER + std::mem::size_of_val(events);
        // SAFETY: SwitchBatch is plain #[repr(C)] data at least `size` bytes long.
        unsafe { std::slice::from_raw_parts((&raw const batch).cast::<u8>(), size) }.to_vec()
    }

    fn switches(batches: &[(u32, Vec<SwitchEvent>)]) -> Vec<(u32, u64, u32)> {
        let mut delivered = HashMap::new();
        let mut out = Vec::new();
        for (cpu, events) in batches {
            deliver(&mut delivered, *cpu, events.iter().copied(), &mut |e| {
                if let Event::Switch(s) = e {
                    out.push((s.cpu, s.ts_ns, s.tid));
                }
            });
        }
        out
    }

    #[test]
    fn batches_decode_to_their_cpus_events() {
        let bytes = wire(1, &[event(10, 5, 6), event(20, 6, 0)]);
        let (cpu, events) = switch_batch(&bytes).expect("valid batch");
        let events: Vec<SwitchEvent> = events.collect();
        assert_eq!(cpu, 1);
        assert_eq!(events.len(), 2);
        assert_eq!(switches(&[(cpu, events)]), [(1, 10, 5), (1, 20, 6)]);
        let Event::Switch(s) = decode_switch(1, &event(10, 5, 6)) else {
            panic!("not a switch");
        };
        assert!(s.next_known && !s.preempted && s.next_tid == 6);
    }

    #[test]
    fn malformed_batches_are_skipped() {
        let mut bytes = wire(0, &[event(10, 5, 6)]);
        assert!(switch_batch(&bytes[..4]).is_none(), "short header");
        bytes.truncate(bytes.len() - 1);
        assert!(switch_batch(&bytes).is_none(), "last event cut short");
        let mut huge = wire(0, &[event(10, 5, 6)]);
        huge[..4].copy_from_slice(&(SWITCH_BATCH as u32 + 1).to_ne_bytes());
        assert!(switch_batch(&huge).is_none(), "length beyond a batch");
    }

    #[test]
    fn events_read_twice_are_delivered_once_per_cpu() {
        // The end-of-capture read of the kernel's batches may overlap what the ring buffer
        // already delivered; each CPU's events are in time order, so older ones are repeats.
        let first = (0, vec![event(10, 1, 2), event(20, 2, 1)]);
        let other_cpu = (1, vec![event(15, 3, 4)]);
        let overlap = (0, vec![event(20, 2, 1), event(30, 1, 2)]);
        assert_eq!(
            switches(&[first, other_cpu, overlap]),
            [(0, 10, 1), (0, 20, 2), (1, 15, 3), (0, 30, 1)]
        );
    }
}
