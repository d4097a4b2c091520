//! Symbolization: raw stack addresses to function, file, line and inlined frames.
//!
//! User addresses are normalised with the recording's mappings (docs/ARCHITECTURE.md, "Capture"): file offset =
//! addr - start + file_offset, then the file is symbolized by path at that offset with
//! blazesym (ELF symbols + DWARF) — so reports work after the process exited. The file's
//! build-id must still match the recorded one; otherwise names would be wrong, so the frame
//! falls back to `module+0xOFFSET`. Kernel addresses resolve through kallsyms. Results are
//! cached per (file, offset) and per kernel address; a profile fills the caches up front,
//! a file at a time over threads (`batch`). Several symbolizers (one per recording of a
//! diff) can fill theirs together, each distinct file offset resolved once for all. A
//! recording that stores its names (`stored`) fills the caches from them first, so only
//! addresses it does not cover are resolved. A frame never comes out as a bare address or
//! an error.

mod batch;
mod frame;
pub mod perf_map;
mod stored;

pub use crate::procmaps::{mappings_of, process_mappings, read_build_id};
pub(crate) use batch::prefetch_together;
pub use frame::{Frame, FrameKind, JIT_MODULE, JitRuntime, PYTHON_MODULE};
pub use stored::{Collector, MAX_COLLECTED, Stored, store};

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blazesym::MaybeDefault;
use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Symbolized};

use crate::pb::v1::Mapping;

/// Hash map with a fast non-cryptographic hasher: keys are file paths and addresses.
type FastMap<K, V> = foldhash::HashMap<K, V>;

/// Counts of how symbolization went, for reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SymbolizeStats {
    /// Unique addresses resolved to a symbol.
    pub resolved: u64,
    /// Unique addresses left as `module+0xOFFSET` or `[kernel]+0xADDR`.
    pub unresolved: u64,
    /// Files whose build-id no longer matches the recording (rebuilt or replaced).
    pub build_id_mismatches: u64,
    /// Addresses named from the names the recording stored ([`Symbolizer::use_stored`]).
    pub stored: u64,
}

/// Symbolizes user and kernel addresses, with caches; one per report.
pub struct Symbolizer {
    inner: blazesym::symbolize::Symbolizer,
    /// kallsyms file to use; `None` disables kernel symbols.
    kallsyms: Option<PathBuf>,
    /// Whether each file on disk still has the recorded build-id, per (path, recorded id).
    build_id_ok: HashMap<(String, Vec<u8>), bool>,
    /// Frames per file path and file offset, leaf first.
    user_cache: FastMap<String, FastMap<u64, Vec<Frame>>>,
    kernel_cache: FastMap<u64, Vec<Frame>>,
    /// Names the recording stored, consulted before resolving anything.
    stored: stored::Index,
    stats: SymbolizeStats,
    /// The frames of the last address in no mapping (not cached: processes differ).
    scratch: Vec<Frame>,
}

impl Default for Symbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Symbolizer {
    /// A symbolizer using the running kernel's `/proc/kallsyms`.
    pub fn new() -> Self {
        Self::with_kallsyms(Some(PathBuf::from("/proc/kallsyms")))
    }

    /// A symbolizer using the given kallsyms file (`None`: kernel frames stay unresolved).
    pub fn with_kallsyms(kallsyms: Option<PathBuf>) -> Self {
        Self {
            inner: blazesym_symbolizer(),
            kallsyms,
            build_id_ok: HashMap::new(),
            user_cache: FastMap::default(),
            kernel_cache: FastMap::default(),
            stored: stored::Index::default(),
            stats: SymbolizeStats::default(),
            scratch: Vec::new(),
        }
    }

    /// How symbolization went so far.
    pub fn stats(&self) -> SymbolizeStats {
        self.stats
    }

    /// Frames (leaf first, inlined callees before their caller) of user address `addr`,
    /// given the mappings recorded for its process.
    pub fn user(&mut self, addr: u64, mappings: &[Mapping]) -> Vec<Frame> {
        self.user_frames(addr, mappings).to_vec()
    }

    /// [`Symbolizer::user`] without a copy: the frames as cached.
    pub(crate) fn user_frames(&mut self, addr: u64, mappings: &[Mapping]) -> &[Frame] {
        let Some(m) = mapping_of(addr, mappings).map(|i| &mappings[i]) else {
            self.stats.unresolved += 1;
            self.scratch = vec![Frame::unresolved("[unknown]", addr, FrameKind::Native)];
            return &self.scratch;
        };
        let offset = addr - m.start + m.file_offset;
        let cached = self
            .user_cache
            .get(&m.path)
            .is_some_and(|c| c.contains_key(&offset));
        if !cached {
            let frames = match self.stored.user(&m.path, offset) {
                Some(frames) => {
                    self.stats.stored += 1;
                    frames
                }
                None => self.resolve_user(m, offset),
            };
            let cache = match self.user_cache.get_mut(&m.path) {
                Some(cache) => cache,
                None => self.user_cache.entry(m.path.clone()).or_default(),
            };
            cache.insert(offset, frames);
        }
        self.user_cache
            .get(&m.path)
            .and_then(|c| c.get(&offset))
            .map_or(&[], Vec::as_slice)
    }

