//! How the agent's userspace cost grows with the machine: a synthetic stream of what the
//! capture session hands the agent (switch events of N CPUs among T threads at R switches
//! per second, thread names on first sighting, process churn with fork and exit events)
//! is fed to the agent's [`Pipeline`] one chunk per quarter second of input (the agent
//! polls four times a second) and a window is closed every 5 s of input (the agent's
//! default), then released, as the agent does. Measured: the pipeline's CPU time (this thread's CPU clock around push and
//! close only; generating the stream is not counted) per second of input and per switch,
//! and RSS after every window (flat = nothing grows with run time), and the high-water mark
//! of the run (the pipeline while it closes a window, with the generator's quarter second
//! of input: RSS between windows is what the allocator kept of that peak).
//!
//! Not covered: decoding the ring buffers and the session's per-event bookkeeping (they
//! need the probes); `cargo xtask bench server` measures the whole agent for real.
//!
//! Run: `cargo bench -p energy-bpf --bench agent_scale` (the table in the README), or one
//! setting: `... --bench agent_scale -- CPUS THREADS SWITCHES_PER_S CHURN_PER_S SECS`.

use std::time::Duration;

use energy_bpf::{
    attribute::Options,
    energy::{EnergyArgs, model},
    pb::v1::{self as pb, process_event::Kind},
    pipeline::{Config, Pipeline},
};

/// xorshift64: deterministic and dependency-free.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// One setting of the stream.
#[derive(Clone, Copy, Debug)]
struct Setting {
    cpus: u32,
    threads: u32,
    switches_per_s: u64,
    churn_per_s: u64,
    secs: u64,
}

/// The stream's state: who runs where, which threads exist, what was already named.
struct Stream {
    s: Setting,
    rng: Rng,
    now_ns: u64,
    running: Vec<(u32, u32)>,
    /// Long-lived threads as (tid, tgid): 8 threads per process.
    threads: Vec<(u32, u32)>,
    named: std::collections::HashSet<u32>,
    next_pid: u32,
}

const START_NS: u64 = 1_000_000_000;
const WINDOW: Duration = Duration::from_secs(5);
/// Input per chunk: the agent's poll.
const POLL_NS: u64 = 250_000_000;
const POLLS_PER_S: u64 = 1_000_000_000 / POLL_NS;

impl Stream {
    fn new(s: Setting) -> Self {
        let threads = (0..s.threads)
            .map(|i| (10_000 + i, 10_000 + i - i % 8))
            .collect();
        Self {
            s,
            rng: Rng(0x9e37_79b9_7f4a_7c15),
            now_ns: START_NS,
            running: vec![(0, 0); s.cpus as usize],
            threads,
            named: Default::default(),
            next_pid: 5_000_000,
        }
    }

    fn info(&mut self, chunk: &mut pb::Chunk, tid: u32, tgid: u32, ts_ns: u64) {
        if tid != 0 && self.named.insert(tid) {
            chunk.threads.push(pb::ThreadInfo {
                tid,
                tgid,
                comm: format!("t{}", tgid % 997),
                process_start_ns: ts_ns,
                ts_ns,
                ..Default::default()
            });
        }
    }

