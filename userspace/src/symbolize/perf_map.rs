//! Perf maps (`/tmp/perf-PID.map`): the names runtimes give the code they compile at run
//! time, one `START SIZE name` line per function (hex start and size; Node
//! `--perf-basic-prof`, Java `jcmd PID Compiler.perfmap` / `-XX:+DumpPerfMapAtExit`,
//! Python 3.12+ `-X perf`, .NET `DOTNET_PerfMapEnabled=1`, LuaJIT).
//!
//! This module owns the line parser ([`parse_line`], fuzzed), the safe incremental reader
//! of another user's map file (`PerfMapFile`: no symlinks, regular file, owned by the
//! process's user, bounded) and the lookup table a report builds from the entries a
//! recording kept ([`JitTable`]), which turns addresses into [`Frame::jit`] frames.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{Frame, JitRuntime};
use crate::pb::v1::JitSymbol;

/// Longest name kept, bytes (Java signatures can be long; anything past this is cut).
pub const MAX_NAME_BYTES: usize = 1024;
/// Longest line looked at, bytes: a longer one is skipped whole.
const MAX_LINE_BYTES: usize = 4096;
/// Most bytes read from one map file over a recording (a large Node app writes tens of MB).
pub(crate) const MAX_FILE_BYTES: u64 = 256 << 20;
/// Most bytes read from a map file at one time.
pub(crate) const MAX_READ_BYTES: u64 = 16 << 20;

/// One parsed perf-map line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerfMapLine<'a> {
    /// First address of the code.
    pub start: u64,
    /// Length of the code, bytes (never 0).
    pub size: u64,
    /// The runtime's name for it (at most [`MAX_NAME_BYTES`]).
    pub name: &'a str,
}

/// Parses `START SIZE name` (hex numbers, an optional `0x`); `None` for a malformed line,
/// an empty range or one that wraps around the address space.
pub fn parse_line(line: &str) -> Option<PerfMapLine<'_>> {
    if line.len() > MAX_LINE_BYTES {
        return None;
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (start, rest) = line.split_once(' ')?;
    let (size, name) = rest.split_once(' ')?;
    let hex = |s: &str| {
        let s = s.strip_prefix("0x").unwrap_or(s);
        if s.is_empty() || s.len() > 16 {
            return None;
        }
        u64::from_str_radix(s, 16).ok()
    };
    let (start, size) = (hex(start)?, hex(size)?);
    let name = name.trim();
    if size == 0 || start.checked_add(size).is_none() || name.is_empty() {
        return None;
    }
    let mut cut = name.len().min(MAX_NAME_BYTES);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(PerfMapLine {
        start,
        size,
        name: &name[..cut],
    })
}

/// Why a map file was not read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PerfMapError {
    /// No map file (the runtime writes none, or not yet).
    #[error("no perf map at {path}")]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// Opening or reading failed.
    #[error("cannot read perf map {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// A symlink, FIFO, device or directory where the map should be.
    #[error("perf map {path} is not a regular file")]
    NotRegular {
        /// The path.
        path: PathBuf,
    },
    /// Someone other than the process's user (or root) owns the file: it could name
    /// another program's code.
    #[error("perf map {path} belongs to uid {owner}, not to the process's uid {expected}")]
    WrongOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The process's uid.
        expected: u32,
    },
}

/// An open map file read as it grows: each `PerfMapFile::read_new` returns the whole
/// lines appended since the previous one.
pub(crate) struct PerfMapFile {
    path: PathBuf,
    file: File,
    /// Bytes consumed (up to the last whole line).
    offset: u64,
}

