//! Running the roofline kernels ([`energy_bpf_kernels`]: f64 sweeps whose flops W and
//! bytes Q are known by construction, the energy roofline thesis's intensity sweep) on a buffer larger than
//! the last-level cache.
//!
//! Threads are pinned one per CPU and share one read-only buffer, each sweeping its own
//! slice cyclically; they add their progress to shared atomic counters every chunk, which
//! [`run`] samples into a progress log. For tests the counters can live in a file mapped
//! shared, which an emulated energy counter reads with no delay.

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

pub use energy_bpf_kernels::{Body, Isa, sweep};

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

/// Shared progress counters the workers add to: on the heap, or in a file mapped shared so
/// that another process (a test's emulated energy counter) reads them as they change.
pub struct Counters {
    /// Flops then bytes.
    cells: *const [AtomicU64; 2],
    /// The mapping to unmap on drop (`None` on the heap).
    mapped: Option<usize>,
}

// SAFETY: the cells are atomics, valid for the life of `Counters` (a leaked box or a
// mapping unmapped only in drop); sharing them between threads is what atomics are for.
unsafe impl Send for Counters {}
// SAFETY: as above.
unsafe impl Sync for Counters {}

impl Default for Counters {
    fn default() -> Self {
        let cells: Box<[AtomicU64; 2]> = Box::default();
        Self {
            cells: Box::into_raw(cells),
            mapped: None,
        }
    }
}

impl Counters {
    /// Counters in `path` (created 0600, never through a symlink): two little-endian u64,
    /// flops at offset 0 and bytes at offset 8, updated in place.
    pub fn in_file(path: &std::path::Path) -> std::io::Result<Self> {
        use std::os::{fd::AsRawFd as _, unix::fs::OpenOptionsExt as _};
        // Read-write (a shared writable mapping needs both), like `create_private` otherwise.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)?;
        let len = std::mem::size_of::<[AtomicU64; 2]>();
        file.set_len(len as u64)?;
        // SAFETY: a fresh shared read-write mapping of a file we just sized to `len`; the
        // kernel picks the (page-aligned, so u64-aligned) address.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            cells: ptr.cast(),
            mapped: Some(len),
        })
    }

    fn cells(&self) -> &[AtomicU64; 2] {
        // SAFETY: `cells` points at live atomics for as long as `self` (see the type).
        unsafe { &*self.cells }
    }

    /// Adds one chunk's work.
    pub fn add(&self, flops: u64, bytes: u64) {
        self.cells()[0].fetch_add(flops, Ordering::Relaxed);
        self.cells()[1].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Current totals.
    pub fn load(&self) -> (u64, u64) {
        (
            self.cells()[0].load(Ordering::Relaxed),
            self.cells()[1].load(Ordering::Relaxed),
        )
    }
}

impl Drop for Counters {
    fn drop(&mut self) {
        match self.mapped {
            // SAFETY: the mapping made in `in_file`, of that length, no longer referenced.
            Some(len) => unsafe {
                libc::munmap(self.cells as *mut libc::c_void, len);
            },
            // SAFETY: the box leaked in `default`, no longer referenced.
            None => drop(unsafe { Box::from_raw(self.cells as *mut [AtomicU64; 2]) }),
        }
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
        counters.add(w, q);
        i += 1;
    }
    std::hint::black_box(sink);
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
    fn counters_in_a_file_are_seen_by_a_reader_of_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("progress");
        let c = Counters::in_file(&path).expect("map");
        c.add(5, 7);
        c.add(1, 1);
        assert_eq!(c.load(), (6, 8));
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(bytes.len(), 16);
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        assert_eq!((word(0), word(8)), (6, 8));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
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
