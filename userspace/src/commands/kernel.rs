//! `energy-bpf kernel stream|fma`: runs one of the roofline's built-in kernels for a while,
//! a workload of known character to record and place with `report --by function
//! --roofline`: `stream` sweeps a buffer larger than the last-level cache with one add per
//! element (memory-bound), `fma` applies FMA rounds to a buffer that stays in L1
//! (compute-bound). They run in functions of their own (`stream_*`, `fma_*`).

use std::{
    hint::black_box,
    process::ExitCode,
    time::{Duration, Instant},
};

use energy_bpf_kernels::{Body, Isa, sweep};

/// Which kernel.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// One add per element over a large buffer: memory-bound.
    Stream,
    /// 64 FMA rounds per element over an L1-resident buffer: compute-bound.
    Fma,
}

/// Arguments of `energy-bpf kernel`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which kernel.
    #[arg(value_enum)]
    pub(crate) kind: Kind,
    /// How long, seconds.
    #[arg(long, default_value_t = 5.0, value_parser = parse_seconds)]
    pub(crate) seconds: f64,
    /// Buffer size, MiB, for `stream` (default 256; larger than the last-level cache).
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=16384))]
    pub(crate) buffer_mib: u64,
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(s) if (0.01..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!("`{text}` is not a number of seconds in 0.01..3600")),
    }
}

/// Runs the command: the kernel on this thread until the time is up.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let isa = Isa::detect();
    let (body, elements) = match args.kind {
        Kind::Stream => (Body::Add(1), (args.buffer_mib as usize) << 17),
        // 16 KiB: half of the smallest L1 data cache in use.
        Kind::Fma => (Body::Fma(64), 2048),
    };
    let data: Vec<f64> = (0..elements).map(|i| 1.0 + (i % 7) as f64 * 1e-3).collect();
    let until = Instant::now() + Duration::from_secs_f64(args.seconds);
    let (mut sweeps, mut sum) = (0u64, 0.0f64);
    while Instant::now() < until {
        sum += sweep(black_box(&data), body, isa);
        sweeps += 1;
    }
    let (flops, bytes) = body.counts(elements);
    println!(
        "{:?} ({}): {sweeps} sweeps, {:.3e} flops, {:.3e} bytes (checksum {:.3e})",
        args.kind,
        isa.name(),
        flops as f64 * sweeps as f64,
        bytes as f64 * sweeps as f64,
        black_box(sum)
    );
    Ok(ExitCode::SUCCESS)
}
