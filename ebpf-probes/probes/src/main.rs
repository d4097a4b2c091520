//! The eBPF side of energy-bpf: who ran on each CPU and when (`sched_switch`), what they
//! were doing (a cpu-clock perf timer that walks kernel and user stacks), and process
//! lifecycle (`sched_process_exec/fork/exit`). Where userspace opened an activity counter
//! (cycles, or a software event), `sched_switch` also counts it per run.
//!
//! Entry points are thin; each fills one ABI struct from `energy-bpf-abi` straight into a
//! ring buffer reservation. Every submit passes `BPF_RB_NO_WAKEUP`: userspace drains on a
//! timer, because waking the reader per event is itself a context switch that feeds back
//! into `sched_switch` (docs/ARCHITECTURE.md, "Capture"). Run counters (`record --activity-events`) are
//! read at the same switch and at each sampler tick ([`run_counts`]).
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext as _,
    bindings::{BPF_F_USER_STACK, pt_regs},
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{
            bpf_get_current_task, bpf_get_current_task_btf, bpf_get_stack, bpf_task_pt_regs,
        },
    },
    macros::{btf_tracepoint, map, perf_event},
    maps::{Array, HashMap, PerCpuArray, PerfEventArray, ProgramArray, RingBuf},
    programs::{BtfTracePointContext, PerfEventContext},
};
use energy_bpf_abi::{
    COMM_LEN, MAX_STACK_DEPTH, PY_PROCESSES, ProcEvent, PyProcess, SampleEvent, SwitchBatch,
    SwitchEvent, UNWIND_MAPPINGS, UNWIND_PROCESSES, UNWIND_ROWS, UnwindMapping, UnwindProcess,
    UnwindRow, counter, proc_kind, py_stop, switch_flags, unwind_flags, unwind_kind, unwind_method,
    unwind_reg, unwind_stop,
};

mod agg;
mod batch;
mod python;
mod run_counts;
mod walk;

/// `BPF_RB_NO_WAKEUP`: never wake the consumer from the probe (see module docs).
const BPF_RB_NO_WAKEUP: u64 = 1;

#[map]
static SWITCHES: RingBuf = RingBuf::with_byte_size(8 << 20, 0);

#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(16 << 20, 0);

#[map]
static PROCS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

/// Each CPU's switch events not yet sent (see [`SwitchBatch`]).
#[map]
static SWITCH_BATCHES: PerCpuArray<SwitchBatch> = PerCpuArray::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// The activity counter of each CPU (cycles, or a software event), opened by userspace
/// and stored at the CPU's index; read, never written to, by [`activity_delta`].
#[map]
static ACTIVITY: PerfEventArray<u32> = PerfEventArray::new(0);

/// Each CPU's activity counter at its previous switch.
#[map]
static ACTIVITY_LAST: PerCpuArray<ActivityCursor> = PerCpuArray::with_max_entries(1, 0);

/// Nonzero when userspace opened an activity counter: without one, the probe skips the
/// helper call on every switch.
#[unsafe(no_mangle)]
static ACTIVITY_ON: u32 = 0;

/// The activity counter's value at a CPU's previous switch. Private to the probe (userspace
/// never reads it), so not an ABI struct.
#[repr(C)]
struct ActivityCursor {
    /// Counter value.
    value: u64,
    /// Nonzero when `value` was read at the previous switch on this CPU.
    known: u64,
}

/// Nonzero when the table walker is loaded (`--unwind dwarf|auto`).
#[unsafe(no_mangle)]
static UNWIND_ON: u32 = 0;

/// Nonzero when the kernel has `bpf_task_pt_regs` (Linux 5.15): a sample taken in kernel
/// mode then walks the user stack from the registers saved at kernel entry. Zero leaves the
/// helper call in dead code, which the verifier never visits on older kernels.
#[unsafe(no_mangle)]
static TASK_REGS_ON: u32 = 0;

/// Every loaded file's unwind rows; each process's mappings point at slices of it.
#[map(name = "UNWIND_ROWS")]
static UNWIND_ROWS_MAP: Array<UnwindRow> = Array::with_max_entries(UNWIND_ROWS, 0);

