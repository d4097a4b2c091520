//! Exact busy time of chosen CPUs, and of chosen processes on them, from the kernel's own
//! context-switch records: one perf dummy software event per CPU with `context_switch` set,
//! read from its ring buffer whenever asked. Every switch on a CPU says which task left
//! and which came in, stamped in CLOCK_MONOTONIC ns, so the busy time of a CPU (every task
//! but the idle task) is known to the nanosecond at any moment, including the task running
//! now. That is what a RAPL package charges: every busy core, whoever runs on it.
//!
//! Unlike `/proc/stat` (10 ms steps) or another process's CPU clock (advanced at scheduler
//! ticks), this follows the load at any update rate, so an emulated counter driven by it can
//! update every millisecond like RAPL.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

/// `struct perf_event_attr` up to `clockid` (PERF_ATTR_SIZE_VER3, 96 bytes).
#[repr(C)]
#[derive(Default)]
struct Attr {
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
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
}

const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_SW_DUMMY: u64 = 9;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_TIME: u64 = 1 << 2;
/// Attribute flag bits: sample_id_all, use_clockid, context_switch.
const FLAG_SAMPLE_ID_ALL: u64 = 1 << 18;
const FLAG_USE_CLOCKID: u64 = 1 << 25;
const FLAG_CONTEXT_SWITCH: u64 = 1 << 26;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_SWITCH_CPU_WIDE: u32 = 15;
const PERF_RECORD_MISC_SWITCH_OUT: u16 = 1 << 13;
/// Ring buffer data pages per CPU (1 MiB): seconds of switches at a build's switch rate,
/// drained every millisecond.
const DATA_PAGES: usize = 256;
/// The longest record this event writes (a switch or lost record, with its sample id).
const MAX_RECORD: u64 = 40;
/// `data_head` and `data_tail` in `struct perf_event_mmap_page`.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;

/// A task: (process id, thread id); the idle task is (0, 0).
type Task = (u32, u32);

/// One CPU's switch ring and what is known of that CPU so far.
struct Cpu {
    _fd: OwnedFd,
    base: *mut u8,
    page: usize,
    /// The task running since `since_ns`, once a switch has said which it is.
    current: Option<Task>,
    since_ns: u64,
    /// Busy ns counted so far (from the clock's start).
    busy_ns: u64,
    /// Busy ns of each watched process so far.
    watched_ns: Vec<u64>,
    /// Switches read from the ring but not yet counted, in time order: (time, the task
    /// that left, the task that runs from then on).
    pending: std::collections::VecDeque<(u64, Task, Task)>,
}

// SAFETY: the mapping is owned by this value alone and read and written only through it.
unsafe impl Send for Cpu {}

impl Drop for Cpu {
    fn drop(&mut self) {
        // SAFETY: `base` is the mapping of `(1 + DATA_PAGES) * page` bytes made in `open`.
        unsafe { libc::munmap(self.base.cast(), (1 + DATA_PAGES) * self.page) };
    }
}

/// Busy time of chosen CPUs and of chosen processes on them, to the nanosecond.
pub struct SwitchClock {
    cpus: Vec<Cpu>,
    watch: Vec<u32>,
    /// Counting starts here; switches before it only tell who runs.
    start_ns: u64,
    /// Records the kernel dropped (a ring overflowed): the counts are then wrong.
    pub lost: u64,
    record: Vec<u8>,
}

/// Busy ns so far: of all the CPUs together, and of each watched process.
#[derive(Clone, Debug, Default)]
pub struct Busy {
    /// Busy CPU-ns of the CPUs (every task but the idle task).
    pub total_ns: u64,
    /// Busy CPU-ns of each watched process (all its threads), in `watch` order.
    pub watched_ns: Vec<u64>,
}

