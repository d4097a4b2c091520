//! Any bytes as a recording file: read, then build the timeline and the model readings
//! the way every report starts, split run counts over the samples, and name every stored
//! address from the recording's own symbol tables. libFuzzer's memory limit catches
//! unbounded allocations.
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
    // Stored names (`SymbolTable`): every table kept is within the reader's bounds, and
    // naming each stored address from them never resolves anything live.
    for table in rec.symbols.iter() {
        assert!(energy_bpf::record::symbols::check(table).is_ok());
    }
    let mut names = energy_bpf::symbolize::Symbolizer::with_kallsyms(None);
    names.use_stored(&rec.symbols);
    for table in rec.symbols.iter() {
        for a in &table.kernel {
            assert!(!names.kernel(a.address).is_empty());
        }
        for file in &table.files {
            let whole = [energy_bpf::pb::v1::Mapping {
                start: 0,
                end: u64::MAX,
                path: file.path.clone(),
                ..Default::default()
            }];
            // The whole address space but its last address, which no mapping can hold.
            for a in file.addresses.iter().filter(|a| a.address < u64::MAX) {
                assert!(!names.user(a.address, &whole).is_empty());
            }
        }
    }
    let stats = names.stats();
    assert_eq!((stats.resolved, stats.unresolved), (0, 0));
    let _ = rec.damage.note();
});
