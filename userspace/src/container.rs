//! Container ids and Kubernetes pod UIDs read from a cgroup v2 path, so containers are
//! named without asking a container runtime or an API server. Pure string parsing.
//!
//! The shapes come from the runtimes' cgroup drivers:
//! - systemd driver: each container is a scope unit named `<runtime>-<id>.scope`
//!   (`docker-`, `cri-containerd-`, `crio-`, `libpod-`), and a pod is a slice
//!   `kubepods[-<qos>]-pod<uid>.slice` whose UID has `_` for `-` (systemd uses `-` as the
//!   slice hierarchy separator);
//! - cgroupfs driver: plain directories, `/docker/<id>` and
//!   `/kubepods[/<qos>]/pod<uid>/<id>`.
//!
//! The innermost container wins, so a container nested in another one (docker in docker,
//! podman's `libpod-<id>.scope/container`) is named by the scope that holds it.

/// What a cgroup path says about the container around a process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerRef {
    /// Full container id (lower-case hex), when the path names one.
    pub container_id: Option<String>,
    /// Kubernetes pod UID in its usual dashed form, when the path is under `kubepods`.
    pub pod_uid: Option<String>,
    /// The runtime the id's shape points to (`docker`, `containerd`, `crio`, `podman`).
    pub runtime: Option<&'static str>,
}

impl ContainerRef {
    /// Whether the path named neither a container nor a pod.
    pub fn is_empty(&self) -> bool {
        self.container_id.is_none() && self.pod_uid.is_none()
    }
}

/// Scope-unit prefixes of the systemd cgroup driver, and the runtime each means.
const SCOPE_PREFIXES: &[(&str, &str)] = &[
    ("docker-", "docker"),
    ("cri-containerd-", "containerd"),
    ("crio-", "crio"),
    ("libpod-", "podman"),
];

/// Reads the container id and pod UID from a cgroup v2 path such as
/// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`.
pub fn parse(path: &str) -> ContainerRef {
    let mut out = ContainerRef::default();
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let under_kubepods = parts.iter().any(|p| p.starts_with("kubepods"));
    for (i, part) in parts.iter().enumerate() {
        if let Some(uid) = pod_uid(part) {
            out.pod_uid = Some(uid);
            continue;
        }
        if let Some((id, runtime)) = scoped_id(part) {
            out.container_id = Some(id);
            out.runtime = Some(runtime);
            continue;
        }
        // cgroupfs driver: a bare 64-hex directory right under `docker` or a pod.
        let parent = i.checked_sub(1).map(|j| parts[j]);
        if is_hex(part, 64..=64)
            && (parent == Some("docker") || parent.is_some_and(|p| pod_uid(p).is_some()))
        {
            out.container_id = Some(part.to_ascii_lowercase());
            out.runtime = Some(if under_kubepods {
                // cgroupfs kubelets front containerd or CRI-O; the path does not say which.
                "kubernetes"
            } else {
                "docker"
            });
        }
    }
    out
}

/// `docker-<id>.scope` and friends -> (id, runtime). CRI-O's `crio-conmon-<id>.scope` holds
/// the monitor, not the container, and names none.
fn scoped_id(part: &str) -> Option<(String, &'static str)> {
    let stem = part.strip_suffix(".scope")?;
    SCOPE_PREFIXES.iter().find_map(|(prefix, runtime)| {
        let id = stem.strip_prefix(prefix)?;
        is_hex(id, 12..=64).then(|| (id.to_ascii_lowercase(), *runtime))
    })
}

/// `kubepods-burstable-pod<uid_with_underscores>.slice` or cgroupfs `pod<uid>` -> the UID.
fn pod_uid(part: &str) -> Option<String> {
    let raw = if let Some(stem) = part.strip_suffix(".slice") {
        if !stem.starts_with("kubepods") {
            return None;
        }
        let (_, uid) = stem.rsplit_once("-pod")?;
        uid.replace('_', "-")
    } else {
        part.strip_prefix("pod")?.to_owned()
    };
    is_uid(&raw).then(|| raw.to_ascii_lowercase())
}

