//! Any bytes as a CPython line table (`python/linetable.rs`): the 3.9 `co_lnotab`, the 3.10
//! `co_linetable` and the 3.11+ location table never panic or loop, whatever the offset.
//! Input: format (first byte mod 3), `co_firstlineno` (u32 LE), offset (u64 LE), table.
#![no_main]

use energy_bpf::python::{LineFormat, line_at};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((head, table)) = data.split_at_checked(13) else {
        return;
    };
    let format = match head[0] % 3 {
        0 => LineFormat::Lnotab,
        1 => LineFormat::Linetable,
        _ => LineFormat::Locations,
    };
    let first = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    let mut offset = [0u8; 8];
    offset.copy_from_slice(&head[5..13]);
    let offset = u64::from_le_bytes(offset);
    let _ = line_at(format, table, first, offset);
    // Every offset the table could cover, as the symbolizer asks for them.
    for o in 0..(table.len() as u64).min(256) {
        let _ = line_at(format, table, first, o);
    }
});
