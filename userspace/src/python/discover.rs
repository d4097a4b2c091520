//! Finding the CPython interpreter of a live process: the mapped file (the executable or a
//! `libpython3.X.so`) that defines `_PyRuntime`, its version and its load address.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};

use super::PythonError;
use super::memory::Memory;
use super::offsets::{DEBUG_OFFSETS_LEN, NEWEST, OLDEST, Table, Version};
use crate::procmaps::{FileKey, parse_maps_line};

/// Largest ELF file looked at for `_PyRuntime`.
const MAX_ELF: u64 = 512 << 20;

/// A CPython interpreter found in a process.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// The offsets of its version.
    pub table: Table,
}

/// What looking at a process found.
#[derive(Debug)]
pub enum Found {
    /// A CPython the walker knows.
    Walked(Interpreter),
    /// A CPython of another version: its frames stay native.
    Unsupported(Version),
    /// No file named like a CPython is mapped (yet: a shared build maps its library just
    /// after exec).
    NotPython,
    /// Files named like a supported CPython are mapped, but none defines `_PyRuntime` (yet:
    /// a shared build's executable is mapped before its `libpython`).
    NoRuntime(Version),
}

impl Found {
    /// What the report says of a process that is not walked, or `None` when it is walked
    /// or not a CPython.
    pub fn not_walked(&self) -> Option<(String, String)> {
        match self {
            Found::Unsupported(v) => Some((
                v.to_string(),
                format!("python {v}: not supported, native frames only"),
            )),
            Found::NoRuntime(v) => Some((
                v.to_string(),
                format!("python {v}: no file defines _PyRuntime, native frames only"),
            )),
            Found::Walked(_) | Found::NotPython => None,
        }
    }
}

/// What one look at a process found, and whether a later look could find more.
#[derive(Debug)]
pub struct Look {
    /// What the mappings hold now.
    pub found: Found,
    /// The dynamic loader is done mapping the program's libraries: no loader is mapped (a
    /// static executable), or the process ran at a `pc` outside the loader. A library not
    /// mapped now comes only by `dlopen`.
    pub loaded: bool,
}

/// Looks at process `tgid`'s mappings for a CPython.
pub fn find(tgid: u32) -> Result<Found, PythonError> {
    look(tgid, None).map(|l| l.found)
}

/// [`find`], and whether the loader is done, given a user `pc` the process ran at since
/// its last exec (a sample's innermost user frame).
pub fn look(tgid: u32, pc: Option<u64>) -> Result<Look, PythonError> {
    let path = format!("/proc/{tgid}/maps");
    let text = std::fs::read_to_string(&path).map_err(|source| PythonError::Io { path, source })?;
    let (found, loader, pc_in_loader) = scan(tgid, &text, pc)?;
    Ok(Look {
        found,
        loaded: !loader || (pc.is_some() && !pc_in_loader),
    })
}

/// Whether a mapped file's name is the dynamic loader's (`ld-linux-x86-64.so.2`,
/// `ld-linux-aarch64.so.1`, `ld-2.31.so`, `ld64.so.2`, `ld-musl-x86_64.so.1`).
fn is_loader(name: &str) -> bool {
    name.starts_with("ld-") || name.starts_with("ld64.so")
}

