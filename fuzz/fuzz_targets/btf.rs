//! Any bytes as kernel BTF: looking up `task_struct` members never panics or loops.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = energy_bpf::capture::btf::member_offsets(data, "task_struct", &["pid", "tgid"]);
});
