//! Line numbers from a code object's line table, in the three formats CPython 3.9 to 3.13
//! use (CPython's `Objects/lnotab_notes.txt` of each version): the 3.9 `co_lnotab`, the
//! 3.10 `co_linetable`, and the 3.11+ location table. Pure functions over bytes read from
//! another process: every step is bounded by the table's length and never panics.

/// Which table format a code object carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFormat {
    /// 3.9 `co_lnotab`: (byte-offset increment, signed line increment) pairs; offsets in
    /// bytes.
    Lnotab,
    /// 3.10 `co_linetable`: (byte-offset delta, signed line delta, -128 = no line) pairs;
    /// offsets in bytes.
    Linetable,
    /// 3.11+ location table: variable-length entries over code units (2 bytes).
    Locations,
}

/// The line of the instruction at `offset` (bytes for [`LineFormat::Lnotab`] and
/// [`LineFormat::Linetable`], code units for [`LineFormat::Locations`]), or `None` when the
/// table gives it none or is malformed before reaching it.
pub fn line_at(format: LineFormat, table: &[u8], firstlineno: u32, offset: u64) -> Option<u32> {
    let first = i64::from(firstlineno);
    let line = match format {
        LineFormat::Lnotab => lnotab(table, first, offset),
        LineFormat::Linetable => linetable(table, first, offset),
        LineFormat::Locations => locations(table, first, offset),
    }?;
    u32::try_from(line).ok()
}

fn lnotab(table: &[u8], first: i64, offset: u64) -> Option<i64> {
    let mut line = first;
    let mut addr: u64 = 0;
    for pair in table.chunks_exact(2) {
        addr += u64::from(pair[0]);
        if addr > offset {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    Some(line)
}

fn linetable(table: &[u8], first: i64, offset: u64) -> Option<i64> {
    let mut computed = first;
    let mut start: u64 = 0;
    for pair in table.chunks_exact(2) {
        let end = start + u64::from(pair[0]);
        let delta = pair[1] as i8;
        let line = if delta == -128 {
            None
        } else {
            computed += i64::from(delta);
            Some(computed)
        };
        if start <= offset && offset < end {
            return line;
        }
        start = end;
    }
    None
}

/// A cursor over a location table.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    /// CPython's location-table varint: 6-bit groups, least significant first, bit 6 set
    /// on all but the last.
    fn varint(&mut self) -> Option<u64> {
        let mut b = self.byte()?;
        let mut value = u64::from(b & 63);
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 42 {
                return None;
            }
            value |= u64::from(b & 63) << shift;
        }
        Some(value)
    }

    fn svarint(&mut self) -> Option<i64> {
        let u = self.varint()?;
        let magnitude = (u >> 1) as i64;
        Some(if u & 1 != 0 { -magnitude } else { magnitude })
    }
}

fn locations(table: &[u8], first: i64, offset: u64) -> Option<i64> {
    let mut c = Cursor {
        bytes: table,
        at: 0,
    };
    let mut line = first;
    let mut addr: u64 = 0;
    while c.at < table.len() {
        let head = c.byte()?;
        if head & 0x80 == 0 {
            // Not the start of an entry: malformed.
            return None;
        }
        let code = (head >> 3) & 15;
        let length = u64::from(head & 7) + 1;
        let delta = match code {
            // No location.
            15 => None,
            // Long form: line delta, end line delta, column + 1, end column + 1.
            14 => {
                let d = c.svarint()?;
                c.varint()?;
                c.varint()?;
                c.varint()?;
                Some(d)
            }
            // No columns.
            13 => Some(c.svarint()?),
            // One line, columns in two bytes.
            10..=12 => {
                c.byte()?;
                c.byte()?;
                Some(i64::from(code) - 10)
            }
            // Short form: same line, columns in one byte.
            _ => {
                c.byte()?;
                Some(0)
            }
        };
        let here = match delta {
            Some(d) => {
                line = line.checked_add(d)?;
                Some(line)
            }
            None => None,
        };
        if addr <= offset && offset < addr + length {
            return here;
        }
        addr += length;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lnotab_walks_increments_up_to_the_offset() {
        // Lines 10 (bytes 0-5), 12 (6-13), 11 (14-).
        let t = [6, 2, 8, (-1i8) as u8];
        assert_eq!(line_at(LineFormat::Lnotab, &t, 10, 0), Some(10));
        assert_eq!(line_at(LineFormat::Lnotab, &t, 10, 5), Some(10));
        assert_eq!(line_at(LineFormat::Lnotab, &t, 10, 6), Some(12));
        assert_eq!(line_at(LineFormat::Lnotab, &t, 10, 14), Some(11));
    }

    #[test]
    fn linetable_gives_ranges_and_no_line() {
        // [0, 4) line 5; [4, 10) no line; [10, 12) line 7.
        let t = [4, 0, 6, 0x80, 2, 2];
        assert_eq!(line_at(LineFormat::Linetable, &t, 5, 2), Some(5));
        assert_eq!(line_at(LineFormat::Linetable, &t, 5, 4), None);
        assert_eq!(line_at(LineFormat::Linetable, &t, 5, 11), Some(7));
        assert_eq!(
            line_at(LineFormat::Linetable, &t, 5, 12),
            None,
            "past the end"
        );
    }

    #[test]
    fn location_table_forms() {
        let t = [
            // Short form, 2 code units, same line (10).
            0x80 | 1,
            0x00,
            // One-line form, +2 lines (12), 1 unit.
            0x80 | (12 << 3),
            3,
            7,
            // No-column form, delta -1 (svarint 3 = -1) -> 11, 3 units.
            0x80 | (13 << 3) | 2,
            3,
            // None, 1 unit.
            0x80 | (15 << 3),
            // Long form, +40 lines (svarint 80: 0b1010000 = 16 | 64 -> two groups), 1 unit.
            0x80 | (14 << 3),
            64 | 16,
            1,
            0,
            1,
            2,
        ];
        let at = |o| line_at(LineFormat::Locations, &t, 10, o);
        assert_eq!(at(0), Some(10));
        assert_eq!(at(1), Some(10));
        assert_eq!(at(2), Some(12));
        assert_eq!(at(3), Some(11));
        assert_eq!(at(5), Some(11));
        assert_eq!(at(6), None);
        assert_eq!(at(7), Some(51));
        assert_eq!(at(8), None, "past the end");
    }

    #[test]
    fn garbage_never_panics() {
        for len in 0..64usize {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            for f in [
                LineFormat::Lnotab,
                LineFormat::Linetable,
                LineFormat::Locations,
            ] {
                for o in [0, 1, 7, u64::MAX] {
                    let _ = line_at(f, &bytes, u32::MAX, o);
                }
            }
        }
        // A varint that never ends.
        let t = [
            0x80 | (13 << 3),
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
            0xff,
        ];
        assert_eq!(line_at(LineFormat::Locations, &t, 1, 0), None);
    }
}
