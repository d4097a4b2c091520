//! Which energy sources this machine has, why the missing ones are missing, and which to use.
//!
//! Every kind is probed under the configured roots. For CPU domains the best kind per
//! (domain, package) wins: perf PMU > powercap > MSR > hwmon (docs/ARCHITECTURE.md, "Energy counters"); a
//! lower kind only adds domains no better kind covers (e.g. AMD per-core MSRs beside the
//! powercap package zone). GPUs come from NVML. With no CPU package counter the estimated
//! model covers the packages. `--energy-source KIND` uses that kind only, or fails saying
//! why it cannot be used.

use std::collections::BTreeSet;

use super::{
    EnergyArgs, EnergyError, EnergySource, SourceKind, host, hwmon, hypervisor, model, msr, nvml,
    perf, powercap,
};
use crate::pb::v1 as pb;

/// What probing one kind found.
pub struct KindProbe {
    /// The kind.
    pub kind: SourceKind,
    /// Whether the machine has this interface at all.
    pub present: bool,
    /// Why it is absent, or why some or all of its counters cannot be read.
    pub reason: Option<String>,
    /// Counters that opened and read.
    pub counters: Vec<Box<dyn EnergySource>>,
}

impl KindProbe {
    fn absent(kind: SourceKind, reason: String) -> Self {
        Self {
            kind,
            present: false,
            reason: Some(reason),
            counters: Vec::new(),
        }
    }

    /// Present, but nothing could be read, for `reason`.
    fn unreadable(kind: SourceKind, reason: impl Into<String>) -> Self {
        Self {
            kind,
            present: true,
            reason: Some(reason.into()),
            counters: Vec::new(),
        }
    }

    fn from_opens(
        kind: SourceKind,
        opens: Vec<Result<Box<dyn EnergySource>, EnergyError>>,
    ) -> Self {
        let mut counters = Vec::new();
        let mut errors: Vec<String> = Vec::new();
        for open in opens {
            match open {
                Ok(c) => counters.push(c),
                Err(e) => {
                    let text = e.to_string();
                    if !errors.contains(&text) {
                        errors.push(text);
                    }
                }
            }
        }
        let reason = (!errors.is_empty()).then(|| errors.join("; "));
        Self {
            kind,
            present: true,
            reason,
            counters,
        }
    }

    /// Whether at least one counter of this kind can be read.
    pub fn readable(&self) -> bool {
        !self.counters.is_empty()
    }
}

fn boxed<S: EnergySource + 'static>(s: S) -> Box<dyn EnergySource> {
    Box::new(s)
}

