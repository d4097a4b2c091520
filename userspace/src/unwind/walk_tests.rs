//! The reference walker on this test process's own stack, through C code built here
//! without frame pointers (`-O2 -fomit-frame-pointer`, loaded with dlopen).
#![allow(clippy::unwrap_used)]

use std::cell::RefCell;
use std::process::Command;

use super::process::{RowArena, process_entries};
use super::walk::{Memory, Regs, Stop, Walk, walk};
use super::*;

/// This process's memory, read with process_vm_readv so a wrong address is a clean
/// failure, not a crash.
struct OwnMemory;

impl Memory for OwnMemory {
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut buf = [0u8; 8];
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: 8,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: 8,
        };
        // SAFETY: both iovecs describe 8 bytes; the local one is `buf`, the remote one is
        // only read by the kernel, which checks it.
        let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        (n == 8).then(|| u64::from_ne_bytes(buf))
    }
}

/// pc, sp and rbp where the asm runs, in this function's frame.
#[inline(never)]
fn here() -> Regs {
    let (pc, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, touches no memory.
    unsafe {
        std::arch::asm!("lea {0}, [rip]", "mov {1}, rsp", "mov {2}, rbp",
            out(reg) pc, out(reg) sp, out(reg) bp, options(nomem, nostack));
    }
    Regs { pc, sp, bp }
}

fn walk_here(cache: &UnwindCache) -> Walk {
    let mut arena = RowArena::new(1 << 24);
    let entries = process_entries(std::process::id(), cache, &mut arena).unwrap();
    assert!(!entries.is_empty(), "this process has tables");
    walk(here(), &entries, &arena, &OwnMemory, 127)
}

#[test]
fn unwind_walk_reaches_the_thread_start() {
    let dir = tempfile::tempdir().unwrap();
    let cache = UnwindCache::open(dir.path()).unwrap();
    let w = walk_here(&cache);
    assert_eq!(w.stop, Stop::EndOfStack, "{w:x?}");
    assert!(w.pcs.len() >= 5 && w.fp_steps == 0, "{w:x?}");
}

const LIB: &str = r#"
typedef void (*cb_t)(void);
volatile long sink;
__attribute__((noinline)) void inner(cb_t cb) { for (long i = 0; i < 3; i++) sink += i; cb(); sink++; }
__attribute__((noinline)) void outer(cb_t cb) { long v[4] = {1, 2, 3, 4}; sink = v[sink & 3]; inner(cb); sink--; }
"#;

thread_local! {
    static SEEN: RefCell<Option<Walk>> = const { RefCell::new(None) };
    static CACHE: RefCell<Option<UnwindCache>> = const { RefCell::new(None) };
}

extern "C" fn callback() {
    CACHE.with(|c| {
        let w = walk_here(c.borrow().as_ref().unwrap());
        SEEN.with(|s| *s.borrow_mut() = Some(w));
    });
}

#[test]
fn unwind_walk_crosses_c_frames_without_frame_pointers() {
    let dir = tempfile::tempdir().unwrap();
    let (src, lib) = (dir.path().join("l.c"), dir.path().join("libl.so"));
    std::fs::write(&src, LIB).unwrap();
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src);
    assert!(gcc.status().unwrap().success(), "gcc failed");
    CACHE.with(|c| *c.borrow_mut() = Some(UnwindCache::open(dir.path().join("c")).unwrap()));
    // SAFETY: the library was just built from LIB: no constructors, and `outer` has the
    // signature declared here.
    let walk = unsafe {
        let l = libloading::Library::new(&lib).unwrap();
        let outer: libloading::Symbol<extern "C" fn(extern "C" fn())> = l.get(b"outer").unwrap();
        let inner: libloading::Symbol<extern "C" fn(extern "C" fn())> = l.get(b"inner").unwrap();
        let (outer_at, inner_at) = (*outer as usize as u64, *inner as usize as u64);
        outer(callback);
        let w = SEEN.with(|s| s.borrow_mut().take()).unwrap();
        // Return addresses within a few hundred bytes after each function's start.
        let within = |f: u64| w.pcs.iter().any(|&pc| pc > f && pc - f < 256);
        assert!(within(inner_at), "inner on the stack: {w:x?}");
        assert!(within(outer_at), "outer on the stack: {w:x?}");
        w
    };
    assert_eq!(walk.stop, Stop::EndOfStack, "{walk:x?}");
    assert_eq!(walk.fp_steps, 0, "{walk:x?}");
}

#[test]
fn unwind_mapping_bias_uses_the_executable_segment() {
    use super::process::mapping_bias;
    // A Rust test binary's layout (readelf -l): the read-only segment's last page is also
    // the first page of the executable mapping.
    let segs = [
        Segment {
            file_offset: 0,
            file_size: 0x64e844,
            vaddr: 0,
            executable: false,
        },
        Segment {
            file_offset: 0x64e880,
            file_size: 0x11f1170,
            vaddr: 0x64f880,
            executable: true,
        },
    ];
    let base = 0x5601_9b08_f000;
    assert_eq!(mapping_bias(&segs, 0x5601_9b6d_e000, 0x64e000), Some(base));
    assert_eq!(mapping_bias(&segs, 0x5601_9b6d_e000, 0x2000_0000), None);
    let mut arena = RowArena::new(4);
    let row = UnwindRow {
        pc: 1,
        cfa_offset: 8,
        rbp_offset: 0,
        cfa_reg: unwind_reg::RSP,
        kind: 0,
    };
    assert_eq!(arena.insert(b"a", &[row; 3]), Some((0, 3)));
    assert_eq!(
        arena.insert(b"a", &[row; 3]),
        Some((0, 3)),
        "a file is stored once"
    );
    assert_eq!(arena.insert(b"b", &[row; 2]), None, "the arena is bounded");
    assert_eq!(arena.full, 1);

    // Rows taken into the BPF map leave only the index; new rows follow them.
    let (start, taken) = arena.take_new();
    assert_eq!((start, taken.len(), arena.len()), (0, 3, 3));
    assert!(arena.rows().is_empty());
    assert_eq!(arena.insert_owned(b"c", vec![row; 1]), Some((3, 1)));
    assert_eq!(arena.get(b"a"), Some((0, 3)), "the index outlives the rows");
    assert_eq!(
        arena.insert_owned(b"d", vec![row; 1]),
        None,
        "still bounded"
    );
    assert_eq!(
        arena.insert_owned(b"e", vec![row; 5]),
        None,
        "larger than the arena"
    );
    assert!(arena.is_too_big(b"e"));
    arena.clear();
    assert_eq!((arena.len(), arena.files()), (0, 0));
}

#[test]
fn a_second_process_of_the_same_files_gets_the_same_entries_from_kept_segments() {
    // A child that maps nothing new while it is read (this process's own mappings change
    // as other tests run beside this one).
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cache = UnwindCache::open(dir.path()).unwrap();
    let mut arena = RowArena::new(1 << 24);
    // `sleep` is dynamically linked: wait until the loader has mapped its libraries.
    let pid = child.id();
    let maps = || std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    for _ in 0..200 {
        if maps().contains("libc.so") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let first = process_entries(pid, &cache, &mut arena);
    // Files with a build-id (libc's at least) have their segments kept, not read again.
    let kept = arena.kept_segments();
    let again = process_entries(pid, &cache, &mut arena);
    let _ = child.kill();
    let _ = child.wait();
    let (first, again) = (first.unwrap(), again.unwrap());
    assert!(kept > 0 && !first.is_empty());
    assert_eq!(first, again);
}
