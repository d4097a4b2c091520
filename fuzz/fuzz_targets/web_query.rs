//! Any bytes as a query string of the agent web view's API (`/api/v1/series`,
//! `/api/v1/profile`, `/api/v1/diff`): decoding errors with a reason or yields a request
//! within every cap, never panics.
#![no_main]

use energy_bpf::web_api as api;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(q) = api::series(query) {
        assert!(q.range_s >= 1 && q.range_s <= api::MAX_SERIES_RANGE_S);
        assert!(q.top >= 1 && q.top <= api::MAX_TOP);
    }
    let bounded = |q: &api::ProfileQuery| {
        q.to_ms > q.from_ms
            && q.to_ms - q.from_ms <= api::MAX_PROFILE_RANGE_S * 1000
            && q.group
                .as_ref()
                .is_none_or(|(_, name)| !name.is_empty() && name.len() <= 256)
            && !(q.pid.is_some() && q.group.is_some())
    };
    if let Ok(q) = api::profile(query) {
        assert!(bounded(&q));
    }
    if let Ok(q) = api::diff(query) {
        assert!(bounded(&q.a) && bounded(&q.b));
    }
    if let Err(reason) = api::series(query) {
        assert!(!reason.is_empty());
    }
});
