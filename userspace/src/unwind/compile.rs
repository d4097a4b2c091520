//! ELF CFI sections to sorted [`UnwindRow`]s, with gimli doing the CFA program evaluation.

use std::ops::Range;
use std::path::Path;

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, EndianSlice, LittleEndian, ReaderOffset,
    RegisterRule, UnwindContext, UnwindSection, UnwindTableRow, X86_64,
};
use object::{
    Architecture, Object, ObjectSection, ObjectSegment, ReadCache, ReadRef, SectionFlags,
    SectionKind, SegmentFlags,
};

use super::{
    MAX_ROWS, MAX_SECTION_BYTES, TableStats, UnwindError, UnwindRow, UnwindTable, unwind_kind,
    unwind_reg,
};

type Slice<'d> = EndianSlice<'d, LittleEndian>;

/// Compiles the table of the ELF file at `path`. Only the headers and the CFI sections are
/// read, so a large binary costs its `.eh_frame`, not its size.
pub fn compile_file(path: &Path) -> Result<UnwindTable, UnwindError> {
    // A closure, not the fn item: the item is not generic over the file's lifetime.
    #[allow(clippy::redundant_closure)]
    with_file(path, |obj| compile_object(obj))
}

/// The GNU build-id of the file at `path` (empty when it has none) and its table, compiled
/// only when `want(build_id)` says so; the file is opened once.
pub(super) fn build_id_and_table(
    path: &Path,
    want: impl FnOnce(&[u8]) -> bool,
) -> Result<(Vec<u8>, Option<UnwindTable>), UnwindError> {
    with_file(path, |obj| {
        // object checks the note's name and type (`GNU`, NT_GNU_BUILD_ID); other notes such
        // as SystemTap probes are not a build-id.
        let id = obj.build_id().ok().flatten().unwrap_or_default().to_vec();
        let table = if want(&id) {
            Some(compile_object(obj)?)
        } else {
            None
        };
        Ok((id, table))
    })
}

fn with_file<T>(
    path: &Path,
    f: impl for<'d> FnOnce(&object::File<'d, &'d ReadCache<std::fs::File>>) -> Result<T, UnwindError>,
) -> Result<T, UnwindError> {
    let file = std::fs::File::open(path).map_err(|source| UnwindError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let cache = ReadCache::new(file);
    f(&object::File::parse(&cache)?)
}

/// Compiles the table of an ELF image held in memory.
pub fn compile_elf(data: &[u8]) -> Result<UnwindTable, UnwindError> {
    compile_object(&object::File::parse(data)?)
}

/// Compiles a bare `.eh_frame` section loaded at `address` (for fuzzing and tests).
pub fn compile_eh_frame(data: &[u8], address: u64) -> Result<UnwindTable, UnwindError> {
    let mut b = Builder::new(Vec::new());
    let bases = BaseAddresses::default().set_eh_frame(address);
    b.add(&EhFrame::new(data, LittleEndian), &bases, true)?;
    Ok(b.finish(0))
}

fn compile_object<'d, R: ReadRef<'d>>(
    obj: &object::File<'d, R>,
) -> Result<UnwindTable, UnwindError> {
    if obj.architecture() != Architecture::X86_64 {
        return Err(UnwindError::Arch {
            arch: format!("{:?}", obj.architecture()),
        });
    }
    let (mut text, mut got, mut text_bytes) = (0, 0, 0u64);
    let mut plt = Vec::new();
    for sec in obj.sections() {
        if sec.kind() == SectionKind::Text {
            text_bytes = text_bytes.saturating_add(sec.size());
        }
        match sec.name().unwrap_or_default() {
            ".text" => text = sec.address(),
            ".got" => got = sec.address(),
            // .plt, .plt.got, .plt.sec: their FDEs use a CFA expression we mark instead.
            n if n.starts_with(".plt") => {
                plt.push(sec.address()..sec.address().saturating_add(sec.size()))
            }
            _ => {}
        }
    }
    let mut b = Builder::new(plt);
    if let Some(sec) = obj.section_by_name(".eh_frame")
        && let Some(data) = cfi_data(&sec, ".eh_frame", &mut b.stats)?
    {
        let bases = BaseAddresses::default()
            .set_eh_frame(sec.address())
            .set_text(text)
            .set_got(got);
        b.add(&EhFrame::new(data, LittleEndian), &bases, true)?;
    }
    // .debug_frame only fills gaps: where both describe a function, .eh_frame wins.
    if let Some(sec) = obj.section_by_name(".debug_frame")
        && let Some(data) = cfi_data(&sec, ".debug_frame", &mut b.stats)?
    {
        let mut section = DebugFrame::new(data, LittleEndian);
        section.set_address_size(8);
        b.add(&section, &BaseAddresses::default(), false)?;
    }
    Ok(b.finish(text_bytes))
}

/// A CFI section's bytes, bounded; `None` (counted as skipped) where they are compressed,
/// which the compiler does not inflate.
fn cfi_data<'d, 'f, R: ReadRef<'d>>(
    sec: &object::Section<'d, 'f, R>,
    name: &'static str,
    stats: &mut TableStats,
) -> Result<Option<&'d [u8]>, UnwindError> {
    if sec.size() > MAX_SECTION_BYTES {
        return Err(UnwindError::SectionTooLarge {
            name,
            size: sec.size(),
            cap: MAX_SECTION_BYTES,
        });
    }
    let compressed = matches!(sec.flags(), SectionFlags::Elf { sh_flags }
        if sh_flags & u64::from(object::elf::SHF_COMPRESSED) != 0);
    if compressed {
        stats.skipped += 1;
        return Ok(None);
    }
    match sec.data() {
        Ok(data) => Ok(Some(data)),
        Err(_) => {
            stats.skipped += 1;
            Ok(None)
        }
    }
}