impl SwitchClock {
    /// Opens the switch records of `cpus` and counts from now. `watch`: process ids whose
    /// own busy time is counted too. Call from the thread that will read it: it visits
    /// every CPU once so that each has a switch saying who runs there.
    pub fn open(cpus: &[u32], watch: &[u32]) -> std::io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let mut open = Vec::new();
        for &cpu in cpus {
            let attr = Attr {
                type_: PERF_TYPE_SOFTWARE,
                size: std::mem::size_of::<Attr>() as u32,
                config: PERF_COUNT_SW_DUMMY,
                sample_period: 1,
                sample_type: PERF_SAMPLE_TID | PERF_SAMPLE_TIME,
                flags: FLAG_SAMPLE_ID_ALL | FLAG_USE_CLOCKID | FLAG_CONTEXT_SWITCH,
                clockid: libc::CLOCK_MONOTONIC,
                ..Default::default()
            };
            // SAFETY: `attr` is a valid perf_event_attr of the size it declares; pid -1 +
            // cpu = every task on that CPU; no group; FD_CLOEXEC (8).
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    &attr as *const Attr,
                    -1 as libc::pid_t,
                    cpu as libc::c_int,
                    -1 as libc::c_int,
                    8 as libc::c_ulong,
                )
            };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a new descriptor that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
            // SAFETY: maps the event's ring (one metadata page + DATA_PAGES) read-write,
            // as perf requires to move `data_tail`; checked for failure below.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    (1 + DATA_PAGES) * page,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd.as_raw_fd(),
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            open.push(Cpu {
                _fd: fd,
                base: base.cast(),
                page,
                current: None,
                since_ns: 0,
                busy_ns: 0,
                watched_ns: vec![0; watch.len()],
                pending: std::collections::VecDeque::new(),
            });
        }
        let mut clock = Self {
            cpus: open,
            watch: watch.to_vec(),
            start_ns: 0,
            lost: 0,
            record: Vec::new(),
        };
        // Run once on each CPU: moving there is a switch on it, which says who ran there.
        let allowed = affinity();
        for &cpu in cpus {
            set_affinity(&one_cpu(cpu));
            // SAFETY: no preconditions.
            unsafe { libc::sched_yield() };
        }
        set_affinity(&allowed);
        clock.drain();
        clock.count_until(u64::MAX);
        clock.start_ns = energy_bpf::clock::monotonic_ns();
        for (c, &cpu) in clock.cpus.iter().zip(cpus) {
            assert!(c.current.is_some(), "no context switch seen on CPU {cpu}");
        }
        Ok(clock)
    }

    /// Busy time from the start up to now (CLOCK_MONOTONIC `now_ns`, taken after this
    /// drains the rings), including the task running on each CPU now.
    pub fn busy(&mut self) -> (u64, Busy) {
        self.drain();
        let now = energy_bpf::clock::monotonic_ns();
        (now, self.busy_at(now))
    }

    /// Busy time from the start up to `t_ns`, an instant at or before the last drain (the
    /// switches up to it are read) and not before an instant asked for earlier: what a
    /// counter that updates on its own clock holds at its last update.
    pub fn busy_at(&mut self, t_ns: u64) -> Busy {
        self.count_until(t_ns);
        let now = t_ns;
        let mut busy = Busy {
            total_ns: 0,
            watched_ns: vec![0; self.watch.len()],
        };
        for c in &self.cpus {
            busy.total_ns += c.busy_ns;
            for (b, w) in busy.watched_ns.iter_mut().zip(&c.watched_ns) {
                *b += w;
            }
            if let Some((pid, _)) = c.current.filter(|&(_, tid)| tid != 0) {
                let ns = now.saturating_sub(c.since_ns.max(self.start_ns));
                busy.total_ns += ns;
                if let Some(i) = self.watch.iter().position(|&w| w == pid) {
                    busy.watched_ns[i] += ns;
                }
            }
        }
        busy
    }

    /// Counts every switch read so far that happened at or before `t_ns`.
    fn count_until(&mut self, t_ns: u64) {
        for i in 0..self.cpus.len() {
            while let Some(&(t, left, now_runs)) =
                self.cpus[i].pending.front().filter(|e| e.0 <= t_ns)
            {
                self.cpus[i].pending.pop_front();
                self.count(i, t, left, now_runs);
            }
        }
    }

    /// Reads every record the rings hold.
    pub fn drain(&mut self) {
        for i in 0..self.cpus.len() {
            let (base, page) = (self.cpus[i].base, self.cpus[i].page);
            let size = DATA_PAGES * page;
            // SAFETY: `data_head` lies in the metadata page of the live mapping; the
            // kernel writes it, so it is read volatile, then fenced before the data.
            let head = unsafe { std::ptr::read_volatile(base.add(DATA_HEAD).cast::<u64>()) };
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            // SAFETY: `data_tail` is ours to read and write in the same page.
            let mut tail = unsafe { std::ptr::read_volatile(base.add(DATA_TAIL).cast::<u64>()) };
            // A ring that has no room left for another record has dropped switches, but
            // the kernel says so (PERF_RECORD_LOST) only once there is room again, after
            // this drain: a full ring counts as lost now, or the CPU's last task would be
            // charged until the next drain.
            if head.saturating_sub(tail) + MAX_RECORD > size as u64 {
                self.lost += 1;
            }
            while tail < head {
                // SAFETY: `base + page` starts the data area of `size` bytes.
                let data = unsafe { base.add(page) };
                self.record.clear();
                let at = |off: u64| (off % size as u64) as usize;
                // SAFETY: every byte read is at an index below `size` in the data area.
                let byte = |off: u64| unsafe { *data.add(at(off)) };
                let len = u64::from(u16::from_ne_bytes([byte(tail + 6), byte(tail + 7)]));
                if len < 8 {
                    break;
                }
                self.record.extend((0..len).map(|k| byte(tail + k)));
                tail += len;
                self.queue(i);
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
            // SAFETY: as above; telling the kernel the records up to `tail` are read.
            unsafe { std::ptr::write_volatile(base.add(DATA_TAIL).cast::<u64>(), tail) };
        }
    }

    /// Reads the record in `self.record`, read from CPU `i`'s ring, into its pending switches.
    fn queue(&mut self, i: usize) {
        let r = &self.record;
        let u32_at = |o: usize| u32::from_ne_bytes([r[o], r[o + 1], r[o + 2], r[o + 3]]);
        let kind = u32_at(0);
        let misc = u16::from_ne_bytes([r[4], r[5]]);
        if kind == PERF_RECORD_LOST {
            // id, lost
            self.lost += u64::from(u32_at(16)) | (u64::from(u32_at(20)) << 32);
            return;
        }
        // header, next_prev pid/tid, then sample_id: pid/tid, time.
        if kind != PERF_RECORD_SWITCH_CPU_WIDE || r.len() < 32 {
            return;
        }
        let other = (u32_at(8), u32_at(12));
        let this = (u32_at(16), u32_at(20));
        let t = u64::from(u32_at(24)) | (u64::from(u32_at(28)) << 32);
        // Out: `this` leaves for `other`; in: `this` arrives from `other`.
        let (left, now_runs) = if misc & PERF_RECORD_MISC_SWITCH_OUT != 0 {
            (this, other)
        } else {
            (other, this)
        };
        self.cpus[i].pending.push_back((t, left, now_runs));
    }

    /// Counts on CPU `i` the switch at `t` from `left` to `now_runs`.
    fn count(&mut self, i: usize, t: u64, left: Task, now_runs: Task) {
        let start_ns = self.start_ns;
        let c = &mut self.cpus[i];
        if c.current.is_some() && left.1 != 0 && start_ns > 0 {
            let ns = t.saturating_sub(c.since_ns.max(start_ns));
            c.busy_ns += ns;
            if let Some(w) = self.watch.iter().position(|&w| w == left.0) {
                c.watched_ns[w] += ns;
            }
        }
        c.current = Some(now_runs);
        c.since_ns = t.max(c.since_ns);
    }
}

