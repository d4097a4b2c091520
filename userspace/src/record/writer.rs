//! Appending records to a recording file. Each record is written whole, in one write, so
//! a recorder killed between writes leaves a file that reads back to its last record; a
//! write that fails (disk full) is cut back off the file, so the file still ends on a
//! whole record and a trailer may follow.

use std::{
    fs::File,
    io::{Seek as _, SeekFrom, Write as _},
    path::{Path, PathBuf},
};

use prost::Message as _;

use super::{MAGIC, frame};
use crate::output::file::{CreateError, create_private};
use crate::pb::v1::{Chunk, Header, Record, SymbolTable, Trailer, record::Kind};

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Creating the file failed (permissions, missing directory, a planted symlink).
    #[error(transparent)]
    Create(#[from] CreateError),
    /// Writing failed (disk full, I/O error).
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A record over `frame::MAX_RECORD_LEN`: no reader would accept it.
    #[error("cannot write {path}: a record of {len} bytes is over the {max} byte limit")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The record's size.
        len: usize,
        /// The limit.
        max: usize,
    },
}

impl WriteError {
    /// Whether the disk (or the file system's quota) is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Self::Io { source, .. }
            if matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)))
    }
}

/// Appends records to a recording file.
pub struct Writer {
    out: File,
    path: PathBuf,
    /// Frame records with a checksum (format version 3) or write them bare (1 and 2,
    /// kept so tests can write old files).
    framed: bool,
    record: Vec<u8>,
    buf: Vec<u8>,
    /// Bytes of whole records in the file.
    bytes: u64,
}

impl Writer {
    /// Creates (truncates) `path` with mode 0600, refusing a symlink, and writes the magic
    /// and `header` in the framing of `header.format_version`.
    pub fn create(path: &Path, header: &Header) -> Result<Self, WriteError> {
        let mut writer = Self {
            out: create_private(path)?,
            path: path.into(),
            framed: header.format_version >= 3,
            record: Vec::new(),
            buf: Vec::new(),
            bytes: 0,
        };
        writer.buf.extend_from_slice(MAGIC);
        Record {
            kind: Some(Kind::Header(header.clone())),
        }
        .encode_length_delimited(&mut writer.buf)
        .map_err(|e| writer.io(std::io::Error::other(e)))?;
        if writer.framed {
            // Version 3: the header stays a bare record, so older readers still find its
            // version and refuse it clearly; its checksum follows.
            let crc = crc32c::crc32c(&writer.buf[MAGIC.len()..]);
            writer.buf.extend_from_slice(&crc.to_le_bytes());
        }
        writer.flush_buf()?;
        Ok(writer)
    }

    /// Appends one chunk. Its switch events go on disk as columns (format version 2); a
    /// reader turns them back into `switches`.
    pub fn chunk(&mut self, mut chunk: Chunk) -> Result<(), WriteError> {
        if !chunk.switches.is_empty() {
            chunk.switch_columns = Some(super::columns::to_columns(&chunk.switches));
            chunk.switches = Vec::new();
        }
        self.write(Kind::Chunk(chunk))
    }

    /// Appends the names of the recording's addresses (written once, at the end, before
    /// the trailer; a large table goes as several records).
    pub fn symbols(&mut self, table: SymbolTable) -> Result<(), WriteError> {
        self.write(Kind::Symbols(table))
    }

    /// Appends the trailer that marks a clean finish, and syncs the file.
    pub fn finish(mut self, trailer: Trailer) -> Result<u64, WriteError> {
        self.write(Kind::Trailer(trailer))?;
        self.out.sync_all().map_err(|e| self.io(e))?;
        Ok(self.bytes)
    }

    /// Bytes of whole records written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn write(&mut self, kind: Kind) -> Result<(), WriteError> {
        self.buf.clear();
        let record = Record { kind: Some(kind) };
        if self.framed {
            self.record.clear();
            record
                .encode(&mut self.record)
                .map_err(|e| self.io(std::io::Error::other(e)))?;
            frame::encode(&self.record, &mut self.buf).ok_or_else(|| WriteError::TooLarge {
                path: self.path.clone(),
                len: self.record.len(),
                max: frame::MAX_RECORD_LEN,
            })?;
        } else {
            record
                .encode_length_delimited(&mut self.buf)
                .map_err(|e| self.io(std::io::Error::other(e)))?;
        }
        self.flush_buf()
    }

    /// Writes `buf` whole or not at all: after a failed write the partial record is cut
    /// off, so the file ends on a whole record.
    fn flush_buf(&mut self) -> Result<(), WriteError> {
        if let Err(e) = self.out.write_all(&self.buf) {
            // Best effort: a file we cannot shorten still reads back (as cut short).
            if self.out.set_len(self.bytes).is_ok() {
                let _ = self.out.seek(SeekFrom::Start(self.bytes));
            }
            return Err(self.io(e));
        }
        self.bytes += self.buf.len() as u64;
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> WriteError {
        WriteError::Io {
            path: self.path.clone(),
            source,
        }
    }
}