/// Processes with tables, by tgid.
#[map]
static UNWIND_PROCS: HashMap<u32, UnwindProcess> = HashMap::with_max_entries(UNWIND_PROCESSES, 0);

/// The sample a table walk is filling, per CPU.
#[map]
static WALK_SAMPLE: PerCpuArray<SampleEvent> = PerCpuArray::with_max_entries(1, 0);

/// The walk's registers between walker programs, per CPU.
#[map]
static WALK_STATE: PerCpuArray<WalkState> = PerCpuArray::with_max_entries(1, 0);

/// The walker programs, for tail calls: [`walk::walk_user`] at [`WALK_USER`] and
/// [`python::walk_python`] at [`WALK_PYTHON`].
#[map]
static WALK_PROGS: ProgramArray = ProgramArray::with_max_entries(2, 0);

/// [`WALK_PROGS`] slot of the table walker.
const WALK_USER: u32 = 0;
/// [`WALK_PROGS`] slot of the CPython frame walker.
const WALK_PYTHON: u32 = 1;

/// Nonzero when the CPython frame walker is loaded.
#[unsafe(no_mangle)]
static PY_ON: u32 = 0;

/// Nonzero when the user asked for probe diagnostics (`--debug-probes`): the walkers then
/// note why a walk stopped and log it through aya-log. Zero (the default) leaves the
/// verifier to prune every diagnostic, as it prunes the log calls (`AYA_LOG_LEVEL` 0).
#[unsafe(no_mangle)]
static PROBE_DEBUG: u32 = 0;

/// Byte offset of `task_struct::thread.fsbase` (x86_64: the thread pointer, which glibc's
/// `pthread_self()` returns and CPython stores as `PyThreadState.thread_id`), from the
/// running kernel's BTF. Zero means unknown: no Python walk.
#[unsafe(no_mangle)]
static TASK_FSBASE_OFFSET: u32 = 0;

/// CPython processes the frame walker knows, by tgid (see [`PyProcess`]).
#[map]
static PY_PROCS: HashMap<u32, PyProcess> = HashMap::with_max_entries(PY_PROCESSES, 0);

/// Where a Python walk stands between two walker programs, per CPU.
#[map]
static PY_STATE: PerCpuArray<python::PyWalkState> = PerCpuArray::with_max_entries(1, 0);

/// Where a walk stands between two walker programs. Private to the probes.
#[repr(C)]
struct WalkState {
    pc: u64,
    sp: u64,
    bp: u64,
    /// Frames taken.
    depth: u64,
    /// [`unwind_flags`] so far.
    flags: u32,
}

/// Byte offsets of `task_struct::pid` and `::tgid`, computed by userspace from the running
/// kernel's BTF (Rust eBPF has no CO-RE field relocations). Zero means unknown.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u32 = 0;

#[inline(always)]
fn bump(index: u32) {
    bump_by(index, 1);
}

#[inline(always)]
fn bump_by(index: u32, n: u64) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; this program is the only writer on this CPU while it runs.
        unsafe { *slot += n };
    }
}

#[inline(always)]
fn current_comm() -> [u8; COMM_LEN] {
    bpf_get_current_comm().unwrap_or([0; COMM_LEN])
}

/// Reads a global that userspace may have rewritten before load; `read_volatile` stops the
/// compiler from folding the initial value in.
#[inline(always)]
fn global(value: &'static u32) -> u32 {
    // SAFETY: a valid, aligned static.
    unsafe { core::ptr::read_volatile(value) }
}

/// (pid, tgid) of a task_struct, or `None` when userspace found no offsets in BTF.
///
/// The task pointers of `tp_btf/sched_switch` are trusted BTF pointers, so the fields are
/// plain loads, not `bpf_probe_read_kernel` calls (~60 ns each on the hottest path we
/// have). The offsets live in frozen `.rodata`, so the verifier knows them as constants and
/// checks each load against `task_struct`'s layout.
#[inline(always)]
fn task_ids(task: *const u8) -> Option<(u32, u32)> {
    let (pid_off, tgid_off) = (global(&TASK_PID_OFFSET), global(&TASK_TGID_OFFSET));
    if pid_off == 0 || tgid_off == 0 {
        return None;
    }
    // SAFETY: `task` is a live task_struct for the duration of the tracepoint and the
    // offsets are those of `pid` and `tgid` in this kernel's BTF; the verifier re-checks.
    unsafe {
        Some((
            core::ptr::read_volatile(task.add(pid_off as usize).cast::<u32>()),
            core::ptr::read_volatile(task.add(tgid_off as usize).cast::<u32>()),
        ))
    }
}

