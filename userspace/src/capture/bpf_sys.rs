//! The `bpf(2)` map calls aya has none for: storing an arbitrary perf event fd in a
//! `PERF_EVENT_ARRAY` (aya's `open` makes output buffers), `BPF_MAP_UPDATE_BATCH` (a row
//! per call cost ~2 µs, so a 400k-row unwind table took most of a second).

use std::io;

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `BPF_MAP_*_ELEM` member of `union bpf_attr` (include/uapi/linux/bpf.h).
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The `BPF_MAP_*_BATCH` member of `union bpf_attr`.
#[repr(C)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// `BPF_MAP_UPDATE_ELEM`: `map[key] = value`. `K` and `V` must be the map's key and value
/// types (plain data of the map's sizes).
pub fn update_elem<K, V>(map_fd: i32, key: &K, value: &V) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: map_fd as u32,
        _pad: 0,
        key: std::ptr::from_ref(key) as u64,
        value: std::ptr::from_ref(value) as u64,
        flags: 0,
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr)
}

/// `BPF_MAP_UPDATE_BATCH` (Linux 5.6): `map[keys[i]] = values[i]` for every pair. Fails
/// with `EINVAL` where the kernel or the map type has no batch operations.
pub fn update_batch<K, V>(map_fd: i32, keys: &[K], values: &[V]) -> io::Result<()> {
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: keys.len().min(values.len()) as u32,
        map_fd: map_fd as u32,
        elem_flags: 0,
        flags: 0,
    };
    bpf(BPF_MAP_UPDATE_BATCH, &mut attr)
}

/// `bpf(2)`; the kernel may write back to `attr` (the batch calls' `count`).
fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<()> {
    // SAFETY: `attr` is the member of `union bpf_attr` that `cmd` reads and writes back,
    // of the size passed; the memory it points at belongs to the caller and outlives the
    // call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr),
            std::mem::size_of::<A>() as libc::c_uint,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