/// Probes one hardware kind (not `auto`, not `model`).
pub fn probe(kind: SourceKind, args: &EnergyArgs, cpus: &[pb::Cpu]) -> KindProbe {
    let sysfs = &args.sysfs_root;
    match kind {
        SourceKind::Perf => match perf::describe(sysfs) {
            Ok(None) => KindProbe::absent(
                kind,
                format!(
                    "no power PMU: {} does not exist (the CPU or hypervisor exposes no RAPL)",
                    perf::pmu_dir(sysfs).display()
                ),
            ),
            Ok(Some(pmu)) if pmu.events.is_empty() => {
                KindProbe::unreadable(kind, "the power PMU lists no energy-* events")
            }
            Ok(Some(pmu)) => KindProbe::from_opens(
                kind,
                match perf::open(&pmu, cpus) {
                    Ok(events) => events.into_iter().map(|e| Ok(boxed(e))).collect(),
                    Err(e) => vec![Err(e)],
                },
            ),
            Err(e) => KindProbe::unreadable(kind, e.to_string()),
        },
        SourceKind::Powercap => match powercap::zones(sysfs) {
            Ok(zones) if zones.is_empty() => {
                let root = powercap::root(sysfs);
                let what = if root.exists() {
                    "has no intel-rapl zones"
                } else {
                    "does not exist"
                };
                KindProbe::absent(
                    kind,
                    format!(
                        "no powercap tree: {} {what} (no RAPL driver, e.g. a VM; on bare metal try `sudo modprobe intel_rapl_common`)",
                        root.display()
                    ),
                )
            }
            Ok(zones) => KindProbe::from_opens(
                kind,
                zones
                    .iter()
                    .map(|z| powercap::Zone::open(z).map(boxed))
                    .collect(),
            ),
            Err(e) => KindProbe::unreadable(kind, e.to_string()),
        },
        SourceKind::Msr => {
            let first = cpus.first().map_or(0, |c| c.id);
            let file = args.dev_cpu_root.join(first.to_string()).join("msr");
            if !file.exists() {
                return KindProbe::absent(
                    kind,
                    format!("{} does not exist: {}", file.display(), msr::DRIVER_HINT),
                );
            }
            KindProbe::from_opens(
                kind,
                match msr::open(&args.dev_cpu_root, cpus) {
                    Ok((_, regs)) => regs.into_iter().map(|r| Ok(boxed(r))).collect(),
                    Err(e) => vec![Err(e)],
                },
            )
        }
        SourceKind::Hwmon => match hwmon::inputs(sysfs, cpus) {
            Ok(inputs) if inputs.is_empty() => KindProbe::absent(
                kind,
                format!(
                    "no hwmon device under {} has energyN_input (no amd_energy/zenergy driver)",
                    sysfs.join("class/hwmon").display()
                ),
            ),
            Ok(inputs) => KindProbe::from_opens(
                kind,
                inputs
                    .iter()
                    .map(|i| hwmon::Input::open(i).map(boxed))
                    .collect(),
            ),
            Err(e) => KindProbe::unreadable(kind, e.to_string()),
        },
        SourceKind::Hypervisor => match hypervisor::open(&args.hypervisor_dir) {
            Ok(zones) if zones.is_empty() => KindProbe::absent(
                kind,
                format!(
                    "no host share: {} does not exist (only a virtual machine whose host runs \
                     the energy-bpf agent has one; docs/virtual-machines.md)",
                    args.hypervisor_dir.join(hypervisor::META_FILE).display()
                ),
            ),
            Ok(zones) => {
                KindProbe::from_opens(kind, zones.into_iter().map(|z| Ok(boxed(z))).collect())
            }
            Err(e) => KindProbe::unreadable(kind, e.to_string()),
        },
        SourceKind::Nvml => match nvml::open() {
            Ok(gpus) => {
                KindProbe::from_opens(kind, gpus.into_iter().map(|g| Ok(boxed(g))).collect())
            }
            Err(e) => {
                let text = e.to_string();
                let present = !text.contains("not loadable");
                KindProbe {
                    kind,
                    present,
                    reason: Some(text),
                    counters: Vec::new(),
                }
            }
        },
        SourceKind::Auto | SourceKind::Model => KindProbe {
            kind,
            present: true,
            reason: None,
            counters: Vec::new(),
        },
    }
}

/// The sources to use and what probing found.
pub struct Plan {
    /// Every probed kind, counters included (used or not).
    pub probes: Vec<KindProbe>,
    /// `(probe index, counter index)` of the counters to read.
    pub used: Vec<(usize, usize)>,
    /// Model sources (ids from 1), when the model covers the packages.
    pub model: Vec<pb::EnergySource>,
}

impl Plan {
    /// Puts the estimated model in charge of the CPU packages when no counter counts them
    /// and the choice is automatic (or the model): [`plan`] decides so first, and start-up
    /// again once a chosen package counter proves not to count ([`super::reader::silent`]).
    pub fn cover_packages(
        &mut self,
        args: &EnergyArgs,
        cpus: &[pb::Cpu],
        package_counted: bool,
    ) -> Result<(), EnergyError> {
        let automatic = matches!(args.energy_source, SourceKind::Auto | SourceKind::Model);
        if self.model.is_empty() && automatic && !package_counted {
            self.model = model::sources(args, cpus, 1)?;
        }
        Ok(())
    }

