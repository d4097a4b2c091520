//! RAPL through model-specific registers: `pread(<devcpu>/N/msr, 8 bytes, offset = register)`.
//!
//! Registers (Intel SDM vol. 4 "RAPL interfaces"; AMD PPR "MSRC001_029x"; docs/ARCHITECTURE.md, "Energy counters"):
//! Intel 0x606 units, 0x611 package, 0x619 DRAM, 0x639 PP0 (cores), 0x641 PP1 (graphics);
//! AMD 0xC0010299 units, 0xC001029A per-core, 0xC001029B package. The energy status unit is
//! 1/2^ESU J with ESU in bits 12:8 of the units register (ESU 16 = 15.3 µJ). Status registers
//! count in bits 31:0 and wrap at 2^32. Package registers are read on the first CPU of each
//! package, AMD core registers on the first CPU of each core. (Some Intel servers count DRAM
//! in a fixed 15.3 µJ unit regardless of ESU; the units register is used as reported.)

use std::{
    collections::BTreeMap,
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use super::{EnergyError, EnergySource, RawSample, SourceKind, source_desc};
use crate::pb::v1 as pb;

/// Intel RAPL power units register.
pub const INTEL_UNITS: u64 = 0x606;
/// Intel package energy status.
pub const INTEL_PKG: u64 = 0x611;
/// Intel DRAM energy status.
pub const INTEL_DRAM: u64 = 0x619;
/// Intel PP0 (cores) energy status.
pub const INTEL_PP0: u64 = 0x639;
/// Intel PP1 (graphics/uncore) energy status.
pub const INTEL_PP1: u64 = 0x641;
/// AMD RAPL power units register.
pub const AMD_UNITS: u64 = 0xC001_0299;
/// AMD per-core energy status.
pub const AMD_CORE: u64 = 0xC001_029A;
/// AMD package energy status.
pub const AMD_PKG: u64 = 0xC001_029B;

/// What to do when `<devcpu>/N/msr` is missing.
pub const DRIVER_HINT: &str = "MSR driver not loaded: run `sudo modprobe msr`";
/// What to do when it is not readable.
pub const PERMISSION_HINT: &str = "reading MSRs needs root (CAP_SYS_RAWIO)";

/// CPU vendor, as told by which units register answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Intel RAPL registers.
    Intel,
    /// AMD (family 17h+) RAPL registers.
    Amd,
}

/// One energy status register of one CPU.
#[derive(Debug)]
pub struct Register {
    file: Arc<File>,
    path: PathBuf,
    offset: u64,
    unit_uj: f64,
    desc: pb::EnergySource,
}

/// Reads one MSR.
fn read_msr(file: &File, path: &Path, offset: u64) -> Result<u64, EnergyError> {
    let mut buf = [0u8; 8];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| EnergyError::from_io(path, e, PERMISSION_HINT))?;
    Ok(u64::from_le_bytes(buf))
}

/// Energy unit in µJ from a units register: 1/2^ESU J, ESU in bits 12:8.
pub fn unit_uj(units: u64) -> f64 {
    let esu = (units >> 8) & 0x1f;
    1e6 / f64::from(1u32 << esu)
}

