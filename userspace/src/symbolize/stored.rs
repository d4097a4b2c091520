//! Names stored in the recording (`SymbolTable` records, [`crate::record::symbols`]).
//!
//! The recorder gathers every address its samples hit as it writes them ([`Collector`]),
//! and when it finishes resolves them once, through the same [`Symbolizer`] path a report
//! takes, and writes what its caches then hold ([`Collector::tables`]). A report's
//! symbolizer starts from those names ([`Symbolizer::use_stored`]): the addresses they
//! cover are cache hits (no ELF or DWARF parsing, and names that outlive the binaries), and
//! any other address is resolved live as before.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::{Frame, FrameKind, Symbolizer, caller_adjusted};
use crate::pb::v1::{Chunk, Mapping, SymbolAddress, SymbolFile, SymbolFrame, SymbolTable};
use crate::record::symbols::{
    MAX_ADDRESSES, MAX_FILES, MAX_FRAMES, MAX_STRING_LEN, MAX_STRINGS, MAX_TABLE_FRAMES,
};

/// Module name of kernel frames.
const KERNEL_MODULE: &str = "[kernel]";

/// String bytes one table holds at most, so every record stays far below the format's
/// record size limit.
const MAX_TABLE_STRING_BYTES: usize = 64 << 20;

/// Most distinct addresses a [`Collector`] keeps (user and kernel together, some 64 MiB
/// of sets at most): names are resolved once per address at the end, so this bounds the
/// recorder's memory and its time at the end. Addresses first seen past it are left to
/// reports, which resolve them live.
pub const MAX_COLLECTED: usize = 1 << 21;

/// The addresses a recording's samples hit, gathered chunk by chunk as they are written,
/// with the mappings that place them.
#[derive(Default)]
pub struct Collector {
    mappings: HashMap<u32, Vec<Mapping>>,
    user: foldhash::HashSet<(u32, u64)>,
    kernel: foldhash::HashSet<u64>,
    /// New addresses not kept, past [`MAX_COLLECTED`].
    skipped: u64,
}

impl Collector {
    /// Takes note of `chunk`'s mappings and of every address of its samples, as a profile
    /// looks them up (a caller's return address less 1).
    pub fn add(&mut self, chunk: &Chunk) {
        for m in &chunk.mappings {
            self.mappings.entry(m.tgid).or_default().push(m.clone());
        }
        for s in &chunk.samples {
            for (depth, &addr) in s.kernel_stack.iter().enumerate() {
                let addr = caller_adjusted(addr, depth);
                if self.has_room() {
                    self.kernel.insert(addr);
                } else if !self.kernel.contains(&addr) {
                    self.skipped += 1;
                }
            }
            for (depth, &addr) in s.user_stack.iter().enumerate() {
                let key = (s.tgid, caller_adjusted(addr, depth));
                if self.has_room() {
                    self.user.insert(key);
                } else if !self.user.contains(&key) {
                    self.skipped += 1;
                }
            }
        }
    }

    fn has_room(&self) -> bool {
        self.user.len() + self.kernel.len() < MAX_COLLECTED
    }

    /// Addresses seen but not kept, past [`super::MAX_COLLECTED`] (counted once per sighting).
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Distinct addresses gathered: user (per process) and kernel.
    pub fn len(&self) -> (usize, usize) {
        (self.user.len(), self.kernel.len())
    }

    /// Whether no address was gathered.
    pub fn is_empty(&self) -> bool {
        self.user.is_empty() && self.kernel.is_empty()
    }

