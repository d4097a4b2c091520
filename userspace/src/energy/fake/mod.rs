//! Fake energy hardware for tests: sysfs and MSR trees built in a directory, and an
//! [`Emulator`] that advances their counters like real RAPL (about every 1 ms, µJ or
//! 15.3 µJ units, wrapping). Tests point `--sysfs-root` / `--dev-cpu-root` at the directory
//! and drive the same code as on real machines (docs/ARCHITECTURE.md, "Our machines": our VMs have no counters).
//!
//! ```no_run
//! use energy_bpf::energy::fake::FakePowercap;
//! let dir = tempfile::tempdir().unwrap();
//! // Two packages, each with a core and a DRAM sub-zone, wrapping after 2 J.
//! let tree = FakePowercap::two_packages(dir.path(), 2_000_000).unwrap();
//! let emu = tree.spawn(&[("intel-rapl:0", 40.0), ("intel-rapl:0:1", 5.0)]).unwrap();
//! // ... run `energy-bpf record --sysfs-root DIR` or `energy::start` ...
//! let totals = emu.stop(); // exact µJ added per zone id
//! ```
//!
//! Layouts written:
//! - powercap: `class/powercap/intel-rapl:N[:M]/{name,energy_uj,max_energy_range_uj}`;
//! - hwmon: `class/hwmon/hwmon0/{name,energyK_input,energyK_label}` (amd_energy naming);
//! - MSR: `N/msr`, sparse files with 8 little-endian bytes at offset = register number,
//!   units register with ESU 16 (15.26 µJ), 32-bit energy registers;
//! - power PMU: `bus/event_source/devices/power/{type,events/energy-*{,.scale,.unit}}`;
//! - topology: `devices/system/cpu/{online,cpuN/topology/{physical_package_id,core_id}}`.

mod emulator;

use std::{
    fs, io,
    path::{Path, PathBuf},
};

pub use emulator::{Emulator, FakeCounter, TICK, Target};

use super::msr;
use crate::pb::v1 as pb;

/// One powercap zone to create.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneSpec {
    /// Directory name, e.g. `intel-rapl:0:1`.
    pub id: String,
    /// Contents of `name`, e.g. `dram`.
    pub name: String,
    /// `max_energy_range_uj`: the counter wraps to 0 after this value.
    pub max_energy_range_uj: u64,
}

impl ZoneSpec {
    /// A zone spec.
    pub fn new(id: &str, name: &str, max_energy_range_uj: u64) -> Self {
        Self {
            id: id.to_owned(),
            name: name.to_owned(),
            max_energy_range_uj,
        }
    }
}

/// A fake powercap tree under a sysfs root.
#[derive(Clone, Debug)]
pub struct FakePowercap {
    root: PathBuf,
    zones: Vec<ZoneSpec>,
}

impl FakePowercap {
    /// Creates the zones under `<sysfs_root>/class/powercap`, counters at 0.
    pub fn create(sysfs_root: &Path, zones: &[ZoneSpec]) -> io::Result<Self> {
        let root = sysfs_root.join("class/powercap");
        for z in zones {
            let dir = root.join(&z.id);
            fs::create_dir_all(&dir)?;
            fs::write(dir.join("name"), format!("{}\n", z.name))?;
            fs::write(
                dir.join("max_energy_range_uj"),
                format!("{}\n", z.max_energy_range_uj),
            )?;
            fs::write(dir.join("energy_uj"), "0\n")?;
        }
        Ok(Self {
            root,
            zones: zones.to_vec(),
        })
    }

