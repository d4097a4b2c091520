//! Tables laid out the way the sampler will read them: every file's rows in one shared,
//! bounded row arena (a file loaded by many processes is stored once), and per process a
//! short list of executable mappings, each pointing at its file's slice of the arena with
//! the bias that turns a runtime PC into the file's virtual address.

use std::collections::HashMap;

use super::compile::{Segment, load_segments};
use super::{UnwindCache, UnwindRow};

/// Most executable mappings kept per process: the walker scans them linearly, and the
/// verifier bounds that loop. Programs beyond it (hundreds of shared objects) keep their
/// first ones; PCs in the others fall back to frame pointers.
const MAX_MAPPINGS: usize = energy_bpf_abi::UNWIND_MAPPINGS;

/// Why a process's table could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// `/proc/PID/maps` could not be read (the process may have exited).
    #[error("cannot read the mappings of process {tgid}")]
    Maps {
        /// The process.
        tgid: u32,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// One executable mapping: PCs in `[start, end)` use rows
/// `arena[row_start..row_start + row_count]`, looked up at `pc - bias`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappingEntry {
    /// First runtime address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Runtime address minus ELF virtual address (wrapping).
    pub bias: u64,
    /// Index of the file's first row in the arena.
    pub row_start: u32,
    /// Rows of the file.
    pub row_count: u32,
}

/// The shared row arena, bounded by `capacity` rows (the BPF array's size).
///
/// It holds the rows added since the last [`RowArena::take_new`]; the sampler's loader takes
/// them into the BPF array and keeps only the index, so rows live once, in the kernel.
#[derive(Debug)]
pub struct RowArena {
    /// Index of `rows[0]` in the arena.
    base: usize,
    rows: Vec<UnwindRow>,
    /// Slice of each file already stored, by build-id (or path when it has none).
    files: HashMap<Vec<u8>, (u32, u32)>,
    capacity: usize,
    /// Files that did not fit.
    pub full: u64,
    /// Files larger than the whole arena: never loaded again.
    too_big: std::collections::HashSet<Vec<u8>>,
    /// The `PT_LOAD` segments of files with a build-id, by the same key as `files`: a new
    /// process of a known program maps the same files, which are then not opened again.
    segments: HashMap<Vec<u8>, Vec<Segment>>,
}

/// Files whose segments [`RowArena`] keeps; past this it starts over.
const MAX_SEGMENT_FILES: usize = 4096;

impl RowArena {
    /// An empty arena of at most `capacity` rows.
    pub fn new(capacity: usize) -> Self {
        Self {
            base: 0,
            rows: Vec::new(),
            files: HashMap::new(),
            capacity,
            full: 0,
            too_big: std::collections::HashSet::new(),
            segments: HashMap::new(),
        }
    }

    /// The rows added since the last [`RowArena::take_new`] (all of them if never taken).
    #[cfg(test)]
    pub fn rows(&self) -> &[UnwindRow] {
        &self.rows
    }

    /// Rows in the arena, taken or not.
    pub fn len(&self) -> usize {
        self.base + self.rows.len()
    }

    /// Rows the arena can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Files stored.
    pub fn files(&self) -> usize {
        self.files.len()
    }

    /// Files whose segments are kept.
    #[cfg(test)]
    pub fn kept_segments(&self) -> usize {
        self.segments.len()
    }

    /// The rows added since the last call and the arena index of the first: the caller
    /// stores them elsewhere, and the arena keeps only the index.
    pub fn take_new(&mut self) -> (usize, Vec<UnwindRow>) {
        let start = self.base;
        self.base += self.rows.len();
        (start, std::mem::take(&mut self.rows))
    }

    /// Forgets every file and row (the caller rebuilds what is still in use).
    pub fn clear(&mut self) {
        self.base = 0;
        self.rows.clear();
        self.files.clear();
    }

    /// The rows of `entry`, empty when they are out of range or already taken.
    #[cfg(test)]
    pub fn slice(&self, entry: &MappingEntry) -> &[UnwindRow] {
        let Some(start) = (entry.row_start as usize).checked_sub(self.base) else {
            return &[];
        };
        self.rows
            .get(start..start + entry.row_count as usize)
            .unwrap_or_default()
    }

