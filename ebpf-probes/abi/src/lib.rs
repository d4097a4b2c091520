//! Wire types shared by the eBPF probes and the userspace agent.
//!
//! Every struct is `#[repr(C)]` with explicit padding and no `bool`, so both sides agree on
//! the layout byte for byte. The probes write them into ring buffers; userspace reads them
//! back through `aya::Pod` (feature `user`). Never copy one of these by hand on the user side.
#![no_std]

/// Deepest kernel or user stack a sample carries (the kernel's `PERF_MAX_STACK_DEPTH`).
pub const MAX_STACK_DEPTH: usize = 127;

/// Length of `task_struct::comm` (`TASK_COMM_LEN`).
pub const COMM_LEN: usize = 16;

/// One context switch. `current` at `sched_switch` is the task *leaving*, so each event
/// closes the run `(previous switch on this cpu, ts_ns]` of `prev_tid`. The CPU is the
/// batch's ([`SwitchBatch`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SwitchEvent {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at the switch: the end of prev's run.
    pub ts_ns: u64,
    /// Thread id of the leaving task (0 is the CPU's idle task).
    pub prev_tid: u32,
    /// Process id (thread group) of the leaving task.
    pub prev_tgid: u32,
    /// Thread id of the task switched in (0 for the idle task, and when the kernel's task
    /// layout is unknown; see [`switch_flags::NEXT_KNOWN`]).
    pub next_tid: u32,
    /// Process id of the task switched in.
    pub next_tgid: u32,
    /// `prev_state` argument: 0 when the task was still runnable, else why it blocked.
    pub prev_state: u32,
    /// [`switch_flags`].
    pub flags: u32,
    /// Count of the activity event (cycles where the PMU has them, or the software event
    /// userspace chose) over the run this switch ends; valid only with
    /// [`switch_flags::ACTIVITY`]. It lets dynamic energy be split by activity instead of
    /// time (docs/ARCHITECTURE.md, "Attribution").
    pub activity: u64,
    // No comm and no cgroup id here on purpose: each is a helper call on every switch
    // (~150 ns and ~20 ns measured with kernel.bpf_stats_enabled). Userspace learns both
    // from samples, lifecycle events, or /proc the first time a thread is seen.
}

/// Bits of [`SwitchEvent::flags`].
pub mod switch_flags {
    /// The switch was a preemption (the tracepoint's `preempt` argument).
    pub const PREEMPT: u32 = 1;
    /// `next_tid`/`next_tgid` were read (the task_struct offsets were known).
    pub const NEXT_KNOWN: u32 = 2;
    /// `activity` holds the run's count: the counter was read at this switch and at the
    /// previous one on the same CPU.
    pub const ACTIVITY: u32 = 4;
}

/// Switch events per [`SwitchBatch`]. 63, not 64: the probe sends `8 + len * 40` bytes and
/// the verifier bounds that through bit masks, which for `len <= 63` stay inside the map
/// value but for `len <= 64` do not.
pub const SWITCH_BATCH: usize = 63;

/// Switch events of one CPU, collected in a per-CPU map and sent to the ring buffer a batch
/// at a time: one ring-buffer write per [`SWITCH_BATCH`] switches instead of per switch, the
/// largest single cost of the probe. A batch is sent when full, when its first event is
/// older than [`SWITCH_BATCH_MAX_AGE_NS`] at the next switch, and on every sampler tick of
/// its CPU, so events reach userspace within one sampling period. Only the first `len`
/// events are written to the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SwitchBatch {
    /// Valid events.
    pub len: u32,
    /// CPU of every event in the batch.
    pub cpu: u32,
    /// Events, oldest first.
    pub events: [SwitchEvent; SWITCH_BATCH],
}

/// Bytes of a [`SwitchBatch`] before its events.
pub const SWITCH_BATCH_HEADER: usize = 8;

/// A batch whose first event is older than this is sent at the next switch on its CPU.
pub const SWITCH_BATCH_MAX_AGE_NS: u64 = 20_000_000;

/// Counters `sched_switch` reads per run besides the activity counter (`record
/// --activity-events`): instructions, cycles and LLC misses for the per-function roofline,
/// or software events standing in for them.
pub const RUN_COUNTERS: usize = 3;