impl PerfMapFile {
    /// Opens `path` without following a symlink at its end or blocking on a FIFO, and
    /// checks it is a regular file owned by `uid` (or by root).
    pub fn open(path: &Path, uid: u32) -> Result<Self, PerfMapError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|source| match source.kind() {
                io::ErrorKind::NotFound => PerfMapError::Missing { path: path.into() },
                // ELOOP: the last component is a symlink.
                _ if source.raw_os_error() == Some(libc::ELOOP) => {
                    PerfMapError::NotRegular { path: path.into() }
                }
                _ => PerfMapError::Io {
                    path: path.into(),
                    source,
                },
            })?;
        let meta = file.metadata().map_err(|source| PerfMapError::Io {
            path: path.into(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(PerfMapError::NotRegular { path: path.into() });
        }
        if meta.uid() != uid && meta.uid() != 0 {
            return Err(PerfMapError::WrongOwner {
                path: path.into(),
                owner: meta.uid(),
                expected: uid,
            });
        }
        Ok(Self {
            path: path.into(),
            file,
            offset: 0,
        })
    }

    /// When the file was last written.
    pub(crate) fn modified(&self) -> Option<std::time::SystemTime> {
        self.file.metadata().and_then(|m| m.modified()).ok()
    }

    /// Calls `each` for every whole line appended since the last call (at most
    /// [`MAX_READ_BYTES`] now, [`MAX_FILE_BYTES`] in all); returns the bytes consumed.
    pub(crate) fn read_new(
        &mut self,
        mut each: impl FnMut(PerfMapLine<'_>),
    ) -> Result<u64, PerfMapError> {
        let io_err = |source| PerfMapError::Io {
            path: self.path.clone(),
            source,
        };
        let len = self.file.metadata().map_err(io_err)?.len();
        if len < self.offset {
            // Truncated and rewritten (a new `jcmd Compiler.perfmap`): start over.
            self.offset = 0;
        }
        let want = len
            .min(MAX_FILE_BYTES)
            .saturating_sub(self.offset)
            .min(MAX_READ_BYTES);
        if want == 0 {
            return Ok(0);
        }
        self.file
            .seek(SeekFrom::Start(self.offset))
            .map_err(|e| PerfMapError::Io {
                path: self.path.clone(),
                source: e,
            })?;
        let mut buf = Vec::with_capacity(want as usize);
        (&mut self.file)
            .take(want)
            .read_to_end(&mut buf)
            .map_err(|e| PerfMapError::Io {
                path: self.path.clone(),
                source: e,
            })?;
        // Only whole lines: the runtime may be writing the last one now.
        let Some(end) = buf.iter().rposition(|&b| b == b'\n') else {
            if buf.len() as u64 >= MAX_READ_BYTES {
                // One line longer than a whole read: skip it.
                self.offset += buf.len() as u64;
            }
            return Ok(0);
        };
        for line in buf[..end].split(|&b| b == b'\n') {
            if let Some(parsed) = std::str::from_utf8(line).ok().and_then(parse_line) {
                each(parsed);
            }
        }
        let used = end as u64 + 1;
        self.offset += used;
        Ok(used)
    }
}

/// Where a live process's perf map is, seen from here: under its root (containers), named
/// with its pid in its own pid namespace.
pub(crate) fn live_path(tgid: u32, ns_pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{tgid}/root/tmp/perf-{ns_pid}.map"))
}

/// Named JIT code of one process, from the entries a recording kept: later entries for
/// the same start replace earlier ones (code freed and compiled again).
#[derive(Clone, Debug, Default)]
pub struct JitTable {
    /// start -> (end, name)
    entries: BTreeMap<u64, (u64, String)>,
}

impl JitTable {
    /// The table of one process's recorded entries.
    pub fn new<'a>(symbols: impl IntoIterator<Item = &'a JitSymbol>) -> Self {
        let mut t = Self::default();
        for s in symbols {
            t.insert(s.start, s.size, &s.name);
        }
        t
    }

    /// Adds an entry; malformed ones (empty, wrapping, nameless) are ignored.
    pub fn insert(&mut self, start: u64, size: u64, name: &str) {
        let Some(end) = start.checked_add(size) else {
            return;
        };
        if size == 0 || name.is_empty() {
            return;
        }
        let name = &name[..floor_boundary(name, MAX_NAME_BYTES)];
        self.entries.insert(start, (end, name.to_string()));
    }

    /// The entry holding `addr`: (start, end, name).
    pub fn lookup(&self, addr: u64) -> Option<(u64, u64, &str)> {
        let (&start, (end, name)) = self.entries.range(..=addr).next_back()?;
        (addr < *end).then_some((start, *end, name.as_str()))
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn floor_boundary(s: &str, max: usize) -> usize {
    let mut cut = s.len().min(max);
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    cut
}

/// The frame of a perf-map name: V8 names carry their source (`JS:*heavy /app.js:3:15`,
/// `LazyCompile:~f file:line:col`), which becomes the frame's file and line; the tier
/// prefix and marker go. Other runtimes' names are kept as written.
pub fn jit_frame(name: &str, runtime: JitRuntime) -> Frame {
    if runtime == JitRuntime::V8
        && let Some((function, file, line)) = split_v8(name)
    {
        return Frame::jit(function, runtime).with_source(Some(file.to_string()), Some(line));
    }
    Frame::jit(name, runtime)
}

/// `[Tier:][*~^+]function file:line:col` -> (function, file, line).
fn split_v8(name: &str) -> Option<(&str, &str, u32)> {
    let (head, location) = name.rsplit_once(' ')?;
    // file:line:col, the file possibly holding ':' itself.
    let (rest, _col) = location.rsplit_once(':')?;
    let (file, line) = rest.rsplit_once(':')?;
    let line: u32 = line.parse().ok()?;
    if file.is_empty() {
        return None;
    }
    let function = head.split_once(':').map_or(head, |(_, f)| f);
    let function = function.trim_start_matches(['*', '~', '^', '+']);
    let function = if function.is_empty() {
        "(anonymous)"
    } else {
        function
    };
    Some((function, file, line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_and_bad_ones_do_not() {
        assert_eq!(
            parse_line("7f0a1b2c3d40 1a0 JS:*heavy /tmp/app.js:3:15"),
            Some(PerfMapLine {
                start: 0x7f0a_1b2c_3d40,
                size: 0x1a0,
                name: "JS:*heavy /tmp/app.js:3:15"
            })
        );
        assert_eq!(
            parse_line("0x10 0x20 f").map(|l| (l.start, l.size)),
            Some((0x10, 0x20))
        );
        for bad in [
            "",
            "zz 10 f",
            "10 0 f",
            "10 20",
            "10 20 ",
            "ffffffffffffffff 2 wraps",
            "10000000000000000 2 too-long",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
        let long = format!("10 20 {}", "é".repeat(MAX_NAME_BYTES));
        let parsed = parse_line(&long).expect("long names are cut");
        assert!(parsed.name.len() <= MAX_NAME_BYTES);
    }

    #[test]
    fn table_finds_the_latest_entry_holding_an_address() {
        let sym = |start, size, name: &str| JitSymbol {
            start,
            size,
            name: name.into(),
            ..JitSymbol::default()
        };
        let t = JitTable::new(&[
            sym(0x100, 0x10, "old"),
            sym(0x100, 0x20, "new"),
            sym(0x200, 8, "b"),
        ]);
        assert_eq!(t.lookup(0x118), Some((0x100, 0x120, "new")));
        assert_eq!(t.lookup(0x120), None);
        assert_eq!(t.lookup(0x207), Some((0x200, 0x208, "b")));
        assert_eq!(t.lookup(0xff), None);
    }

    #[test]
    fn v8_names_become_function_file_and_line() {
        let f = jit_frame("JS:*heavy /tmp/app.js:3:15", JitRuntime::V8);
        assert_eq!(
            (f.function.as_str(), f.file.as_deref(), f.line),
            ("heavy", Some("/tmp/app.js"), Some(3))
        );
        let f = jit_frame("LazyCompile:~ file:///a:b.js:10:1", JitRuntime::V8);
        assert_eq!((f.function.as_str(), f.line), ("(anonymous)", Some(10)));
        let f = jit_frame("Builtin:ArrayMap", JitRuntime::V8);
        assert_eq!((f.function.as_str(), f.file), ("Builtin:ArrayMap", None));
        let f = jit_frame("LHeavy;::run", JitRuntime::Jvm);
        assert_eq!(f.function, "LHeavy;::run");
    }

    #[test]
    fn reading_follows_appends_and_refuses_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("perf-1.map");
        std::fs::write(&path, "10 10 a\n20 10 b\n30 10 c-partial").expect("write");
        let uid = std::fs::metadata(&path).expect("meta").uid();
        let mut f = PerfMapFile::open(&path, uid).expect("opens");
        let mut names = Vec::new();
        f.read_new(|l| names.push(l.name.to_string()))
            .expect("reads");
        assert_eq!(names, ["a", "b"]);
        let mut w = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("append");
        std::io::Write::write_all(&mut w, b"\n40 10 d\n").expect("write");
        names.clear();
        f.read_new(|l| names.push(l.name.to_string()))
            .expect("reads");
        assert_eq!(names, ["c-partial", "d"]);
        let link = dir.path().join("perf-2.map");
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(matches!(
            PerfMapFile::open(&link, uid),
            Err(PerfMapError::NotRegular { .. })
        ));
        assert!(matches!(
            PerfMapFile::open(dir.path(), uid),
            Err(PerfMapError::NotRegular { .. })
        ));
        // Another user's file: refused (as root, make one by chown).
        let (other, expected) = if uid == 0 {
            std::os::unix::fs::chown(&path, Some(4242), None).expect("chown");
            (4242, 4243)
        } else {
            (uid, uid + 1)
        };
        assert!(matches!(
            PerfMapFile::open(&path, expected),
            Err(PerfMapError::WrongOwner { owner, .. }) if owner == other
        ));
        assert!(PerfMapFile::open(&path, other).is_ok());
    }
}
