//! Knowing the machine the estimated model describes: the CPU (`/proc/cpuinfo`: model
//! name, vendor, family/model/stepping, the `hypervisor` flag, the logical CPUs), the
//! memory (`/proc/meminfo`) and the platform (DMI `sys_vendor`, `product_name` under
//! sysfs, e.g. `Amazon EC2` + `c6i.2xlarge`), and from them the power-table estimate
//! ([`estimate`]): the wall watts of this machine, or of a VM's share of its host.
//!
//! Both roots are parameters (`--proc-root`, `--sysfs-root`) so tests drive this same
//! code on fake trees. Every file is read with a size cap; a file that is not what its
//! name says is a clear error, a DMI file that is absent is simply unknown.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    sync::OnceLock,
};

use super::{
    EnergyError,
    power_table::{self, Server, Table, Vendor},
};

/// The checked-in table (`cargo xtask model-table build`).
const TABLE_TEXT: &str = include_str!("../../data/specpower/power-table.tsv");

/// Caps on what is read: cpuinfo of a few thousand CPUs, one short DMI line, meminfo.
const MAX_CPUINFO_BYTES: u64 = 16 * 1024 * 1024;
const MAX_DMI_BYTES: u64 = 4096;
const MAX_MEMINFO_BYTES: u64 = 256 * 1024;

/// The parsed checked-in power table.
pub fn table() -> Result<&'static Table, EnergyError> {
    static TABLE: OnceLock<Result<Table, String>> = OnceLock::new();
    TABLE
        .get_or_init(|| Table::parse(TABLE_TEXT).map_err(|e| e.0))
        .as_ref()
        .map_err(|e| EnergyError::Model(format!("the built-in power table: {e}")))
}

/// What this machine is, as far as the model cares.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Machine {
    /// `model name` of the first CPU.
    pub cpu_name: String,
    /// CPUID vendor (`vendor_id`).
    pub vendor: Option<Vendor>,
    /// CPUID family, model, stepping.
    pub family_model: Option<(u32, u32, u32)>,
    /// The `hypervisor` CPU flag: this is a guest.
    pub hypervisor: bool,
    /// Logical CPUs (`processor` entries).
    pub cpus: u32,
    /// Sockets (distinct `physical id`s; 1 when none are listed).
    pub chips: u32,
    /// `MemTotal`, GB (0 when unknown).
    pub memory_gb: f64,
    /// DMI `sys_vendor`.
    pub sys_vendor: Option<String>,
    /// DMI `product_name`.
    pub product_name: Option<String>,
}

fn read_capped(path: &Path, cap: u64) -> Result<Option<String>, EnergyError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(EnergyError::Model(format!(
                "reading {}: {e}",
                path.display()
            )));
        }
    };
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| EnergyError::Model(format!("reading {}: {e}", path.display())))?;
    if bytes.len() as u64 > cap {
        return Err(EnergyError::Model(format!(
            "{} is over {cap} bytes: not a file the model reads",
            path.display()
        )));
    }
    String::from_utf8(bytes).map(Some).map_err(|_| {
        EnergyError::Model(format!(
            "{} is not text: not a file the model reads",
            path.display()
        ))
    })
}

/// Parses `/proc/cpuinfo` text (x86 layout: `key : value` lines, a blank line between CPUs).
pub fn parse_cpuinfo(text: &str, path: &Path) -> Result<Machine, EnergyError> {
    let mut m = Machine::default();
    let mut physical = std::collections::BTreeSet::new();
    let (mut family, mut model, mut stepping) = (None, None, None);
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            if line.trim().is_empty() {
                continue;
            }
            return Err(EnergyError::Model(format!(
                "{}: expected `key : value` lines, found {:?}",
                path.display(),
                line.chars().take(80).collect::<String>()
            )));
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => m.cpus += 1,
            "model name" if m.cpu_name.is_empty() => m.cpu_name = value.to_string(),
            "vendor_id" if m.vendor.is_none() => {
                m.vendor = match value {
                    "GenuineIntel" => Some(Vendor::Intel),
                    "AuthenticAMD" | "HygonGenuine" => Some(Vendor::Amd),
                    _ => None,
                }
            }
            "cpu family" if family.is_none() => family = value.parse().ok(),
            "model" if model.is_none() => model = value.parse().ok(),
            "stepping" if stepping.is_none() => stepping = value.parse().ok(),
            "physical id" => {
                physical.insert(value.to_string());
            }
            "flags" if m.cpus <= 1 => m.hypervisor = value.split(' ').any(|f| f == "hypervisor"),
            _ => {}
        }
    }
    if m.cpus == 0 {
        return Err(EnergyError::Model(format!(
            "{}: no `processor` lines: not a cpuinfo file",
            path.display()
        )));
    }
    m.chips = (physical.len() as u32).max(1);
    if let (Some(f), Some(md)) = (family, model) {
        m.family_model = Some((f, md, stepping.unwrap_or(0)));
    }
    Ok(m)
}

