//! Reading what the agent writes: a directory of rotating recording files
//! ([`super::rotate`]), or any recording, cut to a wall-clock range (`--from`/`--to`).
//!
//! Files of one directory are merged in time order into one [`Recording`]. Their events
//! share one CLOCK_MONOTONIC (one boot); wall-clock bounds are turned into it with each
//! file's header (`start_unix_ns` − `start_ns`). A range is cut at energy readings: the
//! readings outside it are dropped, so no energy from outside the range is spread over
//! what ran inside it.

use std::path::{Path, PathBuf};

use super::{
    MAX_SOURCES, ReadError, Recording, budget::Budget, merge_thread, read_file,
    reader::read_file_within, rotate::series_files,
};

/// A wall-clock range, Unix ns; `None` leaves that end open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimeRange {
    /// Start.
    pub from_unix_ns: Option<u64>,
    /// End.
    pub to_unix_ns: Option<u64>,
}

impl TimeRange {
    /// Parses `--from`/`--to` values: RFC 3339 (`2026-11-26T04:00:00Z`), a time before
    /// `now_unix_ns` (`-15m`, `-2h30m`), or `now`.
    pub fn parse(
        from: Option<&str>,
        to: Option<&str>,
        now_unix_ns: u64,
    ) -> Result<Self, ReadError> {
        let range = Self {
            from_unix_ns: from.map(|t| parse_time(t, now_unix_ns)).transpose()?,
            to_unix_ns: to.map(|t| parse_time(t, now_unix_ns)).transpose()?,
        };
        if let (Some(a), Some(b)) = (range.from_unix_ns, range.to_unix_ns)
            && a >= b
        {
            return Err(ReadError::BadRange(
                "--from must be before --to".to_string(),
            ));
        }
        Ok(range)
    }

    /// True when both ends are open.
    fn is_all(&self) -> bool {
        self.from_unix_ns.is_none() && self.to_unix_ns.is_none()
    }
}

fn parse_time(text: &str, now_unix_ns: u64) -> Result<u64, ReadError> {
    let t = text.trim();
    if t == "now" {
        return Ok(now_unix_ns);
    }
    if let Some(ago) = t.strip_prefix('-') {
        let d = humantime::parse_duration(ago)
            .map_err(|e| ReadError::BadRange(format!("`{text}`: {e} (e.g. -15m, -2h)")))?;
        return Ok(now_unix_ns.saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)));
    }
    let at = humantime::parse_rfc3339_weak(t).map_err(|e| {
        ReadError::BadRange(format!(
            "`{text}`: {e} (use RFC 3339 like 2026-11-26T04:00:00Z, or -15m)"
        ))
    })?;
    at.duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .map_err(|_| ReadError::BadRange(format!("`{text}` is before 1970")))
}

/// Reads a recording file, or every recording of a directory, cut to `range`.
pub fn read_path(path: &Path, range: &TimeRange) -> Result<Recording, ReadError> {
    if path.is_dir() {
        return read_files_in(path, &files_in_range(path, range)?, range);
    }
    let mut rec = read_file(path)?;
    cut_to(&mut rec, range, path)?;
    Ok(rec)
}

/// Cuts `rec` (read from `path`) to `range`; an error when nothing is left.
fn cut_to(rec: &mut Recording, range: &TimeRange, path: &Path) -> Result<(), ReadError> {
    if !range.is_all() {
        cut(rec, range);
        if rec.end_ns <= rec.header.start_ns {
            return Err(ReadError::NoFiles {
                path: path.into(),
                what: "data in that range".into(),
            });
        }
    }
    Ok(())
}

/// The recordings of `dir` that may hold part of `range`, oldest first, with their sizes.
pub fn files_in_range(dir: &Path, range: &TimeRange) -> Result<Vec<(PathBuf, u64)>, ReadError> {
    let files = series_files(dir);
    if files.is_empty() {
        return Err(ReadError::NoFiles {
            path: dir.into(),
            what: "files (energy-bpf-*.ebpr)".into(),
        });
    }
    let mut chosen = Vec::new();
    for (i, (path, meta)) in files.iter().enumerate() {
        // File names sort by start time: skip files that start after the range, or end
        // before it (a file ends where the next one starts).
        let start_unix = |p: &Path| -> Option<u64> {
            let name = p.file_name()?.to_str()?;
            name.split('-')
                .nth(2)?
                .parse::<u64>()
                .ok()
                .map(|s| s * 1_000_000_000)
        };
        if let (Some(to), Some(s)) = (range.to_unix_ns, start_unix(path))
            && s > to
        {
            continue;
        }
        if let (Some(from), Some(next)) = (
            range.from_unix_ns,
            files.get(i + 1).and_then(|(p, _)| start_unix(p)),
        ) && next < from
        {
            continue;
        }
        chosen.push((path.clone(), meta.len()));
    }
    Ok(chosen)
}