    /// Two packages (`intel-rapl:0`, `intel-rapl:1`), each with a `core` (`:0`) and a `dram`
    /// (`:1`) sub-zone, all wrapping after `max_energy_range_uj`.
    pub fn two_packages(sysfs_root: &Path, max_energy_range_uj: u64) -> io::Result<Self> {
        let mut zones = Vec::new();
        for p in 0..2 {
            zones.push(ZoneSpec::new(
                &format!("intel-rapl:{p}"),
                &format!("package-{p}"),
                max_energy_range_uj,
            ));
            zones.push(ZoneSpec::new(
                &format!("intel-rapl:{p}:0"),
                "core",
                max_energy_range_uj,
            ));
            zones.push(ZoneSpec::new(
                &format!("intel-rapl:{p}:1"),
                "dram",
                max_energy_range_uj,
            ));
        }
        Self::create(sysfs_root, &zones)
    }

    /// Directory of a zone.
    pub fn zone_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    /// The counter of a zone, for the emulator or direct writes.
    pub fn counter(&self, id: &str) -> Option<FakeCounter> {
        let z = self.zones.iter().find(|z| z.id == id)?;
        Some(FakeCounter {
            label: z.id.clone(),
            target: Target::Text(self.zone_dir(id).join("energy_uj")),
            unit_uj: 1.0,
            modulus: Some(z.max_energy_range_uj + 1),
        })
    }

    /// Sets a zone's `energy_uj` (e.g. to make it go backwards).
    pub fn set_energy_uj(&self, id: &str, value: u64) -> io::Result<()> {
        let counter = self
            .counter(id)
            .ok_or_else(|| io::Error::other(format!("no zone {id}")))?;
        counter.write_raw(value)
    }

    /// Removes a zone's directory, as when a device disappears.
    pub fn remove_zone(&self, id: &str) -> io::Result<()> {
        fs::remove_dir_all(self.zone_dir(id))
    }

