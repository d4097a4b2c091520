//! The CPython frame walker: [`walk_python`], tail-called once a sample's native stack is
//! taken (by `sample_stack` under frame pointers, by `walk_user` under unwind tables), and
//! by itself, [`FRAMES_PER_PROGRAM`] frames per program (docs/ARCHITECTURE.md, "Python
//! frames").
//!
//! The thread's `PyThreadState` is found as CPython exposes it: `_PyRuntime` (an ELF symbol
//! userspace resolved) -> the main interpreter -> its thread list, the entry whose
//! `thread_id` is the sampled thread's `pthread_self()`, which on x86_64 glibc is the
//! thread's fs base. From its current frame the walk follows `previous` (`f_back`) and
//! stores, per frame, the code object, a checksum of its stable fields and the instruction
//! offset; userspace names them. Offsets per CPython version come in [`PyProcess`].

const _: () = assert!(PY_MAX_FRAMES.is_power_of_two());

use energy_bpf_abi::{
    PY_MAX_FRAMES, PY_OWNED_BY_CSTACK, PyFrame, py_checksum, py_frame, py_layout,
};

use super::*;

/// Where a Python walk stands between two walker programs. Private to the probes.
#[repr(C)]
pub struct PyWalkState {
    /// The next frame to read (0 before the thread state was found).
    frame: u64,
    /// Frames taken.
    depth: u32,
    /// Nonzero once the thread's current frame was found.
    started: u32,
    /// With [`PROBE_DEBUG`]: the address whose read faulted, and which read it was
    /// ([`read`]).
    fault_addr: u64,
    fault_read: u32,
}

/// Which read of the walk faulted, for the diagnostics of `--debug-probes`.
mod read {
    pub const FSBASE: u32 = 0;
    pub const INTERPRETERS: u32 = 1;
    pub const THREADS: u32 = 2;
    pub const THREAD_ID: u32 = 3;
    pub const THREAD_NEXT: u32 = 4;
    pub const THREAD_FRAME: u32 = 5;
    pub const CFRAME: u32 = 6;
    pub const PREVIOUS: u32 = 7;
    pub const OWNER: u32 = 8;
    pub const CODE: u32 = 9;
    pub const INSTR: u32 = 10;
    pub const NAME: u32 = 11;
    pub const FIRSTLINENO: u32 = 12;
}

/// Frames one walker program takes: 4 programs cover [`PY_MAX_FRAMES`].
const FRAMES_PER_PROGRAM: usize = 16;

/// Thread states looked at to find the sampled thread's.
const MAX_THREADS: usize = 64;

/// Not a stop reason: the walk goes on in the next program.
const CONTINUE: u32 = 0xff;

/// Whether the walker is on and knows process `tgid`.
#[inline(always)]
pub fn is_python(tgid: u32) -> bool {
    // SAFETY: only the key's presence is used.
    global(&PY_ON) != 0 && unsafe { PY_PROCS.get(&tgid) }.is_some()
}

/// Starts a Python walk of the sample in this CPU's `WALK_SAMPLE` slot. Returns only when
/// the tail call failed.
#[inline(always)]
pub fn enter<C: aya_ebpf::EbpfContext>(ctx: &C) {
    let Some(st) = PY_STATE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; a perf_event program does not nest on one CPU.
    unsafe {
        *st = PyWalkState {
            frame: 0,
            depth: 0,
            started: 0,
            fault_addr: 0,
            fault_read: 0,
        };
        WALK_PROGS.tail_call(ctx, WALK_PYTHON);
    }
}

/// The Python walk (see the module docs); sends the sample when done. Only ever entered by
/// tail call.
#[perf_event]
pub fn walk_python(ctx: PerfEventContext) -> u32 {
    let (Some(st), Some(event)) = (PY_STATE.get_ptr_mut(0), WALK_SAMPLE.get_ptr_mut(0)) else {
        return 0;
    };
    // SAFETY: this CPU's slots.
    let tgid = unsafe { (*event).tgid };
    // SAFETY: read-only use while the program runs; userspace replaces whole values.
    let Some(p) = (unsafe { PY_PROCS.get(&tgid) }) else {
        return send(event, 0, py_stop::OFF);
    };
    // SAFETY: this CPU's slot.
    let (mut frame, mut depth, started) = unsafe { ((*st).frame, (*st).depth, (*st).started) };
    if started == 0 {
        match current_frame(p) {
            Ok(f) => frame = f,
            Err(stop) => {
                diagnose(&ctx, event, 0, stop);
                return send(event, 0, stop);
            }
        }
    }
    let mut stop = CONTINUE;
    for _ in 0..FRAMES_PER_PROGRAM {
        if frame == 0 {
            stop = py_stop::END;
            break;
        }
        match step(p, event, frame, depth) {
            Ok((previous, taken)) => {
                frame = previous;
                depth += taken;
            }
            Err(s) => {
                stop = s;
                break;
            }
        }
        if depth as usize >= PY_MAX_FRAMES {
            stop = if frame == 0 {
                py_stop::END
            } else {
                py_stop::DEPTH
            };
            break;
        }
    }
    if stop == CONTINUE {
        // SAFETY: this CPU's slot.
        unsafe {
            (*st).frame = frame;
            (*st).depth = depth;
            (*st).started = 1;
            WALK_PROGS.tail_call(&ctx, WALK_PYTHON);
        }
        stop = py_stop::TAIL_CALL;
    }
    diagnose(&ctx, event, depth, stop);
    send(event, depth, stop)
}