/// Reads `files` of `dir` (from [`files_in_range`]) as one recording, cut to `range`.
pub fn read_files_in(
    dir: &Path,
    files: &[(PathBuf, u64)],
    range: &TimeRange,
) -> Result<Recording, ReadError> {
    let mut rec = read_files(dir, files)?;
    cut_to(&mut rec, range, dir)?;
    Ok(rec)
}

fn read_files(dir: &Path, chosen: &[(PathBuf, u64)]) -> Result<Recording, ReadError> {
    // One memory bound for the whole directory, from the size of all its files: many
    // small files must not each bring the allowance of a file.
    let total = chosen.iter().map(|(_, len)| *len).sum::<u64>();
    let mut budget = Budget::for_input(usize::try_from(total).unwrap_or(usize::MAX));
    let mut merged: Option<Recording> = None;
    for (path, _) in chosen {
        let rec = read_file_within(path, &mut budget)?;
        match &mut merged {
            None => merged = Some(rec),
            Some(m) => append(m, rec),
        }
    }
    merged.ok_or_else(|| ReadError::NoFiles {
        path: dir.into(),
        what: "files in that range".into(),
    })
}

/// Appends a later recording of the same boot to `into`.
fn append(into: &mut Recording, next: Recording) {
    into.switches.append(next.switches);
    into.samples.extend(next.samples);
    into.process_events.extend(next.process_events);
    into.runs.extend(next.runs);
    into.runs.truncate(super::MAX_RUNS);
    for t in next.threads.into_values() {
        merge_thread(&mut into.threads, t);
    }
    for (pid, maps) in next.mappings {
        into.mappings.entry(pid).or_default().extend(maps);
    }
    for (pid, syms) in next.jit_symbols {
        into.jit_symbols.entry(pid).or_default().extend(syms);
    }
    // A source is listed once (the first listing wins), and there are at most
    // MAX_SOURCES, as within one file.
    let mut ids: std::collections::HashSet<u32> = into.sources.iter().map(|s| s.id).collect();
    for s in next.sources {
        if ids.len() < MAX_SOURCES && ids.insert(s.id) {
            into.sources.push(s);
        } else if !ids.contains(&s.id) {
            into.damage.events_dropped += 1;
        }
    }
    into.readings.extend(next.readings);
    let symbols = std::sync::Arc::make_mut(&mut into.symbols);
    symbols.extend(next.symbols.iter().cloned());
    symbols.truncate(super::symbols::MAX_TABLES);
    // Loss counters are cumulative within one agent run; a restart starts them again.
    let l = &mut into.losses;
    let n = next.losses;
    l.switch_dropped = l.switch_dropped.max(n.switch_dropped);
    l.sample_dropped = l.sample_dropped.max(n.sample_dropped);
    l.process_dropped = l.process_dropped.max(n.process_dropped);
    l.stack_errors = l.stack_errors.max(n.stack_errors);
    l.vanished_processes = l.vanished_processes.max(n.vanished_processes);
    into.end_ns = into.end_ns.max(next.end_ns);
    into.stop_reason = next.stop_reason;
    into.truncated = next.truncated;
    into.trailing_garbage_bytes += next.trailing_garbage_bytes;
    let (d, n) = (&mut into.damage, next.damage);
    d.records_damaged += n.records_damaged;
    d.bytes_skipped += n.bytes_skipped;
    d.lost_ns += n.lost_ns;
    d.events_dropped += n.events_dropped;
    d.end_clamped |= n.end_clamped;
    d.records_oversized += n.records_oversized;
    d.end_damaged |= n.end_damaged;
}

/// Cuts a recording to a wall-clock range (see the module comment).
fn cut(rec: &mut Recording, range: &TimeRange) {
    let offset = rec.header.start_unix_ns.saturating_sub(rec.header.start_ns);
    let to_mono = |unix: u64| unix.saturating_sub(offset);
    let start = range
        .from_unix_ns
        .map_or(rec.header.start_ns, |u| to_mono(u).max(rec.header.start_ns));
    let end = range
        .to_unix_ns
        .map_or(rec.end_ns, |u| to_mono(u).min(rec.end_ns));
    let end = end.max(start);
    cut_mono(rec, start, end);
}

