//! Any bytes as the pod list the agent fetches for pod names: decoding errors or yields an
//! index bounded by the pod and container limits, never panics.
#![no_main]

use energy_bpf::kube::podlist;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(index) = podlist::decode(data) {
        assert!(index.pods.len() <= podlist::MAX_PODS);
        assert!(index.containers.len() <= podlist::MAX_PODS * podlist::MAX_CONTAINERS);
    }
});
