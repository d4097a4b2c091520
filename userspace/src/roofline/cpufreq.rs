//! Pinning every CPU to one frequency through cpufreq for a DVFS sweep, and putting the
//! settings back: [`Pinned`] restores what it changed when dropped (the command turns
//! Ctrl-C into an early, orderly return so the drop runs).
//!
//! Per policy (`devices/system/cpu/cpufreq/policy*` under the sysfs root): with the
//! `userspace` governor available, select it and write `scaling_setspeed`; otherwise
//! clamp `scaling_min_freq` = `scaling_max_freq` = f (in the order that never makes
//! min > max). Root only; every file read is small and bounded.

use std::path::{Path, PathBuf};

use super::read_small;

/// Why frequencies cannot be set.
#[derive(Debug, thiserror::Error)]
pub enum CpufreqError {
    /// No cpufreq policies: a VM or a kernel without a cpufreq driver.
    #[error(
        "this machine has no cpufreq control ({path} has no policy*): --frequencies needs a cpufreq driver; without it only one frequency is measured"
    )]
    Unavailable {
        /// The cpufreq directory looked at.
        path: PathBuf,
    },
    /// A frequency outside what a policy allows.
    #[error("{khz} kHz is outside {policy}'s range {min_khz}..{max_khz} kHz")]
    OutOfRange {
        /// The frequency asked for.
        khz: u64,
        /// The policy.
        policy: String,
        /// Its lowest frequency.
        min_khz: u64,
        /// Its highest frequency.
        max_khz: u64,
    },
    /// A cpufreq file could not be read or written.
    #[error("cpufreq {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// What a policy looked like before we touched it.
#[derive(Clone, Debug, PartialEq)]
struct Saved {
    dir: PathBuf,
    governor: String,
    min: String,
    max: String,
    hw_min: u64,
    hw_max: u64,
    userspace: bool,
}

/// Every policy pinned to one frequency; restored on drop.
#[derive(Debug)]
pub struct Pinned {
    saved: Vec<Saved>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CpufreqError + '_ {
    move |source| CpufreqError::Io {
        path: path.to_owned(),
        source,
    }
}

fn read(path: &Path) -> Result<String, CpufreqError> {
    read_small(path).map_err(io(path))
}

fn read_khz(path: &Path) -> Result<u64, CpufreqError> {
    read(path)?.parse().map_err(|_| CpufreqError::Io {
        path: path.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not a frequency"),
    })
}

fn write(path: &Path, value: &str) -> Result<(), CpufreqError> {
    std::fs::write(path, value).map_err(io(path))
}

/// The policies under `sysfs_root`, sorted; an error when there are none.
fn policies(sysfs_root: &Path) -> Result<Vec<Saved>, CpufreqError> {
    let base = sysfs_root.join("devices/system/cpu/cpufreq");
    let unavailable = || CpufreqError::Unavailable { path: base.clone() };
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&base)
        .map_err(|_| unavailable())?
        .flatten()
        .take(4096)
        .filter(|e| e.file_name().to_string_lossy().starts_with("policy"))
        .map(|e| e.path())
        .collect();
    dirs.sort();
    if dirs.is_empty() {
        return Err(unavailable());
    }
    dirs.into_iter()
        .map(|dir| {
            let governors =
                read_small(&dir.join("scaling_available_governors")).unwrap_or_default();
            Ok(Saved {
                governor: read(&dir.join("scaling_governor"))?,
                min: read(&dir.join("scaling_min_freq"))?,
                max: read(&dir.join("scaling_max_freq"))?,
                hw_min: read_khz(&dir.join("cpuinfo_min_freq"))?,
                hw_max: read_khz(&dir.join("cpuinfo_max_freq"))?,
                userspace: governors.split_whitespace().any(|g| g == "userspace")
                    && dir.join("scaling_setspeed").exists(),
                dir,
            })
        })
        .collect()
}

/// Checks that every policy exists and allows every frequency in `khz`.
pub fn check(sysfs_root: &Path, khz: &[u64]) -> Result<(), CpufreqError> {
    for p in policies(sysfs_root)? {
        if let Some(&bad) = khz.iter().find(|&&f| f < p.hw_min || f > p.hw_max) {
            return Err(out_of_range(&p, bad));
        }
    }
    Ok(())
}

fn out_of_range(p: &Saved, khz: u64) -> CpufreqError {
    CpufreqError::OutOfRange {
        khz,
        policy: p.dir.display().to_string(),
        min_khz: p.hw_min,
        max_khz: p.hw_max,
    }
}

impl Pinned {
    /// Pins every policy to `khz`. On failure, whatever was already changed is put back.
    pub fn pin(sysfs_root: &Path, khz: u64) -> Result<Self, CpufreqError> {
        let all = policies(sysfs_root)?;
        let mut pinned = Self { saved: Vec::new() };
        for p in all {
            if khz < p.hw_min || khz > p.hw_max {
                return Err(out_of_range(&p, khz));
            }
            // Saved first: a half-applied policy is restored too.
            pinned.saved.push(p.clone());
            let f = khz.to_string();
            if p.userspace {
                write(&p.dir.join("scaling_governor"), "userspace")?;
                write(&p.dir.join("scaling_setspeed"), &f)?;
            } else {
                // Widen first so min ≤ max holds after every single write.
                write(&p.dir.join("scaling_max_freq"), &p.hw_max.to_string())?;
                write(&p.dir.join("scaling_min_freq"), &f)?;
                write(&p.dir.join("scaling_max_freq"), &f)?;
            }
        }
        Ok(pinned)
    }