/// The run counters' counts over one run: the run of `tid` on the batch's CPU that ends at
/// `ts_ns` (the same `ts_ns` as that switch's [`SwitchEvent`]). Sent only while userspace
/// asked for run counters, on a ring buffer of its own, so switch events keep their size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CountEvent {
    /// End of the run (`bpf_ktime_get_ns()` at the switch).
    pub ts_ns: u64,
    /// Thread id of the task whose run ended (0: the idle task).
    pub tid: u32,
    /// Bit k set: `counts[k]` holds counter k's count over the run (read at this switch and
    /// at the previous one on this CPU).
    pub valid: u32,
    /// Counts, in the order userspace installed the counters.
    pub counts: [u64; RUN_COUNTERS],
}

/// Count events of one CPU, batched like [`SwitchBatch`] (same length, same reasons).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CountBatch {
    /// Valid events.
    pub len: u32,
    /// CPU of every event in the batch.
    pub cpu: u32,
    /// Events, oldest first.
    pub events: [CountEvent; SWITCH_BATCH],
}

/// The aggregating mode's time slot by default: runs are summed per slot of this length,
/// cut exactly at its edges (multiples of it on CLOCK_MONOTONIC). As long as the energy
/// readings' interval at least (10 ms), so splitting energy by busy time per slot loses
/// little of what the exact stream knows.
pub const AGG_SLOT_NS: u64 = 10_000_000;

/// What one thread did on one CPU in one slot (the aggregating mode: the agent's
/// default, where `sched_switch` adds to these rows instead of sending an event).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AggRow {
    /// The slot: `[slot × slot_ns, (slot + 1) × slot_ns)`.
    pub slot: u64,
    /// On-CPU ns within the slot.
    pub busy_ns: u64,
    /// Activity count of those runs, split at slot edges in proportion to time (when
    /// [`agg_row_flags::NO_ACTIVITY`] is clear).
    pub activity: u64,
    /// The thread.
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// [`agg_row_flags`].
    pub flags: u32,
    /// Padding.
    pub _pad: u32,
}

/// One CPU's rows of its current slot (the aggregating mode), one per thread that ran in
/// it, all of one slot. The probe sends the table to the ring as one record of
/// [`SWITCH_BATCH_HEADER`] + `len` rows when the CPU leaves the slot, or earlier when it
/// is full (a thread can then have two rows in a slot: userspace adds them up).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct AggTable {
    /// Valid rows.
    pub len: u32,
    /// The CPU.
    pub cpu: u32,
    /// Rows, in the order the threads first ran in the slot.
    pub rows: [AggRow; SWITCH_BATCH],
}

/// [`AggRow::flags`] bits.
pub mod agg_row_flags {
    /// Some run of the row had no activity count: `activity` is incomplete.
    pub const NO_ACTIVITY: u32 = 1;
}

/// The aggregating mode's state on one CPU: the task that runs since `start_ns`. Every
/// slot before the one holding `start_ns` is complete on this CPU, its table in the ring
/// before `start_ns` moved past it: userspace reads a slot's rows once every CPU is past it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AggCursor {
    /// Start of the current run, or of its slot if it began in an earlier one.
    pub start_ns: u64,
    /// The slot holding `start_ns`: the probe keeps it so that a switch inside the same
    /// slot divides nothing (a 64-bit division is a hardware divide in eBPF, tens of ns).
    pub slot: u64,
    /// The running thread (0: idle).
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// Whether `tid` is known (a switch or a tick was seen on this CPU).
    pub known: u32,
    /// Padding.
    pub _pad: u32,
}

