//! A VM's energy in one window, from the pipeline's rows (the only place per-process
//! numbers are made) and the window's static energy. Pure.
//!
//! - **Dynamic** energy is measured: the VM process's attributed energy per zone, the sum
//!   of its threads', listed apart for vCPU threads and emulator/I/O threads (and as
//!   `unsplit` when the threads are not named).
//! - **Static** energy is split by policy, out of the window's idle (static) energy per
//!   zone: `vcpus` (default) by allotted vCPUs over the host's logical CPUs (over the sum
//!   of all VMs' vCPUs instead when they are overcommitted, so the shares never exceed the
//!   host's static energy), `busy` by the VM's share of the window's busy CPU time, `none`.

use std::str::FromStr;

use super::detect::{Hypervisor, ThreadClass};
use crate::pipeline::{DomainJoules, ProcessRow, ThreadRow};

/// How the host's static energy is shared out to VMs (`--vm-static`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StaticPolicy {
    /// By allotted vCPUs over the host's logical CPUs: an idle guest still costs.
    #[default]
    Vcpus,
    /// By the VM's share of the window's busy CPU time.
    Busy,
    /// No static share: dynamic energy only.
    None,
}

impl StaticPolicy {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StaticPolicy::Vcpus => "vcpus",
            StaticPolicy::Busy => "busy",
            StaticPolicy::None => "none",
        }
    }
}

impl FromStr for StaticPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vcpus" => Ok(StaticPolicy::Vcpus),
            "busy" => Ok(StaticPolicy::Busy),
            "none" => Ok(StaticPolicy::None),
            _ => Err(format!(
                "`{s}` is not a static share policy: use vcpus, busy or none"
            )),
        }
    }
}

/// One VM's energy over one window, J per zone.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct VmEnergy {
    /// The VM's name.
    pub name: String,
    /// The VM process.
    pub pid: u32,
    /// Its hypervisor.
    pub hypervisor: Option<Hypervisor>,
    /// Allotted vCPUs (from the arguments, else the vCPU threads counted, else 1).
    pub vcpus: u32,
    /// Whether its threads are named (vCPU and emulator energy apart); when not, its
    /// dynamic energy is all `unsplit`.
    pub threads_named: bool,
    /// On-CPU time of its threads, ns.
    pub cpu_ns: u64,
    /// On-CPU time of its vCPU threads, ns.
    pub vcpu_ns: u64,
    /// On-CPU time of its emulator and I/O threads, ns.
    pub emulator_ns: u64,
    /// Measured energy of the process (all its threads), J per zone.
    pub dynamic_j: DomainJoules,
    /// Of which its vCPU threads', J per zone.
    pub vcpu_j: DomainJoules,
    /// Of which its emulator and I/O threads', J per zone.
    pub emulator_j: DomainJoules,
    /// Of which threads whose name does not tell, J per zone.
    pub unsplit_j: DomainJoules,
    /// Its static share under the policy, J per zone.
    pub static_j: DomainJoules,
}

impl VmEnergy {
    /// A VM's dynamic energy from its process row (`None`: it did not run in the window),
    /// each thread put in its class by `class`.
    pub fn dynamic(
        name: &str,
        pid: u32,
        vcpus: u32,
        threads_named: bool,
        row: Option<&ProcessRow>,
        class: impl Fn(&ThreadRow) -> ThreadClass,
    ) -> Self {
        let mut out = VmEnergy {
            name: name.to_owned(),
            pid,
            vcpus: vcpus.max(1),
            threads_named,
            ..Default::default()
        };
        let Some(row) = row else {
            return out;
        };
        out.cpu_ns = row.cpu_ns;
        add(&mut out.dynamic_j, &row.energy_j);
        for t in &row.threads {
            let (part, ns) = match class(t) {
                ThreadClass::Vcpu(_) => (&mut out.vcpu_j, &mut out.vcpu_ns),
                ThreadClass::Emulator => (&mut out.emulator_j, &mut out.emulator_ns),
                ThreadClass::Unnamed => (&mut out.unsplit_j, &mut 0),
            };
            add(part, &t.energy_j);
            *ns += t.cpu_ns;
        }
        out
    }

    /// Dynamic + static energy of `zone`, J.
    pub fn total_j(&self, zone: &str) -> f64 {
        self.dynamic_j.get(zone).copied().unwrap_or(0.0)
            + self.static_j.get(zone).copied().unwrap_or(0.0)
    }
}