/// A pod UID: a dashed UUID, or 32 hex digits (static pods take a hash as their UID).
fn is_uid(s: &str) -> bool {
    if is_hex(s, 32..=32) {
        return true;
    }
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| is_hex(g, n..=n))
}

fn is_hex(s: &str, len: std::ops::RangeInclusive<usize>) -> bool {
    len.contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4e2a1b9c8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f";
    const UID: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

    /// (container id, pod UID, runtime).
    type Parsed = (Option<String>, Option<String>, Option<&'static str>);

    fn case(path: &str) -> Parsed {
        let r = parse(path);
        (r.container_id, r.pod_uid, r.runtime)
    }

    #[test]
    fn real_path_shapes() {
        let uid_ = UID.replace('-', "_");
        let id = Some(ID.to_string());
        let uid = Some(UID.to_string());
        let cases: Vec<(String, Parsed)> = vec![
            // Docker, systemd cgroup driver (the default on systemd hosts).
            (
                format!("/system.slice/docker-{ID}.scope"),
                (id.clone(), None, Some("docker")),
            ),
            // Docker, cgroupfs driver.
            (format!("/docker/{ID}"), (id.clone(), None, Some("docker"))),
            // Kubernetes + containerd, systemd driver, burstable and best-effort QoS.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope"
                ),
                (id.clone(), uid.clone(), Some("containerd")),
            ),
            (
                format!(
                    "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{ID}.scope"
                ),
                (id.clone(), uid.clone(), Some("containerd")),
            ),
            // Guaranteed QoS has no QoS slice.
            (
                format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope"),
                (id.clone(), uid.clone(), Some("crio")),
            ),
            // CRI-O's conmon: the pod, not a container.
            (
                format!(
                    "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-conmon-{ID}.scope"
                ),
                (None, uid.clone(), None),
            ),
            // The pod's own slice (the pause process lives in a container of its own).
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice"),
                (None, uid.clone(), None),
            ),
            // Kubernetes, cgroupfs driver.
            (
                format!("/kubepods/besteffort/pod{UID}/{ID}"),
                (id.clone(), uid.clone(), Some("kubernetes")),
            ),
            (
                format!("/kubepods/pod{UID}/{ID}"),
                (id.clone(), uid.clone(), Some("kubernetes")),
            ),
            // Podman, rootful and rootless, and its nested `container` cgroup.
            (
                format!("/machine.slice/libpod-{ID}.scope"),
                (id.clone(), None, Some("podman")),
            ),
            (
                format!(
                    "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
                ),
                (id.clone(), None, Some("podman")),
            ),
            // Static pods take a 32-hex hash as UID.
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8a0b5b4c0d9e4f1a2b3c4d5e6f7a8b9c.slice".into(),
                (None, Some("8a0b5b4c0d9e4f1a2b3c4d5e6f7a8b9c".into()), None),
            ),
            // Not containers.
            ("/".into(), (None, None, None)),
            ("/system.slice/sshd.service".into(), (None, None, None)),
            (
                "/user.slice/user-1000.slice/session-3.scope".into(),
                (None, None, None),
            ),
            ("/system.slice/docker.service".into(), (None, None, None)),
            // A directory named like a hex id but not under docker or a pod.
            (format!("/system.slice/{ID}"), (None, None, None)),
            ("/kubepods.slice/kubepods-burstable.slice".into(), (None, None, None)),
            ("".into(), (None, None, None)),
        ];
        for (path, want) in cases {
            let (c, p, r) = case(&path);
            assert_eq!((c, p, r), (want.0, want.1, want.2), "{path}");
        }
    }

    #[test]
    fn innermost_container_wins() {
        let inner = "aa".repeat(32);
        let r = parse(&format!("/docker/{ID}/docker/{inner}"));
        assert_eq!(r.container_id.as_deref(), Some(inner.as_str()));
    }

    #[test]
    fn upper_case_ids_are_normalised() {
        let r = parse(&format!("/system.slice/docker-{}.scope", ID.to_uppercase()));
        assert_eq!(r.container_id.as_deref(), Some(ID));
    }
}