/// Reads the machine from `proc_root` (`cpuinfo`, `meminfo`) and `sysfs_root`
/// (`class/dmi/id/{sys_vendor,product_name}`).
pub fn read(proc_root: &Path, sysfs_root: &Path) -> Result<Machine, EnergyError> {
    let cpuinfo = proc_root.join("cpuinfo");
    let text = read_capped(&cpuinfo, MAX_CPUINFO_BYTES)?
        .ok_or_else(|| EnergyError::Model(format!("{} does not exist", cpuinfo.display())))?;
    let mut m = parse_cpuinfo(&text, &cpuinfo)?;
    let meminfo = proc_root.join("meminfo");
    if let Some(text) = read_capped(&meminfo, MAX_MEMINFO_BYTES)? {
        let kb = text
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .ok_or_else(|| {
                EnergyError::Model(format!("{}: no `MemTotal: N kB` line", meminfo.display()))
            })?;
        m.memory_gb = kb / 1e6 * 1.024;
    }
    let dmi = |name: &str| -> Result<Option<String>, EnergyError> {
        let path: PathBuf = sysfs_root.join("class/dmi/id").join(name);
        Ok(read_capped(&path, MAX_DMI_BYTES)?
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty()))
    };
    m.sys_vendor = dmi("sys_vendor")?;
    m.product_name = dmi("product_name")?;
    Ok(m)
}

/// A cloud host whose CPU and size are public: the instance families that run on it.
struct Host {
    /// DMI `sys_vendor`.
    sys_vendor: &'static str,
    /// Instance-family prefixes of `product_name` (`c6i` of `c6i.2xlarge`).
    families: &'static [&'static str],
    cpu: &'static str,
    chips: f64,
    threads: f64,
}

/// Public host CPUs of EC2 instance families (AWS's instance-type pages); the host is a
/// two-socket server of that CPU with SMT.
static HOSTS: &[Host] = &[
    Host {
        sys_vendor: "Amazon EC2",
        families: &[
            "c6i", "m6i", "r6i", "c6id", "m6id", "r6id", "c6in", "m6in", "r6in",
        ],
        cpu: "Intel Xeon Platinum 8375C",
        chips: 2.0,
        threads: 128.0,
    },
    Host {
        sys_vendor: "Amazon EC2",
        families: &["c6a", "m6a", "r6a"],
        cpu: "AMD EPYC 7R13",
        chips: 2.0,
        threads: 192.0,
    },
    Host {
        sys_vendor: "Amazon EC2",
        families: &["c7i", "m7i", "r7i"],
        cpu: "Intel Xeon Platinum 8488C",
        chips: 2.0,
        threads: 192.0,
    },
    Host {
        sys_vendor: "Amazon EC2",
        families: &["c5", "m5", "r5", "c5d", "m5d", "r5d"],
        cpu: "Intel Xeon Platinum 8275CL",
        chips: 2.0,
        threads: 96.0,
    },
];

/// Load curve of the model.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "shape", rename_all = "lowercase")]
pub enum Curve {
    /// P = P_idle + (P_max − P_idle)·u.
    Linear,
    /// P = P_idle + (P_max − P_idle)·u^gamma, gamma fitted from SPECpower load curves.
    Fitted {
        /// The exponent.
        gamma: f64,
    },
}

impl Curve {
    /// The exponent (1 for linear).
    pub fn gamma(self) -> f64 {
        match self {
            Curve::Linear => 1.0,
            Curve::Fitted { gamma } => gamma,
        }
    }
}

