//! The eBPF side of energy-bpf: who ran on each CPU and when (`sched_switch`), what they
//! were doing (a cpu-clock perf timer that walks kernel and user stacks), and process
//! lifecycle (`sched_process_exec/fork/exit`).
//!
//! Entry points are thin; each fills one ABI struct from `energy-bpf-abi` straight into a
//! ring buffer reservation. Every submit passes `BPF_RB_NO_WAKEUP`: userspace drains on a
//! timer, because waking the reader per event is itself a context switch that feeds back
//! into `sched_switch` (DESIGN.md §3).
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::bpf_get_stack,
    },
    macros::{btf_tracepoint, map, perf_event},
    maps::{PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, PerfEventContext},
};
use energy_bpf_abi::{
    COMM_LEN, MAX_STACK_DEPTH, ProcEvent, SampleEvent, SwitchEvent, counter, proc_kind,
};

/// `BPF_RB_NO_WAKEUP`: never wake the consumer from the probe (see module docs).
const BPF_RB_NO_WAKEUP: u64 = 1;

#[map]
static SWITCHES: RingBuf = RingBuf::with_byte_size(8 << 20, 0);

#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(16 << 20, 0);

#[map]
static PROCS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Byte offsets of `task_struct::pid` and `::tgid`, computed by userspace from the running
/// kernel's BTF (Rust eBPF has no CO-RE field relocations). Zero means unknown.
#[unsafe(no_mangle)]
static TASK_PID_OFFSET: u32 = 0;
#[unsafe(no_mangle)]
static TASK_TGID_OFFSET: u32 = 0;

#[inline(always)]
fn bump(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; this program is the only writer on this CPU while it runs.
        unsafe { *slot += 1 };
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

/// (pid, tgid, known) of a task_struct, using the offsets userspace found in BTF.
#[inline(always)]
fn task_ids(task: *const u8) -> (u32, u32, u32) {
    let (pid_off, tgid_off) = (global(&TASK_PID_OFFSET), global(&TASK_TGID_OFFSET));
    if pid_off == 0 || tgid_off == 0 {
        return (0, 0, 0);
    }
    // SAFETY: `task` is a live task_struct for the duration of the tracepoint; the offsets
    // come from this kernel's BTF, and bpf_probe_read_kernel tolerates a bad address.
    unsafe {
        if tgid_off == pid_off + 4 {
            // Adjacent (as in every kernel so far): one read instead of two on the hottest
            // path we have.
            return match bpf_probe_read_kernel(task.add(pid_off as usize) as *const u64) {
                Ok(both) => (both as u32, (both >> 32) as u32, 1),
                Err(_) => (0, 0, 0),
            };
        }
        match (
            bpf_probe_read_kernel(task.add(pid_off as usize) as *const u32),
            bpf_probe_read_kernel(task.add(tgid_off as usize) as *const u32),
        ) {
            (Ok(pid), Ok(tgid)) => (pid, tgid, 1),
            _ => (0, 0, 0),
        }
    }
}

/// `tp_btf/sched_switch(bool preempt, task_struct *prev, task_struct *next, unsigned int prev_state)`.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    let preempt: u64 = ctx.arg(0);
    let prev_state: u64 = ctx.arg(3);
    let next: *const u8 = ctx.arg(2);
    let (next_tid, next_tgid, next_known) = task_ids(next);
    let Some(mut entry) = SWITCHES.reserve::<SwitchEvent>(0) else {
        bump(counter::SWITCH_DROPPED);
        return 0;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    entry.write(SwitchEvent {
        // SAFETY: helpers with no preconditions in this program type.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        prev_tid: pid_tgid as u32,
        prev_tgid: (pid_tgid >> 32) as u32,
        cpu: unsafe { bpf_get_smp_processor_id() },
        prev_state: prev_state as u32,
        preempt: (preempt & 1) as u32,
        next_tid,
        next_tgid,
        next_known,
    });
    entry.submit(BPF_RB_NO_WAKEUP);
    0
}

/// cpu-clock timer on every online CPU, at the user's `-F` frequency.
#[perf_event]
pub fn sample_stack(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if pid_tgid as u32 == 0 {
        bump(counter::IDLE_SAMPLES);
        return 0;
    }
    let Some(mut entry) = SAMPLES.reserve::<SampleEvent>(0) else {
        bump(counter::SAMPLE_DROPPED);
        return 0;
    };
    let event = entry.as_mut_ptr();
    const STACK_BYTES: u32 = (MAX_STACK_DEPTH * 8) as u32;
    // SAFETY: `event` points at a reservation of size_of::<SampleEvent>() owned by us until
    // submit; bpf_get_stack writes at most STACK_BYTES into each array.
    unsafe {
        (*event).ts_ns = bpf_ktime_get_ns();
        (*event).cgroup_id = bpf_get_current_cgroup_id();
        (*event).tid = pid_tgid as u32;
        (*event).tgid = (pid_tgid >> 32) as u32;
        (*event).cpu = bpf_get_smp_processor_id();
        (*event)._pad = 0;
        (*event).comm = current_comm();
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
    entry.submit(BPF_RB_NO_WAKEUP);
    0
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
    let (tid, tgid, _) = task_ids(child);
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

/// bpf_get_stack and bpf_probe_read_kernel are GPL-only helpers.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