/// The activity count of the run that ends at this switch on this CPU, if the counter was
/// read now and at the previous switch. A failed read forgets the previous value, so a
/// later count never spans two runs.
#[inline(always)]
fn activity_delta() -> Option<u64> {
    if global(&ACTIVITY_ON) == 0 {
        return None;
    }
    let cursor = ACTIVITY_LAST.get_ptr_mut(0)?;
    let counter = run_counts::read(&ACTIVITY);
    // SAFETY: this CPU's slot; nothing else runs on this CPU meanwhile (see batch.rs).
    unsafe {
        let Some(counter) = counter else {
            (*cursor).known = 0;
            return None;
        };
        let previous = ((*cursor).known != 0).then(|| counter.wrapping_sub((*cursor).value));
        (*cursor).value = counter;
        (*cursor).known = 1;
        previous
    }
}

/// Sends this CPU's pending switch events to the ring buffer and empties the batch.
///
/// Never runs concurrently with itself or [`sched_switch`] on one CPU: the switch
/// tracepoint fires with interrupts off and the sampler runs from the timer interrupt.
#[inline(always)]
fn flush_switches(batch: *mut SwitchBatch) {
    // SAFETY: `batch` is this CPU's slot of SWITCH_BATCHES (see above).
    unsafe { batch::flush(batch, &SWITCHES, counter::SWITCH_DROPPED) };
}

/// `tp_btf/sched_switch(bool preempt, task_struct *prev, task_struct *next, unsigned int prev_state)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    // SAFETY: helper with no preconditions.
    let ts_ns = unsafe { bpf_ktime_get_ns() };
    let Some(batch) = SWITCH_BATCHES.get_ptr_mut(0) else {
        return 0;
    };
    let activity = activity_delta();
    let preempt: u64 = ctx.arg(0);
    let prev_state: u64 = ctx.arg(3);
    let (prev_tid, prev_tgid, next_tid, next_tgid, known) =
        match (task_ids(ctx.arg(1)), task_ids(ctx.arg(2))) {
            (Some((pt, pg)), Some((nt, ng))) => (pt, pg, nt, ng, switch_flags::NEXT_KNOWN),
            _ => {
                let pid_tgid = bpf_get_current_pid_tgid();
                (pid_tgid as u32, (pid_tgid >> 32) as u32, 0, 0, 0)
            }
        };
    run_counts::on_boundary(ts_ns, prev_tid);
    if agg::on() {
        let next = (known != 0).then_some((next_tid, next_tgid));
        agg::on_switch(ts_ns, (prev_tid, prev_tgid), next, activity);
        return 0;
    }
    let event = SwitchEvent {
        ts_ns,
        prev_tid,
        prev_tgid,
        next_tid,
        next_tgid,
        prev_state: prev_state as u32,
        flags: (preempt & 1) as u32
            | known
            | if activity.is_some() {
                switch_flags::ACTIVITY
            } else {
                0
            },
        activity: activity.unwrap_or(0),
    };
    // SAFETY: `batch` is this CPU's slot, and nothing else runs on this CPU meanwhile (see
    // flush_switches).
    unsafe { batch::push(batch, event, &SWITCHES, counter::SWITCH_DROPPED) };
    0
}