/// One timer-driven stack sample.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SampleEvent {
    /// `bpf_ktime_get_ns()` when the timer fired.
    pub ts_ns: u64,
    /// cgroup v2 id of the sampled task.
    pub cgroup_id: u64,
    /// Thread that was running when the timer fired.
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// Number of valid entries in `kernel_stack` (0 when in user mode or on error).
    pub kernel_depth: u32,
    /// Number of valid entries in `user_stack` (0 for kernel threads or on error).
    pub user_depth: u32,
    /// How the user stack was walked: [`unwind_method`] in the low byte, the walk's
    /// [`unwind_stop`] in the next, [`unwind_flags`] above.
    pub unwind: u32,
    /// Command name of the sampled task.
    pub comm: [u8; COMM_LEN],
    /// Kernel return addresses, innermost first.
    pub kernel_stack: [u64; MAX_STACK_DEPTH],
    /// User return addresses, innermost first.
    pub user_stack: [u64; MAX_STACK_DEPTH],
    /// Valid entries of `py_frames` (0 when the process is not a walked CPython).
    pub py_depth: u32,
    /// Why the Python walk ended ([`py_stop`]; [`py_stop::OFF`] when there was none).
    pub py_stop: u32,
    /// CPython frames of the sampled thread, innermost first (see [`PyFrame`]).
    pub py_frames: [PyFrame; PY_MAX_FRAMES],
}

/// Deepest Python stack a sample carries.
pub const PY_MAX_FRAMES: usize = 64;

/// CPython processes walked at once (the `PY_PROCS` map's size).
pub const PY_PROCESSES: u32 = 1024;

/// One CPython frame as the sampler saw it: which code object ran, where in it, and a
/// checksum of the code object's stable fields so userspace never names a code object that
/// was freed and replaced at the same address (see [`py_checksum`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    /// Address of the `PyCodeObject`.
    pub code: u64,
    /// [`py_checksum`] of the code object's name and file pointers and first line.
    pub checksum: u32,
    /// Instruction offset in code units (2 bytes) in the low 31 bits, and
    /// [`py_frame::ENTRY`].
    pub offset: u32,
}

/// Bits of [`PyFrame::offset`].
pub mod py_frame {
    /// The outermost frame of one `_PyEval_EvalFrameDefault` call: the frames up to and
    /// including it belong to the innermost evaluation-loop native frame not yet used.
    pub const ENTRY: u32 = 1 << 31;
    /// The offset bits.
    pub const OFFSET_MASK: u32 = ENTRY - 1;
}

/// The checksum of a code object the sampler stores with its address: the addresses of
/// its `co_name` and `co_filename` strings and its `co_firstlineno`, folded to 32 bits.
/// Userspace recomputes it from the object it reads back; a mismatch means the address now
/// holds another object.
#[inline(always)]
pub fn py_checksum(name: u64, filename: u64, firstlineno: u32) -> u32 {
    let x = name ^ filename.rotate_left(29);
    (x as u32) ^ ((x >> 32) as u32) ^ firstlineno.wrapping_mul(0x9e37_79b9)
}

/// Why a sample's Python walk ended ([`SampleEvent::py_stop`]).
pub mod py_stop {
    /// Not walked: the process is not a CPython the walker knows (yet).
    pub const OFF: u32 = 0;
    /// The frame chain ended: the whole Python stack was taken.
    pub const END: u32 = 1;
    /// [`super::PY_MAX_FRAMES`] frames were taken.
    pub const DEPTH: u32 = 2;
    /// Reading the interpreter's memory faulted (a page not present, or a torn update).
    pub const READ_FAULT: u32 = 3;
    /// No Python thread state belongs to the sampled thread (a thread CPython does not
    /// know, or an interpreter not yet initialised).
    pub const NO_THREAD: u32 = 4;
    /// The chain of walker programs could not continue (the kernel's tail-call limit).
    pub const TAIL_CALL: u32 = 5;
}

/// How a CPython version lays out its frames ([`PyProcess::layout`]).
pub mod py_layout {
    /// 3.9 and 3.10: `PyThreadState.frame` is a `PyFrameObject`; `f_lasti` is an `int`
    /// (bytes in 3.9, code units in 3.10); every frame is its own evaluation-loop call.
    pub const FRAME_OBJECT: u32 = 0;
    /// 3.11: `tstate->cframe->current_frame`, `_PyInterpreterFrame.prev_instr`, `is_entry`.
    pub const CFRAME_IS_ENTRY: u32 = 1;
    /// 3.12: `tstate->cframe->current_frame`, `prev_instr`, `owner` (entry frames are
    /// owned by the C stack).
    pub const CFRAME_OWNER: u32 = 2;
    /// 3.13: `tstate->current_frame`, `instr_ptr`, `owner`.
    pub const CURRENT_FRAME: u32 = 3;
}

