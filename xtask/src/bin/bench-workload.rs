//! Fixed workloads for `cargo xtask bench overhead`:
//! - `cpu N`: N rounds of a CPU-bound integer loop (no syscalls, no allocation);
//! - `pingpong N`: N round trips of one byte between two threads over pipes, so each
//!   round trip is two context switches.
use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixStream,
};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    match args.first().map(String::as_str) {
        Some("cpu") => {
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
            for i in 0..n * 10_000_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x = x.wrapping_add(i);
            }
            println!("{x}");
        }
        Some("pingpong") => {
            // Both threads on CPU 0: every round trip is two direct context switches on one
            // CPU that never idles, so the cost measured is the switch path (and our
            // sched_switch probe), not the VM's idle-exit latency.
            pin_to_cpu0();
            let (mut a, mut b) = UnixStream::pair().expect("socketpair");
            let peer = std::thread::spawn(move || {
                let mut buf = [0u8; 1];
                for _ in 0..n {
                    b.read_exact(&mut buf).expect("read");
                    b.write_all(&buf).expect("write");
                }
            });
            let mut buf = [7u8; 1];
            for _ in 0..n {
                a.write_all(&buf).expect("write");
                a.read_exact(&mut buf).expect("read");
            }
            peer.join().expect("peer");
        }
        _ => {
            eprintln!("usage: bench-workload cpu|pingpong N");
            std::process::exit(2);
        }
    }
}

fn pin_to_cpu0() {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity on the calling thread, inherited by
    // threads it spawns.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
