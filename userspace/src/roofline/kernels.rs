//! The built-in roofline kernels: sweeps over a buffer larger than the last-level cache
//! that do a chosen number of f64 flops per byte read, so each kernel's work W (flops) and
//! traffic Q (bytes) are known by construction, with no PMU (seed 002's intensity sweep).
//!
//! A block is 8 vectors of the widest f64 width this CPU runs (AVX-512, AVX2+FMA or
//! scalar, detected at run time), so 8 independent FMA chains hide the FMA latency:
//! - `fma` kernels apply `r` FMA rounds to each element of a block: I = 2·r/8 = r/4;
//! - `add` kernels add every `s`-th element into the accumulators: I = 1/(8·s). Every
//!   cache line is still fetched (s·8 < 64 bytes), so Q is the bytes swept.
//!
//! Threads are pinned one per CPU and share one read-only buffer, each sweeping its own
//! slice cyclically; they add their progress to shared atomic counters every chunk, which
//! [`run`] samples into a progress log (and, for tests, a progress file an emulated
//! counter reads).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// Intensities of the built-in sweep, flop/byte: 1/16 to 64 in powers of two.
pub const INTENSITIES: [f64; 11] = [
    0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0,
];

/// Elements handed out per chunk (256 KiB of f64): progress is published this often.
const CHUNK: usize = 32 * 1024;

/// What a kernel does per element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Body {
    /// `r` FMA rounds per element.
    Fma(u32),
    /// One add per `s`-th element.
    Add(usize),
}

impl Body {
    /// The kernel for `intensity` flop/byte (rounded to the nearest the bodies can do).
    pub fn for_intensity(intensity: f64) -> Self {
        if intensity >= 0.25 {
            Self::Fma((intensity * 4.0).round().max(1.0) as u32)
        } else {
            Self::Add((1.0 / (8.0 * intensity)).round().clamp(1.0, 8.0) as usize)
        }
    }

    /// Flops and bytes of one chunk of `elements` elements.
    pub fn counts(self, elements: usize) -> (u64, u64) {
        let bytes = (elements * 8) as u64;
        match self {
            Self::Fma(r) => (2 * r as u64 * elements as u64, bytes),
            Self::Add(s) => ((elements / s) as u64, bytes),
        }
    }

    /// W/Q, flop/byte.
    pub fn intensity(self) -> f64 {
        let (w, q) = self.counts(8 * 64);
        w as f64 / q as f64
    }
}

/// The widest f64 vector code this CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// 8 lanes with FMA.
    Avx512,
    /// 4 lanes with FMA.
    Avx2Fma,
    /// Whatever the target baseline gives.
    Scalar,
}

impl Isa {
    /// Detected at run time.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Self::Avx2Fma;
            }
        }
        Self::Scalar
    }

    /// Name for outputs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512f",
            Self::Avx2Fma => "avx2+fma",
            Self::Scalar => "scalar",
        }
    }
}

/// The kernels' data: read-only, shared by every thread.
pub struct Buffer {
    data: Vec<f64>,
}

impl Buffer {
    /// `bytes` of values in [0.5, 0.99], so FMA chains `a·x + c` stay bounded and normal.
    pub fn new(bytes: usize) -> Self {
        let n = (bytes / 8).max(CHUNK);
        let data = (0..n).map(|i| 0.5 + (i % 97) as f64 / 200.0).collect();
        Self { data }
    }

    /// Size, bytes.
    pub fn bytes(&self) -> usize {
        self.data.len() * 8
    }
}

/// The last-level cache of CPU 0 from sysfs, bytes; `None` when sysfs does not say.
pub fn llc_bytes(sysfs_root: &std::path::Path) -> Option<usize> {
    let dir = sysfs_root.join("devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, usize)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten().take(16) {
        let read = |name: &str| super::read_small(&entry.path().join(name)).ok();
        let (Some(level), Some(size)) = (read("level"), read("size")) else {
            continue;
        };
        let level: u32 = level.parse().ok()?;
        let size = match size.strip_suffix('K') {
            Some(k) => k.parse::<usize>().ok()? * 1024,
            None => match size.strip_suffix('M') {
                Some(m) => m.parse::<usize>().ok()? * 1024 * 1024,
                None => size.parse().ok()?,
            },
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, size));
        }
    }
    best.map(|(_, s)| s)
}