struct Builder {
    rows: Vec<UnwindRow>,
    /// `[start, end)` of every `.eh_frame` FDE, sorted once that section is done.
    primary: Vec<(u64, u64)>,
    plt: Vec<Range<u64>>,
    stats: TableStats,
}

impl Builder {
    fn new(plt: Vec<Range<u64>>) -> Self {
        Self {
            rows: Vec::new(),
            primary: Vec::new(),
            plt,
            stats: TableStats::default(),
        }
    }

    fn covered(&self, pc: u64) -> bool {
        let i = self.primary.partition_point(|&(s, _)| s <= pc);
        i > 0 && self.primary.get(i - 1).is_some_and(|&(_, e)| pc < e)
    }

    fn add<'d, S: UnwindSection<Slice<'d>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        primary: bool,
    ) -> Result<(), UnwindError> {
        // Boxed: the context holds the register-rule stacks (a few KiB).
        let mut ctx = Box::new(UnwindContext::new());
        let mut entries = section.entries(bases);
        loop {
            let partial = match entries.next() {
                Ok(Some(CieOrFde::Fde(partial))) => partial,
                Ok(Some(CieOrFde::Cie(_))) => continue,
                Ok(None) => break,
                // The entry list itself is broken: nothing after this point can be found.
                Err(_) => {
                    self.stats.skipped += 1;
                    break;
                }
            };
            let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
                self.stats.skipped += 1;
                continue;
            };
            let (start, end) = (fde.initial_address(), fde.end_address());
            if end <= start || (!primary && self.covered(start)) {
                continue;
            }
            let signal = fde.is_signal_trampoline();
            let in_plt = self.plt.iter().any(|r| r.contains(&start));
            let first = self.rows.len();
            let ok = match fde.rows(section, bases, &mut ctx) {
                Ok(mut table) => loop {
                    match table.next_row() {
                        Ok(Some(row)) => self.rows.push(compile_row(row, in_plt, signal)),
                        Ok(None) => break true,
                        Err(_) => break false,
                    }
                    if self.rows.len() > MAX_ROWS {
                        return Err(UnwindError::TooManyRows { cap: MAX_ROWS });
                    }
                },
                Err(_) => false,
            };
            if !ok {
                // Rows before the error would claim PCs up to `end` that the FDE never
                // described correctly; drop the whole FDE.
                self.rows.truncate(first);
                self.stats.skipped += 1;
                continue;
            }
            self.rows.push(gap(end));
            self.stats.fdes += 1;
            if primary {
                self.primary.push((start, end));
            }
        }
        if primary {
            self.primary.sort_unstable();
        }
        Ok(())
    }

    /// Sorts by PC, lets a real row win over a gap marker at the same PC, and merges rows
    /// that repeat their predecessor's rule.
    fn finish(mut self, text_bytes: u64) -> UnwindTable {
        self.rows
            .sort_by_key(|r| (r.pc, r.kind == unwind_kind::NO_INFO));
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(self.rows.len());
        // The PC of the row last looked at, kept or merged: the first row at a PC wins.
        let mut seen: Option<u64> = None;
        for r in self.rows {
            if seen.replace(r.pc) == Some(r.pc) {
                continue;
            }
            match rows.last() {
                Some(last) if same_rule(last, &r) => {}
                // A table never starts with a gap.
                None if r.kind == unwind_kind::NO_INFO => {}
                _ => rows.push(r),
            }
        }
        rows.shrink_to_fit();
        let mut stats = self.stats;
        stats.rows = rows.len() as u64;
        stats.text_bytes = text_bytes;
        stats.unsupported_rows = rows
            .iter()
            .filter(|r| r.kind == unwind_kind::UNSUPPORTED)
            .count() as u64;
        stats.plt_rows = rows.iter().filter(|r| r.kind == unwind_kind::PLT).count() as u64;
        UnwindTable { rows, stats }
    }
}

