//! Naming a code object the sampler saw: its qualified name, file and line table, read from
//! the live process and checked against the sampler's checksum.

use energy_bpf_abi::py_checksum;

use super::PythonError;
use super::linetable::line_at;
use super::memory::Memory;
use super::offsets::Table;

/// What names one code object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// `co_qualname` (3.11+) or `co_name`.
    pub name: String,
    /// `co_filename`.
    pub file: String,
    /// `co_firstlineno`: the line the line table counts from.
    pub firstlineno: u32,
    /// The line table's bytes.
    pub lines: Vec<u8>,
}

impl CodeInfo {
    /// The line of the sampler's instruction offset (code units; bytes for 3.9).
    pub fn line(&self, table: &Table, offset: u32) -> Option<u32> {
        let offset = u64::from(offset);
        let at = match table.lines {
            // The 3.10 table counts bytes; its f_lasti counts code units.
            super::LineFormat::Linetable => offset * 2,
            _ => offset,
        };
        line_at(table.lines, &self.lines, self.firstlineno, at)
    }
}

/// Reads the code object at `code` and checks it is the one the sampler saw
/// ([`PythonError::Stale`] when the checksum differs: the address was reused).
pub fn read_code(
    mem: &Memory,
    table: &Table,
    code: u64,
    checksum: u32,
) -> Result<CodeInfo, PythonError> {
    let name_ptr = mem.u64(code + u64::from(table.walk.code_name))?;
    let file_ptr = mem.u64(code + u64::from(table.walk.code_name) - 8)?;
    let firstlineno = mem.u32(code + u64::from(table.walk.code_firstlineno))?;
    if py_checksum(name_ptr, file_ptr, firstlineno) != checksum {
        return Err(PythonError::Stale(code));
    }
    let name_obj = match table.code_qualname {
        Some(at) => mem.u64(code + u64::from(at))?,
        None => name_ptr,
    };
    let string = |obj| mem.string(obj, table.ascii_size, table.compact_size);
    let lines_obj = mem.u64(code + u64::from(table.code_lines))?;
    Ok(CodeInfo {
        name: string(name_obj)?,
        file: string(file_ptr)?,
        firstlineno,
        lines: mem.bytes(lines_obj)?,
    })
}