/// The calling thread's CPU affinity.
fn affinity() -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call gets its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
        set
    }
}

/// The set of one CPU.
fn one_cpu(cpu: u32) -> libc::cpu_set_t {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET gets a valid pointer.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        set
    }
}

/// Moves the calling thread to `set`.
fn set_affinity(set: &libc::cpu_set_t) {
    // SAFETY: `set` is a valid cpu_set_t of the size passed.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) };
}

/// The kernel's own wall-clock time on CPU of one process: a perf `cpu-clock` counter on it,
/// which runs from the moment the task is switched in to the moment it is switched out.
/// Unlike the task's run time in `/proc/PID/schedstat` (the scheduler's task clock), it
/// does not leave out time stolen by the hypervisor or spent in interrupts while the task
/// was on the CPU, which the switch records count as the task's too.
fn cpu_clock(pid: u32) -> std::io::Result<OwnedFd> {
    const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
    let attr = Attr {
        type_: PERF_TYPE_SOFTWARE,
        size: std::mem::size_of::<Attr>() as u32,
        config: PERF_COUNT_SW_CPU_CLOCK,
        ..Default::default()
    };
    // SAFETY: `attr` is a valid perf_event_attr of the size it declares; pid + cpu -1 =
    // that task on any CPU; no group; FD_CLOEXEC (8).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const Attr,
            pid as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            8 as libc::c_ulong,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The count of a counter opened by `cpu_clock`, ns.
fn read_count(fd: &OwnedFd) -> u64 {
    let mut count = 0u64;
    // SAFETY: reads 8 bytes (read_format 0: the bare count) into `count`.
    let n = unsafe { libc::read(fd.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    assert_eq!(
        n,
        8,
        "read of cpu-clock: {}",
        std::io::Error::last_os_error()
    );
    count
}

/// The clock against the kernel's other accounts: a spinner pinned to CPU 0 is on its CPU
/// for the wall time the kernel's `cpu-clock` counter of it says, its scheduler run time is
/// no more than that (it leaves out stolen and interrupt time), and the CPUs' busy time
/// matches `/proc/stat` (10 ms steps) within a few ticks per CPU.
#[test]
fn switch_clock_agrees_with_the_kernels_cpu_accounts() {
    if !crate::util::require_root("switch_clock_agrees_with_the_kernels_cpu_accounts") {
        return;
    }
    let _guard = crate::util::exclusive();
    let cpus: Vec<u32> =
        (0..std::thread::available_parallelism().map_or(1, usize::from) as u32).collect();
    let spinner = crate::util::Workload::spawn("while :; do :; done", Some(0));
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pid = spinner.pid();
    let thread_ns = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).expect("schedstat");
        stat.split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .expect("run ns")
    };
    let on_cpu = cpu_clock(pid).expect("perf_event_open(cpu-clock) (root)");
    let mut clock = SwitchClock::open(&cpus, &[pid]).expect("perf_event_open (root)");
    let (t0, b0) = clock.busy();
    let (on0, run0, (idle0, _)) = (
        read_count(&on_cpu),
        thread_ns(),
        crate::util::machine_idle_ns(),
    );
    // Drained every 10 ms, as the emulator drains every millisecond: a busy machine
    // (thousands of wakeups a second) fills a CPU's ring within a second.
    while clock.busy().0 - t0 < 1_000_000_000 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (t1, b1) = clock.busy();
    let (on1, run1, (idle1, n)) = (
        read_count(&on_cpu),
        thread_ns(),
        crate::util::machine_idle_ns(),
    );
    drop(spinner);
    assert_eq!(clock.lost, 0);
    let wall = (t1 - t0) as f64;
    let spin = (b1.watched_ns[0] - b0.watched_ns[0]) as f64;
    let busy = (b1.total_ns - b0.total_ns) as f64;
    let stat_busy = wall * n as f64 - (idle1 - idle0) as f64;
    let (on, run) = ((on1 - on0) as f64, (run1 - run0) as f64);
    eprintln!(
        "over {:.3} s: spinner {:.3} s by switches, {:.3} s by cpu-clock, {:.3} s by its run \
         time; CPUs busy {:.3} s by switches, {:.3} s by /proc/stat",
        wall / 1e9,
        spin / 1e9,
        on / 1e9,
        run / 1e9,
        busy / 1e9,
        stat_busy / 1e9
    );
    assert!(
        (spin - on).abs() < 0.01 * wall,
        "spinner: {spin} ns by switches, {on} ns by cpu-clock"
    );
    assert!(
        run < spin + 0.01 * wall,
        "spinner: {spin} ns by switches, {run} ns by schedstat"
    );
    assert!(
        (busy - stat_busy).abs() < 0.02 * wall * n as f64 + 30e6,
        "busy {busy} ns by switches, {stat_busy} ns by /proc/stat"
    );
}