/// Cumulative progress of all threads, sampled.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Progress {
    /// CLOCK_MONOTONIC, ns.
    pub ts_ns: u64,
    /// Flops done so far.
    pub flops: u64,
    /// Bytes swept so far.
    pub bytes: u64,
}

/// Linear interpolation of the progress log at `ts_ns` (clamped to its ends).
pub fn progress_at(log: &[Progress], ts_ns: u64) -> (f64, f64) {
    let i = log.partition_point(|p| p.ts_ns <= ts_ns);
    match (i.checked_sub(1).and_then(|j| log.get(j)), log.get(i)) {
        (Some(a), Some(b)) if b.ts_ns > a.ts_ns => {
            let f = (ts_ns - a.ts_ns) as f64 / (b.ts_ns - a.ts_ns) as f64;
            let lerp = |x: u64, y: u64| x as f64 + f * (y as f64 - x as f64);
            (lerp(a.flops, b.flops), lerp(a.bytes, b.bytes))
        }
        (Some(a), _) => (a.flops as f64, a.bytes as f64),
        (None, Some(b)) => (b.flops as f64, b.bytes as f64),
        (None, None) => (0.0, 0.0),
    }
}

/// Shared progress counters the workers add to.
#[derive(Default)]
pub struct Counters {
    flops: AtomicU64,
    bytes: AtomicU64,
}

