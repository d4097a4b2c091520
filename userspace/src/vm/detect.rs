//! Which processes are virtual machines, what they are called, and which of their threads
//! are vCPUs. Pure string parsing of what `/proc` (or a recording) says about a process.
//!
//! - qemu (`qemu-system-*`, RHEL's `qemu-kvm`): the name from `-name guest=NAME,...` or
//!   `-name NAME`, else from libvirt's cgroup scope `machine-qemu\x2dID\x2dNAME.scope`;
//!   allotted vCPUs from `-smp N` / `-smp cpus=N` / `sockets*cores*threads`. With
//!   `-name ...,debug-threads=on` (libvirt and KubeVirt set it) vCPU threads are named
//!   `CPU n/KVM` (`/TCG`, `/HVF`, ...) and every other thread is emulator or I/O work;
//!   without it every thread is `qemu-system-x86` and the split is lost ([`ThreadClass::Unnamed`]).
//! - Firecracker: the name from `--id NAME`, else the `--api-sock` file's stem; vCPU
//!   threads `fc_vcpu n`.
//! - cloud-hypervisor: the name from the `--api-socket` file's stem; vCPUs from
//!   `--cpus boot=N`; vCPU threads `vcpuN`.
//! - KubeVirt: its `virt-launcher` pod runs qemu in the pod's cgroup; the VM is named by
//!   qemu's `-name guest=NAMESPACE_VMI`, and the pod UID is kept.

use crate::container;

/// The program that runs the VM.
#[allow(
    clippy::enum_variant_names,
    reason = "cloud-hypervisor is the program's own name"
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Hypervisor {
    /// qemu (KVM, TCG, ...).
    Qemu,
    /// Firecracker.
    Firecracker,
    /// cloud-hypervisor.
    CloudHypervisor,
}

impl Hypervisor {
    /// The name shown (`qemu`, `firecracker`, `cloud-hypervisor`).
    pub fn name(self) -> &'static str {
        match self {
            Hypervisor::Qemu => "qemu",
            Hypervisor::Firecracker => "firecracker",
            Hypervisor::CloudHypervisor => "cloud-hypervisor",
        }
    }

    /// The hypervisor a program name (an executable's file name, or a `comm`, which the
    /// kernel cuts to 15 bytes) belongs to.
    pub fn of_program(name: &str) -> Option<Self> {
        let base = name.rsplit('/').next().unwrap_or(name);
        if base.starts_with("qemu-system-") || base == "qemu-kvm" {
            Some(Hypervisor::Qemu)
        } else if base == "firecracker" {
            Some(Hypervisor::Firecracker)
        } else if base.starts_with("cloud-hyperviso") {
            Some(Hypervisor::CloudHypervisor)
        } else {
            None
        }
    }
}

/// Who started the VM, where the cgroup or the arguments say.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Launcher {
    /// Started directly (a shell, a script, a service).
    #[default]
    Direct,
    /// libvirt (`machine.slice/machine-qemu\x2d...scope`).
    Libvirt,
    /// A KubeVirt `virt-launcher` pod (qemu in a Kubernetes pod's cgroup).
    KubeVirt {
        /// The pod's UID.
        pod_uid: String,
    },
}

/// What a process's arguments and cgroup say about the VM it runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmRef {
    /// The VM's name, made safe as one path component (see [`safe_name`]); `None` when
    /// nothing names it (the caller names it after the program and pid).
    pub name: Option<String>,
    /// The program.
    pub hypervisor: Hypervisor,
    /// Who started it.
    pub launcher: Launcher,
    /// vCPUs the arguments allot (`-smp`, `--cpus boot=`), when they say.
    pub vcpus: Option<u32>,
    /// Whether the arguments ask for named threads (qemu's `debug-threads=on`).
    pub named_threads: bool,
}

/// What kind of work a thread of a VM process does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThreadClass {
    /// A vCPU thread (guest code, and the exits it takes), with its index.
    Vcpu(u32),
    /// Emulator, I/O, API and monitor threads.
    Emulator,
    /// A thread whose name does not tell (qemu without `debug-threads=on`).
    Unnamed,
}

