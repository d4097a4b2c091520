//! `report --by vm` from a recording's process rows: each VM process recognised from its
//! recorded command line, name and cgroup, its threads summed by class (`NAME vcpu`,
//! `NAME emulator`, `NAME unsplit`), every other process under `[host]`. Pure; static
//! energy stays in the report's idle row (the agent's `--vm-static` shares it out live).

use std::collections::BTreeMap;

use super::{
    detect::{self, ThreadClass},
    energy::VmEnergy,
};
use crate::pipeline::{ProcessRow, ThreadRow};

/// The row of processes that run no VM.
pub const HOST: &str = "[host]";

/// The VM a process row runs, with its threads' classes, or `None`.
fn vm_of(p: &ProcessRow) -> Option<(String, Vec<ThreadClass>)> {
    let args: Vec<&str> = p.cmdline.split_whitespace().collect();
    let vm = detect::recognise(&args, &p.comm, &p.cgroup)?;
    let name = vm_name(p)?;
    let named = vm.named_threads
        || p.threads.iter().any(|t| {
            matches!(
                detect::classify(vm.hypervisor, &t.comm, false),
                ThreadClass::Vcpu(_)
            )
        });
    let classes = p
        .threads
        .iter()
        .map(|t| detect::classify(vm.hypervisor, &t.comm, named))
        .collect();
    Some((name, classes))
}

/// The name of the VM a process row runs (as `report --by vm` names it), or `None`.
pub fn vm_name(p: &ProcessRow) -> Option<String> {
    let args: Vec<&str> = p.cmdline.split_whitespace().collect();
    let vm = detect::recognise(&args, &p.comm, &p.cgroup)?;
    Some(
        vm.name
            .unwrap_or_else(|| format!("{}-{}", vm.hypervisor.name(), p.pid)),
    )
}

fn part(c: ThreadClass) -> &'static str {
    match c {
        ThreadClass::Vcpu(_) => "vcpu",
        ThreadClass::Emulator => "emulator",
        ThreadClass::Unnamed => "unsplit",
    }
}

/// One row per VM and thread class, and `[host]` for the rest; largest share first. The
/// rows sum to the input rows (every thread lands in exactly one).
pub fn grouped<'a>(rows: impl IntoIterator<Item = &'a ProcessRow>) -> Vec<ProcessRow> {
    let mut groups: BTreeMap<String, ProcessRow> = BTreeMap::new();
    let mut add = |key: String, p: &ProcessRow, threads: Vec<&ThreadRow>, whole: bool| {
        let g = groups.entry(key.clone()).or_insert_with(|| ProcessRow {
            comm: key,
            cpu_share: vec![0.0; p.cpu_share.len()],
            ..ProcessRow::default()
        });
        if whole {
            g.cpu_ns += p.cpu_ns;
            g.cpu_pct += p.cpu_pct;
            g.samples += p.samples;
            g.power_w += p.power_w;
            g.share += p.share;
            g.since_start_j += p.since_start_j;
            for (d, j) in &p.energy_j {
                *g.energy_j.entry(d).or_default() += j;
            }
            for (a, b) in g.cpu_share.iter_mut().zip(&p.cpu_share) {
                *a += b;
            }
        } else {
            for t in &threads {
                g.cpu_ns += t.cpu_ns;
                g.cpu_pct += t.cpu_pct;
                g.samples += t.samples;
                g.power_w += t.power_w;
                g.share += t.share;
                g.since_start_j += t.since_start_j;
                for (d, j) in &t.energy_j {
                    *g.energy_j.entry(d).or_default() += j;
                }
            }
        }
        g.threads.extend(threads.into_iter().cloned());
    };
    for p in rows {
        match vm_of(p) {
            Some((name, classes)) => {
                let mut by: BTreeMap<&'static str, Vec<&ThreadRow>> = BTreeMap::new();
                for (t, c) in p.threads.iter().zip(classes) {
                    by.entry(part(c)).or_default().push(t);
                }
                for (class, threads) in by {
                    add(format!("{name} {class}"), p, threads, false);
                }
            }
            None => add(HOST.to_owned(), p, p.threads.iter().collect(), true),
        }
    }
    let mut out: Vec<ProcessRow> = groups.into_values().collect();
    out.sort_by(|a, b| b.share.total_cmp(&a.share).then(a.comm.cmp(&b.comm)));
    out
}

