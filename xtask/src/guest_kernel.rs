//! The guest kernel the virtual-machine tests boot: Debian's newest `linux-image-6.1.0-*-amd64`
//! (BTF built in; virtio and 9p as modules an initramfs loads), kept under [`CACHE`] so a
//! test never downloads anything. Only the kernel image and the modules a 9p root needs are
//! kept (a few MB of the package's 400 MB).
use std::{path::Path, process::Command};

use crate::util::{Result, output, status};

/// Where the kernel is kept: `vmlinuz`, `version`, and `modules/` with the `.ko` files and
/// `order` (one module name a line, in load order).
pub const CACHE: &str = "/var/cache/energy-bpf/guest-kernel";

/// The modules a guest needs to mount 9p shares over virtio-pci, in dependency order (the
/// package ships no `modules.dep`; the order comes from each module's `depends=`).
const MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_modern_dev",
    "virtio_pci_legacy_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
];

/// Downloads and unpacks the newest generic 6.1 kernel unless the cache has one.
pub fn ensure() -> Result {
    let cache = Path::new(CACHE);
    if cache.join("vmlinuz").exists() && cache.join("modules/order").exists() {
        return Ok(());
    }
    // The generic flavour: the `cloud` one has no 9p.
    let search = output(
        "apt-cache",
        &["search", "--names-only", "^linux-image-6.1.0-[0-9]+-amd64$"],
    )
    .ok_or("apt-cache search failed: is this Debian 12 with bookworm in sources.list?")?;
    let mut names: Vec<&str> = search
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    names.sort_by_key(|n| abi(n));
    let package = names
        .last()
        .ok_or("no linux-image-6.1.0-*-amd64 package in apt's lists: run `apt-get update`")?
        .to_string();
    eprintln!("xtask: caching {package} in {CACHE}: the virtual-machine tests boot it");
    let work = cache.join("download");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    status(
        Command::new("apt-get")
            .args(["download", "-qq", &package])
            .current_dir(&work),
    )?;
    let deb = std::fs::read_dir(&work)
        .map_err(|e| format!("reading {}: {e}", work.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| format!("apt-get download left no .deb in {}", work.display()))?;
    let tree = work.join("tree");
    status(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    let version = package.trim_start_matches("linux-image-");
    let modules = cache.join("modules");
    std::fs::create_dir_all(&modules)
        .map_err(|e| format!("creating {}: {e}", modules.display()))?;
    let lib = tree.join("lib/modules").join(version).join("kernel");
    for name in MODULES {
        let found = find(&lib, &format!("{name}.ko"))
            .ok_or_else(|| format!("{package} has no {name}.ko under {}", lib.display()))?;
        copy(&found, &modules.join(format!("{name}.ko")))?;
    }
    copy(
        &tree.join(format!("boot/vmlinuz-{version}")),
        &cache.join("vmlinuz"),
    )?;
    write(&cache.join("version"), &format!("{version}\n"))?;
    // Written last: its presence says the cache is complete.
    write(&modules.join("order"), &(MODULES.join("\n") + "\n"))?;
    std::fs::remove_dir_all(&work).map_err(|e| format!("removing {}: {e}", work.display()))
}

/// The ABI number of `linux-image-6.1.0-N-amd64`, for picking the newest.
fn abi(package: &str) -> u32 {
    package
        .trim_start_matches("linux-image-6.1.0-")
        .split('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn find(dir: &Path, file: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find(&path, file) {
                return Some(found);
            }
        } else if entry.file_name() == file {
            return Some(path);
        }
    }
    None
}

fn copy(from: &Path, to: &Path) -> Result {
    std::fs::copy(from, to)
        .map(drop)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
}

fn write(path: &Path, text: &str) -> Result {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}
