//! Executable mappings of a live process, read from `/proc/PID/maps` with each file's GNU
//! build-id, so a recording can symbolize addresses after the process has exited. A leaf:
//! symbolization, the unwinder and the Python walker all read maps and build-ids here.
//!
//! The recorder calls [`process_mappings`] at a process's first sample (and at its first
//! after each exec); build-ids are read once per (device, inode, path) and cached
//! process-wide.

use std::collections::HashMap;
use std::io;
use std::sync::{Mutex, OnceLock};

use object::Object as _;

use crate::pb::v1::Mapping;

/// Identity of a mapped file as a maps line names it: device, inode and path (the same
/// path may be replaced on disk: a new inode).
pub(crate) type FileKey = (String, u64, String);

impl MapsLine<'_> {
    /// The mapped file's [`FileKey`].
    pub(crate) fn file_key(&self) -> FileKey {
        (self.dev.to_string(), self.inode, self.path.to_string())
    }
}

fn build_id_cache() -> &'static Mutex<HashMap<FileKey, Vec<u8>>> {
    static CACHE: OnceLock<Mutex<HashMap<FileKey, Vec<u8>>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// One parsed line of `/proc/PID/maps`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    pub executable: bool,
    pub offset: u64,
    pub dev: &'a str,
    pub inode: u64,
    pub path: &'a str,
}

/// Parses one line: `start-end perms offset dev inode [path]`; `None` for malformed lines.
pub(crate) fn parse_maps_line(line: &str) -> Option<MapsLine<'_>> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let dev = fields.next()?;
    let inode = fields.next()?;
    // The path is padded with spaces after the inode and may itself contain spaces.
    let path = fields.next().unwrap_or("").trim_start();
    let (start, end) = range.split_once('-')?;
    Some(MapsLine {
        start: u64::from_str_radix(start, 16).ok()?,
        end: u64::from_str_radix(end, 16).ok()?,
        executable: perms.as_bytes().get(2) == Some(&b'x'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev,
        inode: inode.parse().ok()?,
        path,
    })
}

/// Executable, file-backed mappings of process `tgid` (with build-ids), stamped `ts_ns`.
///
/// Anonymous, `[vdso]`-like and deleted mappings are skipped: they cannot be re-opened by
/// path later. A file without a build-id gets an empty `build_id`.
pub fn process_mappings(tgid: u32, ts_ns: u64) -> io::Result<Vec<Mapping>> {
    let text = std::fs::read_to_string(format!("/proc/{tgid}/maps"))?;
    Ok(mappings_of(tgid, ts_ns, &text))
}

/// [`process_mappings`] from a maps file already read, for callers that need more of it.
pub fn mappings_of(tgid: u32, ts_ns: u64, maps: &str) -> Vec<Mapping> {
    mappings_from_maps(tgid, ts_ns, maps, &mut |key: &FileKey| cached_build_id(key))
}

/// Builds mappings from the text of a maps file; `build_id` supplies each file's build-id.
pub(crate) fn mappings_from_maps(
    tgid: u32,
    ts_ns: u64,
    text: &str,
    build_id: &mut dyn FnMut(&FileKey) -> Vec<u8>,
) -> Vec<Mapping> {
    text.lines()
        .filter_map(parse_maps_line)
        .filter(|l| {
            l.executable
                && l.inode != 0
                && l.path.starts_with('/')
                && !l.path.ends_with(" (deleted)")
        })
        .map(|l| {
            let key = l.file_key();
            Mapping {
                tgid,
                start: l.start,
                end: l.end,
                file_offset: l.offset,
                path: l.path.to_string(),
                build_id: build_id(&key),
                ts_ns,
            }
        })
        .collect()
}

fn cached_build_id(key: &FileKey) -> Vec<u8> {
    if let Ok(cache) = build_id_cache().lock()
        && let Some(id) = cache.get(key)
    {
        return id.clone();
    }
    let id = read_build_id(std::path::Path::new(&key.2));
    if let Ok(mut cache) = build_id_cache().lock() {
        cache.insert(key.clone(), id.clone());
    }
    id
}

/// The GNU build-id of an ELF file; empty when it has none or cannot be read. Checked by
/// note name as well as type: a SystemTap note has the same type number, and taking one
/// (as a type-only reader does) would give every user of one library the same "build-id".
pub fn read_build_id(path: &std::path::Path) -> Vec<u8> {
    let Ok(file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let cache = object::ReadCache::new(file);
    // object checks the note's name and type (`GNU`, NT_GNU_BUILD_ID).
    object::File::parse(&cache)
        .ok()
        .and_then(|obj| obj.build_id().ok().flatten().map(<[u8]>::to_vec))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_maps_lines() {
        let l = parse_maps_line(
            "7f0a1c000000-7f0a1c1b5000 r-xp 00028000 fd:01 1234567                    /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .expect("valid line");
        assert_eq!(l.start, 0x7f0a1c000000);
        assert_eq!(l.end, 0x7f0a1c1b5000);
        assert!(l.executable);
        assert_eq!(l.offset, 0x28000);
        assert_eq!(l.inode, 1234567);
        assert_eq!(l.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        let anon = parse_maps_line("7ffd1000-7ffd2000 rw-p 00000000 00:00 0").expect("valid");
        assert_eq!(anon.path, "");
        assert!(!anon.executable);
        assert_eq!(parse_maps_line("garbage"), None);
    }

    #[test]
    fn keeps_only_executable_file_mappings() {
        let maps = "\
55d000000000-55d000001000 r--p 00000000 fd:01 42 /opt/my prog
55d000001000-55d000002000 r-xp 00001000 fd:01 42 /opt/my prog
7fff0000-7fff2000 r-xp 00000000 00:00 0 [vdso]
7f0000000000-7f0000001000 r-xp 00000000 fd:01 43 /tmp/gone (deleted)
7f0000100000-7f0000101000 rwxp 00000000 00:00 0
";
        let mut calls = 0;
        let got = mappings_from_maps(7, 99, maps, &mut |key| {
            calls += 1;
            assert_eq!(key.1, 42);
            vec![0xab, 0xcd]
        });
        assert_eq!(calls, 1);
        assert_eq!(got.len(), 1);
        let m = &got[0];
        assert_eq!(
            (m.tgid, m.ts_ns, m.start, m.end),
            (7, 99, 0x55d000001000, 0x55d000002000)
        );
        assert_eq!(m.file_offset, 0x1000);
        assert_eq!(m.path, "/opt/my prog");
        assert_eq!(m.build_id, vec![0xab, 0xcd]);
    }

    #[test]
    fn own_process_has_its_executable_with_build_id() {
        let maps = process_mappings(std::process::id(), 1).expect("read own maps");
        let exe = std::fs::read_link("/proc/self/exe").expect("own exe");
        let own = maps
            .iter()
            .find(|m| std::path::Path::new(&m.path) == exe)
            .expect("own executable mapped");
        assert!(own.end > own.start);
        assert_eq!(own.build_id, read_build_id(&exe));
        assert!(!own.build_id.is_empty(), "rustc links with --build-id");
    }
}