    /// Resolves every gathered address with `symbolizer` (as a report of the recording
    /// would on this machine now) and returns the names as tables to store, each within
    /// the bounds a reader enforces.
    pub fn tables(&self, symbolizer: &mut Symbolizer) -> Vec<SymbolTable> {
        let no_mappings: &[Mapping] = &[];
        // In a fixed order: where a file was mapped with two build-ids, the first mapping
        // seen decides, as in a report.
        let mut sorted: Vec<(u32, u64)> = self.user.iter().copied().collect();
        sorted.sort_unstable();
        let user = sorted.into_iter().map(|(tgid, addr)| {
            let maps = self.mappings.get(&tgid).map_or(no_mappings, Vec::as_slice);
            (addr, maps)
        });
        symbolizer.prefetch(user, self.kernel.iter().copied());
        // The build-id each file's offsets were resolved through (the first mapping seen).
        let mut build_ids: HashMap<&str, &[u8]> = HashMap::new();
        for m in self.mappings.values().flatten() {
            build_ids.entry(m.path.as_str()).or_insert(&m.build_id);
        }
        let mut out = Tables::default();
        let files: BTreeMap<&String, &foldhash::HashMap<u64, Vec<Frame>>> =
            symbolizer.user_cache.iter().collect();
        for (path, offsets) in files {
            let build_id = build_ids.get(path.as_str()).copied().unwrap_or_default();
            let offsets: BTreeMap<&u64, &Vec<Frame>> = offsets.iter().collect();
            for (&offset, frames) in offsets {
                let unresolved = Frame::unresolved(path, offset, FrameKind::Native);
                out.add(Some((path, build_id)), offset, frames, &unresolved);
            }
        }
        let kernel: BTreeMap<&u64, &Vec<Frame>> = symbolizer.kernel_cache.iter().collect();
        for (&addr, frames) in kernel {
            let unresolved = Frame::unresolved(KERNEL_MODULE, addr, FrameKind::Kernel);
            out.add(None, addr, frames, &unresolved);
        }
        out.finish()
    }
}

/// Tables being filled, a new one started whenever the next entry would take the current
/// one past a bound.
#[derive(Default)]
struct Tables {
    done: Vec<SymbolTable>,
    table: SymbolTable,
    strings: HashMap<String, u32>,
    string_bytes: usize,
    addresses: usize,
    frames: usize,
}

impl Tables {
    /// Adds what `address` (a file offset in `file`, or a kernel address when `None`)
    /// resolved to. An address whose names would break a bound is left out: a report
    /// resolves it live.
    fn add(
        &mut self,
        file: Option<(&str, &[u8])>,
        address: u64,
        frames: &[Frame],
        unresolved: &Frame,
    ) {
        let unresolved = frames.len() == 1 && frames[0] == *unresolved;
        let frames = if unresolved { &[][..] } else { frames };
        let module = file.map_or(KERNEL_MODULE, |(path, _)| path);
        let kind = if file.is_some() {
            FrameKind::Native
        } else {
            FrameKind::Kernel
        };
        let storable = frames.len() <= MAX_FRAMES
            && frames.iter().all(|f| {
                f.module == module
                    && f.kind == kind
                    && f.function.len() <= MAX_STRING_LEN
                    && f.file.as_ref().is_none_or(|s| s.len() <= MAX_STRING_LEN)
            })
            && module.len() <= MAX_STRING_LEN;
        if !storable {
            return;
        }
        let new_bytes: usize = frames
            .iter()
            .map(|f| f.function.len() + f.file.as_ref().map_or(0, String::len))
            .sum::<usize>()
            + module.len();
        if self.strings.len() + 2 * frames.len() > MAX_STRINGS
            || self.addresses >= MAX_ADDRESSES
            || self.frames + frames.len() > MAX_TABLE_FRAMES
            || self.table.files.len() >= MAX_FILES
            || self.string_bytes + new_bytes > MAX_TABLE_STRING_BYTES
        {
            self.next_table();
        }
        let frames = frames
            .iter()
            .map(|f| SymbolFrame {
                function: self.intern(&f.function),
                file: f.file.as_deref().map(|s| self.intern(s)),
                line: f.line,
                inlined: f.inlined,
            })
            .collect::<Vec<_>>();
        self.addresses += 1;
        self.frames += frames.len();
        let entry = SymbolAddress { address, frames };
        match file {
            None => self.table.kernel.push(entry),
            Some((path, build_id)) => {
                let same = self.table.files.last().is_some_and(|f| f.path == path);
                if !same {
                    self.string_bytes += path.len();
                    self.table.files.push(SymbolFile {
                        path: path.to_string(),
                        build_id: build_id.to_vec(),
                        addresses: Vec::new(),
                    });
                }
                if let Some(f) = self.table.files.last_mut() {
                    f.addresses.push(entry);
                }
            }
        }
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.table.strings.len() as u32;
        self.table.strings.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        self.string_bytes += s.len();
        i
    }

    fn next_table(&mut self) {
        let table = std::mem::take(&mut self.table);
        if !table.files.is_empty() || !table.kernel.is_empty() {
            self.done.push(table);
        }
        self.strings.clear();
        self.string_bytes = 0;
        self.addresses = 0;
        self.frames = 0;
    }

    fn finish(mut self) -> Vec<SymbolTable> {
        self.next_table();
        self.done
    }
}

