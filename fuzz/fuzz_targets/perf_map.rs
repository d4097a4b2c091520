//! Any bytes as a perf map (`/tmp/perf-PID.map`, written by another user's process): the
//! line parser never panics, every entry it yields is well formed, the table built from
//! them finds each entry's start, and V8-style names split without panicking.
#![no_main]

use energy_bpf::symbolize::JitRuntime;
use energy_bpf::symbolize::perf_map::{self, JitTable, MAX_NAME_BYTES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut lines = Vec::new();
    for line in data.split(|&b| b == b'\n') {
        if let Some(l) = std::str::from_utf8(line).ok().and_then(perf_map::parse_line) {
            assert!(l.size > 0 && l.start.checked_add(l.size).is_some());
            assert!(!l.name.is_empty() && l.name.len() <= MAX_NAME_BYTES);
            lines.push((l.start, l.size, l.name.to_string()));
        }
    }
    let mut table = JitTable::default();
    for (start, size, name) in &lines {
        table.insert(*start, *size, name);
    }
    for (start, _, name) in &lines {
        let hit = table.lookup(*start);
        assert!(hit.is_some(), "entry at {start:#x} found");
        let _ = perf_map::jit_frame(name, JitRuntime::V8);
    }
});