    /// Moves the used counters out (in `used` order), leaving the probes for reporting.
    pub fn take_used(&mut self) -> Vec<Box<dyn EnergySource>> {
        let mut slots: Vec<Vec<Option<Box<dyn EnergySource>>>> = self
            .probes
            .iter_mut()
            .map(|p| {
                std::mem::take(&mut p.counters)
                    .into_iter()
                    .map(Some)
                    .collect()
            })
            .collect();
        let out = self
            .used
            .iter()
            .filter_map(|&(p, c)| slots[p][c].take())
            .collect();
        for (probe, slot) in self.probes.iter_mut().zip(slots) {
            probe.counters = slot.into_iter().flatten().collect();
        }
        out
    }
}

/// Adds what the host says (kernel config, hypervisor) to the reasons of absent kinds, for
/// the real roots only: a fake tree says nothing about the host.
fn explain_absent(probes: &mut [KindProbe], args: &EnergyArgs) {
    let real = |kind| match kind {
        SourceKind::Msr => host::is_real_root(&args.dev_cpu_root, "/dev/cpu"),
        SourceKind::Perf | SourceKind::Powercap => host::is_real_root(&args.sysfs_root, "/sys"),
        _ => false,
    };
    if !probes.iter().any(|p| !p.present && real(p.kind)) {
        return;
    }
    let facts = host::HostFacts::read();
    for p in probes.iter_mut().filter(|p| !p.present && real(p.kind)) {
        let Some(extra) = facts.explain(p.kind) else {
            continue;
        };
        let mut base = p.reason.take().unwrap_or_default();
        if p.kind == SourceKind::Msr && facts.has("CONFIG_X86_MSR") == Some(false) {
            // `modprobe msr` cannot help when the kernel has no such module.
            base = base.replace(&format!(": {}", msr::DRIVER_HINT), "");
        }
        p.reason = Some(format!("{base}; {extra}"));
    }
}

/// Probes the machine and chooses (see the module docs).
pub fn plan(args: &EnergyArgs, cpus: &[pb::Cpu], all_kinds: bool) -> Result<Plan, EnergyError> {
    let forced = args.energy_source;
    let kinds: Vec<SourceKind> = match forced {
        _ if all_kinds => SourceKind::CPU_PREFERENCE
            .into_iter()
            .chain([SourceKind::Nvml])
            .collect(),
        SourceKind::Auto => SourceKind::CPU_PREFERENCE
            .into_iter()
            .chain([SourceKind::Nvml])
            .collect(),
        SourceKind::Model => Vec::new(),
        k => vec![k],
    };
    let mut probes: Vec<KindProbe> = kinds.into_iter().map(|k| probe(k, args, cpus)).collect();
    explain_absent(&mut probes, args);
    let mut used = Vec::new();
    match forced {
        SourceKind::Auto => {
            let mut claimed: BTreeSet<(i32, u32)> = BTreeSet::new();
            for (pi, p) in probes.iter().enumerate() {
                let mut mine = BTreeSet::new();
                for (ci, c) in p.counters.iter().enumerate() {
                    let d = c.describe();
                    let key = (d.domain, d.package);
                    if d.domain == pb::EnergyDomain::DomainUnspecified as i32
                        || claimed.contains(&key)
                    {
                        continue;
                    }
                    mine.insert(key);
                    used.push((pi, ci));
                }
                claimed.extend(mine);
            }
        }
        SourceKind::Model => {}
        k => {
            let Some((pi, p)) = probes.iter().enumerate().find(|(_, p)| p.kind == k) else {
                return Err(EnergyError::Unavailable {
                    kind: k,
                    reason: "not probed".into(),
                });
            };
            if p.counters.is_empty() {
                let reason = p.reason.clone().unwrap_or_else(|| "no counters".into());
                return Err(EnergyError::Unavailable { kind: k, reason });
            }
            used.extend((0..p.counters.len()).map(|ci| (pi, ci)));
        }
    }
    let has_package = used
        .iter()
        .any(|&(p, c)| is_cpu_package(&probes[p].counters[c].describe()));
    let mut plan = Plan {
        probes,
        used,
        model: Vec::new(),
    };
    plan.cover_packages(args, cpus, has_package)?;
    Ok(plan)
}