/// Recognises a VM from a process's arguments (`args[0]` the program), its `comm` and its
/// cgroup v2 path; `None` when it runs no VM.
pub fn recognise(args: &[&str], comm: &str, cgroup: &str) -> Option<VmRef> {
    let hypervisor = args
        .first()
        .and_then(|a| Hypervisor::of_program(a))
        .or_else(|| Hypervisor::of_program(comm))?;
    let c = container::parse(cgroup);
    let kubevirt = c.pod_uid.map(|pod_uid| Launcher::KubeVirt { pod_uid });
    let mut vm = VmRef {
        name: None,
        hypervisor,
        launcher: Launcher::Direct,
        vcpus: None,
        named_threads: false,
    };
    match hypervisor {
        Hypervisor::Qemu => {
            if let Some(value) = flag(args, "-name") {
                let (name, debug_threads) = qemu_name(value);
                vm.name = name;
                vm.named_threads = debug_threads;
            }
            let libvirt = libvirt_scope_name(cgroup);
            if libvirt.is_some() {
                vm.launcher = Launcher::Libvirt;
            }
            vm.name = vm.name.or(libvirt);
            vm.vcpus = flag(args, "-smp").and_then(qemu_smp);
        }
        Hypervisor::Firecracker => {
            vm.name = flag(args, "--id")
                .map(str::to_owned)
                .or_else(|| flag(args, "--api-sock").and_then(file_stem));
            vm.named_threads = true;
        }
        Hypervisor::CloudHypervisor => {
            vm.name = flag(args, "--api-socket").and_then(|v| {
                let path = keyed(v, "path").unwrap_or(v);
                file_stem(path)
            });
            vm.vcpus = flag(args, "--cpus")
                .and_then(|v| keyed(v, "boot"))
                .and_then(|n| n.parse().ok());
            vm.named_threads = true;
        }
    }
    if let Some(k) = kubevirt {
        vm.launcher = k;
    }
    vm.name = vm.name.as_deref().and_then(safe_name);
    Some(vm)
}

/// What a thread of a VM process does, by its name. `named` says whether the VM names its
/// threads (then an unrecognised name is emulator work).
pub fn classify(hypervisor: Hypervisor, comm: &str, named: bool) -> ThreadClass {
    let vcpu = match hypervisor {
        // `CPU 0/KVM`, `CPU 12/TCG`.
        Hypervisor::Qemu => comm
            .strip_prefix("CPU ")
            .and_then(|rest| rest.split_once('/'))
            .and_then(|(n, _)| n.parse().ok()),
        Hypervisor::Firecracker => comm.strip_prefix("fc_vcpu ").and_then(|n| n.parse().ok()),
        Hypervisor::CloudHypervisor => comm.strip_prefix("vcpu").and_then(|n| n.parse().ok()),
    };
    match vcpu {
        Some(n) => ThreadClass::Vcpu(n),
        None if named => ThreadClass::Emulator,
        None => ThreadClass::Unnamed,
    }
}

/// A VM name as one safe path component: letters, digits, `.`, `_` and `-` kept, anything
/// else `_`, at most 128 bytes, never `.`-led (no `..`, no hidden files); `None` when empty.
pub fn safe_name(name: &str) -> Option<String> {
    let mut out: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(128)
        .collect();
    if out.starts_with('.') {
        out.replace_range(..1, "_");
    }
    (!out.is_empty()).then_some(out)
}

/// The value after `name` (`name VALUE` or `name=VALUE`).
fn flag<'a>(args: &[&'a str], name: &str) -> Option<&'a str> {
    args.iter().enumerate().skip(1).find_map(|(i, a)| {
        if *a == name {
            args.get(i + 1).copied()
        } else {
            a.strip_prefix(name)?.strip_prefix('=')
        }
    })
}

/// qemu's option syntax: comma-separated, `,,` a literal comma.
fn qemu_fields(value: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ',' {
            if chars.peek() == Some(&',') {
                chars.next();
                if let Some(f) = fields.last_mut() {
                    f.push(',');
                }
            } else {
                fields.push(String::new());
            }
        } else if let Some(f) = fields.last_mut() {
            f.push(c);
        }
    }
    fields
}

/// `-name [guest=]NAME[,process=P][,debug-threads=on]` -> (name, debug threads).
fn qemu_name(value: &str) -> (Option<String>, bool) {
    let mut name = None;
    let mut debug = false;
    for (i, field) in qemu_fields(value).into_iter().enumerate() {
        match field.split_once('=') {
            Some(("guest", n)) => name = Some(n.to_owned()),
            Some(("debug-threads", v)) => debug = matches!(v, "on" | "yes" | "true"),
            Some(_) => {}
            None if i == 0 => name = Some(field),
            None => {}
        }
    }
    (name.filter(|n| !n.is_empty()), debug)
}