/// `_PyInterpreterFrame.owner` of the shim frame `_PyEval_EvalFrameDefault` pushes
/// (`FRAME_OWNED_BY_CSTACK`, 3.12 and 3.13).
pub const PY_OWNED_BY_CSTACK: u8 = 3;

/// A CPython process the sampler walks (map `PY_PROCS`, keyed by tgid): where its runtime
/// state is and the byte offsets of the fields the walk reads, for its version.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcess {
    /// Runtime address of `_PyRuntime`.
    pub runtime: u64,
    /// One of [`py_layout`].
    pub layout: u32,
    /// `_PyRuntimeState.interpreters.head`.
    pub interpreters_head: u32,
    /// `PyInterpreterState.threads.head` (`tstate_head` before 3.11).
    pub threads_head: u32,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// `PyThreadState.thread_id` (the thread's `pthread_self()`).
    pub tstate_thread_id: u32,
    /// `PyThreadState.frame`, `.cframe` or `.current_frame` per [`py_layout`].
    pub tstate_frame: u32,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    pub cframe_current_frame: u32,
    /// The frame's code object (`f_code`, `f_executable`).
    pub frame_code: u32,
    /// The calling frame (`f_back`, `previous`).
    pub frame_previous: u32,
    /// `f_lasti` (an `int`), `prev_instr` or `instr_ptr` (pointers).
    pub frame_instr: u32,
    /// `is_entry` (3.11) or `owner` (3.12+), one byte; unused before 3.11.
    pub frame_owner: u32,
    /// `PyCodeObject.co_name`; `co_filename` is the pointer just before it in every
    /// version walked.
    pub code_name: u32,
    /// `PyCodeObject.co_firstlineno`.
    pub code_firstlineno: u32,
    /// `PyCodeObject.co_code_adaptive`, the first instruction (3.11+).
    pub code_adaptive: u32,
}

/// Kinds of [`ProcEvent`].
pub mod proc_kind {
    /// A task called execve; `comm` is the new command name.
    pub const EXEC: u32 = 1;
    /// A task forked; `child_tid` is the new task.
    pub const FORK: u32 = 2;
    /// A task exited.
    pub const EXIT: u32 = 3;
}

/// Process and thread lifecycle, so a reused PID never merges two processes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcEvent {
    /// `bpf_ktime_get_ns()` at the event.
    pub ts_ns: u64,
    /// One of [`proc_kind`].
    pub kind: u32,
    /// The task the event is about (the exec'ing or exiting task, or the forking parent).
    pub tid: u32,
    /// Its process.
    pub tgid: u32,
    /// For FORK: the child's thread id (0 when the kernel's task layout is unknown).
    pub child_tid: u32,
    /// For FORK: the child's process id (equal to `tgid` for a new thread).
    pub child_tgid: u32,
    /// For EXIT: the exit code; otherwise 0.
    pub exit_code: u32,
    /// Command name of the task after the event.
    pub comm: [u8; COMM_LEN],
    /// The cgroup v2 id of the task the event is about (for FORK, the parent's, which the
    /// child starts in), so userspace need not ask `/proc` for every new process.
    pub cgroup_id: u64,
}

/// Indices of the per-CPU counters the probes keep (map `COUNTERS`). Every output reports them.
pub mod counter {
    /// Switch events dropped because the switch ring buffer was full.
    pub const SWITCH_DROPPED: u32 = 0;
    /// Samples dropped because the sample ring buffer was full.
    pub const SAMPLE_DROPPED: u32 = 1;
    /// Lifecycle events dropped because the lifecycle ring buffer was full.
    pub const PROC_DROPPED: u32 = 2;
    /// Stack walks that failed (the sample was still recorded, with an empty stack).
    pub const STACK_ERRORS: u32 = 3;
    /// Samples taken while the CPU was idle (not recorded; idle time comes from switches).
    pub const IDLE_SAMPLES: u32 = 4;
    /// Run-counter events ([`super::CountEvent`]) dropped because their ring buffer was full.
    pub const COUNT_DROPPED: u32 = 5;
    /// Aggregation rows lost because the ring could not take their slot table (the
    /// aggregating mode; their time is lost).
    pub const AGG_DROPPED: u32 = 6;
    /// Number of counters.
    pub const COUNT: u32 = 7;
}