/// What the table says about a machine or a VM's share of one.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Estimate {
    /// The row label, as outputs print it.
    pub row: String,
    /// How the CPU was matched (name → arch → fallback).
    pub path: String,
    /// Measured servers behind the row.
    pub servers: u32,
    /// The row's error at full load, %.
    pub error_pct: f64,
    /// The row's error at active idle, %.
    pub idle_error_pct: f64,
    /// Wall watts at active idle of what is described (this VM's share, or the machine).
    pub idle_w: f64,
    /// Wall watts at full load of the same.
    pub full_w: f64,
    /// The server the watts were predicted for and, for a VM, its share of it.
    pub scope: String,
}

fn predict<'t>(
    table: &'t Table,
    cpu: &str,
    id_arch: Option<&'static power_table::Arch>,
    vendor_hint: Option<Vendor>,
    server: Option<Server>,
) -> (power_table::Match<'t>, Server) {
    let found = table.lookup(cpu, id_arch, vendor_hint);
    let row = found.row;
    // A host of unknown size: a two-socket server typical of the row.
    let server = server.unwrap_or(Server {
        chips: 2.0,
        threads: 2.0 * row.threads_per_chip.max(1.0),
        memory_gb: 0.0,
        nodes: 1.0,
    });
    (found, server)
}

fn label(found: &power_table::Match<'_>) -> String {
    let r = found.row;
    format!(
        "{}, {} servers, ±{:.0}%",
        found.path, r.servers, r.full_error_pct
    )
}

/// The estimate for a machine described on the command line (whole-machine watts).
pub fn estimate_described(
    table: &Table,
    cpu: &str,
    threads: f64,
    chips: f64,
    memory_gb: f64,
    nodes: f64,
) -> Estimate {
    let server = Server {
        chips,
        threads,
        memory_gb,
        nodes,
    };
    let (found, server) = predict(table, cpu, None, None, Some(server));
    let server = Server {
        memory_gb: if server.memory_gb > 0.0 {
            server.memory_gb
        } else {
            server.threads * found.row.gb_per_thread.max(0.1)
        },
        ..server
    };
    Estimate {
        row: label(&found),
        path: found.path.clone(),
        servers: found.row.servers,
        error_pct: found.row.full_error_pct,
        idle_error_pct: found.row.idle_error_pct,
        idle_w: table.idle.watts(&server, found.vendor, found.server),
        full_w: table.full.watts(&server, found.vendor, found.server),
        scope: format!(
            "the machine described: {} chips, {} threads, {} GB, {} node(s)",
            server.chips, server.threads, server.memory_gb, server.nodes
        ),
    }
}

