//! The calibration file `energy-bpf calibrate` writes and `record`, `top` and `report` read:
//! static power per host and energy source, as JSON (no secrets: host names, source names,
//! watts and dates). Written atomically (temporary file, fsync, rename) with mode 0644, so a
//! reader never sees half a file.

use std::{
    collections::BTreeMap,
    io::Write as _,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use crate::attribute::{Calibrated, calibrate::Measured};

/// Where calibration lives unless `--calibration` says otherwise.
pub(crate) const DEFAULT_PATH: &str = "/var/lib/energy-bpf/calibration.json";

/// Format version of the file.
pub(crate) const VERSION: u32 = 1;

/// The whole file.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CalibrationFile {
    /// Format version.
    pub version: u32,
    /// Per host name.
    pub hosts: BTreeMap<String, HostCalibration>,
}

/// One host's calibration.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostCalibration {
    /// Per source key (`kind:name`, [`crate::attribute::source_key`]).
    pub sources: BTreeMap<String, SourceCalibration>,
}

/// One source's calibration.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SourceCalibration {
    /// When it was measured (RFC 3339, UTC).
    pub date: String,
    /// Seconds measured.
    pub duration_s: f64,
    /// What was measured.
    #[serde(flatten)]
    pub measured: Measured,
    /// The energy roofline (`calibrate --roofline`), kept when static power is measured
    /// again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roofline: Option<crate::roofline::Roofline>,
}

/// What can go wrong with the file.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// It could not be read.
    #[error("cannot read calibration {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is not a calibration file.
    #[error("{path} is not an energy-bpf calibration file (re-run `energy-bpf calibrate`)")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// It could not be written.
    #[error("cannot write calibration {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl CalibrationFile {
    /// Reads a file.
    pub fn load(path: &Path) -> Result<Self, CalibrationError> {
        let text = std::fs::read_to_string(path).map_err(|source| CalibrationError::Read {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|source| CalibrationError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Reads a file, or an empty one when it does not exist yet.
    pub(crate) fn load_or_default(path: &Path) -> Result<Self, CalibrationError> {
        if path.exists() {
            Self::load(path)
        } else {
            Ok(Self {
                version: VERSION,
                ..Self::default()
            })
        }
    }

    /// Writes the file atomically with mode 0644, creating its directory.
    pub(crate) fn save(&self, path: &Path) -> Result<(), CalibrationError> {
        let err = |source| CalibrationError::Write {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        write_atomically(path, text.as_bytes(), 0o644).map_err(err)
    }

    /// Static power per source key for `host`, as attribution takes it.
    fn for_host(&self, host: &str, file: &Path) -> BTreeMap<String, Calibrated> {
        self.hosts
            .get(host)
            .map(|h| {
                h.sources
                    .iter()
                    .map(|(key, s)| {
                        (
                            key.clone(),
                            Calibrated {
                                watts: s.measured.static_w,
                                date: s.date.clone(),
                                file: file.display().to_string(),
                            },
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Which calibration file the commands that attribute energy read (`--calibration FILE`).
#[derive(Debug, Clone, Default)]
pub(crate) struct CalibrationArgs {
    /// Calibration file from `energy-bpf calibrate` (default: /var/lib/energy-bpf/calibration.json
    /// when it exists).
    pub calibration: Option<PathBuf>,
}

impl CalibrationArgs {
    /// The calibration for `host`: from `--calibration` (which must exist), else from the
    /// default file when it exists; empty when neither applies.
    pub fn resolve(&self, host: &str) -> Result<BTreeMap<String, Calibrated>, CalibrationError> {
        let (path, explicit) = match &self.calibration {
            Some(p) => (p.clone(), true),
            None => (PathBuf::from(DEFAULT_PATH), false),
        };
        if !explicit && !path.exists() {
            return Ok(BTreeMap::new());
        }
        Ok(CalibrationFile::load(&path)?.for_host(host, &path))
    }
}

/// The calibration a report of `header` uses: `--calibration FILE` when given, else the one
/// stored in the recording (so a report stays reproducible), else the default file.
pub(crate) fn for_recording(
    args: &CalibrationArgs,
    header: &crate::pb::v1::Header,
) -> Result<BTreeMap<String, Calibrated>, CalibrationError> {
    if args.calibration.is_none() && !header.calibration.is_empty() {
        return Ok(header
            .calibration
            .iter()
            .map(|c| {
                (
                    c.source_key.clone(),
                    Calibrated {
                        watts: c.static_w,
                        date: c.date.clone(),
                        file: String::new(),
                    },
                )
            })
            .collect());
    }
    args.resolve(&header.hostname)
}

/// For a recording's header: the calibration in use, by source key.
pub(crate) fn to_header(
    cal: &BTreeMap<String, Calibrated>,
) -> Vec<crate::pb::v1::CalibratedStatic> {
    cal.iter()
        .map(|(key, c)| crate::pb::v1::CalibratedStatic {
            source_key: key.clone(),
            static_w: c.watts,
            date: c.date.clone(),
        })
        .collect()
}

/// Unix time (ns) as RFC 3339 UTC, e.g. `2026-05-20T10:00:00Z`.
pub(crate) fn rfc3339(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm, proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Writes `bytes` and a newline to `path` through a temporary file created with `mode`
/// (never an existing or planted one), synced and renamed over it, so a reader sees the old
/// file or the new one. The temporary file is removed on failure.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp.{}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.write_all(b"\n")?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(w: f64) -> Measured {
        Measured {
            load_curve: Vec::new(),
            key: "powercap:package-0".into(),
            name: "package-0".into(),
            static_w: w,
            per_busy_cpu_w: None,
            busy_share: 0.01,
            method: "idle_median".into(),
            intervals: 100,
        }
    }

    #[test]
    fn dates_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(1_779_271_200 * 1_000_000_000),
            "2026-05-20T10:00:00Z"
        );
        assert_eq!(rfc3339(951_782_400 * 1_000_000_000), "2000-02-29T00:00:00Z");
    }

    #[test]
    fn saves_atomically_with_mode_0644_and_reads_back_per_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/calibration.json");
        let mut file = CalibrationFile::load_or_default(&path).expect("empty");
        file.hosts.entry("box".into()).or_default().sources.insert(
            "powercap:package-0".into(),
            SourceCalibration {
                date: rfc3339(0),
                duration_s: 10.0,
                measured: measured(6.5),
                roofline: None,
            },
        );
        file.save(&path).expect("save");
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o644);
        let back = CalibrationFile::load(&path).expect("load");
        assert_eq!(back, file);
        let cal = back.for_host("box", &path);
        assert_eq!(cal["powercap:package-0"].watts, 6.5);
        assert!(back.for_host("other", &path).is_empty());
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
            .expect("ls")
            .collect();
        assert_eq!(names.len(), 1);
        let args = CalibrationArgs {
            calibration: Some(path.clone()),
        };
        assert_eq!(args.resolve("box").expect("resolve").len(), 1);
        let missing = CalibrationArgs {
            calibration: Some(dir.path().join("nope.json")),
        };
        assert!(
            missing.resolve("box").is_err(),
            "an explicit file must exist"
        );
    }
}