/// How a sample's user stack was walked (low byte of [`SampleEvent::unwind`]).
pub mod unwind_method {
    /// Frame pointers, by the kernel (`bpf_get_stack`).
    pub const FP: u32 = 0;
    /// The table walker: rows from `.eh_frame`, a frame-pointer step where a PC has none.
    pub const DWARF: u32 = 1;
}

/// Why a user stack walk ended, or why the table walker did not run (second byte of
/// [`SampleEvent::unwind`]).
pub mod unwind_stop {
    /// Frame-pointer mode: the table walker is off.
    pub const OFF: u32 = 0;
    /// A row with an undefined return address (`_start`, thread entry) or a zero one: the
    /// whole stack was walked.
    pub const END_OF_STACK: u32 = 1;
    /// No row for the PC and no usable frame pointer.
    pub const NO_TABLE: u32 = 2;
    /// The CFA or frame pointer did not move up the stack.
    pub const BAD_CFA: u32 = 3;
    /// A rule the walker cannot follow (expression, signal frame).
    pub const UNSUPPORTED: u32 = 4;
    /// Reading the stack faulted (a page not present, or a wrong CFA).
    pub const READ_FAULT: u32 = 5;
    /// [`super::MAX_STACK_DEPTH`] frames were taken.
    pub const DEPTH_LIMIT: u32 = 6;
    /// Frame pointers were used: the process has no tables loaded (yet).
    pub const NO_PROCESS: u32 = 7;
    /// Frame pointers were used: the timer fired in the kernel, where the sample's
    /// registers are the kernel's.
    pub const IN_KERNEL: u32 = 8;
    /// Frame pointers were used: the chain of walker programs could not continue.
    pub const TAIL_CALL: u32 = 9;
}

/// Bits of [`SampleEvent::unwind`] above the method and stop bytes.
pub mod unwind_flags {
    /// A PC lay in no mapping the process's table knows: it mapped code since its tables
    /// were loaded (`dlopen`, JIT), so userspace reloads them.
    pub const UNMAPPED_PC: u32 = 1 << 16;
}

/// Executable mappings the walker keeps per process ([`UnwindProcess::maps`]); a process
/// with more keeps the first ones and walks the others by frame pointers.
pub const UNWIND_MAPPINGS: usize = 16;

/// Rows in the walker's shared row array (16 MiB of kernel memory at 16 bytes a row).
pub const UNWIND_ROWS: u32 = 1 << 20;

/// Processes with tables at once (the `UNWIND_PROCS` map's size).
pub const UNWIND_PROCESSES: u32 = 4096;

/// One executable mapping of a process in the walker's table: PCs in `[start, end)` use rows
/// `row_start..row_start + row_count` of the shared row array, looked up at `pc - bias`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UnwindMapping {
    /// First runtime address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Runtime address minus ELF virtual address (wrapping).
    pub bias: u64,
    /// Index of the file's first row in the shared row array.
    pub row_start: u32,
    /// Rows of the file.
    pub row_count: u32,
}

/// A process's executable mappings, sorted by start (map `UNWIND_PROCS`, keyed by tgid).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct UnwindProcess {
    /// Valid entries of `maps`.
    pub count: u32,
    /// Explicit padding so the layout has no holes.
    pub _pad: u32,
    /// The mappings, sorted by start; entries past `count` are zero.
    pub maps: [UnwindMapping; UNWIND_MAPPINGS],
}