/// What a maps text holds: the CPython found, whether a loader is mapped, and whether `pc`
/// lies in it.
fn scan(tgid: u32, text: &str, pc: Option<u64>) -> Result<(Found, bool, bool), PythonError> {
    let (mut loader, mut pc_in_loader) = (false, false);
    // Files named like CPython, the library first (a shared build's executable has no
    // runtime), each with the mapping of its first page.
    let mut candidates: Vec<(bool, Version, FileKey, u64, u64)> = Vec::new();
    for line in text.lines() {
        let Some(m) = parse_maps_line(line) else {
            continue;
        };
        let name = m.path.rsplit('/').next().unwrap_or(m.path);
        if is_loader(name) {
            loader = true;
            pc_in_loader |= pc.is_some_and(|pc| (m.start..m.end).contains(&pc));
            continue;
        }
        let Some(version) = Version::from_file_name(name) else {
            continue;
        };
        if !m.path.starts_with('/') || candidates.iter().any(|c| c.2.2 == m.path) {
            continue;
        }
        candidates.push((
            name.starts_with("lib"),
            version,
            m.file_key(),
            m.start,
            m.offset,
        ));
    }
    candidates.sort_by_key(|c| !c.0);
    let found = |f| Ok((f, loader, pc_in_loader));
    let Some(first) = candidates.first() else {
        return found(Found::NotPython);
    };
    if !(OLDEST..=NEWEST).contains(&first.1.minor) || first.1.major != 3 {
        return found(Found::Unsupported(first.1));
    }
    for (_, version, file, start, offset) in &candidates {
        let Some(symbol) = runtime_symbol(file, *start, *offset)? else {
            continue;
        };
        let mut table = Table::of(*version).ok_or(PythonError::Object("no offsets"))?;
        if version.minor >= 13 {
            let mem = Memory::open(tgid)?;
            let mut bytes = vec![0u8; DEBUG_OFFSETS_LEN];
            mem.read(symbol, &mut bytes)?;
            table = Table::from_debug_offsets(&bytes)
                .ok_or(PythonError::Object("_Py_DebugOffsets does not match 3.13"))?;
        }
        table.walk.runtime = symbol;
        return found(Found::Walked(Interpreter { table }));
    }
    found(Found::NoRuntime(first.1))
}

/// What a file named like a CPython says of `_PyRuntime`.
#[derive(Debug)]
struct RuntimeFile {
    /// `_PyRuntime`'s link-time address; `None` when the file does not define it.
    symbol: Option<u64>,
    /// Its loadable segments: file offset, size in the file, link-time address.
    segments: Vec<(u64, u64, u64)>,
}

/// Files already looked at: every process of one interpreter maps the same file, and a new
/// one then costs no read of it (a static build's executable is tens of MiB). Bounded: a
/// machine that maps more such files than this has them read again.
fn runtime_files() -> &'static Mutex<HashMap<FileKey, Arc<RuntimeFile>>> {
    static FILES: OnceLock<Mutex<HashMap<FileKey, Arc<RuntimeFile>>>> = OnceLock::new();
    FILES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Most files [`runtime_files`] keeps.
const MAX_RUNTIME_FILES: usize = 256;

/// Runtime address of `_PyRuntime` in `file`, mapped at `start` from file offset `offset`,
/// or `None` when the file does not define it.
fn runtime_symbol(file: &FileKey, start: u64, offset: u64) -> Result<Option<u64>, PythonError> {
    let known = runtime_files()
        .lock()
        .ok()
        .and_then(|files| files.get(file).cloned());
    let parsed = match known {
        Some(parsed) => parsed,
        None => {
            let parsed = Arc::new(read_runtime_file(Path::new(&file.2))?);
            if let Ok(mut files) = runtime_files().lock() {
                if files.len() >= MAX_RUNTIME_FILES {
                    files.clear();
                }
                files.insert(file.clone(), Arc::clone(&parsed));
            }
            parsed
        }
    };
    let Some(symbol) = parsed.symbol else {
        return Ok(None);
    };
    // The load bias, from the segment holding the mapped file offset.
    let Some(&(seg_offset, _, address)) = parsed
        .segments
        .iter()
        .find(|(o, n, _)| *o <= offset && offset < o + (*n).max(1))
    else {
        return Err(PythonError::Object("no segment at the mapped offset"));
    };
    let mapped_vaddr = address + (offset - seg_offset);
    let bias = start.wrapping_sub(mapped_vaddr);
    Ok(Some(symbol.wrapping_add(bias)))
}