/// cpu-clock timer on every online CPU, at the user's `-F` frequency.
///
/// The kernel stack is always `bpf_get_stack`'s. The user stack is walked with unwind tables
/// (`.eh_frame` rows loaded by userspace) when the table walker is on, the process has
/// tables and the timer interrupted user code: the sample is then built in a per-CPU slot
/// and handed to [`walk::walk_user`], which sends it. Otherwise the kernel walks frame pointers and
/// the sample says why ([`unwind_stop`]).
#[perf_event]
pub fn sample_stack(ctx: PerfEventContext) -> u32 {
    if agg::on() {
        let pid_tgid = bpf_get_current_pid_tgid();
        // SAFETY: helper with no preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        agg::on_tick(
            now,
            (pid_tgid as u32, (pid_tgid >> 32) as u32),
            activity_delta,
        );
    }
    // Bounds how long a switch event waits in its CPU's batch, idle CPUs included.
    if let Some(batch) = SWITCH_BATCHES.get_ptr_mut(0) {
        flush_switches(batch);
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    if pid_tgid as u32 == 0 {
        bump(counter::IDLE_SAMPLES);
        return 0;
    }
    // Before the sample's own timestamp: the sample opens the next counted interval.
    // SAFETY: helper with no preconditions.
    run_counts::on_boundary(unsafe { bpf_ktime_get_ns() }, pid_tgid as u32);
    let mut stop = unwind_stop::OFF;
    if global(&UNWIND_ON) != 0 {
        stop = start_table_walk(&ctx, pid_tgid);
    }
    if python::is_python((pid_tgid >> 32) as u32) {
        // Returns only when the walker could not be entered; the sample then goes out
        // below without Python frames.
        start_python_fp(&ctx, pid_tgid, stop);
    }
    let Some(mut entry) = SAMPLES.reserve::<SampleEvent>(0) else {
        bump(counter::SAMPLE_DROPPED);
        return 0;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points at a reservation of size_of::<SampleEvent>() owned by us until
    // submit.
    unsafe {
        fill_fp_stacks(&ctx, event, pid_tgid, stop);
    }
    entry.submit(BPF_RB_NO_WAKEUP);
    0
}

/// Everything of a sample but its stacks.
///
/// # Safety
/// `event` must point at a writable [`SampleEvent`].
#[inline(always)]
unsafe fn fill_sample_header(event: *mut SampleEvent, pid_tgid: u64, unwind: u32) {
    // SAFETY: the caller's.
    unsafe {
        (*event).ts_ns = bpf_ktime_get_ns();
        (*event).cgroup_id = bpf_get_current_cgroup_id();
        (*event).tid = pid_tgid as u32;
        (*event).tgid = (pid_tgid >> 32) as u32;
        (*event).cpu = bpf_get_smp_processor_id();
        (*event).unwind = unwind;
        (*event).comm = current_comm();
        (*event).py_depth = 0;
        (*event).py_stop = py_stop::OFF;
    }
}

/// The sample header and both stacks by the kernel's frame-pointer walk (`bpf_get_stack`),
/// with `stop` saying why the table walker did not take the user stack.
///
/// # Safety
/// `event` points at a whole `SampleEvent` this program owns (a ring-buffer reservation
/// or this CPU's slot); `bpf_get_stack` writes at most `STACK_BYTES` into each array.
#[inline(always)]
unsafe fn fill_fp_stacks(
    ctx: &PerfEventContext,
    event: *mut SampleEvent,
    pid_tgid: u64,
    stop: u32,
) {
    const STACK_BYTES: u32 = (MAX_STACK_DEPTH * 8) as u32;
    // SAFETY: as the function's contract says.
    unsafe {
        fill_sample_header(event, pid_tgid, unwind_method::FP | (stop << 8));
        let k = bpf_get_stack(
            ctx.as_ptr(),
            (*event).kernel_stack.as_mut_ptr().cast(),
            STACK_BYTES,
            0,
        );
        let u = bpf_get_stack(
            ctx.as_ptr(),
            (*event).user_stack.as_mut_ptr().cast(),
            STACK_BYTES,
            BPF_F_USER_STACK as u64,
        );
        if k < 0 || u < 0 {
            bump(counter::STACK_ERRORS);
        }
        (*event).kernel_depth = if k > 0 { (k as u32) / 8 } else { 0 };
        (*event).user_depth = if u > 0 { (u as u32) / 8 } else { 0 };
    }
}

/// A CPython process under frame pointers: builds the sample in this CPU's slot, with the
/// kernel's frame-pointer walk of the user stack, and hands it to the Python walker, which
/// sends it. Returns only when the walker could not be entered.
#[inline(always)]
fn start_python_fp(ctx: &PerfEventContext, pid_tgid: u64, stop: u32) {
    let Some(event) = WALK_SAMPLE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; a perf_event program does not nest on one CPU.
    unsafe {
        fill_fp_stacks(ctx, event, pid_tgid, stop);
    }
    python::enter(ctx);
}

/// Hands the sample to the table walker; returns only when it cannot, with the reason
/// (the caller then walks frame pointers).
#[inline(always)]
fn start_table_walk(ctx: &PerfEventContext, pid_tgid: u64) -> u32 {
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: only the key's presence is used.
    if unsafe { UNWIND_PROCS.get(&tgid) }.is_none() {
        return unwind_stop::NO_PROCESS;
    }
    let sampled = ctx.as_ptr() as *const pt_regs;
    let (Some(state), Some(event)) = (WALK_STATE.get_ptr_mut(0), WALK_SAMPLE.get_ptr_mut(0)) else {
        return unwind_stop::TAIL_CALL;
    };
    // SAFETY: `sampled` is the sample's pt_regs; the task's user registers are copied with
    // bpf_probe_read_kernel from what bpf_task_pt_regs returns; `state` and `event` are this
    // CPU's slots, and a perf_event program does not nest on one CPU.
    unsafe {
        let mut kernel_depth = 0;
        let (pc, sp, bp);
        if (*sampled).cs & 3 == 3 {
            (pc, sp, bp) = ((*sampled).rip, (*sampled).rsp, (*sampled).rbp);
        } else {
            if global(&TASK_REGS_ON) == 0 {
                return unwind_stop::IN_KERNEL;
            }
            let at = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const pt_regs;
            let Ok(user) = bpf_probe_read_kernel(at) else {
                return unwind_stop::IN_KERNEL;
            };
            if user.cs & 3 != 3 {
                // A kernel thread: no user stack to walk.
                return unwind_stop::IN_KERNEL;
            }
            (pc, sp, bp) = (user.rip, user.rsp, user.rbp);
            const STACK_BYTES: u32 = (MAX_STACK_DEPTH * 8) as u32;
            let k = bpf_get_stack(
                ctx.as_ptr(),
                (*event).kernel_stack.as_mut_ptr().cast(),
                STACK_BYTES,
                0,
            );
            if k < 0 {
                bump(counter::STACK_ERRORS);
            }
            kernel_depth = if k > 0 { (k as u32) / 8 } else { 0 };
        }
        fill_sample_header(event, pid_tgid, unwind_method::DWARF);
        (*event).kernel_depth = kernel_depth;
        (*event).user_depth = 0;
        *state = WalkState {
            pc,
            sp,
            bp,
            depth: 0,
            flags: 0,
        };
        // Returns only when the call failed.
        WALK_PROGS.tail_call(ctx, WALK_USER);
    }
    unwind_stop::TAIL_CALL
}

#[inline(always)]
fn emit_proc(kind: u32, child_tid: u32, child_tgid: u32, exit_code: u32) {
    let Some(mut entry) = PROCS.reserve::<ProcEvent>(0) else {
        bump(counter::PROC_DROPPED);
        return;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    entry.write(ProcEvent {
        // SAFETY: helper with no preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        kind,
        tid: pid_tgid as u32,
        tgid: (pid_tgid >> 32) as u32,
        child_tid,
        child_tgid,
        exit_code,
        comm: current_comm(),
        // SAFETY: helper with no preconditions.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
    });
    entry.submit(BPF_RB_NO_WAKEUP);
}

/// `tp_btf/sched_process_exec(task_struct *p, pid_t old_pid, linux_binprm *bprm)`; comm is
/// already the new one here.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(_ctx: BtfTracePointContext) -> u32 {
    emit_proc(proc_kind::EXEC, 0, 0, 0);
    0
}

/// `tp_btf/sched_process_fork(task_struct *parent, task_struct *child)`; runs in the parent.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> u32 {
    let child: *const u8 = ctx.arg(1);
    let (tid, tgid) = task_ids(child).unwrap_or((0, 0));
    emit_proc(proc_kind::FORK, tid, tgid, 0);
    0
}

/// `tp_btf/sched_process_exit(task_struct *p, bool group_dead)`; fires for every thread.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(_ctx: BtfTracePointContext) -> u32 {
    emit_proc(proc_kind::EXIT, 0, 0, 0);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// bpf_get_stack is a GPL-only helper.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