    /// The slice of a file already stored.
    pub fn get(&self, key: &[u8]) -> Option<(u32, u32)> {
        self.files.get(key).copied()
    }

    /// Whether a file was found larger than the whole arena (so it is not read again).
    pub fn is_too_big(&self, key: &[u8]) -> bool {
        self.too_big.contains(key)
    }

    /// Remembers a file larger than the whole arena.
    fn mark_too_big(&mut self, key: &[u8]) {
        // Bounded: a machine with this many huge files gets them looked at again.
        if self.too_big.len() >= 4096 {
            self.too_big.clear();
        }
        self.too_big.insert(key.to_vec());
    }

    /// [`RowArena::insert`] taking the rows by value: when nothing is pending they are
    /// kept as they are rather than copied (a large file's table then lives once in memory).
    pub fn insert_owned(&mut self, key: &[u8], rows: Vec<UnwindRow>) -> Option<(u32, u32)> {
        if let Some(&slice) = self.files.get(key) {
            return Some(slice);
        }
        let slice = self.place(key, rows.len())?;
        if self.rows.is_empty() {
            self.rows = rows;
        } else {
            self.rows.extend_from_slice(&rows);
        }
        Some(slice)
    }

    /// Stores a file's rows once; `None` when the arena has no room left.
    pub fn insert(&mut self, key: &[u8], rows: &[UnwindRow]) -> Option<(u32, u32)> {
        if let Some(&slice) = self.files.get(key) {
            return Some(slice);
        }
        let slice = self.place(key, rows.len())?;
        self.rows.extend_from_slice(rows);
        Some(slice)
    }

    /// Reserves `n` rows for a new file at the arena's end.
    fn place(&mut self, key: &[u8], n: usize) -> Option<(u32, u32)> {
        if n > self.capacity {
            self.mark_too_big(key);
            return None;
        }
        if self.len() + n > self.capacity {
            self.full += 1;
            return None;
        }
        let slice = (u32::try_from(self.len()).ok()?, u32::try_from(n).ok()?);
        self.files.insert(key.to_vec(), slice);
        Some(slice)
    }
}

/// The bias of an executable mapping of `file_offset` at `start`: from the executable
/// segment holding that offset. Mappings start on a page, segments need not (`p_offset`
/// 0x64e880 is mapped from file offset 0x64e000), and the page before an executable
/// segment's start usually also belongs to the read-only segment before it, so only
/// executable segments are considered, from their page-aligned start.
pub fn mapping_bias(segments: &[Segment], start: u64, file_offset: u64) -> Option<u64> {
    const PAGE: u64 = 4096;
    let seg = segments.iter().filter(|s| s.executable).find(|s| {
        file_offset >= s.file_offset & !(PAGE - 1)
            && file_offset < s.file_offset.saturating_add(s.file_size)
    })?;
    // vaddr and file offset are congruent modulo the page size, so the segment's own
    // vaddr - offset holds for the whole mapping.
    Some(
        start.wrapping_sub(
            seg.vaddr
                .wrapping_sub(seg.file_offset)
                .wrapping_add(file_offset),
        ),
    )
}

