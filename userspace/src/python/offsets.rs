//! Where CPython keeps what the frame walker and the symbolizer read, per minor version.
//!
//! 3.9 to 3.12 use tables derived with `offsetof` against each version's headers
//! (`Include/internal` included; the program is `offsets.c` beside this file), and checked
//! against Debian's 3.11. 3.13 describes itself: `_Py_DebugOffsets` (cookie `xdebugpy`) at
//! the start of `_PyRuntime`, read from the live process ([`Table::from_debug_offsets`]);
//! the 3.13 table here is its fallback and its test.

use energy_bpf_abi::{PyProcess, py_layout};

use super::linetable::LineFormat;

/// A CPython version, `major.minor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// 3.
    pub major: u8,
    /// 9 to 13 are walked.
    pub minor: u8,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl Version {
    /// The version in a file name such as `python3.11`, `libpython3.9.so.1.0` or
    /// `python3.13d`.
    pub fn from_file_name(name: &str) -> Option<Self> {
        let rest = name
            .strip_prefix("lib")
            .unwrap_or(name)
            .strip_prefix("python")?;
        let (major, rest) = rest.split_once('.')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        Some(Self {
            major: major.parse().ok()?,
            minor: digits.parse().ok()?,
        })
    }
}

/// How a version's objects are laid out, for the walker and the symbolizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table {
    /// The version the offsets are for.
    pub version: Version,
    /// What the probe reads (its `runtime` is left 0: it is per process).
    pub walk: PyProcess,
    /// `PyCodeObject.co_qualname` (3.11+).
    pub code_qualname: Option<u32>,
    /// `PyCodeObject.co_linetable` (3.10+) or `co_lnotab`.
    pub code_lines: u32,
    /// Line table format.
    pub lines: LineFormat,
    /// Whether the probe's offsets are in bytes (3.9 `f_lasti`), not code units.
    pub offset_in_bytes: bool,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters start.
    pub ascii_size: u32,
    /// `sizeof(PyCompactUnicodeObject)`: where a compact non-ASCII string's start.
    pub compact_size: u32,
}

/// Oldest and newest minor versions of Python 3 walked.
pub const OLDEST: u8 = 9;
/// Newest minor version of Python 3 walked.
pub const NEWEST: u8 = 13;

#[allow(clippy::too_many_arguments)]
const fn walk(
    layout: u32,
    interpreters_head: u32,
    threads_head: u32,
    tstate_thread_id: u32,
    tstate_frame: u32,
    cframe_current_frame: u32,
    frame: [u32; 4],
    code: [u32; 3],
) -> PyProcess {
    PyProcess {
        runtime: 0,
        layout,
        interpreters_head,
        threads_head,
        tstate_next: 8,
        tstate_thread_id,
        tstate_frame,
        cframe_current_frame,
        frame_code: frame[0],
        frame_previous: frame[1],
        frame_instr: frame[2],
        frame_owner: frame[3],
        code_name: code[0],
        code_firstlineno: code[1],
        code_adaptive: code[2],
    }
}

impl Table {
    /// The table of Python 3.`minor`, if walked.
    pub fn of(version: Version) -> Option<Self> {
        if version.major != 3 {
            return None;
        }
        // frame: [code, previous, instr, owner]; code: [co_name, co_firstlineno, adaptive].
        let (walk, qualname, lines_at, lines, ascii, compact) = match version.minor {
            9 => (
                walk(
                    py_layout::FRAME_OBJECT,
                    32,
                    8,
                    176,
                    24,
                    0,
                    [32, 24, 104, 0],
                    [112, 40, 0],
                ),
                None,
                120,
                LineFormat::Lnotab,
                48,
                72,
            ),
            10 => (
                walk(
                    py_layout::FRAME_OBJECT,
                    32,
                    8,
                    176,
                    24,
                    0,
                    [32, 24, 96, 0],
                    [112, 40, 0],
                ),
                None,
                120,
                LineFormat::Linetable,
                48,
                72,
            ),
            11 => (
                walk(
                    py_layout::CFRAME_IS_ENTRY,
                    40,
                    16,
                    152,
                    56,
                    8,
                    [32, 48, 56, 68],
                    [120, 72, 184],
                ),
                Some(128),
                136,
                LineFormat::Locations,
                48,
                72,
            ),
            12 => (
                walk(
                    py_layout::CFRAME_OWNER,
                    40,
                    72,
                    136,
                    56,
                    0,
                    [0, 8, 56, 70],
                    [120, 68, 192],
                ),
                Some(128),
                136,
                LineFormat::Locations,
                40,
                56,
            ),
            13 => (
                walk(
                    py_layout::CURRENT_FRAME,
                    632,
                    7344,
                    152,
                    72,
                    0,
                    [0, 8, 56, 70],
                    [120, 68, 200],
                ),
                Some(128),
                136,
                LineFormat::Locations,
                40,
                56,
            ),
            _ => return None,
        };
        Some(Self {
            version,
            walk,
            code_qualname: qualname,
            code_lines: lines_at,
            lines,
            offset_in_bytes: version.minor == 9,
            ascii_size: ascii,
            compact_size: compact,
        })
    }

