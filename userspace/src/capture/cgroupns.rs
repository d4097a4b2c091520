//! Cgroup paths when the agent runs in a container with a cgroup namespace of its own (the
//! default for containers on cgroup v2). There `/proc/<pid>/cgroup` and the roots in
//! `/proc/self/mountinfo` are relative to the agent's namespace root: a pod's container is
//! `/../../kubepods-burstable.slice/…/cri-containerd-<id>.scope`, and the container's own
//! `/sys/fs/cgroup` shows only its subtree. With the host's hierarchy bind-mounted
//! (deploy/kubernetes: `/host/sys/fs/cgroup`), its mountinfo root is `/../..` (one `..` per
//! level the namespace root lies below the host root), and the namespace root's host path
//! is found by its inode among that many levels of the host tree. Paths are then made
//! host paths, so cgroup ids resolve and container and pod ids read as on the host.
//!
//! Without a namespace (or without the host mount) nothing changes: the first cgroup2
//! mount, paths as the kernel prints them.

use std::{fs, os::unix::fs::MetadataExt as _, path::Path};

/// Directories looked at while searching for the namespace root (a node has a few
/// thousand cgroups; this bounds a pathological tree).
const MAX_SCAN: usize = 200_000;

/// How this process sees the cgroup v2 hierarchy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// The mount to stat paths under.
    pub mount: String,
    /// Host path of this process's cgroup namespace root (`""` when not namespaced or not
    /// found): prefixed to the paths /proc prints.
    pub ns_root: String,
}

/// A cgroup2 mount from mountinfo: (root within the hierarchy, mount point).
fn cgroup2_mounts(mountinfo: &str) -> Vec<(String, String)> {
    mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            let mut f = pre.split_whitespace();
            let (root, dir) = (f.nth(3)?, f.next()?);
            Some((unescape(root), unescape(dir)))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Leading `..` components of a mountinfo root or /proc cgroup path.
fn ups(path: &str) -> usize {
    path.split('/')
        .filter(|p| !p.is_empty())
        .take_while(|p| *p == "..")
        .count()
}

/// The view from `mountinfo` text; `ino_of` stats a directory (a seam for tests).
pub fn view(mountinfo: &str, ino_of: &dyn Fn(&Path) -> Option<u64>) -> View {
    let mounts = cgroup2_mounts(mountinfo);
    let Some(host) = mounts.iter().max_by_key(|(root, _)| ups(root)) else {
        return View {
            mount: "/sys/fs/cgroup".into(),
            ns_root: String::new(),
        };
    };
    let depth = ups(&host.0);
    if depth == 0 {
        // Not namespaced, or no host mount: the first mount, as the kernel prints paths.
        return View {
            mount: mounts[0].1.clone(),
            ns_root: String::new(),
        };
    }
    // The namespace root's inode, from a mount of it (the container's own /sys/fs/cgroup).
    let ns_root = mounts
        .iter()
        .find(|(root, _)| root == "/")
        .and_then(|(_, dir)| ino_of(Path::new(dir)))
        .and_then(|ino| find_at_depth(Path::new(&host.1), depth, ino))
        .unwrap_or_default();
    if ns_root.is_empty() {
        tracing::warn!(
            "cgroup namespace: cannot find its root under {} ({depth} levels down); container ids may be missing",
            host.1
        );
    }
    View {
        mount: host.1.clone(),
        ns_root,
    }
}

/// The path (from `base`) of the directory `depth` levels below `base` with inode `ino`.
fn find_at_depth(base: &Path, depth: usize, ino: u64) -> Option<String> {
    let mut level = vec![String::new()];
    let mut scanned = 0usize;
    for _ in 0..depth {
        let mut next = Vec::new();
        for rel in &level {
            let Ok(entries) = fs::read_dir(base.join(rel.trim_start_matches('/'))) else {
                continue;
            };
            for e in entries.flatten() {
                scanned += 1;
                if scanned > MAX_SCAN {
                    return None;
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    next.push(format!("{rel}/{}", e.file_name().to_string_lossy()));
                }
            }
        }
        level = next;
    }
    level.into_iter().find(|rel| {
        fs::metadata(base.join(rel.trim_start_matches('/'))).is_ok_and(|m| m.ino() == ino)
    })
}

/// A /proc cgroup path as a host path: `ns_root` + `path` with `..` resolved; `None` when it
/// climbs above the host root.
pub fn host_path(ns_root: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = ns_root.split('/').filter(|p| !p.is_empty()).collect();
    for p in path.split('/').filter(|p| !p.is_empty() && *p != ".") {
        if p == ".." {
            parts.pop()?;
        } else {
            parts.push(p);
        }
    }
    Some(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_inside_a_namespace() {
        let ns = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podX.slice/cri-containerd-a.scope";
        assert_eq!(
            host_path(ns, "/../../kubepods-burstable.slice/p.slice/c.scope").as_deref(),
            Some(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable.slice/p.slice/c.scope"
            )
        );
        assert_eq!(host_path(ns, "/").as_deref(), Some(ns));
        assert_eq!(
            host_path("", "/system.slice/x.service").as_deref(),
            Some("/system.slice/x.service")
        );
        assert_eq!(host_path("/a", "/../.."), None, "above the host root");
    }

    #[test]
    fn views() {
        let host = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let v = view(host, &|_| None);
        assert_eq!(
            (v.mount.as_str(), v.ns_root.as_str()),
            ("/sys/fs/cgroup/unified", "")
        );
        // Inside a namespace two levels below the host root, with the host tree mounted at
        // a temporary directory holding a/b (the namespace root, by inode).
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(tmp.path().join("a/b")).expect("mkdir");
        std::fs::create_dir_all(tmp.path().join("c/d")).expect("mkdir");
        let ino = std::fs::metadata(tmp.path().join("a/b"))
            .expect("stat")
            .ino();
        let info = format!(
            "50 40 0:38 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n51 40 0:38 /../.. {} ro - cgroup2 cgroup2 rw\n",
            tmp.path().display()
        );
        let v = view(&info, &|p| {
            (p == Path::new("/sys/fs/cgroup")).then_some(ino)
        });
        assert_eq!(v.mount, tmp.path().display().to_string());
        assert_eq!(v.ns_root, "/a/b");
        assert_eq!(view("", &|_| None).mount, "/sys/fs/cgroup");
    }
}
