//! One VM's directory in the share (`/run/energy-bpf/vms/NAME/`), laid out like a bare-metal
//! powercap tree so a guest's powercap reader reads it (docs/virtual-machines.md):
//!
//! ```text
//! NAME/                                   0750 root:<the VM process's group>
//!   intel-rapl:0/{name,energy_uj,max_energy_range_uj}                  "package-0"
//!   intel-rapl:0/intel-rapl:0:0/{...}     "core", when the host has it
//!   intel-rapl:0/intel-rapl:0:1/{...}     "dram", when the host has it
//!   energy-bpf.json                       the metadata, written last
//! ```
//!
//! Security: every file is 0640 and the directory 0750, owned by root and group-owned by
//! the VM process's group, so only root and the VM's own process read it and nobody but
//! root writes it; each file is written as `.NAME.tmp` beside it (`O_NOFOLLOW`, created
//! anew) and renamed over, so a reader sees a whole old or a whole new file. The directory
//! itself is never replaced while its VM runs: a hypervisor sharing it holds it open.

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::SystemTime,
};

/// `max_energy_range_uj`: a round 9·10^18 µJ, below 2^63; never reached in practice.
pub const MAX_RANGE_UJ: u64 = 9_000_000_000_000_000_000;

/// The zones a VM's tree has, as (domain name in rows, zone name in the tree and the
/// metadata, subdirectory under `intel-rapl:0`; empty for the package itself).
pub const ZONES: [(&str, &str, &str); 3] = [
    ("package", "package", ""),
    ("cores", "core", "intel-rapl:0:0"),
    ("dram", "dram", "intel-rapl:0:1"),
];

/// One zone's cumulative counters in the metadata.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ZoneCounters {
    /// Dynamic + static, µJ.
    pub energy_uj: u64,
    /// The static share inside `energy_uj`, µJ.
    pub static_uj: u64,
}

/// A flagged gap.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Gap {
    /// The `seq` of the first write after it.
    pub seq: u64,
    /// Why (`host agent restarted`).
    pub reason: String,
    /// Time whose energy is not counted, ms.
    pub missing_ms: u64,
}

/// The package's dynamic energy by thread class (beyond the shared contract: the guest
/// reads none of it).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ThreadCounters {
    /// vCPU threads, µJ.
    pub vcpu_uj: u64,
    /// Emulator and I/O threads, µJ.
    pub emulator_uj: u64,
    /// Threads whose names do not tell (qemu without `debug-threads=on`), µJ.
    pub unsplit_uj: u64,
}

/// `energy-bpf.json`.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    /// 1.
    pub format: u32,
    /// The VM's name.
    pub vm: String,
    /// `pid:starttime` of the VM process.
    pub instance: String,
    /// +1 per write: the guest's staleness clock.
    pub seq: u64,
    /// The agent's interval, ms.
    pub interval_ms: u64,
    /// Allotted vCPUs.
    pub vcpus: u32,
    /// `vcpus`, `busy` or `none`.
    pub static_policy: String,
    /// False when the host's own energy is the estimated model.
    pub measured: bool,
    /// The host's energy source kind.
    pub host_source: String,
    /// Cumulative counters per zone (`package`, `core`, `dram`).
    pub zones: BTreeMap<String, ZoneCounters>,
    /// Flagged gaps so far.
    pub gaps: u64,
    /// The latest one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub last_gap: Option<Gap>,
    /// The hypervisor (`qemu`, `firecracker`, `cloud-hypervisor`).
    #[serde(default)]
    pub hypervisor: String,
    /// Whether vCPU and emulator threads are told apart (named threads).
    #[serde(default)]
    pub threads_named: bool,
    /// The package's dynamic energy by thread class.
    #[serde(default)]
    pub threads: ThreadCounters,
    /// Host time the counters cover, µs, cumulative: the static share's clock (a guest
    /// divides `static_uj`'s change by this one's, not by its own poll timing).
    #[serde(default)]
    pub counted_us: u64,
}

/// Why a VM's directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// Something other than a directory sits at the path.
    #[error("{} exists and is not a directory (a link or a file): not touched", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// An I/O error.
    #[error("{what} {}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DirError {
    let path = path.to_path_buf();
    move |source| DirError::Io { what, path, source }
}

/// What a VM directory held from before (an earlier agent run).
#[derive(Clone, Debug, PartialEq)]
pub struct Previous {
    /// Its metadata.
    pub meta: Meta,
    /// When it was last written.
    pub written: SystemTime,
}

/// Makes `dir` a VM directory for the VM process group `gid` (creating it, or taking the
/// one a launcher made beforehand) and reads back what an earlier run left in it.
pub fn open(dir: &Path, gid: u32) -> Result<Option<Previous>, DirError> {
    match fs::symlink_metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return Err(DirError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        Ok(_) => {}
        Err(_) => fs::create_dir(dir).map_err(io("cannot create", dir))?,
    }
    own(dir, gid, 0o750)?;
    let json = dir.join("energy-bpf.json");
    let previous = fs::read(&json).ok().and_then(|bytes| {
        let meta: Meta = serde_json::from_slice(&bytes).ok()?;
        let written = fs::metadata(&json).and_then(|m| m.modified()).ok()?;
        Some(Previous { meta, written })
    });
    Ok(previous)
}

