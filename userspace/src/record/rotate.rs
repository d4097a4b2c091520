//! Rotating recordings for the always-on agent: the recording format as a series of files in
//! one directory, each of bounded size and age, pruned by a retention rule.
//!
//! Every file is a whole recording on its own: a new file starts with a chunk that repeats
//! what earlier files told (sources, thread names, mappings, loss counters), so any file,
//! or any run of files, reports alone. Each chunk is flushed as written, so a SIGKILLed agent
//! leaves every file readable (the last one marked cut short).

use std::{
    path::{Path, PathBuf},
    str::FromStr,
    time::Duration,
};

use super::{LiveTables, WriteError, Writer};
use crate::pb::v1::{Chunk, EnergySource, Header, LossCounters, Trailer};

/// File names are `energy-bpf-<unix seconds, 20 digits>-<sequence>.ebpr`: sorting by name
/// is sorting by time.
const PREFIX: &str = "energy-bpf-";
/// Extension of recording files.
const EXTENSION: &str = "ebpr";

/// How much to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retain {
    /// Files that ended within this long.
    Age(Duration),
    /// The newest files up to this many bytes in all.
    Size(u64),
}

impl FromStr for Retain {
    type Err = String;

    /// `7d`, `12h`, `30m` (a duration), or `500MiB`, `2GB`, `1G` (a size).
    fn from_str(text: &str) -> Result<Self, String> {
        let t = text.trim();
        let split = t
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num
            .parse()
            .map_err(|_| format!("`{text}` is neither a duration (7d, 12h) nor a size (500MiB)"))?;
        let unit = unit.trim().to_ascii_lowercase();
        let bytes = match unit.as_str() {
            "b" => Some(1.0),
            "k" | "kb" | "kib" => Some(1024.0),
            "mb" | "mib" => Some(1024.0 * 1024.0), // a bare `m` is minutes
            "g" | "gb" | "gib" => Some(1024.0 * 1024.0 * 1024.0),
            "t" | "tb" | "tib" => Some(1024.0f64.powi(4)),
            _ => None,
        };
        if let Some(b) = bytes {
            return Ok(Retain::Size((n * b) as u64));
        }
        humantime::parse_duration(t)
            .map(Retain::Age)
            .map_err(|_| format!("`{text}` is neither a duration (7d, 12h) nor a size (500MiB)"))
    }
}

/// When to start a new file, and what to keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rotation {
    /// Start a new file past this size, bytes.
    pub max_file_bytes: u64,
    /// Start a new file after this long.
    pub max_file_age: Duration,
    /// Delete older files beyond this.
    pub retain: Retain,
}

impl Default for Rotation {
    fn default() -> Self {
        Self {
            max_file_bytes: 64 << 20,
            max_file_age: Duration::from_secs(600),
            retain: Retain::Age(Duration::from_secs(7 * 86_400)),
        }
    }
}

/// Writes chunks into a directory of rotating recording files.
pub struct RotatingWriter {
    dir: PathBuf,
    header: Header,
    rotation: Rotation,
    current: Option<(Writer, PathBuf, u64)>,
    seq: u64,
    live: LiveTables,
    sources: Vec<EnergySource>,
    losses: LossCounters,
}

