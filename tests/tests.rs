//! Integration tests, one binary; modules by concern:
//! - `outputs`: flamegraph SVG in Chromium, pprof in `go tool pprof`, on our workload.

mod outputs;
