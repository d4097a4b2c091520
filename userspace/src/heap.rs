//! The heap. The `energy-bpf` binary allocates with mimalloc (its `main.rs`): the agent
//! allocates and frees small buffers at every poll, and glibc's allocator took about a
//! quarter of its CPU beside a saturated server (docs/benchmarks.md).

/// Hands memory the calling thread freed back to the system, after a large one-off use
/// (a window of millions of runs, a large unwind table): mimalloc's pages, and glibc's for
/// what C libraries allocated. Either allocator keeps a freed footprint for reuse
/// otherwise.
pub fn release() {
    // SAFETY: mi_collect has no preconditions; it frees pages with no live blocks, of this
    // thread's heap and of heaps abandoned by exited threads.
    unsafe { libmimalloc_sys::mi_collect(true) };
    // SAFETY: malloc_trim has no preconditions.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
