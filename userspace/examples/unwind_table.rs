//! Builds (or reads from the cache) the unwind table of each ELF file named, and prints
//! what it cost: `cargo run --release --example unwind_table -- FILE... [--cache DIR]`.

use std::time::Instant;

use anyhow::Context;
use energy_bpf::unwind::{UnwindCache, compile_file};

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let cache = match args.iter().position(|a| a == "--cache") {
        Some(i) => {
            let dir = args
                .get(i + 1)
                .context("--cache needs a directory")?
                .clone();
            args.drain(i..=i + 1);
            Some(UnwindCache::open(dir)?)
        }
        None => None,
    };
    for path in &args {
        let t = Instant::now();
        let (table, source) = match &cache {
            Some(c) => {
                let (t, s) = c.table(path.as_ref())?;
                (t, format!("{s:?}"))
            }
            None => (compile_file(path.as_ref())?, "compiled".to_string()),
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let s = table.stats;
        let per_100mib = s.bytes() as f64 * (100.0 * 1048576.0) / (s.text_bytes.max(1) as f64);
        println!(
            "{path}: {source} in {ms:.1} ms, {} rows, {} fdes, {} skipped, {} unsupported, {} plt, \
             {} table bytes for {} text bytes ({:.2} MiB per 100 MiB of text)",
            s.rows,
            s.fdes,
            s.skipped,
            s.unsupported_rows,
            s.plt_rows,
            s.bytes(),
            s.text_bytes,
            per_100mib / 1048576.0
        );
    }
    Ok(())
}
