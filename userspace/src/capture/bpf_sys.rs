//! The `bpf(2)` map calls aya has none for: storing an arbitrary perf event fd in a
//! `PERF_EVENT_ARRAY` (aya's `open` makes output buffers), `BPF_MAP_UPDATE_BATCH` (a row
//! per call cost ~2 µs, so a 400k-row unwind table took most of a second), and
//! `BPF_MAP_LOOKUP_BATCH` / `BPF_MAP_DELETE_BATCH` (the aggregating mode reads and removes
//! its rows in a few calls instead of two per row).

use std::io;

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

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

/// `BPF_MAP_LOOKUP_BATCH` (Linux 5.6) on a hash map: copies every row into `keys` and
/// `values` (cleared first), `chunk` rows per call. Rows a probe adds meanwhile may or may
/// not be seen. Fails with `EINVAL` where the kernel has no batch operations.
pub fn lookup_all<K: Copy + Default, V: Copy + Default>(
    map_fd: i32,
    chunk: usize,
    keys: &mut Vec<K>,
    values: &mut Vec<V>,
) -> io::Result<()> {
    keys.clear();
    values.clear();
    let chunk = chunk.max(1);
    // For hash maps the batch token is a bucket index (u32).
    let (mut token_in, mut token_out) = (0u32, 0u32);
    let mut first = true;
    loop {
        let at = keys.len();
        keys.resize(at + chunk, K::default());
        values.resize(at + chunk, V::default());
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                std::ptr::from_ref(&token_in) as u64
            },
            out_batch: std::ptr::from_mut(&mut token_out) as u64,
            keys: keys[at..].as_mut_ptr() as u64,
            values: values[at..].as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: map_fd as u32,
            elem_flags: 0,
            flags: 0,
        };
        let rc = bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let got = (attr.count as usize).min(chunk);
        keys.truncate(at + got);
        values.truncate(at + got);
        match rc {
            Ok(()) => {}
            // ENOENT: no rows after this call's.
            Err(err) if err.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(err) => return Err(err),
        }
        token_in = token_out;
        first = false;
    }
}

/// `BPF_MAP_DELETE_BATCH` (Linux 5.6): removes the rows of `keys` (missing ones are an
/// error: `ENOENT`, after the ones before it were removed).
pub fn delete_keys<K>(map_fd: i32, keys: &[K]) -> io::Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: 0,
        count: keys.len() as u32,
        map_fd: map_fd as u32,
        elem_flags: 0,
        flags: 0,
    };
    bpf(BPF_MAP_DELETE_BATCH, &mut attr)
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