/// Mapping entries for process `tgid`, sorted by start, with their files' rows added to
/// `arena` (compiled or read from `cache`). Files that fail to parse are skipped: their
/// PCs fall back to frame pointers.
pub fn process_entries(
    tgid: u32,
    cache: &UnwindCache,
    arena: &mut RowArena,
) -> Result<Vec<MappingEntry>, ProcessError> {
    // Read once: the file mappings and the vDSO's both come from it.
    let text = std::fs::read_to_string(format!("/proc/{tgid}/maps"))
        .map_err(|source| ProcessError::Maps { tgid, source })?;
    let maps = crate::procmaps::mappings_of(tgid, 0, &text);
    let mut out = Vec::new();
    for m in &maps {
        if out.len() == MAX_MAPPINGS {
            break;
        }
        // The path as the process sees it: through its root, for containers.
        let path = std::path::PathBuf::from(format!("/proc/{tgid}/root{}", m.path));
        // Build-id and path together: two copies of one file at different paths are then
        // stored twice, but a file without a build-id never merges with another.
        let mut key = m.build_id.clone();
        key.extend_from_slice(m.path.as_bytes());
        let known = arena.segments.get(&key).filter(|_| !m.build_id.is_empty());
        let bias = match known {
            Some(segments) => mapping_bias(segments, m.start, m.file_offset),
            None => {
                let Ok(segments) = load_segments(&path) else {
                    continue;
                };
                let bias = mapping_bias(&segments, m.start, m.file_offset);
                if !m.build_id.is_empty() {
                    if arena.segments.len() >= MAX_SEGMENT_FILES {
                        arena.segments.clear();
                    }
                    arena.segments.insert(key.clone(), segments);
                }
                bias
            }
        };
        let Some(bias) = bias else {
            continue;
        };
        let slice = match arena.get(&key) {
            Some(slice) => Some(slice),
            None if arena.is_too_big(&key) => None,
            None => match cache.table_at_most(&path, arena.capacity()) {
                Ok(Some((table, _))) => arena.insert_owned(&key, table.rows),
                Ok(None) => {
                    arena.mark_too_big(&key);
                    None
                }
                Err(_) => None,
            },
        };
        let Some((row_start, row_count)) = slice else {
            continue;
        };
        out.push(MappingEntry {
            start: m.start,
            end: m.end,
            bias,
            row_start,
            row_count,
        });
    }
    if out.len() < MAX_MAPPINGS
        && let Some(entry) = vdso_entry(&text, arena)
    {
        out.push(entry);
    }
    out.sort_by_key(|e| e.start);
    Ok(out)
}

/// The entry of the process's vDSO (`clock_gettime` and friends, hot in many programs): the
/// kernel maps the same image into every process, so its table is compiled once from ours.
fn vdso_entry(maps: &str, arena: &mut RowArena) -> Option<MappingEntry> {
    let (start, end) = vdso_range(maps)?;
    let vdso = own_vdso()?;
    let (row_start, row_count) = arena.insert(b"[vdso]", &vdso.0.rows)?;
    Some(MappingEntry {
        start,
        end,
        bias: start.wrapping_sub(vdso.1),
        row_start,
        row_count,
    })
}

/// The `[vdso]` line of a maps file.
fn vdso_range(maps: &str) -> Option<(u64, u64)> {
    let line = maps.lines().find(|l| l.trim_end().ends_with("[vdso]"))?;
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    Some((
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    ))
}

/// Our own vDSO's table and the virtual address its image is linked at (its first load
/// segment's address less that segment's file offset), read once.
fn own_vdso() -> Option<&'static (super::UnwindTable, u64)> {
    static VDSO: std::sync::OnceLock<Option<(super::UnwindTable, u64)>> =
        std::sync::OnceLock::new();
    VDSO.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let (start, end) = vdso_range(&maps)?;
        // SAFETY: getauxval has no preconditions.
        let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) };
        if base != start || end <= start || end - start > 1 << 20 {
            return None;
        }
        // SAFETY: [start, end) is our own vDSO mapping, readable for the whole life of the
        // process, and checked above to be where the auxiliary vector says it is.
        let image =
            unsafe { std::slice::from_raw_parts(start as *const u8, (end - start) as usize) };
        let table = super::compile_elf(image).ok()?;
        use object::{Object as _, ObjectSegment as _};
        let file = object::File::parse(image).ok()?;
        let linked = file
            .segments()
            .next()
            .map(|s| s.address().wrapping_sub(s.file_range().0))?;
        Some((table, linked))
    })
    .as_ref()
}

/// The row for `pc` (a file virtual address) in one file's sorted rows; `None` for gaps.
#[cfg(test)]
pub fn find_row(rows: &[UnwindRow], pc: u64) -> Option<&UnwindRow> {
    let i = rows.partition_point(|r| r.pc <= pc).checked_sub(1)?;
    rows.get(i)
        .filter(|r| r.kind != super::unwind_kind::NO_INFO)
}