impl Symbolizer {
    /// Starts from the names a recording stored (`tables`, checked when read): each
    /// address they cover is named from them when first looked up, never resolved again,
    /// and counted in [`super::SymbolizeStats::stored`]. Only an index is built here; the
    /// frames are made for the addresses looked up. The first entry for an address wins.
    pub fn use_stored(&mut self, tables: &Arc<Vec<SymbolTable>>) {
        self.stored = Index::new(tables);
    }
}

/// Where, in a recording's tables, each stored address's names are.
#[derive(Default)]
pub(super) struct Index {
    tables: Arc<Vec<SymbolTable>>,
    /// Per file path: file offset → (table, file, address) indices.
    user: foldhash::HashMap<String, foldhash::HashMap<u64, (u32, u32, u32)>>,
    /// Kernel address → (table, address) indices.
    kernel: foldhash::HashMap<u64, (u32, u32)>,
}

impl Index {
    fn new(tables: &Arc<Vec<SymbolTable>>) -> Self {
        let mut index = Self {
            tables: Arc::clone(tables),
            ..Self::default()
        };
        // Indices fit in u32: tables, files and addresses are bounded far below it.
        for (t, table) in tables.iter().enumerate() {
            for (f, file) in table.files.iter().enumerate() {
                let offsets = index.user.entry(file.path.clone()).or_default();
                for (a, address) in file.addresses.iter().enumerate() {
                    offsets
                        .entry(address.address)
                        .or_insert((t as u32, f as u32, a as u32));
                }
            }
            for (a, address) in table.kernel.iter().enumerate() {
                index
                    .kernel
                    .entry(address.address)
                    .or_insert((t as u32, a as u32));
            }
        }
        index
    }

    /// Whether file offset `offset` of `path` has stored names.
    pub(super) fn has_user(&self, path: &str, offset: u64) -> bool {
        self.user.get(path).is_some_and(|o| o.contains_key(&offset))
    }

    /// Whether kernel address `addr` has stored names.
    pub(super) fn has_kernel(&self, addr: u64) -> bool {
        self.kernel.contains_key(&addr)
    }

    /// The stored frames of file offset `offset` of `path`.
    pub(super) fn user(&self, path: &str, offset: u64) -> Option<Vec<Frame>> {
        let &(t, f, a) = self.user.get(path)?.get(&offset)?;
        let table = self.tables.get(t as usize)?;
        let address = table.files.get(f as usize)?.addresses.get(a as usize)?;
        Some(frames_of(table, address, path, FrameKind::Native))
    }

    /// The stored frames of kernel address `addr`.
    pub(super) fn kernel(&self, addr: u64) -> Option<Vec<Frame>> {
        let &(t, a) = self.kernel.get(&addr)?;
        let table = self.tables.get(t as usize)?;
        let address = table.kernel.get(a as usize)?;
        Some(frames_of(table, address, KERNEL_MODULE, FrameKind::Kernel))
    }
}

/// The frames of one stored address (an unresolved frame when it has none).
fn frames_of(table: &SymbolTable, a: &SymbolAddress, module: &str, kind: FrameKind) -> Vec<Frame> {
    if a.frames.is_empty() {
        return vec![Frame::unresolved(module, a.address, kind)];
    }
    let string = |i: u32| table.strings.get(i as usize).map_or("", String::as_str);
    a.frames
        .iter()
        .map(|f| Frame {
            function: string(f.function).to_string(),
            file: f.file.map(|i| string(i).to_string()),
            line: f.line,
            module: module.to_string(),
            inlined: f.inlined,
            kind,
        })
        .collect()
}

/// What [`store`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// Addresses whose names were written.
    pub addresses: u64,
    /// Records written.
    pub tables: usize,
    /// Sightings of addresses not gathered, past [`super::MAX_COLLECTED`]: reports resolve them
    /// live.
    pub skipped: u64,
}

/// Resolves what `collector` gathered on this machine now and appends the names to
/// `writer` (before its trailer).
pub fn store(
    collector: &Collector,
    writer: &mut crate::record::Writer,
) -> Result<Stored, crate::record::WriteError> {
    let mut stored = Stored {
        skipped: collector.skipped(),
        ..Stored::default()
    };
    if collector.is_empty() {
        return Ok(stored);
    }
    let tables = collector.tables(&mut Symbolizer::new());
    for table in tables {
        stored.addresses += table
            .files
            .iter()
            .map(|f| f.addresses.len() as u64)
            .sum::<u64>()
            + table.kernel.len() as u64;
        stored.tables += 1;
        writer.symbols(table)?;
    }
    Ok(stored)
}

#[cfg(test)]
#[path = "stored_tests.rs"]
mod tests;
