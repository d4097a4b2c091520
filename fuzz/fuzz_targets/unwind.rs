//! Any bytes as an ELF file, a bare `.eh_frame` section or an unwind cache file: compiling
//! or decoding never panics or runs away, and whatever comes out is sorted.
#![no_main]

use energy_bpf::unwind::{self, UnwindTable, cache};
use libfuzzer_sys::fuzz_target;

fn check(table: &UnwindTable) {
    assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc), "rows sorted and unique");
    assert!(table.rows.len() <= unwind::MAX_ROWS);
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the decoder, so one corpus feeds all three.
    let Some((&pick, rest)) = data.split_first() else { return };
    match pick % 3 {
        0 => {
            if let Ok(t) = unwind::compile_elf(rest) {
                check(&t);
            }
        }
        1 => {
            if let Ok(t) = unwind::compile_eh_frame(rest, 0x1000) {
                check(&t);
            }
        }
        _ => {
            if let Ok(t) = cache::decode(rest) {
                check(&t);
                assert_eq!(cache::decode(&cache::encode(&t)).ok().as_ref(), Some(&t));
            }
        }
    }
});