/// `-smp N[,...]`, `-smp cpus=N,...`, or `sockets*dies*clusters*cores*threads` when no
/// count is given (qemu's own default for a missing count).
fn qemu_smp(value: &str) -> Option<u32> {
    let mut cpus = None;
    let mut product: Option<u32> = None;
    for (i, field) in qemu_fields(value).into_iter().enumerate() {
        match field.split_once('=') {
            Some(("cpus", n)) => cpus = n.parse().ok(),
            Some(("sockets" | "dies" | "clusters" | "cores" | "threads", n)) => {
                let n: u32 = n.parse().ok()?;
                product = Some(product.unwrap_or(1).saturating_mul(n));
            }
            Some(_) => {}
            None if i == 0 => cpus = field.parse().ok(),
            None => {}
        }
    }
    cpus.or(product).filter(|n| *n > 0)
}

/// `key=value` inside a comma-separated value.
fn keyed<'a>(value: &'a str, key: &str) -> Option<&'a str> {
    value
        .split(',')
        .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
}

/// `/run/fc/vm1.sock` -> `vm1`.
fn file_stem(path: &str) -> Option<String> {
    let stem = std::path::Path::new(path).file_stem()?.to_str()?;
    (!stem.is_empty()).then(|| stem.to_owned())
}

/// libvirt's systemd scope, `machine-qemu\x2d3\x2dmy\x2dvm.scope` -> `my-vm` (systemd
/// escapes `-` as `\x2d`; the number is libvirt's domain id).
fn libvirt_scope_name(cgroup: &str) -> Option<String> {
    cgroup.split('/').find_map(|part| {
        let stem = part.strip_prefix("machine-")?.strip_suffix(".scope")?;
        let unescaped = unescape_systemd(stem);
        let rest = unescaped
            .strip_prefix("qemu-")
            .or_else(|| unescaped.strip_prefix("kvm-"))?;
        let (id, name) = rest.split_once('-')?;
        (id.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty()).then(|| name.to_owned())
    })
}