/// With `--debug-probes`, logs why a walk stopped short: a read fault (which read, which
/// address), the depth limit, a failed tail call, or no thread state for the thread.
#[inline(always)]
fn diagnose(ctx: &PerfEventContext, event: *const SampleEvent, depth: u32, stop: u32) {
    if global(&PROBE_DEBUG) == 0 {
        return;
    }
    // SAFETY: this CPU's slot of WALK_SAMPLE.
    let (tgid, tid) = unsafe { ((*event).tgid, (*event).tid) };
    match stop {
        py_stop::READ_FAULT => {
            let (addr, which) = match PY_STATE.get_ptr(0) {
                // SAFETY: this CPU's slot.
                Some(st) => unsafe { ((*st).fault_addr, (*st).fault_read) },
                None => (0, u32::MAX),
            };
            aya_log_ebpf::warn!(
                ctx,
                "python walk of {}/{}: read fault at {:x} reading {} after {} frames",
                tgid,
                tid,
                addr,
                read_name(which),
                depth
            );
        }
        py_stop::DEPTH => aya_log_ebpf::info!(
            ctx,
            "python walk of {}/{}: depth limit reached ({} frames); outer frames not walked",
            tgid,
            tid,
            depth
        ),
        py_stop::TAIL_CALL => aya_log_ebpf::warn!(
            ctx,
            "python walk of {}/{}: tail call failed after {} frames",
            tgid,
            tid,
            depth
        ),
        py_stop::NO_THREAD => aya_log_ebpf::debug!(
            ctx,
            "python walk of {}/{}: no thread state for this thread",
            tgid,
            tid
        ),
        _ => {}
    }
}

/// What a [`read`] code names.
#[inline(always)]
fn read_name(which: u32) -> &'static str {
    match which {
        read::FSBASE => "task fsbase",
        read::INTERPRETERS => "_PyRuntime.interpreters.head",
        read::THREADS => "interp.threads.head",
        read::THREAD_ID => "tstate.thread_id",
        read::THREAD_NEXT => "tstate.next",
        read::THREAD_FRAME => "tstate frame",
        read::CFRAME => "cframe.current_frame",
        read::PREVIOUS => "frame.previous",
        read::OWNER => "frame.owner",
        read::CODE => "frame code",
        read::INSTR => "frame instruction",
        read::NAME => "code name/filename",
        read::FIRSTLINENO => "code.co_firstlineno",
        _ => "?",
    }
}

/// With `--debug-probes`, notes which read faulted at which address for [`diagnose`].
#[inline(always)]
fn note_fault(addr: u64, which: u32) {
    if global(&PROBE_DEBUG) == 0 {
        return;
    }
    if let Some(st) = PY_STATE.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; a perf_event program does not nest on one CPU.
        unsafe {
            (*st).fault_addr = addr;
            (*st).fault_read = which;
        }
    }
}

/// Reads one frame at `frame` into the sample's slot `depth`; returns the calling frame and
/// how many frames were stored (0 for a shim frame of the C stack, which instead marks the
/// frame stored before it as an entry frame).
#[inline(always)]
fn step(p: &PyProcess, event: *mut SampleEvent, frame: u64, depth: u32) -> Result<(u64, u32), u32> {
    let previous = read_u64(frame + u64::from(p.frame_previous), read::PREVIOUS)?;
    let layout = p.layout;
    let mut entry = layout == py_layout::FRAME_OBJECT;
    if layout != py_layout::FRAME_OBJECT {
        let owner = read_u8(frame + u64::from(p.frame_owner), read::OWNER)?;
        if layout == py_layout::CFRAME_IS_ENTRY {
            entry = owner != 0;
        } else if owner == PY_OWNED_BY_CSTACK {
            // The shim `_PyEval_EvalFrameDefault` pushes below its first frame.
            if depth > 0 && (depth as usize) <= PY_MAX_FRAMES {
                let at = slot(depth - 1);
                // SAFETY: this CPU's slot; the index is below PY_MAX_FRAMES.
                unsafe { (*event).py_frames[at].offset |= py_frame::ENTRY };
            }
            return Ok((previous, 0));
        }
    }
    let code = read_u64(frame + u64::from(p.frame_code), read::CODE)?;
    let offset = if layout == py_layout::FRAME_OBJECT {
        let lasti = read_u32(frame + u64::from(p.frame_instr), read::INSTR)?;
        if (lasti as i32) < 0 { 0 } else { lasti }
    } else {
        let instr = read_u64(frame + u64::from(p.frame_instr), read::INSTR)?;
        let first = code + u64::from(p.code_adaptive);
        if instr < first {
            0
        } else {
            ((instr - first) / 2) as u32
        }
    };
    let name_at = code + u64::from(p.code_name);
    let filename = read_u64(name_at - 8, read::NAME)?;
    let name = read_u64(name_at, read::NAME)?;
    let firstlineno = read_u32(code + u64::from(p.code_firstlineno), read::FIRSTLINENO)?;
    if (depth as usize) < PY_MAX_FRAMES {
        let at = slot(depth);
        // SAFETY: this CPU's slot; the index is below PY_MAX_FRAMES.
        unsafe {
            (*event).py_frames[at] = PyFrame {
                code,
                checksum: py_checksum(name, filename, firstlineno),
                offset: (offset & py_frame::OFFSET_MASK) | if entry { py_frame::ENTRY } else { 0 },
            };
        }
    }
    Ok((previous, 1))
}

