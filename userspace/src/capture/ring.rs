//! A ring buffer that counts the bytes it hands out, so that the capture loop can drain
//! as rarely as the rings allow (see `agent::collect`): draining costs the same syscalls and
//! wake-ups however little there is to read.

use aya::{
    Ebpf,
    maps::{MapData, RingBuf, ring_buf::RingBufItem},
};

/// Bytes the kernel puts before each record (`BPF_RINGBUF_HDR_SZ`); records are padded to 8.
const RECORD_HEADER: u64 = 8;

/// One of the probes' ring buffers, and what was read from it since [`Ring::take_fill`].
pub struct Ring {
    ring: RingBuf<MapData>,
    capacity: u64,
    read: u64,
}

impl Ring {
    /// Takes the ring buffer `name` out of a loaded object; `None` when it has none of that
    /// name or type.
    pub fn take(ebpf: &mut Ebpf, name: &str) -> Option<Self> {
        let map = ebpf.take_map(name)?;
        let capacity = match &map {
            aya::maps::Map::RingBuf(data) => data.info().ok()?.max_entries(),
            _ => return None,
        };
        Some(Self {
            ring: RingBuf::try_from(map).ok()?,
            capacity: u64::from(capacity).max(1),
            read: 0,
        })
    }

    /// The next record, if any (see [`RingBuf::next`]).
    pub fn next(&mut self) -> Option<RingBufItem<'_>> {
        let Self { ring, read, .. } = self;
        let item = ring.next()?;
        *read += (item.len() as u64).next_multiple_of(8) + RECORD_HEADER;
        Some(item)
    }

    /// The fraction of the ring read since the last call: how full it got between two
    /// drains, had nothing been read in between.
    pub fn take_fill(&mut self) -> f64 {
        let fill = self.read as f64 / self.capacity as f64;
        self.read = 0;
        fill
    }
}