impl RotatingWriter {
    /// Writes into `dir` (created mode 0700 when missing). `header` is the template of every
    /// file's header (its start times are set per file).
    pub fn create(dir: &Path, header: Header, rotation: Rotation) -> Result<Self, WriteError> {
        use std::os::unix::fs::DirBuilderExt as _;
        if !dir.is_dir() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|source| WriteError::Io {
                    path: dir.into(),
                    source,
                })?;
        }
        Ok(Self {
            dir: dir.into(),
            header,
            rotation,
            current: None,
            seq: 0,
            live: LiveTables::default(),
            sources: Vec::new(),
            losses: LossCounters::default(),
        })
    }

    /// The file being written, if any.
    fn current_path(&self) -> Option<&Path> {
        self.current.as_ref().map(|(_, p, _)| p.as_path())
    }

    /// Appends a chunk whose events end at `now_ns` (CLOCK_MONOTONIC), starting a new file
    /// first when the current one is full or old, and pruning old files after a rotation.
    pub fn chunk(&mut self, chunk: Chunk, now_ns: u64) -> Result<(), WriteError> {
        self.remember(&chunk);
        let rotate = match &self.current {
            None => true,
            Some((w, _, opened)) => {
                w.bytes() >= self.rotation.max_file_bytes
                    || now_ns.saturating_sub(*opened)
                        >= u64::try_from(self.rotation.max_file_age.as_nanos()).unwrap_or(u64::MAX)
            }
        };
        if rotate {
            self.rotate(now_ns)?;
        }
        let Some((w, _, _)) = self.current.as_mut() else {
            return Ok(());
        };
        w.chunk(chunk)
    }

    /// Closes the current file with `trailer`.
    pub fn finish(mut self, trailer: Trailer) -> Result<(), WriteError> {
        if let Some((w, _, _)) = self.current.take() {
            w.finish(trailer)?;
        }
        Ok(())
    }

    fn remember(&mut self, chunk: &Chunk) {
        self.live.remember(chunk);
        self.live.exited(&chunk.process_events);
        for s in &chunk.sources {
            if !self.sources.iter().any(|k| k.id == s.id) {
                self.sources.push(s.clone());
            }
        }
        if let Some(l) = chunk.losses {
            self.losses = l;
        }
    }

    fn rotate(&mut self, now_ns: u64) -> Result<(), WriteError> {
        if let Some((w, _, _)) = self.current.take() {
            w.finish(Trailer {
                end_ns: now_ns,
                stop_reason: "rotated".into(),
                losses: Some(self.losses),
            })?;
        }
        let mut header = self.header.clone();
        let shift = now_ns.saturating_sub(header.start_ns);
        header.start_ns = now_ns;
        header.start_unix_ns = header.start_unix_ns.saturating_add(shift);
        self.seq += 1;
        let path = self.dir.join(format!(
            "{PREFIX}{:020}-{:06}.{EXTENSION}",
            header.start_unix_ns / 1_000_000_000,
            self.seq % 1_000_000
        ));
        let mut w = Writer::create(&path, &header)?;
        // What earlier files told, so this file reports alone.
        w.chunk(Chunk {
            threads: self.live.threads.values().cloned().collect(),
            mappings: self.live.mappings.values().flatten().cloned().collect(),
            jit_symbols: self.live.jit_symbols.values().flatten().cloned().collect(),
            sources: self.sources.clone(),
            losses: Some(self.losses),
            ..Chunk::default()
        })?;
        self.current = Some((w, path, now_ns));
        self.prune();
        Ok(())
    }

    /// Deletes the oldest files beyond the retention rule (never the current one). A file
    /// that cannot be deleted is left and logged; recording goes on.
    fn prune(&self) {
        let current = self.current_path().map(Path::to_path_buf);
        let mut files = series_files(&self.dir);
        files.retain(|(p, _)| Some(p) != current.as_ref());
        let mut total: u64 = files.iter().map(|(_, m)| m.len()).sum::<u64>()
            + current
                .as_ref()
                .and_then(|p| std::fs::metadata(p).ok())
                .map_or(0, |m| m.len());
        let now = std::time::SystemTime::now();
        for (path, meta) in files {
            let drop = match self.rotation.retain {
                Retain::Size(max) => total > max,
                Retain::Age(age) => meta
                    .modified()
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|d| d > age),
            };
            if !drop {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => total = total.saturating_sub(meta.len()),
                Err(err) => tracing::warn!("cannot prune {}: {err}", path.display()),
            }
        }
    }
}

/// The recording files of a series directory, oldest first.
pub fn series_files(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(PathBuf, std::fs::Metadata)> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with(PREFIX) && name.ends_with(&format!(".{EXTENSION}"))
        })
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .filter(|(_, m)| m.is_file())
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::ThreadInfo;

    #[test]
    fn retention_parses_durations_and_sizes() {
        assert_eq!(
            "7d".parse(),
            Ok(Retain::Age(Duration::from_secs(7 * 86_400)))
        );
        assert_eq!("30m".parse(), Ok(Retain::Age(Duration::from_secs(1800))));
        assert_eq!("500MiB".parse(), Ok(Retain::Size(500 << 20)));
        assert_eq!("2G".parse(), Ok(Retain::Size(2 << 30)));
        assert!("lots".parse::<Retain>().is_err());
        assert!("".parse::<Retain>().is_err());
    }

    fn header() -> Header {
        Header {
            format_version: super::super::FORMAT_VERSION,
            start_ns: 1_000,
            start_unix_ns: 1_700_000_000_000_000_000,
            ..Header::default()
        }
    }

    #[test]
    fn files_rotate_by_size_repeat_what_they_need_and_are_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rotation = Rotation {
            max_file_bytes: 1, // every chunk starts a new file
            max_file_age: Duration::from_secs(3600),
            retain: Retain::Size(u64::MAX),
        };
        let mut w = RotatingWriter::create(dir.path(), header(), rotation).expect("create");
        let named = ThreadInfo {
            tid: 7,
            tgid: 7,
            comm: "worker".into(),
            ..ThreadInfo::default()
        };
        w.chunk(
            Chunk {
                threads: vec![named],
                ..Chunk::default()
            },
            2_000,
        )
        .expect("first");
        w.chunk(Chunk::default(), 3_000).expect("second");
        w.finish(Trailer {
            end_ns: 4_000,
            ..Trailer::default()
        })
        .expect("finish");
        let files = series_files(dir.path());
        assert_eq!(files.len(), 2, "{files:?}");
        // The second file alone still knows thread 7's name.
        let second = super::super::read_file(&files[1].0).expect("readable");
        assert_eq!(
            second.threads.get(&7).map(|t| t.comm.as_str()),
            Some("worker")
        );
        assert_eq!(second.header.start_ns, 3_000);
        let first = super::super::read_file(&files[0].0).expect("readable");
        assert!(!first.truncated, "a rotated file is finished");

        // Keep at most one file's worth: the oldest goes at the next rotation.
        let size = files[1].1.len();
        let rotation = Rotation {
            retain: Retain::Size(size + size / 2),
            ..rotation
        };
        let mut w = RotatingWriter::create(dir.path(), header(), rotation).expect("create");
        w.chunk(Chunk::default(), 5_000).expect("third");
        assert_eq!(series_files(dir.path()).len(), 1);
    }
}