/// The sampled thread's current frame: its `PyThreadState` by `thread_id`, then the
/// version's way to the frame.
#[inline(always)]
fn current_frame(p: &PyProcess) -> Result<u64, u32> {
    let off = global(&TASK_FSBASE_OFFSET);
    if off == 0 {
        return Err(py_stop::NO_THREAD);
    }
    // SAFETY: helper with no preconditions; the task pointer is only read through
    // bpf_probe_read_kernel, which checks it.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: as above.
    let fsbase = unsafe { bpf_probe_read_kernel(task.wrapping_add(off as usize).cast::<u64>()) }
        .map_err(|_| {
            note_fault(task as u64 + u64::from(off), read::FSBASE);
            py_stop::READ_FAULT
        })?;
    let interp = read_u64(
        p.runtime + u64::from(p.interpreters_head),
        read::INTERPRETERS,
    )?;
    if interp == 0 {
        return Err(py_stop::NO_THREAD);
    }
    let mut tstate = read_u64(interp + u64::from(p.threads_head), read::THREADS)?;
    let mut found = false;
    for _ in 0..MAX_THREADS {
        if tstate == 0 {
            break;
        }
        if read_u64(tstate + u64::from(p.tstate_thread_id), read::THREAD_ID)? == fsbase {
            found = true;
            break;
        }
        tstate = read_u64(tstate + u64::from(p.tstate_next), read::THREAD_NEXT)?;
    }
    if !found {
        return Err(py_stop::NO_THREAD);
    }
    let at = read_u64(tstate + u64::from(p.tstate_frame), read::THREAD_FRAME)?;
    match p.layout {
        py_layout::CFRAME_IS_ENTRY | py_layout::CFRAME_OWNER => {
            if at == 0 {
                return Ok(0);
            }
            read_u64(at + u64::from(p.cframe_current_frame), read::CFRAME)
        }
        _ => Ok(at),
    }
}

/// Sends the sample with its Python frames.
#[inline(always)]
fn send(event: *mut SampleEvent, depth: u32, stop: u32) -> u32 {
    // SAFETY: this CPU's slot of WALK_SAMPLE.
    unsafe {
        (*event).py_depth = depth;
        (*event).py_stop = stop;
        if SAMPLES
            .output::<SampleEvent>(&*event, BPF_RB_NO_WAKEUP)
            .is_err()
        {
            bump(counter::SAMPLE_DROPPED);
        }
    }
    0
}

/// `i` as an index of `py_frames` the verifier can bound: the mask is applied to a value
/// read back through a volatile load, so the compiler cannot fold it into an earlier
/// comparison (which the verifier does not connect to the index). Callers check
/// `i < PY_MAX_FRAMES` first; the mask then changes nothing.
#[inline(always)]
fn slot(i: u32) -> usize {
    // SAFETY: a read of a local.
    let v = unsafe { core::ptr::read_volatile(&i) };
    v as usize & (PY_MAX_FRAMES - 1)
}

#[inline(always)]
fn read_u64(addr: u64, which: u32) -> Result<u64, u32> {
    // SAFETY: the helper checks the address and fails on a fault.
    unsafe { bpf_probe_read_user(addr as *const u64) }.map_err(|_| fault(addr, which))
}

#[inline(always)]
fn read_u32(addr: u64, which: u32) -> Result<u32, u32> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_user(addr as *const u32) }.map_err(|_| fault(addr, which))
}

#[inline(always)]
fn read_u8(addr: u64, which: u32) -> Result<u8, u32> {
    // SAFETY: as above.
    unsafe { bpf_probe_read_user(addr as *const u8) }.map_err(|_| fault(addr, which))
}

#[inline(always)]
fn fault(addr: u64, which: u32) -> u32 {
    note_fault(addr, which);
    py_stop::READ_FAULT
}
