//! Any bytes as the agent socket's stream: `top --connect` reads frames until the stream
//! ends or is refused, never panics, and never allocates more than one bounded frame.
#![no_main]

use energy_bpf::remote;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut stream = data;
    while let Ok(Some(snapshot)) = remote::read_frame(&mut stream) {
        // A decoded frame is a window that ends after it starts.
        assert!(snapshot.ts_ns >= snapshot.start_ns);
    }
});