/// The estimate for `machine`: on bare metal, the machine itself; in a VM, its share of
/// the host's wall power, vCPUs over the host's threads (the Cloud Carbon Footprint /
/// Teads convention), the host from the instance type where its CPU is public, else a
/// two-socket server typical of the row.
pub fn estimate(table: &Table, machine: &Machine) -> Estimate {
    let id_arch = match (machine.vendor, machine.family_model) {
        (Some(v), Some((f, m, s))) => power_table::arch_of_id(v, f, m, s),
        _ => None,
    };
    let instance = machine.product_name.as_deref().unwrap_or("");
    let family = instance.split('.').next().unwrap_or("");
    let host = HOSTS.iter().find(|h| {
        machine.sys_vendor.as_deref() == Some(h.sys_vendor) && h.families.contains(&family)
    });
    let vm = machine.hypervisor || host.is_some();
    let cpu_name = if machine.cpu_name.is_empty() {
        host.map_or("", |h| h.cpu)
    } else {
        &machine.cpu_name
    };
    let server = if let Some(h) = host {
        Some((h.chips, h.threads))
    } else if vm {
        None
    } else {
        Some((f64::from(machine.chips), f64::from(machine.cpus)))
    };
    let (found, mut server) = predict(
        table,
        cpu_name,
        id_arch,
        machine.vendor,
        server.map(|(chips, threads)| Server {
            chips,
            threads,
            memory_gb: 0.0,
            nodes: 1.0,
        }),
    );
    if server.memory_gb <= 0.0 {
        server.memory_gb = if vm || machine.memory_gb <= 0.0 {
            server.threads * found.row.gb_per_thread.max(0.1)
        } else {
            machine.memory_gb
        };
    }
    let share = if vm {
        (f64::from(machine.cpus.max(1)) / server.threads).min(1.0)
    } else {
        1.0
    };
    let idle = table.idle.watts(&server, found.vendor, found.server);
    let full = table.full.watts(&server, found.vendor, found.server);
    let platform = match (&machine.sys_vendor, &machine.product_name) {
        (Some(v), Some(p)) => format!("{v} {p}"),
        (Some(v), None) | (None, Some(v)) => v.clone(),
        (None, None) => "no DMI".to_string(),
    };
    let scope = if vm {
        format!(
            "a VM ({platform}): {} vCPUs of a {} host of {} chips, {} threads, {:.0} GB ({}); share {:.4} of its wall power (vCPUs / host threads)",
            machine.cpus,
            if host.is_some() { "public" } else { "typical" },
            server.chips,
            server.threads,
            server.memory_gb,
            if host.is_some() {
                "from the instance type"
            } else {
                "the row's typical server"
            },
            share
        )
    } else {
        format!(
            "this machine ({platform}): {} chips, {} threads, {:.0} GB",
            server.chips, server.threads, server.memory_gb
        )
    };
    Estimate {
        row: label(&found),
        path: found.path.clone(),
        servers: found.row.servers,
        error_pct: found.row.full_error_pct,
        idle_error_pct: found.row.idle_error_pct,
        idle_w: idle * share,
        full_w: full * share,
        scope,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::fake;

    fn estimate_of(
        name: &str,
        id: (&str, u32, u32, u32),
        cpus: u32,
        guest: bool,
        dmi: Option<(&str, &str)>,
    ) -> (Machine, Estimate) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let proc_root = fake::machine(tmp.path(), name, id, cpus, guest, dmi).expect("fake");
        let m = read(&proc_root, tmp.path()).expect("read");
        let e = estimate(table().expect("table"), &m);
        (m, e)
    }

    #[test]
    fn the_built_in_table_parses_and_has_its_provenance() {
        let t = table().expect("table");
        assert!(t.provenance.iter().any(|p| p.contains("SPECpower")));
        assert!(t.provenance.iter().any(|p| p.contains("before 2020-01-01")));
        assert!((0.2..=5.0).contains(&t.curve_gamma));
    }

    #[test]
    fn an_ec2_ice_lake_instance_is_a_share_of_its_public_host() {
        let (m, e) = estimate_of(
            "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz",
            ("GenuineIntel", 6, 106, 6),
            8,
            true,
            Some(("Amazon EC2", "c6i.2xlarge")),
        );
        assert!(m.hypervisor && m.cpus == 8);
        assert!(
            e.row
                .starts_with("Intel Xeon Platinum 8375C → Ice Lake-SP (no servers before"),
            "{}",
            e.row
        );
        assert!(e.row.contains("→ Intel server"), "{}", e.row);
        assert!(
            e.scope
                .contains("8 vCPUs of a public host of 2 chips, 128 threads")
                && e.scope.contains("Amazon EC2 c6i.2xlarge"),
            "{}",
            e.scope
        );
        // The share is 8/128 of the host described on the command line.
        let host = estimate_described(
            table().expect("table"),
            "Intel Xeon Platinum 8375C",
            128.0,
            2.0,
            0.0,
            1.0,
        );
        let share = 8.0 / 128.0;
        assert!(
            (e.full_w - host.full_w * share).abs() < 1e-9,
            "{e:?} {host:?}"
        );
        assert!((e.idle_w - host.idle_w * share).abs() < 1e-9);
        assert!(e.idle_w > 0.0 && e.full_w > 2.0 * e.idle_w);
    }

    #[test]
    fn a_gce_milan_instance_falls_back_to_amd_servers() {
        let (_, e) = estimate_of(
            "AMD EPYC 7B13",
            ("AuthenticAMD", 25, 1, 0),
            4,
            true,
            Some(("Google", "Google Compute Engine")),
        );
        assert!(
            e.row
                .starts_with("AMD EPYC 7B13 → Zen 3 (Milan) (no servers before")
                && e.row.contains("→ AMD server"),
            "{}",
            e.row
        );
        assert!(e.scope.contains("typical host"), "{}", e.scope);
        assert!(e.scope.contains("Google Compute Engine"), "{}", e.scope);
    }

    #[test]
    fn a_known_cpu_model_picks_its_own_row() {
        let (_, e) = estimate_of(
            "Intel(R) Xeon(R) Platinum 8280 CPU @ 2.70GHz",
            ("GenuineIntel", 6, 85, 7),
            112,
            false,
            None,
        );
        assert!(
            e.row
                .starts_with("Intel Xeon Platinum 8280 → Cascade Lake-SP, "),
            "{}",
            e.row
        );
        assert!(e.scope.starts_with("this machine (no DMI)"), "{}", e.scope);
    }

    #[test]
    fn an_unknown_cpu_falls_back_by_cpuid_then_vendor() {
        // A generic QEMU name: the family/model says Emerald Rapids (none in the table
        // before the cut-off), so Intel servers.
        let (_, e) = estimate_of(
            "Intel(R) Xeon(R) Processor",
            ("GenuineIntel", 6, 207, 2),
            2,
            true,
            None,
        );
        assert!(e.row.contains("→ Emerald Rapids (no servers"), "{}", e.row);
        assert!(e.row.contains("→ Intel server"), "{}", e.row);
        // No name and no known id: the vendor alone.
        let (_, e) = estimate_of(
            "QEMU Virtual CPU version 2.5+",
            ("AuthenticAMD", 99, 1, 0),
            2,
            true,
            None,
        );
        assert!(e.row.contains("unknown CPU → AMD server"), "{}", e.row);
        // Nothing at all: between the vendors, said so.
        let (_, e) = estimate_of("Mystery CPU", ("SomeVendor", 1, 1, 0), 2, true, None);
        assert!(e.row.contains("Intel/AMD server average"), "{}", e.row);
    }

    #[test]
    fn garbage_and_oversized_files_are_clear_errors() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let proc_root = tmp.path().join("proc");
        std::fs::create_dir_all(&proc_root).expect("mkdir");
        let err = read(&proc_root, tmp.path())
            .expect_err("no cpuinfo")
            .to_string();
        assert!(err.contains("cpuinfo does not exist"), "{err}");
        std::fs::write(proc_root.join("cpuinfo"), "this is not\na cpuinfo file\n").expect("w");
        let err = read(&proc_root, tmp.path())
            .expect_err("garbage")
            .to_string();
        assert!(err.contains("expected `key : value` lines"), "{err}");
        std::fs::write(proc_root.join("cpuinfo"), "model name : X\n").expect("w");
        let err = read(&proc_root, tmp.path())
            .expect_err("no processor")
            .to_string();
        assert!(err.contains("no `processor` lines"), "{err}");
        std::fs::write(proc_root.join("cpuinfo"), [0xffu8, 0xfe, b':', b'\n']).expect("w");
        let err = read(&proc_root, tmp.path())
            .expect_err("binary")
            .to_string();
        assert!(err.contains("is not text"), "{err}");
        let big = "processor : 0\n".repeat((MAX_CPUINFO_BYTES / 14 + 2) as usize);
        std::fs::write(proc_root.join("cpuinfo"), big).expect("w");
        let err = read(&proc_root, tmp.path())
            .expect_err("too big")
            .to_string();
        assert!(err.contains("over"), "{err}");
        std::fs::write(proc_root.join("cpuinfo"), "processor : 0\n").expect("w");
        let dmi = tmp.path().join("class/dmi/id");
        std::fs::create_dir_all(&dmi).expect("mkdir");
        std::fs::write(dmi.join("product_name"), "x".repeat(10_000)).expect("w");
        let err = read(&proc_root, tmp.path())
            .expect_err("dmi too big")
            .to_string();
        assert!(err.contains("product_name is over"), "{err}");
        std::fs::remove_file(dmi.join("product_name")).expect("rm");
        std::fs::write(proc_root.join("meminfo"), "nonsense\n").expect("w");
        let err = read(&proc_root, tmp.path())
            .expect_err("meminfo")
            .to_string();
        assert!(err.contains("MemTotal"), "{err}");
        // A damaged table.
        assert!(Table::parse("fit\tidle\t1\t2\n").is_err());
        assert!(Table::parse(&"#".repeat(power_table::MAX_TABLE_BYTES + 1)).is_err());
        let err = Table::parse("row\tcpu\tx\n").expect_err("short row").0;
        assert!(err.contains("line 1: missing"), "{err}");
    }
}
