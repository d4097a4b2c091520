//! Compiled tables cached on disk by build-id, so each file is compiled once per machine.
//!
//! One file per build-id, `<hex build-id>.unw`: a 48-byte header, the rows (16 bytes each,
//! little-endian) and a CRC32C of everything before it. The directory is private (0700,
//! owned by us, refused when others may write to it: these rows end up in BPF maps that
//! steer kernel memory reads), files are 0600 and written by rename, so a reader never sees
//! half a file. A damaged or foreign file is ignored and rebuilt. A file without a build-id
//! is keyed by what `stat` says of it (device, inode, size, modification time, path), so
//! it is compiled again only when it changes.
//!
//! The directory is bounded ([`DEFAULT_BUDGET`], or [`UnwindCache::with_budget`]): a store
//! that takes it over the budget removes the least recently used files (a load marks its
//! file used) down to three quarters of it. A build machine makes new binaries all day,
//! each without a build-id its stat key has not seen; unbounded, their tables filled
//! 3.9 GiB of `/var/cache` on a developer's VM.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{MAX_ROWS, ROW_BYTES, TableStats, UnwindError, UnwindRow, UnwindTable, unwind_kind};

const MAGIC: &[u8; 8] = b"EBPFUNW1";
/// Bumped whenever the compiler's output for the same input changes.
const VERSION: u32 = 1;
/// magic, version, pad, rows, fdes, skipped, text_bytes.
const HEADER: usize = 48;
/// Longest build-id taken as a file name (GNU build-ids are 20 bytes; 64 is generous).
const MAX_BUILD_ID: usize = 64;
/// Most bytes of tables kept on disk unless told otherwise. A store can pass it by one table
/// and its temporary file (at most 128 MiB each) before the trim, so 256 MiB stays under
/// the 512 MiB the Kubernetes DaemonSet gives the cache's emptyDir.
pub const DEFAULT_BUDGET: u64 = 256 << 20;
/// Largest cache file [`decode`] accepts.
pub(crate) const MAX_FILE_BYTES: usize = HEADER + MAX_ROWS * ROW_BYTES + 4;

/// Why the cache could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache directory could not be created or read.
    #[error("cannot create or read the unwind cache directory {path}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    #[error("unwind cache directory {path} is not private (mode {mode:o}, owner {uid})")]
    /// Others could write to the cache directory: it is not used.
    InsecureDir {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// Its owner.
        uid: u32,
    },
    /// A cache file could not be written.
    #[error("cannot write {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The table could not be compiled.
    #[error(transparent)]
    Compile(#[from] UnwindError),
}

/// Why bytes are not a cache file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{len} bytes: not a cache file of this version")]
    /// Too short, or the magic or version does not match.
    Header {
        /// Length of the bytes.
        len: usize,
    },
    /// The CRC32C does not match the rows.
    #[error("checksum mismatch")]
    Checksum,
    #[error("row {index} is out of order or of unknown kind")]
    /// A row breaks the table's order or has an unknown kind.
    Row {
        /// Its index.
        index: usize,
    },
}

/// Where a table came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableSource {
    /// Read from the cache.
    Cached,
    /// Compiled now and stored.
    Built,
    /// Compiled now and stored under what `stat` says of the file: it has no build-id.
    BuiltByStat,
    /// Compiled now, not stored: neither a build-id nor `stat` identify it.
    Uncached,
}

/// The cache key of a file: its build-id, or for a file without one `stat-` and a digest
/// of its device, inode, size, modification time and path (a length no build-id has).
/// Empty when neither is usable.
fn cache_key(build_id: &[u8], path: &Path) -> Vec<u8> {
    if !build_id.is_empty() {
        return if build_id.len() <= MAX_BUILD_ID {
            build_id.to_vec()
        } else {
            Vec::new()
        };
    }
    let Ok(m) = fs::metadata(path) else {
        return Vec::new();
    };
    let mut facts = Vec::new();
    for v in [
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime() as u64,
        m.mtime_nsec() as u64,
    ] {
        facts.extend_from_slice(&v.to_le_bytes());
    }
    facts.extend_from_slice(path.as_os_str().as_encoded_bytes());
    let mut key = b"stat-".to_vec();
    key.extend_from_slice(&m.size().to_le_bytes());
    key.extend_from_slice(&crc32c::crc32c(&facts).to_le_bytes());
    facts.reverse();
    key.extend_from_slice(&crc32c::crc32c(&facts).to_le_bytes());
    key
}