    /// Puts every policy back; the first error, if any (all are tried).
    pub fn restore(mut self) -> Result<(), CpufreqError> {
        self.restore_all()
    }

    fn restore_all(&mut self) -> Result<(), CpufreqError> {
        let mut first = None;
        for p in self.saved.drain(..).rev() {
            let steps = [
                ("scaling_governor", p.governor.clone()),
                ("scaling_min_freq", p.hw_min.to_string()),
                ("scaling_max_freq", p.max.clone()),
                ("scaling_min_freq", p.min.clone()),
            ];
            for (file, value) in steps {
                if let Err(e) = write(&p.dir.join(file), &value) {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Err(e) = self.restore_all() {
            tracing::warn!("could not restore CPU frequencies: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake cpufreq tree of two policies, 800 MHz..3 GHz, `governor` in use.
    fn tree(userspace: bool) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for i in 0..2 {
            let p = dir
                .path()
                .join(format!("devices/system/cpu/cpufreq/policy{i}"));
            std::fs::create_dir_all(&p).expect("mkdir");
            let governors = if userspace {
                "performance powersave userspace"
            } else {
                "performance powersave"
            };
            for (f, v) in [
                ("scaling_governor", "powersave"),
                ("scaling_available_governors", governors),
                ("scaling_min_freq", "1200000"),
                ("scaling_max_freq", "2800000"),
                ("cpuinfo_min_freq", "800000"),
                ("cpuinfo_max_freq", "3000000"),
            ] {
                std::fs::write(p.join(f), format!("{v}\n")).expect("write");
            }
            if userspace {
                std::fs::write(p.join("scaling_setspeed"), "<unsupported>\n").expect("write");
            }
        }
        dir
    }

    fn get(root: &Path, policy: u32, file: &str) -> String {
        read_small(&root.join(format!("devices/system/cpu/cpufreq/policy{policy}/{file}")))
            .expect("read")
    }

    #[test]
    fn min_max_clamp_is_applied_and_restored() {
        let t = tree(false);
        let pinned = Pinned::pin(t.path(), 1_000_000).expect("pin");
        for p in 0..2 {
            assert_eq!(get(t.path(), p, "scaling_min_freq"), "1000000");
            assert_eq!(get(t.path(), p, "scaling_max_freq"), "1000000");
        }
        pinned.restore().expect("restore");
        for p in 0..2 {
            assert_eq!(get(t.path(), p, "scaling_min_freq"), "1200000");
            assert_eq!(get(t.path(), p, "scaling_max_freq"), "2800000");
            assert_eq!(get(t.path(), p, "scaling_governor"), "powersave");
        }
    }

    #[test]
    fn userspace_governor_is_used_and_dropping_restores() {
        let t = tree(true);
        {
            let _pinned = Pinned::pin(t.path(), 2_000_000).expect("pin");
            assert_eq!(get(t.path(), 1, "scaling_governor"), "userspace");
            assert_eq!(get(t.path(), 1, "scaling_setspeed"), "2000000");
            // Dropped here, as on an early return or Ctrl-C.
        }
        assert_eq!(get(t.path(), 0, "scaling_governor"), "powersave");
        assert_eq!(get(t.path(), 1, "scaling_governor"), "powersave");
        assert_eq!(get(t.path(), 1, "scaling_max_freq"), "2800000");
    }

    #[test]
    fn out_of_range_and_missing_cpufreq_are_clear_errors_that_change_nothing() {
        let t = tree(false);
        let err = Pinned::pin(t.path(), 5_000_000).expect_err("too fast");
        assert!(err.to_string().contains("outside"), "{err}");
        assert_eq!(get(t.path(), 0, "scaling_max_freq"), "2800000");
        assert!(check(t.path(), &[1_000_000, 3_000_000]).is_ok());
        let none = tempfile::tempdir().expect("tempdir");
        let err = check(none.path(), &[1_000_000]).expect_err("no cpufreq");
        assert!(err.to_string().contains("no cpufreq control"), "{err}");
    }

    #[test]
    fn a_failed_write_midway_restores_what_was_changed() {
        let t = tree(false);
        // policy1's min file reads but cannot be written (even by root): the failure comes
        // after policy0 was set.
        let min1 = t
            .path()
            .join("devices/system/cpu/cpufreq/policy1/scaling_min_freq");
        std::fs::remove_file(&min1).expect("rm");
        std::os::unix::fs::symlink("/proc/version", &min1).expect("symlink");
        let err = Pinned::pin(t.path(), 1_000_000).expect_err("write fails");
        assert!(err.to_string().contains("scaling_min_freq"), "{err}");
        assert_eq!(get(t.path(), 0, "scaling_min_freq"), "1200000");
        assert_eq!(get(t.path(), 0, "scaling_max_freq"), "2800000");
    }
}
