//! Any bytes as a chunk's switch columns: decoding never panics, and decoded events
//! encode and decode back to themselves.
#![no_main]

use energy_bpf::{pb::v1::SwitchColumns, record::columns};
use libfuzzer_sys::fuzz_target;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    let Ok(c) = SwitchColumns::decode(data) else {
        return;
    };
    let Ok(events) = columns::from_columns(&c) else {
        return;
    };
    let again = columns::from_columns(&columns::to_columns(&events));
    assert_eq!(again.ok().as_ref(), Some(&events), "round trip");
});