/// The cache directory.
#[derive(Clone, Debug)]
pub struct UnwindCache {
    dir: PathBuf,
    budget: u64,
}

impl UnwindCache {
    /// `$XDG_CACHE_HOME/energy-bpf/unwind`, else `/var/cache/energy-bpf/unwind` for root,
    /// else `~/.cache/energy-bpf/unwind`.
    pub(crate) fn default_dir() -> Option<PathBuf> {
        let sub = "energy-bpf/unwind";
        if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
            return Some(PathBuf::from(x).join(sub));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            return Some(PathBuf::from("/var/cache").join(sub));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join(sub))
    }

    /// Opens (creating, mode 0700) the cache at `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, CacheError> {
        let dir = dir.into();
        let err = |source| CacheError::Dir {
            path: dir.clone(),
            source,
        };
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(err)?;
        let meta = fs::metadata(&dir).map_err(err)?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if meta.uid() != me || meta.mode() & 0o022 != 0 {
            return Err(CacheError::InsecureDir {
                path: dir,
                mode: meta.mode() & 0o7777,
                uid: meta.uid(),
            });
        }
        Ok(Self {
            dir,
            budget: DEFAULT_BUDGET,
        })
    }

    /// The same cache, keeping at most `bytes` of tables on disk.
    #[must_use]
    pub fn with_budget(mut self, bytes: u64) -> Self {
        self.budget = bytes;
        self
    }

    /// The table of the ELF file at `path`: from the cache when its build-id is there,
    /// else compiled (and stored when it has a build-id).
    pub fn table(&self, path: &Path) -> Result<(UnwindTable, TableSource), CacheError> {
        self.table_at_most(path, usize::MAX)?
            .ok_or(CacheError::Compile(UnwindError::TooManyRows {
                cap: usize::MAX,
            }))
    }

    /// [`UnwindCache::table`], or `None` when the table has more than `max_rows` rows. A
    /// cached table that large is recognised by its file size and not read (for the
    /// sampler, whose row array cannot hold it anyway).
    pub(crate) fn table_at_most(
        &self,
        path: &Path,
        max_rows: usize,
    ) -> Result<Option<(UnwindTable, TableSource)>, CacheError> {
        let mut cached = None;
        let mut too_big = false;
        let mut key = Vec::new();
        let (id, built) = super::compile::build_id_and_table(path, |id| {
            key = cache_key(id, path);
            if key.is_empty() {
                return true;
            }
            let rows = fs::metadata(self.path_for(&key))
                .map(|m| (m.len() as usize).saturating_sub(HEADER + 4) / ROW_BYTES);
            if rows.is_ok_and(|rows| rows > max_rows) {
                too_big = true;
                return false;
            }
            cached = self.load(&key);
            cached.is_none()
        })?;
        if too_big {
            return Ok(None);
        }
        if let Some(table) = cached {
            return Ok(Some((table, TableSource::Cached)));
        }
        // `want` asked for a table whenever there was no cached one.
        let table = built.unwrap_or_default();
        if key.is_empty() {
            return Ok(Some((table, TableSource::Uncached)));
        }
        self.store(&key, &table)?;
        let fits = table.rows.len() <= max_rows;
        let source = if id.is_empty() {
            TableSource::BuiltByStat
        } else {
            TableSource::Built
        };
        Ok(fits.then_some((table, source)))
    }

    /// The cache file of `build_id`.
    fn path_for(&self, build_id: &[u8]) -> PathBuf {
        let hex: String = build_id.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}.unw"))
    }

    /// The cached table of `build_id`, or `None` when absent or damaged.
    pub fn load(&self, build_id: &[u8]) -> Option<UnwindTable> {
        let file = fs::File::open(self.path_for(build_id)).ok()?;
        let mut bytes = Vec::new();
        // One byte over the cap, so an oversized file is seen as such, not truncated.
        (&file)
            .take(MAX_FILE_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .ok()?;
        let table = decode(&bytes).ok()?;
        // Used now: the budget removes least recently used files first. Best effort: a
        // file that keeps its old time is only removed sooner.
        let _ = file.set_modified(std::time::SystemTime::now());
        Some(table)
    }

    /// Stores `table` under `build_id` (0600, atomically).
    pub fn store(&self, build_id: &[u8], table: &UnwindTable) -> Result<(), CacheError> {
        let path = self.path_for(build_id);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let err = |source| CacheError::Write {
            path: path.clone(),
            source,
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err)?;
        let written = f
            .write_all(&encode(table))
            .and_then(|()| fs::rename(&tmp, &path));
        if let Err(e) = written {
            // Best effort: a stale temporary file is harmless, the error is what matters.
            let _ = fs::remove_file(&tmp);
            return Err(err(e));
        }
        self.trim(&path);
        Ok(())
    }

    /// Keeps the directory within the budget: when its tables take more, removes the least
    /// recently used (oldest modification time) down to three quarters of it, never
    /// `keep`, the file just stored. Returns the bytes removed. Files another process
    /// removes meanwhile are skipped; one this cannot remove stays counted.
    pub fn trim(&self, keep: &Path) -> u64 {
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = dir
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "unw"))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        if total <= self.budget {
            return 0;
        }
        files.sort();
        let target = self.budget / 4 * 3;
        let mut removed = 0;
        for (_, len, path) in files {
            if total <= target {
                break;
            }
            if path == keep {
                continue;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
                removed += len;
            }
        }
        removed
    }
}

