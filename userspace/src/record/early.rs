//! Closing a recording whose writing failed (disk full, I/O error). The writer has cut the
//! partial record off, so the file ends on a whole record; a trailer saying why is tried
//! (the cut-off record freed more than a trailer needs), and the caller learns what the
//! file keeps.

use super::{WriteError, Writer};
use crate::pb::v1::Trailer;

/// What a recording stopped by a write error keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kept {
    /// Closed with a trailer naming the error: it reads normally.
    Closed {
        /// Seconds from the recording's start to the trailer.
        secs: f64,
        /// The file's size.
        bytes: u64,
    },
    /// The trailer could not be written either: everything before the error is there, and
    /// the file reads as cut short.
    CutShort,
}

/// Closes `writer` after `err` with a trailer whose stop reason is the error; `start_ns`
/// is the header's start.
pub fn close_after_error(writer: Writer, err: &WriteError, start_ns: u64) -> Kept {
    let end_ns = crate::clock::monotonic_ns();
    match writer.finish(Trailer {
        end_ns,
        stop_reason: format!("error: {err}"),
        losses: None,
    }) {
        Ok(bytes) => Kept::Closed {
            secs: end_ns.saturating_sub(start_ns) as f64 / 1e9,
            bytes,
        },
        Err(_) => Kept::CutShort,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::Header;

    #[test]
    fn the_trailer_names_the_error_and_the_file_reads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.ebpr");
        let start_ns = crate::clock::monotonic_ns();
        let writer = Writer::create(
            &path,
            &Header {
                format_version: super::super::FORMAT_VERSION,
                start_ns,
                ..Default::default()
            },
        )
        .expect("create");
        let err = WriteError::TooLarge {
            path: path.clone(),
            len: 9,
            max: 8,
        };
        let kept = close_after_error(writer, &err, start_ns);
        let Kept::Closed { secs, bytes } = kept else {
            panic!("not closed: {kept:?}");
        };
        assert!(secs >= 0.0 && bytes > 0, "{kept:?}");
        let rec = super::super::read_file(&path).expect("reads");
        assert!(!rec.truncated);
        assert_eq!(
            rec.stop_reason.as_deref(),
            Some(format!("error: {err}").as_str())
        );
    }
}
