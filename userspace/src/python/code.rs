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

#[cfg(test)]
mod tests {
    use super::super::offsets::Version;
    use super::*;

    /// Writes `bytes` at `at` in `buf`.
    fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
        buf[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// A compact ASCII `str` object holding `s`, laid out as `table`'s version has it.
    fn ascii(table: &Table, s: &str) -> Vec<u8> {
        let at = table.ascii_size as usize;
        let mut obj = vec![0u8; at + s.len() + 1];
        put(&mut obj, 16, &(s.len() as u64).to_le_bytes());
        // kind 1 (bits 2-4), compact (bit 5), ascii (bit 6).
        put(
            &mut obj,
            32,
            &((1u32 << 2) | (1 << 5) | (1 << 6)).to_le_bytes(),
        );
        put(&mut obj, at, s.as_bytes());
        obj
    }

    fn addr(obj: &[u8]) -> u64 {
        obj.as_ptr() as u64
    }

    /// A code object in this process's own memory, read through `/proc/self/mem` as the
    /// symbolizer reads a Python process's: the checksum the sampler took of it names it,
    /// and once the address holds another function the old checksum no longer does.
    #[test]
    fn a_code_object_that_no_longer_matches_the_sampler_is_stale() {
        let table = Table::of(Version {
            major: 3,
            minor: 11,
        })
        .expect("3.11 is walked");
        let name = ascii(&table, "spin");
        let other = ascii(&table, "evaluate");
        let file = ascii(&table, "/srv/w.py");
        let mut lines = vec![0u8; 32 + 2];
        put(&mut lines, 16, &2u64.to_le_bytes());
        let mut code = vec![0u8; 1024];
        let name_at = table.walk.code_name as usize;
        put(&mut code, name_at, &addr(&name).to_le_bytes());
        put(&mut code, name_at - 8, &addr(&file).to_le_bytes());
        put(
            &mut code,
            table.walk.code_firstlineno as usize,
            &12u32.to_le_bytes(),
        );
        let qualname = table.code_qualname.expect("3.11 has co_qualname") as usize;
        put(&mut code, qualname, &addr(&name).to_le_bytes());
        put(
            &mut code,
            table.code_lines as usize,
            &addr(&lines).to_le_bytes(),
        );
        let mem = Memory::open(std::process::id()).expect("open /proc/self/mem");
        let checksum = py_checksum(addr(&name), addr(&file), 12);

        let info = read_code(&mem, &table, addr(&code), checksum).expect("the sampled code");
        assert_eq!(
            (info.name.as_str(), info.file.as_str(), info.firstlineno),
            ("spin", "/srv/w.py", 12)
        );
        assert_eq!(info.lines.len(), 2);

        // A checksum the object never had.
        assert!(matches!(
            read_code(&mem, &table, addr(&code), checksum ^ 1),
            Err(PythonError::Stale(at)) if at == addr(&code)
        ));
        // The address reused by another function: the sampler's checksum is stale.
        put(&mut code, name_at, &addr(&other).to_le_bytes());
        put(&mut code, qualname, &addr(&other).to_le_bytes());
        assert!(matches!(
            read_code(&mem, &table, addr(&code), checksum),
            Err(PythonError::Stale(at)) if at == addr(&code)
        ));
        let moved = py_checksum(addr(&other), addr(&file), 12);
        let info = read_code(&mem, &table, addr(&code), moved).expect("the new function");
        assert_eq!(info.name, "evaluate");
    }
}
