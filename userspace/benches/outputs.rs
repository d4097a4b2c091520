//! Micro-benchmark: profile build + every exporter on a synthetic 60 s, 999 Hz, 2-CPU
//! recording (~120k samples). Target (issue 5): report/flamegraph under 2 s.
//!
//! Run: `cargo bench -p energy-bpf --bench outputs`. User addresses are real ones in this
//! benchmark's own executable (so blazesym does real DWARF work), kernel addresses come from
//! /proc/kallsyms when readable.

use std::time::Instant;

use energy_bpf::output::{ProfileSink, collapsed, functions, pprof, speedscope, svg};
use energy_bpf::pb::v1::{Header, Sample, ThreadInfo};
use energy_bpf::profile::{self, Filter, SampleValues};
use energy_bpf::record::Recording;
use energy_bpf::symbolize::{Symbolizer, process_mappings};

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

fn kernel_addresses() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let addrs: Vec<u64> = text
        .lines()
        .filter(|l| l.contains(" T ") || l.contains(" t "))
        .filter_map(|l| u64::from_str_radix(l.split(' ').next()?, 16).ok())
        .filter(|&a| a != 0)
        .step_by(97)
        .take(300)
        .collect();
    if addrs.is_empty() {
        (0..300).map(|i| 0xffff_ffff_8100_0000 + i * 0x40).collect()
    } else {
        addrs
    }
}

fn recording() -> Recording {
    let pid = std::process::id();
    let maps = process_mappings(pid, 0).expect("own maps");
    let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
    let text = maps
        .iter()
        .find(|m| std::path::Path::new(&m.path) == exe)
        .expect("own executable mapping")
        .clone();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let user_pool: Vec<u64> = (0..2000)
        .map(|_| text.start + rng.below(text.end - text.start))
        .collect();
    let kernel_pool = kernel_addresses();
    // Distinct stacks (BENCH_STACKS, default 600), depth 8-24, a third with kernel frames.
    // Stacks share their outer frames like real call trees: 20 roots, 5 levels of fan-out.
    let n_stacks: u64 = std::env::var("BENCH_STACKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let stacks: Vec<(Vec<u64>, Vec<u64>)> = (0..n_stacks)
        .map(|_| {
            let depth = 8 + rng.below(17) as usize;
            let mut prefix = rng.below(20);
            let mut user: Vec<u64> = (0..depth)
                .map(|level| {
                    prefix = if level < 5 {
                        prefix * 7 + rng.below(3)
                    } else {
                        rng.below(2000)
                    };
                    user_pool[(prefix % 2000) as usize]
                })
                .collect();
            // Generated root first; samples are leaf first.
            user.reverse();
            let kernel = if rng.below(3) == 0 {
                (0..6)
                    .map(|_| kernel_pool[rng.below(kernel_pool.len() as u64) as usize])
                    .collect()
            } else {
                Vec::new()
            };
            (user, kernel)
        })
        .collect();
    let mut rec = Recording {
        header: Header {
            sample_hz: 999,
            hostname: "bench".into(),
            ..Header::default()
        },
        end_ns: 60_000_000_000,
        ..Recording::default()
    };
    // Every sample is in our own address space: 4 "processes" share the mappings.
    for tgid in [pid, pid + 1, pid + 2, pid + 3] {
        rec.mappings.insert(tgid, maps.clone());
        for k in 0..3 {
            let tid = tgid * 10 + k;
            rec.threads.insert(
                tid,
                ThreadInfo {
                    tid,
                    tgid,
                    comm: format!("proc{tgid}"),
                    ..ThreadInfo::default()
                },
            );
        }
    }
    let n = 60 * 999 * 2;
    for i in 0..n {
        let tgid = pid + (rng.below(4) as u32);
        let (user, kernel) = &stacks[rng.below(n_stacks) as usize];
        rec.samples.push(Sample {
            ts_ns: i * 500_500,
            cpu: (i % 2) as u32,
            tid: tgid * 10 + rng.below(3) as u32,
            tgid,
            cgroup_id: 1,
            kernel_stack: kernel.clone(),
            user_stack: user.clone(),
            ..Sample::default()
        });
    }
    rec
}

/// CPU time (user + system) of this process, s: unlike wall time, barely moved by other
/// load on a shared machine.
fn cpu_s() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we pass and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

fn time<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let (t, c) = (Instant::now(), cpu_s());
    let out = f();
    println!(
        "{what:<28} {:>8.1} ms wall {:>8.1} ms cpu",
        t.elapsed().as_secs_f64() * 1e3,
        (cpu_s() - c) * 1e3
    );
    out
}

fn main() {
    let rec = time("synthetic recording", recording);
    println!("samples: {}", rec.samples.len());
    let total = Instant::now();
    let mut weights = SampleValues::cpu_time(&rec);
    // A second, energy-like value so exporters carry several values as they will.
    weights
        .value_types
        .push(profile::ValueType::energy("package"));
    weights.values = weights
        .values
        .iter()
        .flat_map(|&ns| [ns, ns / 1e3 * 15.0])
        .collect();
    let mut symbolizer = Symbolizer::new();
    let p = time("profile build (symbolize)", || {
        profile::build(&rec, &weights, &mut symbolizer, &Filter::default())
    });
    let build_s = total.elapsed().as_secs_f64();
    // Same again with the symbolizer's caches warm: the cost of everything but blazesym.
    time("profile build (warm cache)", || {
        profile::build(&rec, &weights, &mut symbolizer, &Filter::default())
    });
    println!("frames: {}", p.frames.len());
    let mut sinks: Vec<(&str, Box<dyn ProfileSink>)> = vec![
        (
            "svg",
            Box::new(svg::Svg {
                value: "energy_package".into(),
                width: None,
            }),
        ),
        (
            "collapsed",
            Box::new(collapsed::Collapsed {
                value: "energy_package".into(),
            }),
        ),
        (
            "pprof",
            Box::new(pprof::Pprof {
                default_value: None,
            }),
        ),
        (
            "speedscope",
            Box::new(speedscope::Speedscope {
                value: "energy_package".into(),
            }),
        ),
    ];
    for (name, sink) in &mut sinks {
        let t = Instant::now();
        let c = cpu_s();
        let mut out = Vec::new();
        sink.write_profile(&p, &mut out).expect("export");
        let ms = t.elapsed().as_secs_f64() * 1e3;
        print!("cpu {:>8.1} ms  ", (cpu_s() - c) * 1e3);
        println!(
            "{:<28} {ms:>8.1} ms ({} bytes; build + this = {:.2} s)",
            format!("export {name}"),
            out.len(),
            build_s + ms / 1e3
        );
    }
    time("report --by function", || {
        functions::by_function(&p, &["package".to_string()])
    });
}
