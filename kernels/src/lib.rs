//! The roofline calibration's compute kernels (`energy-bpf calibrate --roofline`, seed
//! 002's intensity sweep): sweeps over f64 data that do a chosen number of flops per byte
//! read, so work W and traffic Q are known by construction. This crate is built with
//! optimisation in every profile (workspace `Cargo.toml`): the kernels must measure the
//! machine, not unoptimised code. Threads, buffers and timing live in the `energy-bpf`
//! crate (`roofline::kernels`).
//!
//! A block is 8 vectors of the widest f64 width the CPU runs (AVX-512, AVX2+FMA or
//! scalar, detected at run time), so 8 independent FMA chains hide the FMA latency:
//! - `Fma(r)` applies `r` FMA rounds to each element of a block: I = 2·r/8 = r/4;
//! - `Add(s)` adds every `s`-th element into the accumulators: I = 1/(8·s). Every cache
//!   line is still fetched (s·8 < 64 bytes), so Q is the bytes swept.

/// What a kernel does per element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Body {
    /// `r` FMA rounds per element.
    Fma(u32),
    /// One add per `s`-th element.
    Add(usize),
}

impl Body {
    /// The kernel for `intensity` flop/byte (rounded to the nearest the bodies can do).
    pub fn for_intensity(intensity: f64) -> Self {
        if intensity >= 0.25 {
            Self::Fma((intensity * 4.0).round().max(1.0) as u32)
        } else {
            Self::Add((1.0 / (8.0 * intensity)).round().clamp(1.0, 8.0) as usize)
        }
    }

    /// Flops and bytes of one chunk of `elements` elements.
    pub fn counts(self, elements: usize) -> (u64, u64) {
        let bytes = (elements * 8) as u64;
        match self {
            Self::Fma(r) => (2 * r as u64 * elements as u64, bytes),
            Self::Add(s) => ((elements / s) as u64, bytes),
        }
    }

    /// W/Q, flop/byte.
    pub fn intensity(self) -> f64 {
        let (w, q) = self.counts(8 * 64);
        w as f64 / q as f64
    }
}

/// The widest f64 vector code this CPU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// 8 lanes with FMA.
    Avx512,
    /// 4 lanes with FMA.
    Avx2Fma,
    /// Whatever the target baseline gives.
    Scalar,
}

impl Isa {
    /// Detected at run time.
    pub fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Self::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Self::Avx2Fma;
            }
        }
        Self::Scalar
    }

    /// Name for outputs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Avx512 => "avx512f",
            Self::Avx2Fma => "avx2+fma",
            Self::Scalar => "scalar",
        }
    }
}

/// One sweep of `chunk`; returns a sum that depends on every flop (keep it observable).
///
/// FMA and streaming bodies run in functions of their own (`fma_avx512`,
/// `stream_avx512`, ...), so a profile of the kernels tells them apart.
pub fn sweep(chunk: &[f64], body: Body, isa: Isa) -> f64 {
    match (isa, body) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `detect` saw avx512f on this CPU.
        (Isa::Avx512, Body::Fma(_)) => unsafe { fma_avx512(chunk, body) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Isa::Avx512, Body::Add(_)) => unsafe { stream_avx512(chunk, body) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `detect` saw avx2 and fma on this CPU.
        (Isa::Avx2Fma, Body::Fma(_)) => unsafe { fma_avx2(chunk, body) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        (Isa::Avx2Fma, Body::Add(_)) => unsafe { stream_avx2(chunk, body) },
        (_, Body::Fma(_)) => fma_scalar(chunk, body),
        (_, Body::Add(_)) => stream_scalar(chunk, body),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn fma_avx512(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<64>(chunk, body)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn stream_avx512(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<64>(chunk, body)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn fma_avx2(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<32>(chunk, body)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn stream_avx2(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<32>(chunk, body)
}

#[inline(never)]
fn fma_scalar(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<8>(chunk, body)
}

#[inline(never)]
fn stream_scalar(chunk: &[f64], body: Body) -> f64 {
    sweep_generic::<8>(chunk, body)
}

/// One chunk with `B`-element blocks (8 vectors); inlined into the feature-enabled callers
/// so the loops are vectorised at their width and `mul_add` is one FMA instruction.
#[inline(always)]
fn sweep_generic<const B: usize>(chunk: &[f64], body: Body) -> f64 {
    let mut acc = [0.0f64; B];
    match body {
        Body::Fma(rounds) => {
            for block in chunk.chunks_exact(B) {
                for _ in 0..rounds {
                    for (a, &x) in acc.iter_mut().zip(block) {
                        *a = a.mul_add(x, 0.25);
                    }
                }
            }
        }
        Body::Add(stride) => {
            for block in chunk.chunks_exact(B * stride) {
                for (a, x) in acc.iter_mut().zip(block.iter().step_by(stride)) {
                    *a += x;
                }
            }
        }
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_isa_computes_the_same_sums_as_the_portable_code() {
        let data: Vec<f64> = (0..8192).map(|i| 0.5 + (i % 97) as f64 / 200.0).collect();
        let isa = Isa::detect();
        for body in [Body::Fma(3), Body::Add(1), Body::Add(2)] {
            // The same block width as the vector code: the same sums in the same order.
            let want = match isa {
                Isa::Avx512 => sweep_generic::<64>(&data, body),
                Isa::Avx2Fma => sweep_generic::<32>(&data, body),
                Isa::Scalar => sweep_generic::<8>(&data, body),
            };
            let got = sweep(&data, body, isa);
            assert!(
                (got - want).abs() <= 1e-9 * want.abs() && want > 0.0,
                "{body:?}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn bodies_have_the_intensities_asked_for() {
        for i in [0.0625, 0.125, 0.25, 0.5, 1.0, 8.0, 64.0] {
            let b = Body::for_intensity(i);
            assert!((b.intensity() - i).abs() < 1e-12, "{i}: {b:?}");
        }
        assert_eq!(Body::Fma(3).counts(64), (384, 512));
        assert_eq!(Body::Add(2).counts(64), (32, 512));
    }
}