/// [`grouped`], each group with the processes it holds (a VM's process under each of its
/// classes): `top`'s VM view expands a group to them.
pub fn grouped_with_members<'a>(rows: &[&'a ProcessRow]) -> Vec<(ProcessRow, Vec<&'a ProcessRow>)> {
    grouped(rows.iter().copied())
        .into_iter()
        .map(|g| {
            let members = rows
                .iter()
                .copied()
                .filter(|p| {
                    let name = vm_of(p).map(|(n, _)| n);
                    match &name {
                        Some(n) => g
                            .comm
                            .strip_prefix(n.as_str())
                            .is_some_and(|r| r.starts_with(' ')),
                        None => g.comm == HOST,
                    }
                })
                .collect();
            (g, members)
        })
        .collect()
}

/// Each VM's dynamic energy in the rows (no static share: see the module's header).
pub fn energies(rows: &[ProcessRow]) -> Vec<VmEnergy> {
    rows.iter()
        .filter_map(|p| {
            let (name, classes) = vm_of(p)?;
            let args: Vec<&str> = p.cmdline.split_whitespace().collect();
            let vm = detect::recognise(&args, &p.comm, &p.cgroup)?;
            let by_tid: BTreeMap<u32, ThreadClass> =
                p.threads.iter().map(|t| t.tid).zip(classes).collect();
            let counted = by_tid
                .values()
                .filter(|c| matches!(c, ThreadClass::Vcpu(_)))
                .count();
            let named = by_tid.values().all(|c| *c != ThreadClass::Unnamed);
            let mut e = VmEnergy::dynamic(
                &name,
                p.pid,
                vm.vcpus
                    .unwrap_or(u32::try_from(counted).unwrap_or(u32::MAX)),
                named,
                Some(p),
                |t| by_tid.get(&t.tid).copied().unwrap_or(ThreadClass::Unnamed),
            );
            e.hypervisor = Some(vm.hypervisor);
            Some(e)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread(tid: u32, comm: &str, j: f64) -> ThreadRow {
        ThreadRow {
            tid,
            comm: comm.into(),
            cpu_ns: (j * 1e9) as u64,
            share: j / 10.0,
            energy_j: [("package", j)].into_iter().collect(),
            ..Default::default()
        }
    }

    fn process(pid: u32, comm: &str, cmdline: &str, threads: Vec<ThreadRow>) -> ProcessRow {
        let j: f64 = threads.iter().map(|t| t.energy_j["package"]).sum();
        ProcessRow {
            pid,
            comm: comm.into(),
            cmdline: cmdline.into(),
            cpu_ns: threads.iter().map(|t| t.cpu_ns).sum(),
            share: j / 10.0,
            energy_j: [("package", j)].into_iter().collect(),
            threads,
            ..Default::default()
        }
    }

    #[test]
    fn vm_threads_group_by_class_and_everything_sums() {
        let rows = vec![
            process(
                10,
                "qemu-system-x86",
                "qemu-system-x86_64 -name guest=a,debug-threads=on -smp 2",
                vec![
                    thread(11, "CPU 0/KVM", 3.0),
                    thread(12, "CPU 1/KVM", 1.0),
                    thread(10, "qemu-system-x86", 0.5),
                    thread(13, "IO iothread1", 0.5),
                ],
            ),
            process(
                20,
                "qemu-system-x86",
                "qemu-system-x86_64 -name b",
                vec![thread(20, "qemu-system-x86", 2.0)],
            ),
            process(30, "bash", "bash", vec![thread(30, "bash", 3.0)]),
        ];
        let g = grouped(&rows);
        let j = |k: &str| {
            g.iter()
                .find(|r| r.comm == k)
                .map(|r| r.energy_j["package"])
                .unwrap_or_else(|| panic!("no row {k}: {g:?}"))
        };
        assert_eq!(j("a vcpu"), 4.0);
        assert_eq!(j("a emulator"), 1.0);
        assert_eq!(j("b unsplit"), 2.0);
        assert_eq!(j(HOST), 3.0);
        let total: f64 = g.iter().map(|r| r.energy_j["package"]).sum();
        assert_eq!(total, 10.0);
        let e = energies(&rows);
        assert_eq!(e.len(), 2);
        assert_eq!((e[0].name.as_str(), e[0].vcpus), ("a", 2));
        assert_eq!(e[0].vcpu_j["package"], 4.0);
        assert!(!e[1].threads_named);
    }
}
