//! Unwind tables: `.eh_frame`/`.debug_frame` of an ELF file compiled into compact rows
//! that an eBPF stack walker can follow without frame pointers (docs/ARCHITECTURE.md,
//! "Capture"). x86_64 only.
//!
//! A row says, for every PC from its `pc` up to the next row's, where the CFA is
//! (`rsp|rbp + offset`), that the return address is at CFA-8, and where the caller's rbp was
//! saved. Rules the walker cannot follow are kept as marked rows (PLT stubs, signal
//! trampolines, expressions) so it knows to fall back instead of guessing.
//!
//! Tables are built once per file and cached on disk by build-id ([`cache`]). `process`
//! lays them out as the sampler will read them (a shared, bounded row arena and per-process
//! mapping entries with load biases); `walk` is the walk itself in plain Rust, the
//! reference the eBPF walker is to follow step for step (not wired into the sampler yet).
//!
//! Every input is bounded (these are outside bytes, and the tables end up in BPF maps):
//! - a CFI section larger than `MAX_SECTION_BYTES` is refused;
//! - a table is at most [`MAX_ROWS`] rows ([`MAX_ROWS`] × 16 bytes of memory);
//! - a malformed FDE is skipped and counted, never fatal; a malformed entry list ends that
//!   section, also counted.

pub mod cache;
mod compile;
pub(crate) mod process;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod walk;
#[cfg(test)]
mod walk_tests;

pub use cache::UnwindCache;
pub use compile::{Segment, compile_eh_frame, compile_elf, compile_file, load_segments};
pub(crate) use energy_bpf_abi::{UnwindRow, unwind_kind, unwind_reg};

use std::path::PathBuf;

/// Largest `.eh_frame` or `.debug_frame` accepted: 128 MiB. The largest we know of
/// (browsers, LLVM) carry 20–40 MiB of `.eh_frame`; anything beyond is damage or abuse.
pub(crate) const MAX_SECTION_BYTES: u64 = 128 << 20;

/// Most rows in one table: 8 Mi rows = 128 MiB. Measured: librustc_driver (93 MiB of text)
/// compiles to 1.15 Mi rows, libLLVM 22 (63 MiB) to 1.29 Mi, so this leaves 4x headroom.
pub const MAX_ROWS: usize = 8 << 20;

/// Bytes one row takes, in memory, on disk and in a BPF map.
pub(crate) const ROW_BYTES: usize = std::mem::size_of::<UnwindRow>();

/// Why a table could not be built.
#[derive(Debug, thiserror::Error)]
pub enum UnwindError {
    /// The file could not be opened or read.
    #[error("cannot open {path}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not an ELF file `object` can parse.
    #[error("not a readable ELF file: {0}")]
    Elf(#[from] object::Error),
    #[error("unwind tables are built for x86_64 only, this file is {arch}")]
    /// The file is for another architecture.
    Arch {
        /// Its architecture, as `object` names it.
        arch: String,
    },
    #[error("section {name} is {size} bytes, more than the {cap}-byte cap")]
    /// A CFI section is larger than the bound on input.
    SectionTooLarge {
        /// `.eh_frame` or `.debug_frame`.
        name: &'static str,
        /// Its size in bytes.
        size: u64,
        /// The bound in bytes.
        cap: u64,
    },
    #[error("more than {cap} unwind rows")]
    /// The table would exceed the bound on rows.
    TooManyRows {
        /// The bound.
        cap: usize,
    },
}

/// What a compiled table holds and costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Rows in the table (including marked and gap rows).
    pub rows: u64,
    /// FDEs compiled.
    pub fdes: u64,
    /// FDEs or entry lists skipped as malformed.
    pub skipped: u64,
    /// Rows of kind [`unwind_kind::UNSUPPORTED`].
    pub unsupported_rows: u64,
    /// Rows of kind [`unwind_kind::PLT`].
    pub plt_rows: u64,
    /// Bytes of executable sections in the file, to report memory per text size.
    pub text_bytes: u64,
}

impl TableStats {
    /// Memory the rows take (heap, cache file and BPF map alike, less headers).
    pub fn bytes(&self) -> u64 {
        self.rows * ROW_BYTES as u64
    }
}

/// The compiled table of one file: rows sorted by `pc`, no two consecutive rows equal but
/// for their `pc`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnwindTable {
    /// The rows, sorted by `pc`.
    pub rows: Vec<UnwindRow>,
    /// What the table holds and costs.
    pub stats: TableStats,
}

impl UnwindTable {
    /// The row covering `pc` (an ELF virtual address), or `None` where no FDE covers it.
    pub fn find(&self, pc: u64) -> Option<&UnwindRow> {
        let i = self.rows.partition_point(|r| r.pc <= pc).checked_sub(1)?;
        let row = self.rows.get(i)?;
        (row.kind != unwind_kind::NO_INFO).then_some(row)
    }
}
