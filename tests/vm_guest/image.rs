//! A real qemu guest for the virtual-machine tests: Debian's 6.1 kernel (cached by `cargo
//! xtask setup` under [`KERNEL_CACHE`]), an initramfs of static busybox and the virtio/9p
//! modules, and three 9p shares: this host's `/` read-only (the guest runs this build's
//! `energy-bpf` and the host's tools from it, chrooted), a writable scratch directory for
//! the guest's script and results, and the VM's energy directory, read-only, mounted at the
//! guest's `/run/energy-bpf/host`. TCG, since nested KVM hangs on our machines.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// Where `cargo xtask setup` keeps the guest kernel (`vmlinuz`, `modules/*.ko`,
/// `modules/order`).
pub const KERNEL_CACHE: &str = "/var/cache/energy-bpf/guest-kernel";

/// Why a guest cannot start here, if it cannot.
pub fn unavailable() -> Option<String> {
    let qemu = Command::new("qemu-system-x86_64").arg("--version").output();
    if !qemu.is_ok_and(|o| o.status.success()) {
        return Some("qemu-system-x86_64 cannot run (run `sudo cargo xtask setup`)".into());
    }
    for need in ["vmlinuz", "modules/order"] {
        let path = Path::new(KERNEL_CACHE).join(need);
        if !path.exists() {
            return Some(format!(
                "{} is missing: the guest kernel is cached by `sudo cargo xtask setup`",
                path.display()
            ));
        }
    }
    for tool in ["/bin/busybox", "/usr/bin/cpio"] {
        if !Path::new(tool).exists() {
            return Some(format!("{tool} is missing (run `sudo cargo xtask setup`)"));
        }
    }
    None
}

/// The guest's `/init`: modules, the three shares, the script chrooted into the host's
/// root, then power off. `@SCRATCH@` is the scratch directory's path on the host, where it
/// is mounted again inside the chroot so paths read the same on both sides.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /lib/modules/order); do insmod /lib/modules/$m.ko || echo "insmod $m failed"; done
o=trans=virtio,version=9p2000.L
mount -t 9p -o $o,ro,cache=loose hostroot /host || echo "mounting the host root failed"
mount -t proc proc /host/proc; mount -t sysfs sys /host/sys; mount -t devtmpfs dev /host/dev
mount -t tmpfs run /host/run; mkdir -p /host/run/energy-bpf/host
mount -t 9p -o $o,ro energy-bpf /host/run/energy-bpf/host || echo "mounting the energy share failed"
mount -t 9p -o $o scratch /host@SCRATCH@ || echo "mounting the scratch share failed"
chroot /host /bin/sh @SCRATCH@/guest.sh > /host@SCRATCH@/guest.log 2>&1
echo "guest script exited $?"
sync
poweroff -f
"#;

/// A running guest; killed on drop.
pub struct Guest {
    child: Child,
    /// The serial console's log.
    pub console: PathBuf,
}

impl Guest {
    /// Boots a guest named `name` (qemu `-name guest=NAME,debug-threads=on`, as libvirt
    /// starts it) with 2 vCPUs that runs `scratch/guest.sh`, sharing `energy_dir` read-only.
    pub fn boot(name: &str, work: &Path, scratch: &Path, energy_dir: &Path) -> Self {
        let initrd = initramfs(work, scratch);
        let console = work.join("console.log");
        let child = Command::new("qemu-system-x86_64")
            .args(["-name", &format!("guest={name},debug-threads=on")])
            .args(["-accel", "tcg,thread=multi", "-smp", "2,sockets=1,cores=2"])
            .args(["-m", "2048", "-display", "none", "-monitor", "none"])
            .args(["-no-reboot", "-net", "none"])
            .arg("-serial")
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(Path::new(KERNEL_CACHE).join("vmlinuz"))
            .arg("-initrd")
            .arg(&initrd)
            .args(["-append", "console=ttyS0 quiet panic=-1"])
            .arg("-virtfs")
            .arg("local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=energy-bpf,security_model=none,readonly=on",
                energy_dir.display()
            ))
            .arg("-virtfs")
            .arg(format!(
                "local,path={},mount_tag=scratch,security_model=none",
                scratch.display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn qemu-system-x86_64");
        Self { child, console }
    }

    /// Waits for the guest to power off, calling `tick` every 100 ms; false at `cap`.
    pub fn wait(&mut self, cap: Duration, mut tick: impl FnMut()) -> bool {
        let start = Instant::now();
        while start.elapsed() < cap {
            if self.child.try_wait().ok().flatten().is_some() {
                return true;
            }
            tick();
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// The console so far, for messages.
    pub fn console_text(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the initramfs under `work` and returns its path.
fn initramfs(work: &Path, scratch: &Path) -> PathBuf {
    let root = work.join("initramfs");
    for dir in ["bin", "proc", "sys", "dev", "host", "lib/modules"] {
        std::fs::create_dir_all(root.join(dir)).expect("initramfs dir");
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).expect("copy busybox");
    let modules = Path::new(KERNEL_CACHE).join("modules");
    for entry in std::fs::read_dir(&modules).expect("kernel modules") {
        let entry = entry.expect("module");
        std::fs::copy(
            entry.path(),
            root.join("lib/modules").join(entry.file_name()),
        )
        .expect("copy module");
    }
    let init = root.join("init");
    std::fs::write(
        &init,
        INIT.replace("@SCRATCH@", &scratch.display().to_string()),
    )
    .expect("init");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755)).expect("chmod init");
    let out = work.join("initramfs.cpio");
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd '{}' && find . | cpio -o -H newc --quiet > '{}'",
            root.display(),
            out.display()
        ))
        .status()
        .expect("cpio");
    assert!(status.success(), "packing the initramfs failed");
    out
}