/// Reads `_PyRuntime`'s address and the segments of the ELF file at `path`: only the parts
/// of the file that hold them (headers, symbol tables), not the whole file.
fn read_runtime_file(path: &Path) -> Result<RuntimeFile, PythonError> {
    let io = |source| PythonError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() > MAX_ELF {
        return Err(PythonError::Object("an ELF file over the size limit"));
    }
    let data = object::ReadCache::new(file);
    let elf = object::File::parse(&data).map_err(|_| PythonError::Object("not an ELF file"))?;
    // The dynamic symbols first: a few thousand, where the full table of a static build
    // has tens of thousands.
    let symbol = elf
        .dynamic_symbols()
        .chain(elf.symbols())
        .find(|s| s.name() == Ok("_PyRuntime") && s.is_definition())
        .map(|s| s.address());
    let segments = elf
        .segments()
        .map(|s| {
            let (o, n) = s.file_range();
            (o, n, s.address())
        })
        .collect();
    Ok(RuntimeFile { symbol, segments })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file is read once: after it was looked at, its answer comes from the cache even
    /// when the file is gone (a new process of a known interpreter reads nothing).
    #[test]
    fn a_file_looked_at_is_not_read_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let copy = dir.path().join("python3.99");
        std::fs::copy(std::env::current_exe().expect("own exe"), &copy).expect("copy");
        let key = ("fe:01".to_string(), 424_242, copy.display().to_string());
        // An ELF without `_PyRuntime`: none, and cached.
        assert!(matches!(runtime_symbol(&key, 0x1000, 0), Ok(None)));
        std::fs::remove_file(&copy).expect("remove");
        assert!(matches!(runtime_symbol(&key, 0x1000, 0), Ok(None)));
        // A file never looked at and missing is an error, not cached.
        let other = ("fe:01".to_string(), 424_243, copy.display().to_string());
        assert!(matches!(
            runtime_symbol(&other, 0x1000, 0),
            Err(PythonError::Io { .. })
        ));
        assert!(
            runtime_files()
                .lock()
                .is_ok_and(|f| f.contains_key(&key) && !f.contains_key(&other))
        );
    }

    /// A dynamically linked program that is no CPython: the loader, libc and the program.
    const DYNAMIC: &str = "\
55d0c0a00000-55d0c0a20000 r-xp 00002000 fe:01 1311 /usr/bin/redis-benchmark
7f1c2a000000-7f1c2a180000 r-xp 00028000 fe:01 2020 /usr/lib/x86_64-linux-gnu/libc.so.6
7f1c2a400000-7f1c2a425000 r-xp 00001000 fe:01 2001 /usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
7ffd1b3fe000-7ffd1b400000 r-xp 00000000 00:00 0 [vdso]
";

    #[test]
    fn loaded_once_the_process_ran_outside_the_loader() {
        let (found, loader, in_loader) =
            scan(1, DYNAMIC, Some(0x55d0_c0a0_1234)).expect("no file to open");
        assert!(matches!(found, Found::NotPython));
        assert!(loader && !in_loader);
        // Running in the loader (just after exec, or while it maps libraries): not yet.
        let (_, loader, in_loader) =
            scan(1, DYNAMIC, Some(0x7f1c_2a40_0010)).expect("no file to open");
        assert!(loader && in_loader);
        // No pc known (a look at exec, before any sample): not known to be done.
        let (_, loader, in_loader) = scan(1, DYNAMIC, None).expect("no file to open");
        assert!(loader && !in_loader);
    }

    #[test]
    fn a_static_program_is_loaded_at_once() {
        let text = "00400000-00800000 r-xp 00000000 fe:01 77 /usr/local/bin/static-server\n";
        let (found, loader, _) = scan(1, text, None).expect("no file to open");
        assert!(matches!(found, Found::NotPython));
        assert!(!loader);
    }

    #[test]
    fn loader_names() {
        for name in [
            "ld-linux-x86-64.so.2",
            "ld-linux-aarch64.so.1",
            "ld-2.31.so",
            "ld64.so.2",
            "ld-musl-x86_64.so.1",
        ] {
            assert!(is_loader(name), "{name}");
        }
        for name in [
            "libc.so.6",
            "python3.12",
            "libpython3.12.so.1.0",
            "ldconfig",
        ] {
            assert!(!is_loader(name), "{name}");
        }
    }
}