    /// One poll of input ([`POLL_NS`]), as one drain delivers it: each CPU's switches in
    /// time order, CPU after CPU.
    fn poll(&mut self) -> pb::Chunk {
        let mut chunk = pb::Chunk::default();
        let t0 = self.now_ns;
        let per_cpu = self.s.switches_per_s / u64::from(self.s.cpus) / POLLS_PER_S;
        let gap = POLL_NS / per_cpu.max(1);
        let churn = self.s.churn_per_s / POLLS_PER_S;
        // The session reserves a drain's switches at once.
        chunk
            .switches
            .reserve_exact((per_cpu * u64::from(self.s.cpus)) as usize);
        // Short-lived processes of this poll: fork, a few runs, exit.
        let mut churned = Vec::new();
        for i in 0..churn {
            let pid = self.next_pid;
            self.next_pid += 1;
            let ts = t0 + i * (POLL_NS / churn.max(1));
            let parent = self.threads[self.rng.below(self.threads.len() as u64) as usize];
            let mut fork = pb::ProcessEvent {
                ts_ns: ts,
                tid: parent.0,
                tgid: parent.1,
                child_tid: pid,
                child_tgid: pid,
                comm: "churn".into(),
                ..Default::default()
            };
            fork.set_kind(Kind::Fork);
            chunk.process_events.push(fork);
            chunk.threads.push(pb::ThreadInfo {
                tid: pid,
                tgid: pid,
                comm: "churn".into(),
                process_start_ns: ts,
                ts_ns: ts,
                ..Default::default()
            });
            let mut exit = pb::ProcessEvent {
                ts_ns: ts + 500_000,
                tid: pid,
                tgid: pid,
                ..Default::default()
            };
            exit.set_kind(Kind::Exit);
            chunk.process_events.push(exit);
            churned.push((pid, ts));
        }
        for cpu in 0..self.s.cpus {
            for k in 0..per_cpu {
                let ts = t0 + k * gap + self.rng.below(gap / 2);
                let prev = self.running[cpu as usize];
                // A churned process runs where its slot falls; otherwise a quarter of the
                // switches go idle, the rest to a random long-lived thread.
                let next = match churned.get((k as usize) % (per_cpu as usize).max(1)) {
                    Some(&(pid, at)) if k % 64 == 0 && ts > at && ts < at + 500_000 => (pid, pid),
                    _ if self.rng.below(4) == 0 => (0, 0),
                    _ => self.threads[self.rng.below(self.threads.len() as u64) as usize],
                };
                self.info(&mut chunk, next.0, next.1, ts);
                chunk.switches.push(pb::SwitchEvent {
                    ts_ns: ts,
                    cpu,
                    tid: prev.0,
                    tgid: prev.1,
                    preempted: self.rng.below(2) == 0,
                    next_known: true,
                    next_tid: next.0,
                    next_tgid: next.1,
                    ..Default::default()
                });
                self.running[cpu as usize] = next;
            }
        }
        self.now_ns = t0 + POLL_NS;
        chunk
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A `/proc/self/status` figure in KiB (`VmRSS:`, `VmHWM:`).
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// (CPU ns per second of input, RSS after each window in KiB).
fn run(s: Setting) -> (f64, Vec<u64>) {
    let cpus: Vec<pb::Cpu> = (0..s.cpus)
        .map(|id| pb::Cpu {
            id,
            package: id / 64,
            core: id % 64,
        })
        .collect();
    let sources = model::sources(&EnergyArgs::default(), &cpus, 0).expect("model sources");
    let cfg = Config {
        cpus,
        sources,
        options: Options::default(),
        activity_event: None,
    };
    // The folded path (what `top --replay` runs); AGENT_SCALE_EXACT=1 measures the exact one.
    let mut pipeline = if std::env::var_os("AGENT_SCALE_EXACT").is_some() {
        Pipeline::new(cfg, START_NS)
    } else {
        Pipeline::folded(cfg, START_NS)
    };
    let mut stream = Stream::new(s);
    // Each setting's own high-water mark: "5" resets VmHWM to the current RSS.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let (mut cpu_ns, mut push_ns) = (0, 0);
    let mut rss = Vec::new();
    let window_ns = WINDOW.as_nanos() as u64;
    for _ in 0..s.secs * POLLS_PER_S {
        let chunk = stream.poll();
        let t = thread_cpu_ns();
        pipeline.push(chunk);
        let pushed = thread_cpu_ns();
        push_ns += pushed - t;
        // The agent ends a window before anything could still be in flight.
        let limit = stream.now_ns.saturating_sub(40_000_000);
        if limit >= pipeline.window_start_ns() + window_ns {
            let w = pipeline.close_at(limit);
            std::hint::black_box(&w.processes);
            w.release();
            cpu_ns += thread_cpu_ns() - t;
            rss.push(rss_kib());
        } else {
            cpu_ns += pushed - t;
        }
    }
    // Where it went: taking chunks in (the fold) and closing windows (attribution, rollup).
    let switches = (s.switches_per_s * s.secs).max(1) as f64;
    eprintln!(
        "{} x {} x {}/s: push {:.0} ns/switch, close {:.0} ns/switch",
        s.cpus,
        s.threads,
        s.switches_per_s,
        push_ns as f64 / switches,
        (cpu_ns - push_ns) as f64 / switches
    );
    (cpu_ns as f64 / s.secs as f64, rss)
}

fn report(s: Setting) {
    let (cpu_ns_per_s, rss) = run(s);
    let per_switch = cpu_ns_per_s / s.switches_per_s as f64;
    let first = rss.first().copied().unwrap_or(0);
    let last = rss.last().copied().unwrap_or(0);
    let peak = rss.iter().copied().max().unwrap_or(0);
    // The process's high-water mark: the pipeline while a window closes (its timeline and
    // attribution alive), the generator's input second included.
    let hwm = status_kib("VmHWM:");
    println!(
        "| {:>4} | {:>7} | {:>9} | {:>6} | {:>4} | {:>8.2}% | {:>7.0} | {:>7.1} | {:>7.1} | {:>7.1} | {:>7.1} |",
        s.cpus,
        s.threads,
        s.switches_per_s,
        s.churn_per_s,
        s.secs,
        cpu_ns_per_s / 1e7,
        per_switch,
        first as f64 / 1024.0,
        last as f64 / 1024.0,
        peak as f64 / 1024.0,
        hwm as f64 / 1024.0,
    );
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    println!(
        "| CPUs | threads | switches/s | churn/s | secs | CPU (% of one) | ns/switch | RSS 1st window MiB | RSS last MiB | RSS peak MiB | high-water MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    if let [cpus, threads, rate, churn, secs] = args[..] {
        report(Setting {
            cpus: cpus as u32,
            threads: threads as u32,
            switches_per_s: rate,
            churn_per_s: churn,
            secs,
        });
        return;
    }
    let base = Setting {
        cpus: 64,
        threads: 10_000,
        switches_per_s: 100_000,
        churn_per_s: 1_000,
        secs: 20,
    };
    for cpus in [16, 64, 256] {
        report(Setting { cpus, ..base });
    }
    for threads in [1_000, 100_000] {
        report(Setting { threads, ..base });
    }
    for switches_per_s in [1_000_000, 3_000_000] {
        report(Setting {
            switches_per_s,
            ..base
        });
    }
    report(Setting {
        cpus: 256,
        switches_per_s: 1_000_000,
        ..base
    });
}
