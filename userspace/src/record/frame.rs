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
const FRAME_HEADER_LEN: usize = 12;

/// The largest record a reader accepts, bytes. A drain of the busiest machine we know of
/// writes a few MiB; anything larger is a damaged length. Keeps a single record from
/// claiming the whole file and bounds what one decode may allocate.
pub(crate) const MAX_RECORD_LEN: usize = 256 << 20;

/// The checksum stored in a frame: CRC32C of the length bytes then the payload, so a
/// damaged length fails the check as surely as a damaged payload.
pub fn checksum(len: [u8; 4], payload: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&len), payload)
}

/// Appends `payload` as one frame to `out`. `None` when the payload is over
/// `MAX_RECORD_LEN` (no reader would accept it).
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

/// Whether `bytes`, a frame whose length runs past the end ([`Frame::Cut`]), can be the
/// start of a frame a writer was stopped in the middle of. It cannot when the bytes there
/// are a whole frame under their own length (the length field was damaged, the checksum
/// says so), or when the payload does not start as a record of the length claimed does
/// (a `Record` is one field, a header, chunk or trailer, filling the payload).
pub(crate) fn looks_cut(bytes: &[u8]) -> bool {
    let Some(header) = bytes.get(..FRAME_HEADER_LEN) else {
        return true;
    };
    let payload = &bytes[FRAME_HEADER_LEN..];
    let want = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    let claimed = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if let Ok(len) = u32::try_from(payload.len())
        && checksum(len.to_le_bytes(), payload) == want
    {
        return false;
    }
    match varint_prefix(payload) {
        Prefix::Short => true,
        Prefix::Bad => false,
        Prefix::Value(0x0a | 0x12 | 0x1a, n) => match varint_prefix(&payload[n..]) {
            Prefix::Short => true,
            Prefix::Bad => false,
            Prefix::Value(inner, m) => {
                usize::try_from(inner).is_ok_and(|inner| n + m + inner == claimed)
            }
        },
        Prefix::Value(..) => false,
    }
}

/// A varint at the start of some bytes.
enum Prefix {
    /// Its value and length.
    Value(u64, usize),
    /// The bytes end inside it.
    Short,
    /// Not a varint.
    Bad,
}

fn varint_prefix(bytes: &[u8]) -> Prefix {
    let mut rest = bytes;
    match super::budget::varint(&mut rest) {
        Ok(v) => Prefix::Value(v, bytes.len() - rest.len()),
        Err(_) if rest.is_empty() && bytes.len() < 10 => Prefix::Short,
        Err(_) => Prefix::Bad,
    }
}

/// Where the next whole frame starts after damage at the start of `bytes` (never at 0),
/// and how many frames the skipped bytes held (sync markers seen, at least one).
#[cfg(test)]
pub(crate) fn resync(bytes: &[u8]) -> (Option<usize>, u64) {
    Resync::new(bytes).next_after(0)
}

/// Bytes of input between two saved checksums in [`Resync`].
const STRIDE: usize = 64;

/// Finds whole frames after damage in time linear in the input.
///
/// Checking a candidate frame by checksumming its payload costs its length, and a crafted
/// file can hold a sync marker every few bytes, each claiming a length that runs to the end:
/// checked one by one, that is quadratic. Instead the CRC32C of every prefix of the input
/// is known from one pass (saved every `STRIDE` bytes, the rest recomputed from the one
/// before), and the checksum of any range follows from two prefixes (CRC32C is linear:
/// `crc(a ++ b) = crc(a) · x^(8|b|) ⊕ crc(b)`), so each candidate costs at most
/// 2 × `STRIDE` bytes and a few multiplications.
pub(crate) struct Resync<'a> {
    bytes: &'a [u8],
    /// CRC32C of `bytes[..i * STRIDE]`; built on first use.
    prefix: Vec<u32>,
    /// Bytes checksummed so far, the table included: the work done.
    pub crc_bytes: u64,
    /// Candidate frames checked.
    pub candidates: u64,
}

impl<'a> Resync<'a> {
    /// Nothing is computed until the first damage.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self {
            bytes,
            prefix: Vec::new(),
            crc_bytes: 0,
            candidates: 0,
        }
    }

    /// Bytes of input.
    pub(crate) fn input_len(&self) -> usize {
        self.bytes.len()
    }

    /// Like [`resync`] for damage at `bytes[at..]`: the offset in `bytes` of the next whole
    /// frame after `at`, and how many frames the skipped bytes held.
    pub(crate) fn next_after(&mut self, at: usize) -> (Option<usize>, u64) {
        let mut frames = 1;
        let mut from = at + 1;
        while let Some(found) = self.bytes.get(from..).and_then(find_sync) {
            let pos = from + found;
            if self.whole_at(pos) {
                return (Some(pos), frames);
            }
            frames += 1;
            from = pos + 1;
        }
        (None, frames)
    }

    /// Whether a whole frame (see [`parse`]) starts at `pos`, where there is a sync marker.
    fn whole_at(&mut self, pos: usize) -> bool {
        self.candidates += 1;
        let Some(header) = self.bytes.get(pos..pos + FRAME_HEADER_LEN) else {
            return false;
        };
        let len_bytes = [header[4], header[5], header[6], header[7]];
        let want = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        let len = u32::from_le_bytes(len_bytes) as usize;
        let start = pos + FRAME_HEADER_LEN;
        if len > MAX_RECORD_LEN || start + len > self.bytes.len() {
            return false;
        }
        // crc(payload) from the prefixes around it, then crc(length ++ payload).
        let payload = self.prefix_crc(start + len) ^ shift(self.prefix_crc(start), len);
        let got = shift(crc32c::crc32c(&len_bytes), len) ^ payload;
        got == want
    }

    /// CRC32C of `bytes[..end]`.
    fn prefix_crc(&mut self, end: usize) -> u32 {
        if self.prefix.is_empty() {
            self.prefix.reserve_exact(self.bytes.len() / STRIDE + 1);
            let mut crc = 0;
            self.prefix.push(crc);
            for block in self.bytes.chunks_exact(STRIDE) {
                crc = crc32c::crc32c_append(crc, block);
                self.prefix.push(crc);
            }
            self.crc_bytes += self.bytes.len() as u64;
        }
        let k = end / STRIDE;
        self.crc_bytes += (end - k * STRIDE) as u64;
        crc32c::crc32c_append(self.prefix[k], &self.bytes[k * STRIDE..end])
    }
}

