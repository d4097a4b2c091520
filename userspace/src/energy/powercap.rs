//! powercap sysfs: `<sysfs>/class/powercap/intel-rapl:N[:M]/{name,energy_uj,max_energy_range_uj}`.
//!
//! Zones are identified by their `name` (`package-N`, `core`, `uncore`, `dram`, `psys`), not
//! by their directory number: `intel-rapl:1` is not always package 1, and on laptops it is
//! often `psys`. Sub-zones belong to the package of their parent. AMD exposes the same tree.
//! `intel-rapl-mmio:*` duplicates the package zones through MMIO and is skipped so energy is
//! not counted twice.
//!
//! `energy_uj` counts in µJ and wraps after `max_energy_range_uj`: the counter's modulus is
//! taken as `max_energy_range_uj + 1`. (The kernel derives both from a 32-bit register in
//! RAPL units, so on hardware the true modulus can be up to one unit larger: at most 61 µJ
//! per wrap, one wrap every several minutes.)

use std::path::{Path, PathBuf};

use super::{EnergyError, EnergySource, RawSample, SourceKind, read_text, read_u64, source_desc};
use crate::pb::v1 as pb;

/// Why `energy_uj` is unreadable, and the fix.
pub const PERMISSION_HINT: &str = "energy_uj is root-only since CVE-2020-8694; run as root, \
     add CAP_DAC_READ_SEARCH (missing), or grant read access (e.g. `sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj`)";

/// One powercap zone.
#[derive(Debug)]
pub struct Zone {
    energy_path: PathBuf,
    desc: pb::EnergySource,
    range_uj: u64,
}

/// A zone directory found in the tree, before its counter is opened.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneInfo {
    /// The zone directory.
    pub dir: PathBuf,
    /// Directory name, e.g. `intel-rapl:0:1`.
    pub id: String,
    /// Contents of `name`, e.g. `dram`.
    pub name: String,
    /// Domain of the zone.
    pub domain: pb::EnergyDomain,
    /// Package it belongs to.
    pub package: u32,
}

/// The powercap root under a sysfs root.
pub fn root(sysfs: &Path) -> PathBuf {
    sysfs.join("class/powercap")
}

/// Finds the RAPL zones under `sysfs`, sorted by directory name. Unknown zone names are
/// skipped. `Ok(empty)` when there is no powercap tree.
pub fn zones(sysfs: &Path) -> Result<Vec<ZoneInfo>, EnergyError> {
    zones_in(&root(sysfs))
}

/// [`zones`] of a powercap directory itself (a hypervisor share is laid out like one).
pub fn zones_in(dir: &Path) -> Result<Vec<ZoneInfo>, EnergyError> {
    let dir = dir.to_owned();
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EnergyError::from_io(&dir, e, "")),
    };
    let mut ids: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix("intel-rapl:")
                .is_some_and(|rest| !rest.is_empty())
        })
        .collect();
    ids.sort();
    let mut out = Vec::new();
    for id in &ids {
        let zone_dir = dir.join(id);
        let name = read_text(&zone_dir.join("name"), "")?;
        let parts: Vec<&str> = id["intel-rapl:".len()..].split(':').collect();
        let (domain, package) = if parts.len() == 1 {
            match name.strip_prefix("package-").map(str::parse::<u32>) {
                Some(Ok(p)) => (pb::EnergyDomain::Package, p),
                _ if name == "psys" => (pb::EnergyDomain::Psys, 0),
                _ => continue,
            }
        } else {
            let Some(domain) = sub_domain(&name) else {
                continue;
            };
            let parent_name = read_text(
                &dir.join(format!("intel-rapl:{}", parts[0])).join("name"),
                "",
            )?;
            let package = parent_name
                .strip_prefix("package-")
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            (domain, package)
        };
        out.push(ZoneInfo {
            dir: zone_dir,
            id: id.clone(),
            name,
            domain,
            package,
        });
    }
    Ok(out)
}