fn open_cpu(root: &Path, cpu: u32) -> Result<(Arc<File>, PathBuf), EnergyError> {
    let path = root.join(cpu.to_string()).join("msr");
    match File::open(&path) {
        Ok(f) => Ok((Arc::new(f), path)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(EnergyError::Io {
            path,
            source: std::io::Error::new(std::io::ErrorKind::NotFound, DRIVER_HINT),
        }),
        Err(e) => Err(EnergyError::from_io(path, e, PERMISSION_HINT)),
    }
}

/// Opens every RAPL energy register the CPUs answer. Registers that fail to read or read 0
/// (domains the part does not have, e.g. DRAM on most clients) are skipped.
///
/// The units register is package-scoped and read once per package. Package registers are
/// read on the first CPU of the package; AMD core registers (core-scoped) on the last thread
/// of each core, so that with SMT no CPU's file carries both 0xC001029A and 0xC001029B,
/// which lie one byte apart (a fake MSR file, being a plain file, cannot hold overlapping
/// 8-byte registers; the real driver does not care).
pub fn open(root: &Path, cpus: &[pb::Cpu]) -> Result<(Vendor, Vec<Register>), EnergyError> {
    let cpus: Vec<pb::Cpu> = if cpus.is_empty() {
        vec![pb::Cpu {
            id: 0,
            package: 0,
            core: 0,
        }]
    } else {
        cpus.to_vec()
    };
    let (packages, cores) = reading_cpus(&cpus);
    let first_cpu = packages.values().next().copied().unwrap_or(0);
    let (file, path) = open_cpu(root, first_cpu)?;
    let vendor = if read_msr(&file, &path, INTEL_UNITS).is_ok_and(|v| v != 0) {
        Vendor::Intel
    } else if read_msr(&file, &path, AMD_UNITS).is_ok_and(|v| v != 0) {
        Vendor::Amd
    } else {
        return Err(EnergyError::Io {
            path,
            source: std::io::Error::other(
                "no RAPL MSRs: neither Intel 0x606 nor AMD 0xC0010299 reads a power unit",
            ),
        });
    };
    let (units_reg, per_package): (u64, &[(u64, pb::EnergyDomain, &str)]) = match vendor {
        Vendor::Intel => (
            INTEL_UNITS,
            &[
                (INTEL_PKG, pb::EnergyDomain::Package, "package"),
                (INTEL_PP0, pb::EnergyDomain::Cores, "pp0"),
                (INTEL_PP1, pb::EnergyDomain::Uncore, "pp1"),
                (INTEL_DRAM, pb::EnergyDomain::Dram, "dram"),
            ],
        ),
        Vendor::Amd => (
            AMD_UNITS,
            &[(AMD_PKG, pb::EnergyDomain::Package, "package")],
        ),
    };
    let mut out = Vec::new();
    let mut units: BTreeMap<u32, f64> = BTreeMap::new();
    for (&package, &cpu) in &packages {
        let (file, path) = open_cpu(root, cpu)?;
        let unit = unit_uj(read_msr(&file, &path, units_reg)?);
        units.insert(package, unit);
        for &(reg, domain, label) in per_package {
            let name = format!("cpu{cpu} msr {reg:#x} ({label}-{package})");
            out.extend(register(&file, &path, reg, unit, domain, package, name));
        }
    }
    if vendor == Vendor::Amd {
        for (&(package, core), &cpu) in &cores {
            let (file, path) = open_cpu(root, cpu)?;
            let unit = units.get(&package).copied().unwrap_or(unit_uj(0));
            let name = format!("cpu{cpu} msr {AMD_CORE:#x} (core {core} of package {package})");
            out.extend(register(
                &file,
                &path,
                AMD_CORE,
                unit,
                pb::EnergyDomain::Cores,
                package,
                name,
            ));
        }
    }
    Ok((vendor, out))
}

/// The CPU that reads each package's registers (its first) and each core's (its last).
pub fn reading_cpus(cpus: &[pb::Cpu]) -> (BTreeMap<u32, u32>, BTreeMap<(u32, u32), u32>) {
    let mut packages: BTreeMap<u32, u32> = BTreeMap::new();
    let mut cores: BTreeMap<(u32, u32), u32> = BTreeMap::new();
    for c in cpus {
        let p = packages.entry(c.package).or_insert(c.id);
        *p = (*p).min(c.id);
        let k = cores.entry((c.package, c.core)).or_insert(c.id);
        *k = (*k).max(c.id);
    }
    (packages, cores)
}

/// A register, when it reads a non-zero count.
fn register(
    file: &Arc<File>,
    path: &Path,
    offset: u64,
    unit_uj: f64,
    domain: pb::EnergyDomain,
    package: u32,
    name: String,
) -> Option<Register> {
    read_msr(file, path, offset)
        .ok()
        .filter(|v| v & 0xffff_ffff != 0)?;
    let desc = source_desc(SourceKind::Msr, domain, package, name);
    Some(Register {
        file: file.clone(),
        path: path.to_owned(),
        offset,
        unit_uj,
        desc,
    })
}

impl EnergySource for Register {
    fn describe(&self) -> pb::EnergySource {
        self.desc.clone()
    }

    fn unit_uj(&self) -> f64 {
        self.unit_uj
    }

    fn wrap_counts(&self) -> Option<u64> {
        Some(1 << 32)
    }

    fn read(&mut self) -> Result<RawSample, EnergyError> {
        let value = read_msr(&self.file, &self.path, self.offset)?;
        Ok(RawSample {
            count: value & 0xffff_ffff,
            gpu_processes: Vec::new(),
        })
    }
}

#[cfg(test)]
#[path = "msr_tests.rs"]
mod tests;
