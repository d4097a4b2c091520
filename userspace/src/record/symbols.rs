//! The names a recording stores for its own addresses (`SymbolTable` records): written by
//! the recorder when it finishes, read back as they are after checking them against the
//! bounds below. A table outside them is damage (the reader counts it and goes on), so no
//! later stage indexes out of range or sizes work from a crafted count.

use crate::pb::v1::{SymbolAddress, SymbolTable};

/// Most strings one table holds.
pub const MAX_STRINGS: usize = 1 << 16;
/// Longest string (function name or source file), bytes.
pub const MAX_STRING_LEN: usize = 1 << 16;
/// Most files one table holds.
pub const MAX_FILES: usize = 1 << 16;
/// Most addresses (file offsets and kernel addresses together) one table holds.
pub const MAX_ADDRESSES: usize = 1 << 18;
/// Most frames one address resolves to (the function and the calls inlined into it).
pub const MAX_FRAMES: usize = 128;
/// Most frames one table holds, all addresses together.
pub const MAX_TABLE_FRAMES: usize = 1 << 20;
/// Most tables one recording keeps; later ones are dropped as damage.
pub const MAX_TABLES: usize = 256;

/// Why a stored table is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SymbolsError {
    /// A count or length over its bound.
    #[error("symbol table has {found} {what}, over the limit of {max}")]
    TooMany {
        /// What was counted.
        what: &'static str,
        /// How many there were.
        found: usize,
        /// The bound.
        max: usize,
    },
    /// A frame refers to a string the table does not have.
    #[error("symbol table frame refers to string {index} of {len}")]
    BadIndex {
        /// The index.
        index: u32,
        /// Strings in the table.
        len: usize,
    },
}

/// Checks `table` against the bounds of this module.
pub fn check(table: &SymbolTable) -> Result<(), SymbolsError> {
    let over = |what, found, max| {
        if found > max {
            Err(SymbolsError::TooMany { what, found, max })
        } else {
            Ok(())
        }
    };
    over("strings", table.strings.len(), MAX_STRINGS)?;
    let longest = table.strings.iter().map(String::len).max().unwrap_or(0);
    over("bytes in a string", longest, MAX_STRING_LEN)?;
    over("files", table.files.len(), MAX_FILES)?;
    let addresses = || {
        table
            .files
            .iter()
            .flat_map(|f| &f.addresses)
            .chain(&table.kernel)
    };
    over("addresses", addresses().count(), MAX_ADDRESSES)?;
    let deepest = addresses().map(|a| a.frames.len()).max().unwrap_or(0);
    over("frames for one address", deepest, MAX_FRAMES)?;
    let frames: usize = addresses().map(|a| a.frames.len()).sum();
    over("frames", frames, MAX_TABLE_FRAMES)?;
    let longest_path = table.files.iter().map(|f| f.path.len()).max().unwrap_or(0);
    over("bytes in a file path", longest_path, MAX_STRING_LEN)?;
    let len = table.strings.len();
    let in_range = |index: u32| {
        if (index as usize) < len {
            Ok(())
        } else {
            Err(SymbolsError::BadIndex { index, len })
        }
    };
    for frame in addresses().flat_map(|a: &SymbolAddress| &a.frames) {
        in_range(frame.function)?;
        if let Some(file) = frame.file {
            in_range(file)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "symbols_tests.rs"]
mod tests;
