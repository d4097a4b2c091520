//! Bounded reads of another process's memory (`/proc/PID/mem`), and the CPython objects
//! the symbolizer reads through them: strings and bytes.

use std::fs::File;
use std::os::unix::fs::FileExt as _;

use super::PythonError;

/// Longest string read (characters): longer names and paths are cut.
pub const MAX_STRING: usize = 4096;

/// Largest line table read, bytes.
pub const MAX_TABLE: usize = 1 << 20;

/// A process's memory, open for reading.
pub struct Memory {
    file: File,
}

impl Memory {
    /// Opens `/proc/tgid/mem` (needs ptrace access to the process: root, or its owner).
    pub fn open(tgid: u32) -> Result<Self, PythonError> {
        let path = format!("/proc/{tgid}/mem");
        let file = File::open(&path).map_err(|source| PythonError::Io { path, source })?;
        Ok(Self { file })
    }

    /// Fills `buf` from address `addr`.
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), PythonError> {
        self.file
            .read_exact_at(buf, addr)
            .map_err(|_| PythonError::Fault(addr))
    }

    /// The little-endian u64 at `addr`.
    pub fn u64(&self, addr: u64) -> Result<u64, PythonError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The little-endian u32 at `addr`.
    pub fn u32(&self, addr: u64) -> Result<u32, PythonError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// A `str` object's text: compact strings only (what code objects hold), at most
    /// [`MAX_STRING`] characters. `ascii_size` and `compact_size` are the version's
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`.
    pub fn string(
        &self,
        obj: u64,
        ascii_size: u32,
        compact_size: u32,
    ) -> Result<String, PythonError> {
        // ob_refcnt, ob_type, length, hash, then the state bit field.
        let length = self.u64(obj + 16)?;
        let state = self.u32(obj + 32)?;
        let kind = (state >> 2) & 7;
        let compact = state & (1 << 5) != 0;
        let ascii = state & (1 << 6) != 0;
        if !compact {
            return Err(PythonError::Object("a non-compact str"));
        }
        let n = usize::try_from(length)
            .unwrap_or(usize::MAX)
            .min(MAX_STRING);
        if ascii {
            let mut b = vec![0u8; n];
            self.read(obj + u64::from(ascii_size), &mut b)?;
            return plausible(String::from_utf8_lossy(&b).into_owned());
        }
        let width = match kind {
            1 | 2 | 4 => kind as usize,
            _ => return Err(PythonError::Object("a str of unknown kind")),
        };
        let mut b = vec![0u8; n * width];
        self.read(obj + u64::from(compact_size), &mut b)?;
        plausible(
            b.chunks_exact(width)
                .map(|c| {
                    let mut v = [0u8; 4];
                    v[..width].copy_from_slice(c);
                    char::from_u32(u32::from_le_bytes(v)).unwrap_or(char::REPLACEMENT_CHARACTER)
                })
                .collect(),
        )
    }

    /// A `bytes` object's contents, at most [`MAX_TABLE`] bytes.
    pub fn bytes(&self, obj: u64) -> Result<Vec<u8>, PythonError> {
        let size = self.u64(obj + 16)?;
        let n = usize::try_from(size).unwrap_or(usize::MAX);
        if n > MAX_TABLE {
            return Err(PythonError::Object("a line table over the size limit"));
        }
        let mut b = vec![0u8; n];
        self.read(obj + 32, &mut b)?;
        Ok(b)
    }
}

/// A name or path read from another process: empty, or holding control characters (memory
/// that is not, or no longer, the string the header promised), is refused.
fn plausible(s: String) -> Result<String, PythonError> {
    if s.is_empty() || s.chars().any(char::is_control) {
        return Err(PythonError::Object("a str that does not read as text"));
    }
    Ok(s)
}