/// Whether `d` is a CPU package's counter (NVML's GPUs have packages of their own).
pub fn is_cpu_package(d: &pb::EnergySource) -> bool {
    d.domain == pb::EnergyDomain::Package as i32 && d.kind != SourceKind::Nvml.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::fake;

    /// Two packages of one core with two threads.
    fn cpus() -> Vec<pb::Cpu> {
        (0..4)
            .map(|id| pb::Cpu {
                id,
                package: id / 2,
                core: 0,
            })
            .collect()
    }

    fn names(plan: &Plan) -> Vec<String> {
        plan.used
            .iter()
            .map(|&(p, c)| {
                let d = plan.probes[p].counters[c].describe();
                format!("{}:{}", d.kind, d.name)
            })
            .collect()
    }

    #[test]
    fn empty_machine_uses_the_model_and_says_why() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let args = EnergyArgs {
            sysfs_root: tmp.path().into(),
            dev_cpu_root: tmp.path().join("dev/cpu"),
            ..Default::default()
        };
        let plan = plan(&args, &cpus(), true).expect("plan");
        assert!(plan.used.is_empty());
        assert_eq!(plan.model.len(), 2);
        let reasons: Vec<String> = plan
            .probes
            .iter()
            .map(|p| p.reason.clone().unwrap_or_default())
            .collect();
        assert!(reasons[0].starts_with("no power PMU"), "{reasons:?}");
        assert!(reasons[1].starts_with("no powercap tree"), "{reasons:?}");
        assert!(reasons[2].contains("modprobe msr"), "{reasons:?}");
        assert!(reasons[3].starts_with("no hwmon device"), "{reasons:?}");
    }

    #[test]
    fn powercap_beats_msr_per_domain_and_msr_fills_the_rest() {
        let tmp = tempfile::tempdir().expect("tempdir");
        // powercap: packages only (as on AMD); MSR: AMD with per-core registers.
        fake::FakePowercap::create(
            tmp.path(),
            &[
                fake::ZoneSpec::new("intel-rapl:0", "package-0", 1 << 30),
                fake::ZoneSpec::new("intel-rapl:1", "package-1", 1 << 30),
            ],
        )
        .expect("powercap");
        fake::FakeMsr::amd(&tmp.path().join("dev/cpu"), &cpus()).expect("msr");
        let args = EnergyArgs {
            sysfs_root: tmp.path().into(),
            dev_cpu_root: tmp.path().join("dev/cpu"),
            ..Default::default()
        };
        let plan = plan(&args, &cpus(), false).expect("plan");
        assert_eq!(
            names(&plan),
            vec![
                "powercap:intel-rapl:0 (package-0)",
                "powercap:intel-rapl:1 (package-1)",
                "msr:cpu1 msr 0xc001029a (core 0 of package 0)",
                "msr:cpu3 msr 0xc001029a (core 0 of package 1)",
            ]
        );
        assert!(plan.model.is_empty());
        // Forcing MSR uses all of its registers.
        let forced = EnergyArgs {
            energy_source: SourceKind::Msr,
            ..args.clone()
        };
        assert_eq!(
            super::plan(&forced, &cpus(), false)
                .expect("plan")
                .used
                .len(),
            4
        );
        // Forcing an absent kind is a clear error.
        let forced = EnergyArgs {
            energy_source: SourceKind::Hwmon,
            ..args
        };
        let err = super::plan(&forced, &cpus(), false)
            .err()
            .expect("hwmon is absent")
            .to_string();
        assert!(
            err.starts_with("--energy-source hwmon: not usable"),
            "{err}"
        );
    }
}