/// systemd's `\xNN` escapes.
fn unescape_systemd(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && bytes.get(i + 1) == Some(&b'x')
            && let Some(b) = s
                .get(i + 2..i + 4)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(cmdline: &str, comm: &str, cgroup: &str) -> Option<VmRef> {
        let args: Vec<&str> = cmdline.split_whitespace().collect();
        recognise(&args, comm, cgroup)
    }

    #[test]
    fn libvirt_qemu_is_named_from_its_arguments_with_named_threads() {
        // As libvirt 9 starts a domain (abridged).
        let v = vm(
            "/usr/bin/qemu-system-x86_64 -name guest=web-1,debug-threads=on -S -machine pc-q35-7.2,usb=off -smp 4,sockets=4,dies=1,cores=1,threads=1 -m 2048",
            "qemu-system-x86",
            "/machine.slice/machine-qemu\\x2d3\\x2dweb\\x2d1.scope/libvirt/emulator",
        )
        .expect("a VM");
        assert_eq!(v.name.as_deref(), Some("web-1"));
        assert_eq!(v.hypervisor, Hypervisor::Qemu);
        assert_eq!(v.launcher, Launcher::Libvirt);
        assert_eq!(v.vcpus, Some(4));
        assert!(v.named_threads);
    }

    #[test]
    fn qemu_name_and_smp_shapes() {
        let cases: &[(&str, Option<&str>, Option<u32>, bool)] = &[
            (
                "qemu-system-x86_64 -name vm1 -smp 2",
                Some("vm1"),
                Some(2),
                false,
            ),
            (
                "qemu-system-x86_64 -name vm1,debug-threads=on",
                Some("vm1"),
                None,
                true,
            ),
            (
                "qemu-system-aarch64 -name=guest=a,,b -smp cpus=3",
                Some("a_b"),
                Some(3),
                false,
            ),
            (
                "qemu-kvm -smp sockets=2,cores=2,threads=2",
                None,
                Some(8),
                false,
            ),
            (
                "qemu-system-x86_64 -name process=x,guest=y -smp 0",
                Some("y"),
                None,
                false,
            ),
            (
                "qemu-system-x86_64 -name ../../etc",
                Some("_._.._etc"),
                None,
                false,
            ),
        ];
        for &(cmd, name, vcpus, named) in cases {
            let v = vm(cmd, "qemu-system-x86", "/").expect(cmd);
            assert_eq!(
                (v.name.as_deref(), v.vcpus, v.named_threads),
                (name, vcpus, named),
                "{cmd}"
            );
        }
    }

    #[test]
    fn libvirt_scope_names_a_qemu_without_name() {
        let v = vm(
            "qemu-system-x86_64 -m 512",
            "qemu-system-x86",
            "/machine.slice/machine-qemu\\x2d12\\x2dbuild\\x2dbox.scope",
        )
        .expect("a VM");
        assert_eq!(v.name.as_deref(), Some("build-box"));
        assert_eq!(v.launcher, Launcher::Libvirt);
    }

    #[test]
    fn firecracker_and_cloud_hypervisor() {
        let fc = vm(
            "/usr/bin/firecracker --id fc-7 --api-sock /run/fc/x.sock",
            "firecracker",
            "/",
        )
        .expect("firecracker");
        assert_eq!(
            (fc.name.as_deref(), fc.hypervisor),
            (Some("fc-7"), Hypervisor::Firecracker)
        );
        let fc = vm(
            "firecracker --api-sock=/run/fc/vm9.sock",
            "firecracker",
            "/",
        )
        .expect("fc");
        assert_eq!(fc.name.as_deref(), Some("vm9"));
        let ch = vm(
            "cloud-hypervisor --api-socket path=/run/ch/db.sock --cpus boot=6,max=8 --memory size=1G",
            "cloud-hyperviso",
            "/",
        )
        .expect("cloud-hypervisor");
        assert_eq!(
            (ch.name.as_deref(), ch.vcpus, ch.hypervisor),
            (Some("db"), Some(6), Hypervisor::CloudHypervisor)
        );
    }

    #[test]
    fn kubevirt_qemu_in_a_pod_keeps_the_pod() {
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let v = vm(
            "/usr/libexec/qemu-kvm -name guest=default_testvmi,debug-threads=on -smp 1,sockets=1,cores=1,threads=1",
            "qemu-kvm",
            &format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{}.scope",
                uid.replace('-', "_"),
                "ab".repeat(32)
            ),
        )
        .expect("a VM");
        assert_eq!(v.name.as_deref(), Some("default_testvmi"));
        assert_eq!(
            v.launcher,
            Launcher::KubeVirt {
                pod_uid: uid.into()
            }
        );
        assert_eq!(v.vcpus, Some(1));
    }

    #[test]
    fn other_processes_are_not_vms() {
        for (cmd, comm) in [
            ("/usr/bin/bash -c qemu-system-x86_64", "bash"),
            ("virt-launcher --qemu-timeout 5m", "virt-launcher"),
            ("/usr/sbin/libvirtd", "libvirtd"),
            ("", "kworker/0:1"),
        ] {
            assert_eq!(vm(cmd, comm, "/"), None, "{cmd}");
        }
    }

    #[test]
    fn thread_names() {
        use ThreadClass::*;
        let cases = [
            (Hypervisor::Qemu, "CPU 0/KVM", true, Vcpu(0)),
            (Hypervisor::Qemu, "CPU 11/TCG", false, Vcpu(11)),
            (Hypervisor::Qemu, "IO iothread1", true, Emulator),
            (Hypervisor::Qemu, "qemu-system-x86", true, Emulator),
            (Hypervisor::Qemu, "qemu-system-x86", false, Unnamed),
            (Hypervisor::Firecracker, "fc_vcpu 1", true, Vcpu(1)),
            (Hypervisor::Firecracker, "fc_api", true, Emulator),
            (Hypervisor::CloudHypervisor, "vcpu3", true, Vcpu(3)),
            (Hypervisor::CloudHypervisor, "vmm", true, Emulator),
        ];
        for (h, comm, named, want) in cases {
            assert_eq!(classify(h, comm, named), want, "{comm}");
        }
    }

    #[test]
    fn names_are_one_safe_path_component() {
        assert_eq!(safe_name("..").as_deref(), Some("_."));
        assert_eq!(safe_name("a/b c").as_deref(), Some("a_b_c"));
        assert_eq!(safe_name(""), None);
        assert_eq!(safe_name(&"x".repeat(300)).map(|n| n.len()), Some(128));
    }
}