fn sub_domain(name: &str) -> Option<pb::EnergyDomain> {
    Some(match name {
        "core" => pb::EnergyDomain::Cores,
        "uncore" => pb::EnergyDomain::Uncore,
        "dram" => pb::EnergyDomain::Dram,
        "psys" => pb::EnergyDomain::Psys,
        _ => return None,
    })
}

impl Zone {
    /// Opens a zone: reads its range and checks that `energy_uj` is readable.
    pub fn open(info: &ZoneInfo) -> Result<Self, EnergyError> {
        let range_uj = read_u64(&info.dir.join("max_energy_range_uj"), PERMISSION_HINT)?;
        let energy_path = info.dir.join("energy_uj");
        read_u64(&energy_path, PERMISSION_HINT)?;
        let desc = source_desc(
            SourceKind::Powercap,
            info.domain,
            info.package,
            format!("{} ({})", info.id, info.name),
        );
        Ok(Self {
            energy_path,
            desc,
            range_uj,
        })
    }
}

impl EnergySource for Zone {
    fn describe(&self) -> pb::EnergySource {
        self.desc.clone()
    }

    fn unit_uj(&self) -> f64 {
        1.0
    }

    fn wrap_counts(&self) -> Option<u64> {
        self.range_uj.checked_add(1)
    }

    fn read(&mut self) -> Result<RawSample, EnergyError> {
        // Re-opened on every read: sysfs regenerates the value on open, and a fake tree
        // replaces the file atomically by rename.
        let count = read_u64(&self.energy_path, PERMISSION_HINT)?;
        Ok(RawSample {
            count,
            gpu_processes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::fake::FakePowercap;

    #[test]
    fn finds_two_packages_with_sub_zones() {
        let tmp = tempfile::tempdir().expect("tempdir");
        FakePowercap::two_packages(tmp.path(), 1_000_000).expect("fake tree");
        let found = zones(tmp.path()).expect("zones");
        let summary: Vec<(String, &str, pb::EnergyDomain, u32)> = found
            .iter()
            .map(|z| (z.id.clone(), z.name.as_str(), z.domain, z.package))
            .collect();
        use pb::EnergyDomain::*;
        assert_eq!(
            summary,
            vec![
                ("intel-rapl:0".into(), "package-0", Package, 0),
                ("intel-rapl:0:0".into(), "core", Cores, 0),
                ("intel-rapl:0:1".into(), "dram", Dram, 0),
                ("intel-rapl:1".into(), "package-1", Package, 1),
                ("intel-rapl:1:0".into(), "core", Cores, 1),
                ("intel-rapl:1:1".into(), "dram", Dram, 1),
            ]
        );
        let mut zone = Zone::open(&found[2]).expect("open");
        assert_eq!(zone.wrap_counts(), Some(1_000_001));
        assert_eq!(zone.describe().name, "intel-rapl:0:1 (dram)");
        assert_eq!(zone.read().expect("read").count, 0);
    }

    #[test]
    fn permission_denied_names_the_cve_and_the_fix() {
        // Tests run as root here, so the EACCES a normal user gets is made by hand; the
        // classification is the same code every read goes through.
        let path = Path::new("/sys/class/powercap/intel-rapl:0/energy_uj");
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        let text = EnergyError::from_io(path, denied, PERMISSION_HINT).to_string();
        assert!(
            text.starts_with(
                "permission denied reading /sys/class/powercap/intel-rapl:0/energy_uj: "
            ),
            "{text}"
        );
        assert!(
            text.contains("CVE-2020-8694") && text.contains("run as root"),
            "{text}"
        );
    }

    #[test]
    fn no_tree_is_empty_not_an_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert_eq!(zones(tmp.path()).expect("zones"), Vec::new());
    }

    #[test]
    fn garbage_counter_is_a_clear_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        FakePowercap::two_packages(tmp.path(), 1_000_000).expect("fake tree");
        let found = zones(tmp.path()).expect("zones");
        std::fs::write(found[0].dir.join("energy_uj"), "garbage\n").expect("write");
        let err = Zone::open(&found[0]).expect_err("garbage accepted");
        let text = err.to_string();
        assert!(
            text.contains("intel-rapl:0/energy_uj") && text.contains("\"garbage\""),
            "{text}"
        );
    }
}
