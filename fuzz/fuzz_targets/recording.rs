//! Any bytes as a recording file: read, then build the timeline and the model readings
//! the way every report starts, and split run counts over the samples. libFuzzer's memory
//! limit catches unbounded allocations.
#![no_main]

use std::path::Path;

use energy_bpf::energy::model;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(rec) = energy_bpf::record::read_from(data, Path::new("fuzz.ebpr")) else {
        return;
    };
    let timeline = energy_bpf::timeline::Timeline::of(&rec);
    let sources: Vec<_> = rec
        .sources
        .iter()
        .cloned()
        .map(|mut s| {
            // Model every source, so the readings loop runs on whatever window was read.
            s.kind = "model".into();
            s
        })
        .collect();
    let readings = model::readings(
        &timeline,
        &rec.header.cpus,
        &sources,
        model::DEFAULT_INTERVAL_NS,
    );
    assert!(readings.len() as u64 <= model::MAX_READINGS + sources.len() as u64);
    // Run counts (`record --activity-events`) split over the samples: any counts, any
    // timestamps, never more per-sample rows than samples.
    let counts = energy_bpf::roofline::per_function::sample_counts(&rec);
    assert_eq!(counts.per_sample.len(), rec.samples.len());
    let _ = rec.damage.note();
});