/// Kinds of [`UnwindRow`]: how the walker treats a PC that falls in the row.
pub mod unwind_kind {
    /// CFA = `cfa_reg` + `cfa_offset`; return address at CFA-8; rbp per `rbp_offset`.
    pub const NORMAL: u8 = 0;
    /// The return address is undefined here (`_start`, thread entry): the stack ends.
    pub const END_OF_STACK: u8 = 1;
    /// A PLT stub: the CFA is `rsp + 8`, plus 8 more when `(pc & 15) >= 11` (the expression
    /// binutils and lld emit for `.plt`), which the walker computes instead of DWARF.
    pub const PLT: u8 = 2;
    /// A signal trampoline (CIE augmentation `S`): the caller's registers are in the
    /// `ucontext` on the stack, not at CFA offsets.
    pub const SIGNAL: u8 = 3;
    /// A rule the walker cannot follow (CFA or register expressions, CFA in a register other
    /// than rsp/rbp, offsets out of range): fall back to frame pointers or stop.
    pub const UNSUPPORTED: u8 = 4;
    /// No FDE covers this PC (a gap between functions, or past the last one).
    pub const NO_INFO: u8 = 5;
}

/// `UnwindRow::cfa_reg` values: x86_64 DWARF register numbers (System V psABI, Fig. 3.36).
pub mod unwind_reg {
    /// DWARF register 6.
    pub const RBP: u8 = 6;
    /// DWARF register 7.
    pub const RSP: u8 = 7;
}

/// One row of a compiled unwind table: the rule for every PC from `pc` up to the next
/// row's `pc`. Rows of one file are sorted by `pc` (ELF virtual addresses), so the walker
/// finds a PC's row by binary search. 16 bytes, so a table costs 16 bytes per row.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnwindRow {
    /// First PC (ELF virtual address in the file) the row covers.
    pub pc: u64,
    /// CFA = `cfa_reg` + `cfa_offset` (x86_64 return address at CFA-8).
    pub cfa_offset: i32,
    /// The caller's rbp is saved at CFA + `rbp_offset`; 0 means rbp is unchanged (a saved
    /// register is always below the CFA, so 0 is never a real slot).
    pub rbp_offset: i16,
    /// One of [`unwind_reg`].
    pub cfa_reg: u8,
    /// One of [`unwind_kind`].
    pub kind: u8,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are #[repr(C)] with only integer fields and explicit padding, so
    // every bit pattern is a valid value and there are no uninitialised holes.
    unsafe impl aya::Pod for super::SwitchEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SwitchBatch {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CountEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::CountBatch {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::SampleEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ProcEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindRow {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindMapping {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::UnwindProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PyProcess {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::AggCursor {}
}

/// Turns a NUL-padded `comm` into a string slice (lossy on invalid UTF-8 is the caller's job).
pub fn comm_bytes(comm: &[u8; COMM_LEN]) -> &[u8] {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
    &comm[..end]
}

const _: () = assert!(core::mem::size_of::<SwitchEvent>() == 40);
const _: () = assert!(core::mem::offset_of!(SwitchEvent, activity) == 32);
const _: () = assert!(core::mem::offset_of!(SwitchBatch, events) == SWITCH_BATCH_HEADER);
// The same size as a switch event, so the probe's bounds on a batch hold for both.
const _: () = assert!(core::mem::size_of::<CountEvent>() == 40);
const _: () = assert!(core::mem::offset_of!(CountBatch, events) == SWITCH_BATCH_HEADER);
const _: () = assert!(core::mem::size_of::<UnwindRow>() == 16);
const _: () = assert!(core::mem::size_of::<UnwindMapping>() == 32);
const _: () = assert!(core::mem::size_of::<UnwindProcess>() == 8 + 32 * UNWIND_MAPPINGS);
const _: () = assert!(core::mem::size_of::<PyFrame>() == 16);
// The same size as a switch event, so the probe's bounds on a batch hold for the table.
const _: () = assert!(core::mem::size_of::<AggRow>() == 40);
const _: () = assert!(core::mem::offset_of!(AggTable, rows) == SWITCH_BATCH_HEADER);
const _: () = assert!(core::mem::size_of::<AggCursor>() == 32);
const _: () = assert!(core::mem::size_of::<PyProcess>() == 8 + 4 * 14);
const _: () = assert!(core::mem::size_of::<SampleEvent>().is_multiple_of(8));
