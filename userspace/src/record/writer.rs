//! Appending records to a recording file. Each record is written whole and flushed, so a
//! recorder killed between writes leaves a file that reads back to its last record.

use std::{
    fs::{File, OpenOptions},
    io::{BufWriter, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use prost::Message as _;

use super::MAGIC;
use crate::pb::v1::{Chunk, Header, Record, Trailer, record::Kind};

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// Creating or writing the file failed (permissions, missing directory, disk full).
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Appends records to a recording file.
pub struct Writer {
    out: BufWriter<File>,
    path: PathBuf,
    buf: Vec<u8>,
    bytes: u64,
}

impl Writer {
    /// Creates (truncates) `path` with mode 0600 and writes the magic and `header`.
    pub fn create(path: &Path, header: &Header) -> Result<Self, WriteError> {
        let io = |source| WriteError::Io {
            path: path.into(),
            source,
        };
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let mut writer = Self {
            out: BufWriter::new(file),
            path: path.into(),
            buf: Vec::new(),
            bytes: 0,
        };
        writer.out.write_all(MAGIC).map_err(io)?;
        writer.bytes += MAGIC.len() as u64;
        writer.write(Kind::Header(header.clone()))?;
        Ok(writer)
    }

    /// Appends one chunk and flushes it to the file. Its switch events go on disk as
    /// columns (format version 2); a reader turns them back into `switches`.
    pub fn chunk(&mut self, mut chunk: Chunk) -> Result<(), WriteError> {
        if !chunk.switches.is_empty() {
            chunk.switch_columns = Some(super::columns::to_columns(&chunk.switches));
            chunk.switches = Vec::new();
        }
        self.write(Kind::Chunk(chunk))
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Appends the trailer that marks a clean finish, and syncs the file.
    pub fn finish(mut self, trailer: Trailer) -> Result<u64, WriteError> {
        self.write(Kind::Trailer(trailer))?;
        self.out
            .get_ref()
            .sync_all()
            .map_err(|source| WriteError::Io {
                path: self.path.clone(),
                source,
            })?;
        Ok(self.bytes)
    }

    fn write(&mut self, kind: Kind) -> Result<(), WriteError> {
        self.buf.clear();
        Record { kind: Some(kind) }
            .encode_length_delimited(&mut self.buf)
            .map_err(|e| WriteError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(e),
            })?;
        self.out
            .write_all(&self.buf)
            .and_then(|()| self.out.flush())
            .map_err(|source| WriteError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.bytes += self.buf.len() as u64;
        Ok(())
    }
}
