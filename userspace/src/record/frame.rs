//! How records sit in the file (`proto/energy_bpf.proto`, "Framing").
//!
//! Versions 1 and 2: a varint length, then the `Record`. Nothing tells a flipped byte
//! from data, and a damaged length loses everything after it.
//!
//! Version 3: after the header, every record is a frame
//! `SYNC (4) | length (u32 LE) | CRC32C of length and payload (u32 LE) | payload`.
//! The checksum catches damage; the sync marker lets the reader find the next whole frame
//! after a damaged one by scanning forward and checking each candidate's checksum.

/// First bytes of every version 3 frame. Not a valid start of a protobuf `Record` (field 29,
/// wire type 3), so a version 2 reader sees garbage, never a misread record.
pub const SYNC: [u8; 4] = [0xeb, 0x9f, 0x5a, 0xc3];

/// Sync marker, length, checksum.
pub const FRAME_HEADER_LEN: usize = 12;

/// The largest record a reader accepts, bytes. A drain of the busiest machine we know of
/// writes a few MiB; anything larger is a damaged length. Keeps a single record from
/// claiming the whole file and bounds what one decode may allocate.
pub const MAX_RECORD_LEN: usize = 256 << 20;

/// The checksum stored in a frame: CRC32C of the length bytes then the payload, so a
/// damaged length fails the check as surely as a damaged payload.
pub fn checksum(len: [u8; 4], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len), payload)
}

/// Appends `payload` as one frame to `out`. `None` when the payload is over
/// [`MAX_RECORD_LEN`] (no reader would accept it).
pub fn encode(payload: &[u8], out: &mut Vec<u8>) -> Option<()> {
    if payload.len() > MAX_RECORD_LEN {
        return None;
    }
    let len = u32::try_from(payload.len()).ok()?.to_le_bytes();
    out.extend_from_slice(&SYNC);
    out.extend_from_slice(&len);
    out.extend_from_slice(&checksum(len, payload).to_le_bytes());
    out.extend_from_slice(payload);
    Some(())
}

/// What is at the start of the remaining bytes.
#[derive(Debug, PartialEq)]
pub enum Frame<'a> {
    /// A whole frame whose checksum holds: its payload and its total length.
    Whole {
        /// The record's bytes.
        payload: &'a [u8],
        /// Bytes the frame takes, header included.
        len: usize,
    },
    /// A frame header whose length runs past the end of the input: a recording cut short.
    Cut,
    /// Not a whole frame: no sync marker, an impossible length, or a checksum mismatch.
    Bad,
}

/// Reads the frame at the start of `bytes`.
pub fn parse(bytes: &[u8]) -> Frame<'_> {
    let Some(header) = bytes.get(..FRAME_HEADER_LEN) else {
        // A few bytes of a frame header (or of garbage): a cut tail if they could start one.
        let n = bytes.len().min(SYNC.len());
        return if bytes[..n] == SYNC[..n] {
            Frame::Cut
        } else {
            Frame::Bad
        };
    };
    if header[..4] != SYNC {
        return Frame::Bad;
    }
    let len_bytes = [header[4], header[5], header[6], header[7]];
    let want = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    let len = u32::from_le_bytes(len_bytes) as usize;
    if len > MAX_RECORD_LEN {
        return Frame::Bad;
    }
    let Some(payload) = bytes.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
        return Frame::Cut;
    };
    if checksum(len_bytes, payload) != want {
        return Frame::Bad;
    }
    Frame::Whole {
        payload,
        len: FRAME_HEADER_LEN + len,
    }
}

/// Where the next whole frame starts after damage at the start of `bytes` (never at 0),
/// and how many frames the skipped bytes held (sync markers seen, at least one).
pub fn resync(bytes: &[u8]) -> (Option<usize>, u64) {
    let mut frames = 1;
    let mut at = 1;
    while let Some(found) = find_sync(&bytes[at..]) {
        let pos = at + found;
        if let Frame::Whole { .. } = parse(&bytes[pos..]) {
            return (Some(pos), frames);
        }
        frames += 1;
        at = pos + 1;
    }
    (None, frames)
}

fn find_sync(bytes: &[u8]) -> Option<usize> {
    bytes.windows(SYNC.len()).position(|w| w == SYNC)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in payloads {
            encode(p, &mut out).expect("small payload");
        }
        out
    }

    #[test]
    fn whole_cut_and_damaged_frames() {
        let bytes = frames(&[b"hello", b"world!"]);
        assert_eq!(
            parse(&bytes),
            Frame::Whole {
                payload: b"hello",
                len: 17
            }
        );
        for cut in 1..17 {
            assert_eq!(parse(&bytes[..cut]), Frame::Cut, "cut at {cut}");
        }
        for at in 0..17 {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            assert_ne!(
                parse(&bad),
                Frame::Whole {
                    payload: b"hello",
                    len: 17
                },
                "flip at {at} must not pass"
            );
            assert_eq!(resync(&bad), (Some(17), 1), "flip at {at}");
        }
        assert_eq!(parse(b"\x0a\x00"), Frame::Bad, "a version 2 record");
    }

    #[test]
    fn resync_skips_every_damaged_frame_and_counts_them() {
        let mut bytes = frames(&[b"one", b"two", b"three", b"four"]);
        // Damage the first and second payloads; the third is the next whole frame.
        bytes[13] ^= 1;
        bytes[15 + 13] ^= 1;
        assert_eq!(resync(&bytes), (Some(30), 2));
        // Nothing whole after the damage: the rest is lost, and counted.
        let mut tail = frames(&[b"one", b"two"]);
        tail[13] ^= 1;
        tail[15 + 13] ^= 1;
        assert_eq!(resync(&tail), (None, 2));
    }

    #[test]
    fn oversized_lengths_are_bad_not_cut() {
        let mut bytes = SYNC.to_vec();
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        assert_eq!(parse(&bytes), Frame::Bad);
    }
}