/// CRC32C's polynomial, bit-reflected as the checksum is computed.
const POLY: u32 = 0x82f6_3b78;

/// `a · b` modulo the polynomial, both reflected (as zlib's `multmodp`).
fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut m = 1u32 << 31;
    while m != 0 {
        if a & m != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        m >>= 1;
    }
    product
}

/// `x^(2^k)` modulo the polynomial, reflected, for k = 0..64.
static X_POW_2K: std::sync::LazyLock<[u32; 64]> = std::sync::LazyLock::new(|| {
    let mut table = [0; 64];
    let mut p = 1u32 << 30; // x^1
    for t in &mut table {
        *t = p;
        p = multiply(p, p);
    }
    table
});

/// `crc · x^(8 · bytes)`: what a checksum becomes when `bytes` bytes follow its data
/// (zlib's `crc32_combine` without the second checksum).
fn shift(crc: u32, bytes: usize) -> u32 {
    let mut n = bytes as u64;
    let mut k = 3; // x^(8n) = x^(2^3 · n)
    let mut out = crc;
    while n != 0 {
        if n & 1 != 0 {
            out = multiply(X_POW_2K[k], out);
        }
        n >>= 1;
        k += 1;
    }
    out
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

    #[test]
    fn shift_is_crc32c_combine() {
        let data: Vec<u8> = (0..5_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for (a, b) in [
            (0, 0),
            (0, 1),
            (3, 17),
            (100, 4_096),
            (64, 5_000),
            (4_999, 5_000),
        ] {
            let (head, tail) = (&data[..a], &data[a..b]);
            let whole = crc32c::crc32c(&data[..b]);
            assert_eq!(
                shift(crc32c::crc32c(head), tail.len()) ^ crc32c::crc32c(tail),
                whole,
                "{a}..{b}"
            );
        }
    }

    /// The reference: every sync marker after the first byte, checked with [`parse`].
    fn resync_by_parsing(bytes: &[u8]) -> (Option<usize>, u64) {
        let mut frames = 1;
        for pos in 1..bytes.len() {
            if bytes[pos..].starts_with(&SYNC) {
                if let Frame::Whole { .. } = parse(&bytes[pos..]) {
                    return (Some(pos), frames);
                }
                frames += 1;
            }
        }
        (None, frames)
    }

    #[test]
    fn resync_finds_what_parsing_every_marker_finds() {
        let payloads: Vec<Vec<u8>> = (0..40u8)
            .map(|i| (0..u32::from(i) * 37).map(|k| (k as u8) ^ i).collect())
            .collect();
        let whole = frames(&payloads.iter().map(Vec::as_slice).collect::<Vec<_>>());
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..300 {
            let mut bytes = whole.clone();
            for _ in 0..=(x % 6) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = (x >> 8) as usize % bytes.len();
                bytes[at] ^= (x >> 40) as u8 | 1;
            }
            // Some damage where it hurts most: lengths, and cuts.
            if x.is_multiple_of(3) {
                bytes.truncate(bytes.len() - (x >> 20) as usize % 200);
            }
            let mut resync = Resync::new(&bytes);
            let mut at = 0;
            loop {
                let found = resync.next_after(at);
                let (pos, n) = resync_by_parsing(&bytes[at..]);
                assert_eq!(found, (pos.map(|p| p + at), n), "damage at {at}");
                match found.0 {
                    Some(next) => at = next,
                    None => break,
                }
            }
        }
    }

    /// A crafted file: a frame header every 12 bytes, each claiming a length that runs
    /// nearly to the end of the file, with a wrong checksum, and one whole frame at the
    /// end. Checked one by one, the candidates would cost the square of the file's size.
    #[test]
    fn resync_is_linear_in_the_input() {
        const SIZE: usize = 2 << 20;
        let mut bytes = Vec::with_capacity(SIZE + 64);
        while bytes.len() < SIZE {
            let len = (SIZE - bytes.len()) as u32;
            bytes.extend_from_slice(&SYNC);
            bytes.extend_from_slice(&len.to_le_bytes());
            bytes.extend_from_slice(&0xdead_beefu32.to_le_bytes());
        }
        let end = bytes.len();
        encode(b"the next whole frame", &mut bytes).expect("small payload");
        let mut resync = Resync::new(&bytes);
        let (next, frames) = resync.next_after(0);
        assert_eq!(next, Some(end));
        assert_eq!(frames, (end / FRAME_HEADER_LEN) as u64);
        assert_eq!(resync.candidates, frames);
        // One pass over the input, then at most two strides per candidate.
        let n = bytes.len() as u64;
        assert!(
            resync.crc_bytes <= n + 2 * STRIDE as u64 * resync.candidates,
            "{} bytes checksummed for {n} bytes of input",
            resync.crc_bytes
        );
        assert!(resync.crc_bytes <= 12 * n, "{}", resync.crc_bytes);
    }
}