    /// The 3.13 table from the `_Py_DebugOffsets` at the start of `_PyRuntime` (`bytes`,
    /// at least `DEBUG_OFFSETS_LEN` of them); `None` when the cookie or version do not
    /// match, or the build is free-threaded (not walked).
    pub fn from_debug_offsets(bytes: &[u8]) -> Option<Self> {
        if bytes.get(..8)? != b"xdebugpy" {
            return None;
        }
        let word = |i: usize| -> Option<u64> {
            let b = bytes.get(i * 8..i * 8 + 8)?;
            Some(u64::from_le_bytes(b.try_into().ok()?))
        };
        let hex = word(1)?;
        let version = Version {
            major: ((hex >> 24) & 0xff) as u8,
            minor: ((hex >> 16) & 0xff) as u8,
        };
        if version
            != (Version {
                major: 3,
                minor: 13,
            })
            || word(2)? != 0
        {
            return None;
        }
        let mut t = Self::of(version)?;
        let small = |i: usize| word(i).and_then(|v| u32::try_from(v).ok());
        t.walk.interpreters_head = small(5)?;
        t.walk.threads_head = small(9)?;
        t.walk.tstate_next = small(21)?;
        t.walk.tstate_frame = small(23)?;
        t.walk.tstate_thread_id = small(24)?;
        t.walk.frame_previous = small(29)?;
        t.walk.frame_code = small(30)?;
        t.walk.frame_instr = small(31)?;
        t.walk.frame_owner = small(33)?;
        let filename = small(35)?;
        t.walk.code_name = small(36)?;
        t.code_qualname = Some(small(37)?);
        t.code_lines = small(38)?;
        t.walk.code_firstlineno = small(39)?;
        t.walk.code_adaptive = small(43)?;
        // The probe reads co_filename just before co_name.
        (filename + 8 == t.walk.code_name).then_some(t)
    }
}

/// Bytes of `_Py_DebugOffsets` [`Table::from_debug_offsets`] reads (3.13).
pub const DEBUG_OFFSETS_LEN: usize = 44 * 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_from_file_names() {
        let v = |s| Version::from_file_name(s);
        assert_eq!(
            v("python3.11"),
            Some(Version {
                major: 3,
                minor: 11
            })
        );
        assert_eq!(
            v("libpython3.9.so.1.0"),
            Some(Version { major: 3, minor: 9 })
        );
        assert_eq!(
            v("python3.13d"),
            Some(Version {
                major: 3,
                minor: 13
            })
        );
        assert_eq!(v("python3"), None);
        assert_eq!(v("ls"), None);
    }

    #[test]
    fn every_table_reads_the_file_name_just_before_the_name() {
        // co_filename offsets from offsets.c: 104 (3.9, 3.10), 112 (3.11-3.13).
        for (minor, filename) in [(9, 104), (10, 104), (11, 112), (12, 112), (13, 112)] {
            let t = Table::of(Version { major: 3, minor }).expect("walked");
            assert_eq!(t.walk.code_name, filename + 8, "3.{minor}");
        }
        assert!(Table::of(Version { major: 3, minor: 8 }).is_none());
        assert!(
            Table::of(Version {
                major: 3,
                minor: 14
            })
            .is_none()
        );
    }

    #[test]
    fn debug_offsets_need_the_cookie_and_3_13() {
        let mut bytes = vec![0u8; DEBUG_OFFSETS_LEN];
        assert!(Table::from_debug_offsets(&bytes).is_none());
        bytes[..8].copy_from_slice(b"xdebugpy");
        bytes[8..16].copy_from_slice(&0x030c_00f0u64.to_le_bytes());
        assert!(Table::from_debug_offsets(&bytes).is_none(), "3.12");
        assert!(Table::from_debug_offsets(&bytes[..16]).is_none(), "short");
    }
}