    /// [`Symbolizer::user_frames`] for a caller that keeps what it is given and asks once
    /// per address (a profile's interner): names the recording stored are handed over
    /// rather than cached as well (each such hand-over counts in
    /// [`SymbolizeStats::stored`]); anything else comes from the cache as there.
    pub(crate) fn user_frames_once(
        &mut self,
        addr: u64,
        mappings: &[Mapping],
    ) -> std::borrow::Cow<'_, [Frame]> {
        if let Some(m) = mapping_of(addr, mappings).map(|i| &mappings[i]) {
            let offset = addr - m.start + m.file_offset;
            let cached = self
                .user_cache
                .get(&m.path)
                .is_some_and(|c| c.contains_key(&offset));
            if !cached && let Some(frames) = self.stored.user(&m.path, offset) {
                self.stats.stored += 1;
                return frames.into();
            }
        }
        self.user_frames(addr, mappings).into()
    }

    /// [`Symbolizer::user_frames_once`] for kernel address `addr`.
    pub(crate) fn kernel_frames_once(&mut self, addr: u64) -> std::borrow::Cow<'_, [Frame]> {
        if !self.kernel_cache.contains_key(&addr)
            && let Some(frames) = self.stored.kernel(addr)
        {
            self.stats.stored += 1;
            return frames.into();
        }
        self.kernel_frames(addr).into()
    }

    /// Frames of kernel address `addr`.
    pub fn kernel(&mut self, addr: u64) -> Vec<Frame> {
        self.kernel_frames(addr).to_vec()
    }

    /// [`Symbolizer::kernel`] without a copy: the frames as cached.
    pub(crate) fn kernel_frames(&mut self, addr: u64) -> &[Frame] {
        if !self.kernel_cache.contains_key(&addr) {
            let frames = match self.stored.kernel(addr) {
                Some(frames) => {
                    self.stats.stored += 1;
                    frames
                }
                None => self.resolve_kernel(addr),
            };
            self.kernel_cache.insert(addr, frames);
        }
        self.kernel_cache.get(&addr).map_or(&[], Vec::as_slice)
    }

    fn build_id_matches(&mut self, m: &Mapping) -> bool {
        if m.build_id.is_empty() {
            // Nothing recorded to compare with: trust the path.
            return true;
        }
        let key = (m.path.clone(), m.build_id.clone());
        if let Some(ok) = self.build_id_ok.get(&key) {
            return *ok;
        }
        let ok = read_build_id(Path::new(&m.path)) == m.build_id;
        if !ok {
            self.stats.build_id_mismatches += 1;
        }
        self.build_id_ok.insert(key, ok);
        ok
    }

    fn resolve_user(&mut self, m: &Mapping, offset: u64) -> Vec<Frame> {
        let module = m.path.as_str();
        if !self.build_id_matches(m) {
            self.stats.unresolved += 1;
            return vec![Frame::unresolved(module, offset, FrameKind::Native)];
        }
        let src = Source::Elf(Elf::new(&m.path));
        let resolved = self
            .inner
            .symbolize(&src, Input::FileOffset(&[offset]))
            .ok()
            .and_then(|mut v| v.pop());
        match resolved {
            Some(Symbolized::Sym(sym)) => {
                self.stats.resolved += 1;
                frames_of(&sym, module, FrameKind::Native)
            }
            _ => {
                self.stats.unresolved += 1;
                vec![Frame::unresolved(module, offset, FrameKind::Native)]
            }
        }
    }

    fn resolve_kernel(&mut self, addr: u64) -> Vec<Frame> {
        let resolved = self.kallsyms.as_ref().and_then(|path| {
            let src = kernel_source(path);
            self.inner
                .symbolize(&src, Input::AbsAddr(&[addr]))
                .ok()
                .and_then(|mut v| v.pop())
        });
        match resolved {
            Some(Symbolized::Sym(sym)) => {
                self.stats.resolved += 1;
                frames_of(&sym, "[kernel]", FrameKind::Kernel)
            }
            _ => {
                self.stats.unresolved += 1;
                vec![Frame::unresolved("[kernel]", addr, FrameKind::Kernel)]
            }
        }
    }
}

/// A blazesym symbolizer set up as every lookup here wants it.
fn blazesym_symbolizer() -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        // Files are not expected to change during one report; skip a stat per lookup.
        .enable_auto_reload(false)
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .build()
}

/// The kernel as a blazesym source: symbols from the kallsyms file at `path`.
fn kernel_source(path: &Path) -> Source<'static> {
    Source::Kernel(Kernel {
        kallsyms: MaybeDefault::Some(path.to_path_buf()),
        // vmlinux discovery scans the disk; kallsyms has what a profile needs.
        vmlinux: MaybeDefault::None,
        debug_syms: false,
        ..Kernel::default()
    })
}

/// The address to look up for frame `depth` of a stack: a caller's return address points
/// past its call, so callers (depth > 0) look up the byte before it.
pub(crate) fn caller_adjusted(addr: u64, depth: usize) -> u64 {
    if depth == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

/// Index of the recorded mapping that holds user address `addr`: the latest recorded one
/// wins (a later exec replaces earlier ones).
pub(crate) fn mapping_of(addr: u64, mappings: &[Mapping]) -> Option<usize> {
    mappings
        .iter()
        .rposition(|m| m.start <= addr && addr < m.end)
}

/// Leaf-first frames of one blazesym symbol: innermost inlined function first.
fn frames_of(sym: &blazesym::symbolize::Sym<'_>, module: &str, kind: FrameKind) -> Vec<Frame> {
    let code = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| match info {
        Some(ci) => (Some(ci.to_path().to_string_lossy().into_owned()), ci.line),
        None => (None, None),
    };
    let mut frames = Vec::with_capacity(1 + sym.inlined.len());
    for inl in sym.inlined.iter().rev() {
        let (file, line) = code(inl.code_info.as_ref());
        frames.push(Frame {
            function: inl.name.to_string(),
            file,
            line,
            module: module.to_string(),
            inlined: true,
            kind,
        });
    }
    let (file, line) = code(sym.code_info.as_deref());
    frames.push(Frame {
        function: sym.name.to_string(),
        file,
        line,
        module: module.to_string(),
        inlined: false,
        kind,
    });
    frames
}

#[cfg(test)]
mod tests;