/// The cache file bytes of `table`.
pub fn encode(table: &UnwindTable) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + table.rows.len() * ROW_BYTES + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for v in [
        table.rows.len() as u64,
        table.stats.fdes,
        table.stats.skipped,
        table.stats.text_bytes,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for r in &table.rows {
        out.extend_from_slice(&r.pc.to_le_bytes());
        out.extend_from_slice(&r.cfa_offset.to_le_bytes());
        out.extend_from_slice(&r.rbp_offset.to_le_bytes());
        out.extend_from_slice(&[r.cfa_reg, r.kind]);
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn le<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    if let Some(s) = b.get(at..at + N) {
        a.copy_from_slice(s);
    }
    a
}

/// Parses a cache file, bounded by `MAX_FILE_BYTES`; the rows must be sorted (the
/// walker's binary search depends on it) and of known kinds.
pub fn decode(bytes: &[u8]) -> Result<UnwindTable, DecodeError> {
    let header = DecodeError::Header { len: bytes.len() };
    if bytes.len() < HEADER + 4 || bytes.len() > MAX_FILE_BYTES || &bytes[..8] != MAGIC {
        return Err(header);
    }
    if u32::from_le_bytes(le(bytes, 8)) != VERSION {
        return Err(header);
    }
    let rows = u64::from_le_bytes(le(bytes, 16));
    let n = usize::try_from(rows)
        .ok()
        .filter(|&n| n <= MAX_ROWS)
        .ok_or(header.clone())?;
    if bytes.len() != HEADER + n * ROW_BYTES + 4 {
        return Err(header);
    }
    let body = bytes.len() - 4;
    if crc32c::crc32c(&bytes[..body]) != u32::from_le_bytes(le(bytes, body)) {
        return Err(DecodeError::Checksum);
    }
    let mut out = Vec::with_capacity(n);
    for index in 0..n {
        let at = HEADER + index * ROW_BYTES;
        let r = UnwindRow {
            pc: u64::from_le_bytes(le(bytes, at)),
            cfa_offset: i32::from_le_bytes(le(bytes, at + 8)),
            rbp_offset: i16::from_le_bytes(le(bytes, at + 12)),
            cfa_reg: bytes[at + 14],
            kind: bytes[at + 15],
        };
        if r.kind > unwind_kind::NO_INFO || out.last().is_some_and(|p: &UnwindRow| p.pc >= r.pc) {
            return Err(DecodeError::Row { index });
        }
        out.push(r);
    }
    let stats = TableStats {
        rows,
        fdes: u64::from_le_bytes(le(bytes, 24)),
        skipped: u64::from_le_bytes(le(bytes, 32)),
        unsupported_rows: out
            .iter()
            .filter(|r| r.kind == unwind_kind::UNSUPPORTED)
            .count() as u64,
        plt_rows: out.iter().filter(|r| r.kind == unwind_kind::PLT).count() as u64,
        text_bytes: u64::from_le_bytes(le(bytes, 40)),
    };
    Ok(UnwindTable { rows: out, stats })
}