/// Removes what a VM directory holds from an earlier VM of the same name, keeping the
/// directory itself (a new VM may already share it).
pub fn clear(dir: &Path) {
    let _ = fs::remove_dir_all(dir.join("intel-rapl:0"));
    let _ = fs::remove_file(dir.join("energy-bpf.json"));
}

/// Removes a VM's directory (its VM exited). Only a real directory is removed.
pub fn remove(dir: &Path) -> Result<(), DirError> {
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(dir).map_err(io("cannot remove", dir)),
        Ok(_) => Err(DirError::NotADirectory {
            path: dir.to_path_buf(),
        }),
        Err(_) => Ok(()),
    }
}

/// Writes one interval: each zone's `energy_uj` (and on `first`, its `name` and
/// `max_energy_range_uj`), then the metadata.
pub fn write(dir: &Path, gid: u32, meta: &Meta, first: bool) -> Result<(), DirError> {
    for (_, zone, sub) in ZONES {
        let Some(c) = meta.zones.get(zone) else {
            continue;
        };
        let mut zdir = dir.join("intel-rapl:0");
        if !sub.is_empty() {
            zdir.push(sub);
        }
        if first || !zdir.is_dir() {
            match fs::create_dir_all(&zdir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io("cannot create", &zdir)(e)),
            }
            own(&dir.join("intel-rapl:0"), gid, 0o750)?;
            own(&zdir, gid, 0o750)?;
            let name = if sub.is_empty() { "package-0" } else { zone };
            put(&zdir, "name", &format!("{name}\n"), gid)?;
            put(
                &zdir,
                "max_energy_range_uj",
                &format!("{MAX_RANGE_UJ}\n"),
                gid,
            )?;
        }
        put(&zdir, "energy_uj", &format!("{}\n", c.energy_uj), gid)?;
    }
    let text = serde_json::to_string_pretty(meta).unwrap_or_default();
    put(dir, "energy-bpf.json", &format!("{text}\n"), gid)
}

/// Writes `dir/name` atomically: `.name.tmp` created anew (never through a link), 0640
/// root:`gid`, then renamed over.
fn put(dir: &Path, name: &str, text: &str, gid: u32) -> Result<(), DirError> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = fs::remove_file(&tmp);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(io("cannot write", &tmp))?;
    f.write_all(text.as_bytes())
        .map_err(io("cannot write", &tmp))?;
    // The mode above is cut by the umask; the group must read.
    f.set_permissions(fs::Permissions::from_mode(0o640))
        .map_err(io("cannot set the mode of", &tmp))?;
    if gid != 0 {
        std::os::unix::fs::fchown(&f, None, Some(gid)).map_err(io("cannot chown", &tmp))?;
    }
    drop(f);
    fs::rename(&tmp, dir.join(name)).map_err(io("cannot rename into place", &tmp))
}

/// root:`gid`, `mode`, on a directory.
fn own(dir: &Path, gid: u32, mode: u32) -> Result<(), DirError> {
    fs::set_permissions(dir, fs::Permissions::from_mode(mode))
        .map_err(io("cannot set the mode of", dir))?;
    if gid != 0 {
        std::os::unix::fs::lchown(dir, None, Some(gid)).map_err(io("cannot chown", dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt as _;

    use super::*;

    fn meta() -> Meta {
        Meta {
            format: 1,
            vm: "vm1".into(),
            instance: "10:20".into(),
            seq: 1,
            zones: [
                (
                    "package".into(),
                    ZoneCounters {
                        energy_uj: 5,
                        static_uj: 2,
                    },
                ),
                (
                    "core".into(),
                    ZoneCounters {
                        energy_uj: 3,
                        static_uj: 1,
                    },
                ),
            ]
            .into_iter()
            .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_written_directory_reads_back_with_the_contract_modes() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("vm1");
        assert_eq!(open(&dir, 0).expect("open"), None);
        write(&dir, 0, &meta(), true).expect("write");
        let mode = |p: &Path| fs::metadata(p).expect("exists").mode() & 0o777;
        assert_eq!(mode(&dir), 0o750);
        let pkg = dir.join("intel-rapl:0");
        assert_eq!(
            fs::read_to_string(pkg.join("name")).expect("name"),
            "package-0\n"
        );
        assert_eq!(
            fs::read_to_string(pkg.join("energy_uj")).expect("uj"),
            "5\n"
        );
        assert_eq!(mode(&pkg.join("energy_uj")), 0o640);
        let core = pkg.join("intel-rapl:0:0");
        assert_eq!(
            fs::read_to_string(core.join("name")).expect("name"),
            "core\n"
        );
        assert!(
            !pkg.join("intel-rapl:0:1").exists(),
            "no dram zone on this host"
        );
        assert_eq!(mode(&dir.join("energy-bpf.json")), 0o640);
        let back = open(&dir, 0).expect("reopen").expect("previous");
        assert_eq!(back.meta, meta());
        let stray: Vec<_> = fs::read_dir(&dir)
            .expect("list")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(stray.is_empty(), "temporary files left: {stray:?}");
        clear(&dir);
        assert_eq!(open(&dir, 0).expect("open"), None, "cleared");
        remove(&dir).expect("remove");
        assert!(!dir.exists());
    }

    #[test]
    fn a_link_in_place_of_the_directory_is_refused() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("vm1");
        std::os::unix::fs::symlink("/etc", &dir).expect("symlink");
        assert!(matches!(open(&dir, 0), Err(DirError::NotADirectory { .. })));
        assert!(remove(&dir).is_err());
        assert!(Path::new("/etc/passwd").exists());
    }
}