    /// Starts advancing the listed zones (by id) at the given watts.
    pub fn spawn(&self, watts: &[(&str, f64)]) -> io::Result<Emulator> {
        let counters = watts
            .iter()
            .map(|&(id, w)| {
                let c = self
                    .counter(id)
                    .ok_or_else(|| io::Error::other(format!("no zone {id}")))?;
                Ok((c, w))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Emulator::spawn(counters)
    }
}

/// Creates an amd_energy hwmon device (`hwmon0`) with `Ecore000..` inputs for
/// `packages × cores_per_package` cores, then `Esocket0..`; counters at 0, µJ. Returns the
/// counters in that order (labels = the input labels).
pub fn hwmon_amd_energy(
    sysfs_root: &Path,
    packages: u32,
    cores_per_package: u32,
) -> io::Result<Vec<FakeCounter>> {
    let dir = sysfs_root.join("class/hwmon/hwmon0");
    fs::create_dir_all(&dir)?;
    fs::write(dir.join("name"), "amd_energy\n")?;
    let labels: Vec<String> = (0..packages * cores_per_package)
        .map(|c| format!("Ecore{c:03}"))
        .chain((0..packages).map(|p| format!("Esocket{p}")))
        .collect();
    let mut out = Vec::new();
    for (i, label) in labels.into_iter().enumerate() {
        let k = i + 1;
        fs::write(dir.join(format!("energy{k}_label")), format!("{label}\n"))?;
        let path = dir.join(format!("energy{k}_input"));
        fs::write(&path, "0\n")?;
        out.push(FakeCounter {
            label,
            target: Target::Text(path),
            unit_uj: 1.0,
            modulus: None,
        });
    }
    Ok(out)
}

/// Units register value with ESU 16 (15.26 µJ), power units 3, time units 10.
pub const UNITS_ESU16: u64 = 0x000A_1003;
/// Energy registers start this close to the 32-bit wrap, so a test wraps within
/// milliseconds (4096 counts ≈ 62.5 mJ).
pub const MSR_START: u64 = (1 << 32) - 4096;

/// Fake `/dev/cpu/N/msr` files.
#[derive(Clone, Debug)]
pub struct FakeMsr {
    counters: Vec<FakeCounter>,
}

impl FakeMsr {
    /// Intel: units 0x606 and package 0x611, PP0 0x639 and DRAM 0x619 on the first
    /// CPU of each package (labels `pkg-P`, `pp0-P`, `dram-P`). PP1 is absent (reads 0).
    pub fn intel(dev_cpu_root: &Path, cpus: &[pb::Cpu]) -> io::Result<Self> {
        let regs = [
            (msr::INTEL_PKG, "pkg"),
            (msr::INTEL_PP0, "pp0"),
            (msr::INTEL_DRAM, "dram"),
        ];
        Self::build(dev_cpu_root, cpus, msr::INTEL_UNITS, &regs, None)
    }

    /// AMD: units 0xC0010299 and package 0xC001029B on the first CPU of each package
    /// (`pkg-P`), core 0xC001029A on the last thread of each core (`core-P-C`). Needs two
    /// threads per core (see [`msr::open`]).
    pub fn amd(dev_cpu_root: &Path, cpus: &[pb::Cpu]) -> io::Result<Self> {
        Self::build(
            dev_cpu_root,
            cpus,
            msr::AMD_UNITS,
            &[(msr::AMD_PKG, "pkg")],
            Some(msr::AMD_CORE),
        )
    }

    fn build(
        root: &Path,
        cpus: &[pb::Cpu],
        units: u64,
        package_regs: &[(u64, &str)],
        core_reg: Option<u64>,
    ) -> io::Result<Self> {
        let (packages, cores) = msr::reading_cpus(cpus);
        let mk = |cpu: u32, offset: u64, label: String| -> io::Result<FakeCounter> {
            let dir = root.join(cpu.to_string());
            fs::create_dir_all(&dir)?;
            let path = dir.join("msr");
            if !path.exists() {
                fs::File::create(&path)?;
            }
            Ok(FakeCounter {
                label,
                target: Target::Msr { path, offset },
                unit_uj: 1e6 / 65536.0,
                modulus: Some(1 << 32),
            })
        };
        for cpu in cpus {
            mk(cpu.id, 0, String::new())?;
        }
        let mut counters = Vec::new();
        // Units first: on AMD the package register, two bytes above the units register,
        // then overwrites the units' upper bytes but not the ESU (bits 12:8).
        for (&package, &cpu) in &packages {
            mk(cpu, units, String::new())?.write_raw(UNITS_ESU16)?;
            for &(reg, name) in package_regs {
                counters.push(mk(cpu, reg, format!("{name}-{package}"))?);
            }
        }
        if let Some(reg) = core_reg {
            for (&(package, core), &cpu) in &cores {
                if packages.values().any(|&p| p == cpu) {
                    return Err(io::Error::other(format!(
                        "fake AMD MSRs need two threads per core: cpu{cpu} would hold both the \
                         package and the core register, which overlap in a plain file"
                    )));
                }
                counters.push(mk(cpu, reg, format!("core-{package}-{core}"))?);
            }
        }
        for c in &counters {
            c.write_raw(MSR_START)?;
        }
        Ok(Self { counters })
    }

    /// The energy registers written.
    pub fn counters(&self) -> &[FakeCounter] {
        &self.counters
    }

    /// Starts advancing the registers by label at the given watts.
    pub fn spawn(&self, watts: &[(&str, f64)]) -> io::Result<Emulator> {
        let counters = watts
            .iter()
            .map(|&(label, w)| {
                let c = self.counters.iter().find(|c| c.label == label);
                let c = c.ok_or_else(|| io::Error::other(format!("no register {label}")))?;
                Ok((c.clone(), w))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Emulator::spawn(counters)
    }
}

/// Writes a power PMU description with the kernel's event codes (arch/x86/events/rapl.c:
/// cores 0x01, pkg 0x02, ram 0x03, gpu 0x04, psys 0x05) and scale 2^-32 J.
pub fn power_pmu(sysfs_root: &Path, pmu_type: u32, events: &[&str]) -> io::Result<()> {
    let dir = super::perf::pmu_dir(sysfs_root);
    let events_dir = dir.join("events");
    fs::create_dir_all(&events_dir)?;
    fs::write(dir.join("type"), format!("{pmu_type}\n"))?;
    for &name in events {
        let code = match name {
            "energy-cores" => 1,
            "energy-pkg" => 2,
            "energy-ram" => 3,
            "energy-gpu" => 4,
            "energy-psys" => 5,
            _ => return Err(io::Error::other(format!("unknown power event {name}"))),
        };
        fs::write(events_dir.join(name), format!("event=0x{code:02x}\n"))?;
        fs::write(
            events_dir.join(format!("{name}.scale")),
            "2.3283064365386962890625e-10\n",
        )?;
        fs::write(events_dir.join(format!("{name}.unit")), "Joules\n")?;
    }
    Ok(())
}

/// CPUs numbered package by package, core ids 0.. within each package (no files written).
pub fn cpus(packages: u32, cpus_per_package: u32) -> Vec<pb::Cpu> {
    (0..packages * cpus_per_package)
        .map(|id| pb::Cpu {
            id,
            package: id / cpus_per_package,
            core: id % cpus_per_package,
        })
        .collect()
}

/// Writes CPU topology: `packages × cpus_per_package` CPUs, numbered package by package,
/// core ids 0.. within each package. Returns the CPUs.
pub fn topology(
    sysfs_root: &Path,
    packages: u32,
    cpus_per_package: u32,
) -> io::Result<Vec<pb::Cpu>> {
    let base = sysfs_root.join("devices/system/cpu");
    fs::create_dir_all(&base)?;
    let out = cpus(packages, cpus_per_package);
    fs::write(
        base.join("online"),
        format!("0-{}\n", out.len().saturating_sub(1)),
    )?;
    for c in &out {
        let dir = base.join(format!("cpu{}/topology", c.id));
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("physical_package_id"), format!("{}\n", c.package))?;
        fs::write(dir.join("core_id"), format!("{}\n", c.core))?;
    }
    Ok(out)
}

/// A fake machine for the estimated model: `proc/cpuinfo` (x86 layout, `cpus` logical CPUs
/// of `cpu_name`, vendor/family/model/stepping, the `hypervisor` flag when `guest`) and
/// `proc/meminfo` under `root`, and, when given, DMI `sys_vendor`/`product_name` under
/// `root/class/dmi/id` (so `root` doubles as the sysfs root). Returns the proc root.
pub fn machine(
    root: &Path,
    cpu_name: &str,
    id: (&str, u32, u32, u32),
    cpus: u32,
    guest: bool,
    dmi: Option<(&str, &str)>,
) -> io::Result<PathBuf> {
    let proc_root = root.join("proc");
    fs::create_dir_all(&proc_root)?;
    let (vendor, family, model, stepping) = id;
    let flags = if guest {
        "fpu vme sse sse2 hypervisor avx2"
    } else {
        "fpu vme sse sse2 avx2"
    };
    let text: String = (0..cpus)
        .map(|n| {
            format!(
                "processor\t: {n}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n\
                 model name\t: {cpu_name}\nstepping\t: {stepping}\nphysical id\t: 0\nflags\t\t: {flags}\n\n"
            )
        })
        .collect();
    fs::write(proc_root.join("cpuinfo"), text)?;
    fs::write(
        proc_root.join("meminfo"),
        "MemTotal:       16000000 kB\nMemFree:         8000000 kB\n",
    )?;
    if let Some((sys_vendor, product)) = dmi {
        let dir = root.join("class/dmi/id");
        fs::create_dir_all(&dir)?;
        fs::write(dir.join("sys_vendor"), format!("{sys_vendor}\n"))?;
        fs::write(dir.join("product_name"), format!("{product}\n"))?;
    }
    Ok(proc_root)
}
