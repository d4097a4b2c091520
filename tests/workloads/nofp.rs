// Test workload for table-driven unwinding: a Rust release binary without frame pointers,
// main -> outer -> inner. Built by the test: rustc -C opt-level=3 -C force-frame-pointers=no
// Run: ./nofp_rs SECONDS
use std::hint::black_box;
use std::time::{Duration, Instant};

#[inline(never)]
fn inner(n: u64) -> u64 {
    let mut a = 0u64;
    for i in 0..n {
        a = a.wrapping_add(black_box(i).wrapping_mul(i));
    }
    a
}

#[inline(never)]
fn outer(n: u64) -> u64 {
    let mut s = 0u64;
    for k in 0..4 {
        s = s.wrapping_add(inner(black_box(n + k)));
    }
    s
}

fn main() {
    let secs: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3.0);
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let mut sink = 0u64;
    while Instant::now() < end {
        sink = sink.wrapping_add(outer(100_000));
    }
    black_box(sink);
}