/// Gives each VM its static share of the window's static energy `idle` (J per zone):
/// `host_cpus` logical CPUs, `busy_ns` the busy CPU time of every thread of the window.
pub fn share_static(
    vms: &mut [VmEnergy],
    idle: &DomainJoules,
    host_cpus: usize,
    busy_ns: u64,
    policy: StaticPolicy,
) {
    let allotted: u64 = vms.iter().map(|v| u64::from(v.vcpus)).sum();
    let cpus = (host_cpus as u64).max(allotted).max(1) as f64;
    for vm in vms.iter_mut() {
        let fraction = match policy {
            StaticPolicy::Vcpus => f64::from(vm.vcpus) / cpus,
            StaticPolicy::Busy if busy_ns > 0 => vm.cpu_ns as f64 / busy_ns as f64,
            StaticPolicy::Busy | StaticPolicy::None => 0.0,
        };
        vm.static_j = idle
            .iter()
            .map(|(&z, &j)| (z, j.max(0.0) * fraction))
            .collect();
    }
}

fn add(into: &mut DomainJoules, from: &DomainJoules) {
    for (&z, &j) in from {
        *into.entry(z).or_default() += j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(tid: u32, comm: &str, ns: u64, j: f64) -> ThreadRow {
        ThreadRow {
            tid,
            comm: comm.into(),
            cpu_ns: ns,
            energy_j: [("package", j)].into_iter().collect(),
            ..Default::default()
        }
    }

    fn row() -> ProcessRow {
        let threads = vec![
            thread(11, "CPU 0/KVM", 600, 6.0),
            thread(12, "CPU 1/KVM", 300, 3.0),
            thread(10, "qemu-system-x86", 100, 1.0),
        ];
        ProcessRow {
            pid: 10,
            cpu_ns: 1000,
            energy_j: [("package", 10.0)].into_iter().collect(),
            threads,
            ..Default::default()
        }
    }

    fn qemu_class(t: &ThreadRow) -> ThreadClass {
        super::super::detect::classify(Hypervisor::Qemu, &t.comm, true)
    }

    #[test]
    fn vcpu_and_emulator_threads_are_apart_and_sum_to_the_process() {
        let v = VmEnergy::dynamic("vm", 10, 2, true, Some(&row()), qemu_class);
        assert_eq!(v.vcpu_j["package"], 9.0);
        assert_eq!(v.emulator_j["package"], 1.0);
        assert!(v.unsplit_j.is_empty());
        assert_eq!(v.dynamic_j["package"], 10.0);
        assert_eq!((v.vcpu_ns, v.emulator_ns, v.cpu_ns), (900, 100, 1000));
    }

    #[test]
    fn unnamed_threads_stay_unsplit() {
        let v = VmEnergy::dynamic("vm", 10, 2, false, Some(&row()), |t| {
            super::super::detect::classify(Hypervisor::Qemu, &t.comm, false)
        });
        assert_eq!(v.unsplit_j["package"], 1.0);
        assert_eq!(v.vcpu_j["package"], 9.0, "vCPU names still tell");
    }

    #[test]
    fn static_policies() {
        let idle: DomainJoules = [("package", 8.0), ("dram", 2.0)].into_iter().collect();
        let mk = |vcpus, ns| VmEnergy {
            vcpus,
            cpu_ns: ns,
            ..Default::default()
        };
        // vcpus: 2 of 8 CPUs, 4 of 8.
        let mut vms = vec![mk(2, 100), mk(4, 300)];
        share_static(&mut vms, &idle, 8, 1000, StaticPolicy::Vcpus);
        assert_eq!(vms[0].static_j["package"], 2.0);
        assert_eq!(vms[1].static_j["dram"], 1.0);
        // Overcommitted: 12 vCPUs on 8 CPUs share the static energy by vCPUs, never more.
        let mut vms = vec![mk(4, 0), mk(8, 0)];
        share_static(&mut vms, &idle, 8, 1000, StaticPolicy::Vcpus);
        let sum: f64 = vms.iter().map(|v| v.static_j["package"]).sum();
        assert!((sum - 8.0).abs() < 1e-12, "{sum}");
        // busy: by busy time.
        let mut vms = vec![mk(2, 250)];
        share_static(&mut vms, &idle, 8, 1000, StaticPolicy::Busy);
        assert_eq!(vms[0].static_j["package"], 2.0);
        share_static(&mut vms, &idle, 8, 1000, StaticPolicy::None);
        assert_eq!(vms[0].static_j["package"], 0.0);
        assert_eq!(vms[0].total_j("package"), 0.0);
    }

    #[test]
    fn policies_parse_and_bad_ones_say_what_to_use() {
        assert_eq!("busy".parse(), Ok(StaticPolicy::Busy));
        let err = "all".parse::<StaticPolicy>().expect_err("not a policy");
        assert!(err.contains("vcpus, busy or none"), "{err}");
    }
}