fn same_rule(a: &UnwindRow, b: &UnwindRow) -> bool {
    (a.cfa_offset, a.rbp_offset, a.cfa_reg, a.kind)
        == (b.cfa_offset, b.rbp_offset, b.cfa_reg, b.kind)
}

fn gap(pc: u64) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_offset: 0,
        rbp_offset: 0,
        cfa_reg: 0,
        kind: unwind_kind::NO_INFO,
    }
}

fn marked(pc: u64, kind: u8) -> UnwindRow {
    UnwindRow {
        pc,
        cfa_offset: 0,
        rbp_offset: 0,
        cfa_reg: 0,
        kind,
    }
}

fn compile_row<T: ReaderOffset>(row: &UnwindTableRow<T>, in_plt: bool, signal: bool) -> UnwindRow {
    let pc = row.start_address();
    if signal {
        // The trampoline's rules are expressions into the ucontext; the walker reads it.
        return marked(pc, unwind_kind::SIGNAL);
    }
    let (cfa_reg, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let reg = match *register {
                X86_64::RSP => unwind_reg::RSP,
                X86_64::RBP => unwind_reg::RBP,
                _ => return marked(pc, unwind_kind::UNSUPPORTED),
            };
            match i32::try_from(*offset) {
                Ok(off) => (reg, off),
                Err(_) => return marked(pc, unwind_kind::UNSUPPORTED),
            }
        }
        CfaRule::Expression(_) if in_plt => return marked(pc, unwind_kind::PLT),
        CfaRule::Expression(_) => return marked(pc, unwind_kind::UNSUPPORTED),
    };
    let kind = match row.register(X86_64::RA) {
        Some(RegisterRule::Offset(-8)) => unwind_kind::NORMAL,
        Some(RegisterRule::Undefined) => unwind_kind::END_OF_STACK,
        _ => return marked(pc, unwind_kind::UNSUPPORTED),
    };
    let rbp_offset = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue | RegisterRule::Undefined) => 0,
        Some(RegisterRule::Offset(off)) if off != 0 => match i16::try_from(off) {
            Ok(off) => off,
            Err(_) => return marked(pc, unwind_kind::UNSUPPORTED),
        },
        _ => return marked(pc, unwind_kind::UNSUPPORTED),
    };
    UnwindRow {
        pc,
        cfa_offset,
        rbp_offset,
        cfa_reg,
        kind,
    }
}

/// A loadable segment: where file bytes land in the file's virtual address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Offset of the segment's bytes in the file.
    pub file_offset: u64,
    /// Bytes of the file it maps.
    pub file_size: u64,
    /// ELF virtual address it is mapped at.
    pub vaddr: u64,
    /// `PF_X`: a mapping of this segment holds code.
    pub executable: bool,
}

/// The `PT_LOAD` segments of the ELF file at `path`, to turn a mapping's file offset into
/// the virtual addresses the rows use.
pub fn load_segments(path: &Path) -> Result<Vec<Segment>, UnwindError> {
    with_file(path, |obj| {
        Ok(obj
            .segments()
            .map(|s| {
                let (file_offset, file_size) = s.file_range();
                let executable = matches!(s.flags(), SegmentFlags::Elf { p_flags }
                    if p_flags & object::elf::PF_X != 0);
                Segment {
                    file_offset,
                    file_size,
                    vaddr: s.address(),
                    executable,
                }
            })
            .collect())
    })
}
