//! `cargo xtask bench probe [ROUNDS] [SWITCHES]`: the agent's `sched_switch` program's run
//! time per switch (`kernel.bpf_stats_enabled`), aggregating and streaming, against two
//! floor programs attached to the same tracepoint at the same time: one that does nothing
//! and one that only reads the clock (`bpf_ktime_get_ns`, which every probe of switches
//! needs). The statistics charge each run two clock reads of their own, so the floors say
//! what a program costs here before it does anything.
//!
//! Each round starts the release agent in one mode (modes alternate, the first one
//! rotating), waits for its first windows, then runs a pipe ping-pong of SWITCHES round
//! trips between two threads pinned to CPU 0, and reads every program's run time and run
//! count over the ping-pong. Reports each round and the median per program.
use std::{
    io::{Read as _, Write as _},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    thread,
    time::Duration,
};

use crate::util::Result;

/// Runs the benchmark.
pub fn run(rounds: usize, switches: u64) -> Result {
    let bin = super::release_bin()?;
    let stats = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok();
    std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1")
        .map_err(|e| format!("turning kernel.bpf_stats_enabled on (root?): {e}"))?;
    let result = rounds_of(&bin, rounds.max(1), switches.max(1000));
    if let Some(stats) = stats {
        let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats.trim());
    }
    result
}

const MODES: [&str; 2] = ["aggregate", "stream"];

fn rounds_of(bin: &std::path::Path, rounds: usize, switches: u64) -> Result {
    println!(
        "# bench probe: {rounds} rounds; each the agent (--switches MODE) and two floor programs on sched_switch over a pipe ping-pong of {switches} round trips on CPU 0; ns per run under kernel.bpf_stats_enabled"
    );
    // Per mode: (agent's program, empty floor, clock floor) per round.
    let mut results: Vec<Vec<[f64; 3]>> = vec![Vec::new(); MODES.len()];
    for round in 0..rounds {
        for k in 0..MODES.len() {
            let m = (round + k) % MODES.len();
            let ns = one_run(bin, MODES[m], switches)?;
            println!(
                "round {round:>2}  {:<9}  agent {:>6.1}  empty {:>5.1}  clock {:>5.1}",
                MODES[m], ns[0], ns[1], ns[2]
            );
            results[m].push(ns);
        }
    }
    println!("median ns per run:");
    for (m, rows) in MODES.iter().zip(&results) {
        let col = |i: usize| super::median(&rows.iter().map(|r| r[i]).collect::<Vec<_>>());
        println!(
            "  {m:<9}  agent {:>6.1}  empty floor {:>5.1}  clock floor {:>5.1}  agent over the clock floor {:>5.1}",
            col(0),
            col(1),
            col(2),
            col(0) - col(2)
        );
    }
    Ok(())
}

/// One round: the agent in `mode` and the floors over one ping-pong; ns per run of each.
fn one_run(bin: &std::path::Path, mode: &str, switches: u64) -> Result<[f64; 3]> {
    let agent = super::BenchAgent::start(bin, &["--no-web", "--switches", mode])?;
    thread::sleep(Duration::from_secs(3));
    let empty = Floor::attach(&[mov_r0_0(), exit()])?;
    let clock = Floor::attach(&[call(BPF_FUNC_KTIME_GET_NS), mov_r0_0(), exit()])?;
    let agent_stats = || {
        super::server::busiest_program(agent.pid())
            .map(|(_, ns, runs)| (ns, runs))
            .ok_or("the agent holds no program that ran")
    };
    let before = [agent_stats()?, empty.stats()?, clock.stats()?];
    ping_pong(switches)?;
    let after = [agent_stats()?, empty.stats()?, clock.stats()?];
    let per_run = |i: usize| {
        let (ns, runs) = (after[i].0 - before[i].0, after[i].1 - before[i].1);
        ns as f64 / runs.max(1) as f64
    };
    Ok([per_run(0), per_run(1), per_run(2)])
}

/// `switches` round trips over two pipes between two threads pinned to CPU 0: two
/// context switches each.
fn ping_pong(switches: u64) -> Result {
    let pipe = || -> Result<(std::fs::File, std::fs::File)> {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) into a two-int array.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return Err(format!("pipe: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: two fresh fds we own.
        Ok(unsafe {
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        })
    };
    let ((mut a_read, mut a_write), (mut b_read, mut b_write)) = (pipe()?, pipe()?);
    let pin = || {
        // SAFETY: a zeroed cpu_set_t with CPU 0 set, for the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    };
    let echo = thread::spawn(move || {
        pin();
        let mut byte = [0u8];
        for _ in 0..switches {
            if a_read.read_exact(&mut byte).is_err() || b_write.write_all(&byte).is_err() {
                break;
            }
        }
    });
    pin();
    let mut byte = [0u8];
    for _ in 0..switches {
        a_write
            .write_all(&byte)
            .and_then(|()| b_read.read_exact(&mut byte))
            .map_err(|e| format!("ping-pong: {e}"))?;
    }
    echo.join().map_err(|_| "the ping-pong thread panicked")?;
    // Back to every CPU for the rest of the bench.
    // SAFETY: a cpu_set_t with every CPU set, for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for cpu in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
    Ok(())
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;
const BPF_FUNC_KTIME_GET_NS: i32 = 5;

/// A floor program on the raw `sched_switch` tracepoint, attached while this lives.
struct Floor {
    prog: OwnedFd,
    _link: OwnedFd,
}

impl Floor {
    fn attach(insns: &[u64]) -> Result<Self> {
        let license = c"GPL";
        // union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, then
        // fields left zero.
        let mut attr = [0u8; 128];
        attr[0..4].copy_from_slice(&BPF_PROG_TYPE_RAW_TRACEPOINT.to_ne_bytes());
        attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
        attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
        attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
        let prog =
            bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| format!("loading a floor program: {e}"))?;
        let name = c"sched_switch";
        // BPF_RAW_TRACEPOINT_OPEN: name, prog_fd.
        let mut attr = [0u8; 16];
        attr[0..8].copy_from_slice(&(name.as_ptr() as u64).to_ne_bytes());
        attr[8..12].copy_from_slice(&prog.as_raw_fd().to_ne_bytes());
        let link = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut attr)
            .map_err(|e| format!("attaching a floor program to sched_switch: {e}"))?;
        Ok(Self { prog, _link: link })
    }

    /// (run time ns, runs) so far, from our own fdinfo.
    fn stats(&self) -> Result<(u64, u64)> {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.prog.as_raw_fd()))
            .map_err(|e| format!("reading a floor program's fdinfo: {e}"))?;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok((field("run_time_ns:"), field("run_cnt:")))
    }
}

/// `bpf(2)` returning a new fd.
fn bpf(cmd: libc::c_long, attr: &mut [u8]) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is the union member `cmd` reads, of the size passed; what it points
    // at (instructions, strings) outlives the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            attr.len() as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd the kernel gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// One eBPF instruction: opcode, registers, offset, immediate.
fn insn(code: u8, regs: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | u64::from(regs) << 8
        | u64::from(off as u16) << 16
        | u64::from(imm as u32) << 32
}

/// `r0 = 0`.
fn mov_r0_0() -> u64 {
    insn(0xb7, 0, 0, 0)
}

/// `call helper`.
fn call(helper: i32) -> u64 {
    insn(0x85, 0, 0, helper)
}

/// `exit`.
fn exit() -> u64 {
    insn(0x95, 0, 0, 0)
}
