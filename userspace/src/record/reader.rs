//! Reading a recording back (being written by the lead).
use std::path::{Path, PathBuf};

use super::Recording;

/// Why a recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Reads a whole recording.
pub fn read_file(path: &Path) -> Result<Recording, ReadError> {
    let file = std::fs::File::open(path).map_err(|source| ReadError::Io { path: path.into(), source })?;
    read_from(file, path)
}

/// Reads a whole recording from any reader; `path` is for messages.
pub fn read_from(_input: impl std::io::Read, _path: &Path) -> Result<Recording, ReadError> {
    Ok(Recording::default())
}