/// Cuts a recording to the CLOCK_MONOTONIC span `[start, end)` (clamped to the
/// recording's): what runs before it only says who was on each CPU at `start`.
pub fn cut_mono(rec: &mut Recording, start: u64, end: u64) {
    let start = start.max(rec.header.start_ns);
    let end = end.min(rec.end_ns).max(start);
    // Switches before the start only say who was running at it: keep each CPU's last.
    let mut last_before: std::collections::BTreeMap<u32, crate::pb::v1::SwitchEvent> =
        std::collections::BTreeMap::new();
    for s in rec.switches.iter().filter(|s| s.ts_ns < start) {
        if last_before.get(&s.cpu).is_none_or(|l| l.ts_ns <= s.ts_ns) {
            last_before.insert(s.cpu, s);
        }
    }
    rec.switches.retain(|s| s.ts_ns >= start && s.ts_ns <= end);
    let carried: Vec<crate::pb::v1::SwitchEvent> = last_before.into_values().collect();
    rec.switches.push(&carried);
    rec.samples.retain(|s| s.ts_ns >= start && s.ts_ns < end);
    rec.process_events
        .retain(|e| e.ts_ns >= start && e.ts_ns < end);
    rec.readings.retain(|r| r.ts_ns >= start && r.ts_ns <= end);
    rec.runs.retain(|r| r.start_ns >= start && r.end_ns <= end);
    rec.header.start_unix_ns = rec
        .header
        .start_unix_ns
        .saturating_add(start - rec.header.start_ns);
    rec.header.start_ns = start;
    rec.end_ns = end;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::v1::{Chunk, Header, Sample, Trailer};
    use crate::record::rotate::{Retain, RotatingWriter, Rotation};

    const UNIX0: u64 = 1_700_000_000_000_000_000;

    #[test]
    fn times_parse_absolute_relative_and_now() {
        let now = UNIX0;
        assert_eq!(parse_time("now", now).expect("now"), now);
        assert_eq!(
            parse_time("-15m", now).expect("relative"),
            now - 15 * 60 * 1_000_000_000
        );
        assert_eq!(
            parse_time("2023-11-14T22:13:20Z", now).expect("rfc3339"),
            1_700_000_000_000_000_000
        );
        assert!(parse_time("yesterday", now).is_err());
        assert!(TimeRange::parse(Some("-1m"), Some("-2m"), now).is_err());
    }

    #[test]
    fn a_directory_reads_as_one_recording_and_cuts_to_a_range() {
        let dir = tempfile::tempdir().expect("tempdir");
        let header = Header {
            format_version: crate::record::FORMAT_VERSION,
            start_ns: 0,
            start_unix_ns: UNIX0,
            ..Header::default()
        };
        let rotation = Rotation {
            max_file_bytes: 1,
            max_file_age: std::time::Duration::from_secs(3600),
            retain: Retain::Size(u64::MAX),
        };
        let mut w = RotatingWriter::create(dir.path(), header, rotation).expect("create");
        let sec = 1_000_000_000u64;
        for i in 0..3u64 {
            let samples = (0..10)
                .map(|k| Sample {
                    ts_ns: i * 2 * sec + k * 100_000_000,
                    tid: 5,
                    tgid: 5,
                    ..Sample::default()
                })
                .collect();
            w.chunk(
                Chunk {
                    samples,
                    ..Chunk::default()
                },
                i * 2 * sec,
            )
            .expect("chunk");
        }
        w.finish(Trailer {
            end_ns: 6 * sec,
            ..Trailer::default()
        })
        .expect("finish");
        let all = read_path(dir.path(), &TimeRange::default()).expect("reads");
        assert_eq!(all.samples.len(), 30);
        assert_eq!((all.header.start_ns, all.end_ns), (0, 6 * sec));
        // The middle two seconds.
        let range = TimeRange {
            from_unix_ns: Some(UNIX0 + 2 * sec),
            to_unix_ns: Some(UNIX0 + 4 * sec),
        };
        let mid = read_path(dir.path(), &range).expect("range");
        assert_eq!((mid.header.start_ns, mid.end_ns), (2 * sec, 4 * sec));
        assert_eq!(mid.samples.len(), 10);
        let empty = TimeRange {
            from_unix_ns: Some(UNIX0 + 100 * sec),
            to_unix_ns: None,
        };
        assert!(read_path(dir.path(), &empty).is_err());
        let none = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            read_path(none.path(), &TimeRange::default()),
            Err(ReadError::NoFiles { .. })
        ));
    }
}