impl Counters {
    /// Current totals.
    pub fn load(&self) -> (u64, u64) {
        (
            self.flops.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// Runs `body` on `cpus` (one pinned thread each) for `how_long`, while the calling thread
/// samples progress every millisecond into the returned log and calls `tick` with the
/// totals at each sample (to publish them and to drain capture and counters).
pub fn run(
    buffer: &Arc<Buffer>,
    body: Body,
    isa: Isa,
    cpus: &[u32],
    how_long: Duration,
    counters: &Arc<Counters>,
    tick: &mut dyn FnMut(Progress),
) -> Vec<Progress> {
    let stop = Arc::new(AtomicBool::new(false));
    let n = cpus.len().max(1);
    let len = buffer.data.len();
    let workers: Vec<_> = cpus
        .iter()
        .enumerate()
        .map(|(t, &cpu)| {
            let (buffer, stop, counters) = (buffer.clone(), stop.clone(), counters.clone());
            let (from, to) = (t * len / n, (t + 1) * len / n);
            std::thread::spawn(move || {
                pin(cpu);
                worker(&buffer.data[from..to], body, isa, &stop, &counters)
            })
        })
        .collect();
    let mut log = Vec::new();
    let until = Instant::now() + how_long;
    loop {
        let (flops, bytes) = counters.load();
        let p = Progress {
            ts_ns: crate::clock::monotonic_ns(),
            flops,
            bytes,
        };
        log.push(p);
        tick(p);
        let now = Instant::now();
        if now >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(1).min(until - now));
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let (flops, bytes) = counters.load();
    let p = Progress {
        ts_ns: crate::clock::monotonic_ns(),
        flops,
        bytes,
    };
    log.push(p);
    tick(p);
    log
}

/// Pins the calling thread to `cpu` (best effort: a CPU outside our cpuset is left to the
/// scheduler).
fn pin(cpu: u32) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it, and
    // sched_setaffinity(0, ...) only changes this thread's affinity.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn worker(slice: &[f64], body: Body, isa: Isa, stop: &AtomicBool, counters: &Counters) {
    let mut sink = 0.0;
    let chunks: Vec<&[f64]> = slice.chunks_exact(CHUNK).collect();
    if chunks.is_empty() {
        return;
    }
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let chunk = chunks[i % chunks.len()];
        sink += sweep(chunk, body, isa);
        let (w, q) = body.counts(chunk.len());
        counters.flops.fetch_add(w, Ordering::Relaxed);
        counters.bytes.fetch_add(q, Ordering::Relaxed);
        i += 1;
    }
    std::hint::black_box(sink);
}

fn sweep(chunk: &[f64], body: Body, isa: Isa) -> f64 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `detect` saw avx512f on this CPU.
        Isa::Avx512 => unsafe { sweep_avx512(chunk, body) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `detect` saw avx2 and fma on this CPU.
        Isa::Avx2Fma => unsafe { sweep_avx2(chunk, body) },
        _ => sweep_generic::<8>(chunk, body),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn sweep_avx512(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<64>(chunk, body)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn sweep_avx2(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<32>(chunk, body)
}

/// One chunk with `B`-element blocks (8 vectors); inlined into the feature-enabled callers
/// so the loops are vectorised at their width and `mul_add` is one FMA instruction.
#[inline(always)]
fn sweep_generic<const B: usize>(chunk: &[f64], body: Body) -> f64 {
    let mut acc = [0.0f64; B];
    match body {
        Body::Fma(rounds) => {
            for block in chunk.chunks_exact(B) {
                for _ in 0..rounds {
                    for (a, &x) in acc.iter_mut().zip(block) {
                        *a = a.mul_add(x, 0.25);
                    }
                }
            }
        }
        Body::Add(stride) => {
            for block in chunk.chunks_exact(B * stride) {
                for (a, x) in acc.iter_mut().zip(block.iter().step_by(stride)) {
                    *a += x;
                }
            }
        }
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_intensities_of_the_sweep() {
        for i in INTENSITIES {
            let b = Body::for_intensity(i);
            assert!((b.intensity() - i).abs() < 1e-12, "{i}: {b:?}");
        }
        assert_eq!(Body::Fma(3).counts(64), (384, 512));
        assert_eq!(Body::Add(2).counts(64), (32, 512));
    }

    #[test]
    fn every_isa_computes_the_same_sums() {
        let buf = Buffer::new(CHUNK * 8);
        for body in [Body::Fma(3), Body::Add(1), Body::Add(2)] {
            let want = sweep_generic::<8>(&buf.data[..CHUNK], body);
            let got = sweep(&buf.data[..CHUNK], body, Isa::detect());
            assert!(
                (got - want).abs() <= 1e-9 * want.abs(),
                "{body:?}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn run_counts_progress_and_logs_it() {
        let buf = Arc::new(Buffer::new(CHUNK * 8 * 4));
        let counters = Arc::new(Counters::default());
        let mut ticks = 0;
        let log = run(
            &buf,
            Body::Fma(4),
            Isa::detect(),
            &[0],
            Duration::from_millis(30),
            &counters,
            &mut |_| ticks += 1,
        );
        let last = log.last().expect("log");
        assert!(last.flops > 0 && last.flops == last.bytes, "{last:?}");
        assert!(log.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
        assert_eq!(ticks, log.len());
        let (w, q) = progress_at(&log, last.ts_ns);
        assert_eq!((w, q), (last.flops as f64, last.bytes as f64));
    }

    #[test]
    fn progress_is_interpolated_between_samples() {
        let p = |ts_ns, flops, bytes| Progress {
            ts_ns,
            flops,
            bytes,
        };
        let log = [p(10, 0, 0), p(20, 100, 10)];
        assert_eq!(progress_at(&log, 15), (50.0, 5.0));
        assert_eq!(progress_at(&log, 5), (0.0, 0.0));
        assert_eq!(progress_at(&log, 25), (100.0, 10.0));
        assert_eq!(progress_at(&[], 25), (0.0, 0.0));
    }

    #[test]
    fn llc_size_comes_from_the_highest_cache_level() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (i, level, size) in [(0, "1", "48K"), (1, "2", "2048K"), (2, "3", "30M")] {
            let d = dir
                .path()
                .join(format!("devices/system/cpu/cpu0/cache/index{i}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("level"), level).expect("level");
            std::fs::write(d.join("size"), size).expect("size");
        }
        assert_eq!(llc_bytes(dir.path()), Some(30 * 1024 * 1024));
        assert_eq!(llc_bytes(&dir.path().join("none")), None);
    }
}
