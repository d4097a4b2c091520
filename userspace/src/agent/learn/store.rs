//! The learned intervals on disk: `static-learned.json` in the agent's state directory
//! (`--state-dir`, default `/var/lib/energy-bpf`), keyed by host and source key like the
//! calibration file. Written atomically (a private temporary file, fsync, rename) with mode
//! 0600; read bounded. A file that is damaged, truncated, too large or of another version
//! is treated as empty with one warning: the agent learns again rather than stop.

use std::{
    collections::BTreeMap,
    io::Read as _,
    os::unix::fs::DirBuilderExt as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::keeper::{CAPACITY, Keeper};

/// Where the agent keeps state unless `--state-dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/energy-bpf";
/// The file's name in the state directory.
const FILE_NAME: &str = "static-learned.json";
/// Format version.
pub const VERSION: u32 = 1;
/// Sources kept per host: more than any machine has counters.
const MAX_SOURCES: usize = 64;
/// Largest file read: 64 sources × 64 intervals at ~200 bytes is under 1 MiB.
const MAX_BYTES: u64 = 2 << 20;

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LearnedFile {
    /// Format version.
    pub version: u32,
    /// Per host name, per source key (`kind:name`), the kept intervals.
    pub hosts: BTreeMap<String, BTreeMap<String, Keeper>>,
}

/// Why the file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write learned static power {path}: {source}")]
pub struct SaveError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub source: std::io::Error,
}

/// The file in `state_dir`.
pub fn path_in(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE_NAME)
}

/// This host's keepers from `path`; empty when there is no file, and empty with a warning
/// when it cannot be used. They are bounded again ([`Keeper::sanitised`]) once the agent
/// knows each source's CPUs.
pub fn load(path: &Path, host: &str) -> BTreeMap<String, Keeper> {
    match read(path) {
        Ok(Some(mut file)) => file
            .hosts
            .remove(host)
            .unwrap_or_default()
            .into_iter()
            .take(MAX_SOURCES)
            .collect(),
        Ok(None) => BTreeMap::new(),
        Err(why) => {
            tracing::warn!(
                "ignoring learned static power {}: {why}; learning again",
                path.display()
            );
            BTreeMap::new()
        }
    }
}

fn read(path: &Path) -> Result<Option<LearnedFile>, String> {
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut text = String::new();
    f.take(MAX_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_BYTES {
        return Err(format!("larger than {MAX_BYTES} bytes"));
    }
    let file: LearnedFile = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    if file.version != VERSION {
        return Err(format!(
            "format version {} (expected {VERSION})",
            file.version
        ));
    }
    Ok(Some(file))
}

/// Writes this host's keepers atomically with mode 0600, creating the directory (0700).
/// Only this host is written: a state directory belongs to one machine.
pub fn save(path: &Path, host: &str, keepers: &BTreeMap<String, Keeper>) -> Result<(), SaveError> {
    let err = |source| SaveError {
        path: path.to_owned(),
        source,
    };
    let bounded: BTreeMap<String, Keeper> = keepers
        .iter()
        .filter(|(_, k)| !k.kept.is_empty())
        .take(MAX_SOURCES)
        .map(|(key, k)| {
            let mut k = k.clone();
            k.kept.truncate(CAPACITY);
            (key.clone(), k)
        })
        .collect();
    let file = LearnedFile {
        version: VERSION,
        hosts: BTreeMap::from([(host.to_owned(), bounded)]),
    };
    let text = serde_json::to_vec(&file).map_err(|e| err(std::io::Error::other(e)))?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(err)?;
    }
    // Created 0600 (no window in which others could open it), refused if planted.
    crate::calibration::write_atomically(path, &text, 0o600).map_err(err)
}
