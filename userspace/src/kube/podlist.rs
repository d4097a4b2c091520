//! The pod list (`/api/v1/pods`, or the kubelet's `/pods`: both answer a `v1.PodList`)
//! decoded into the names of this node's containers. Outside input: bounded in size before
//! it is parsed (`MAX_BYTES`), and in the number of pods and containers kept; fields the
//! agent does not use are ignored. Pure.

use std::collections::HashMap;

use serde::Deserialize;

/// Largest pod list accepted: a node runs at most a few hundred pods (110 by default), and
/// their full specs take well under this.
pub(crate) const MAX_BYTES: usize = 32 << 20;
/// Pods kept from one list.
pub const MAX_PODS: usize = 4096;
/// Containers kept per pod (init, regular and ephemeral).
pub const MAX_CONTAINERS: usize = 64;

/// The names of one container, or of a pod when the cgroup names no container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNames {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub pod: String,
    /// The container's name; empty for a pod-level cgroup.
    pub container: String,
}

/// Names by container id and by pod UID.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Index {
    /// Container id (hex, without the `containerd://` scheme) -> names.
    pub containers: HashMap<String, PodNames>,
    /// Pod UID -> namespace and pod (container empty).
    pub pods: HashMap<String, PodNames>,
}

/// Why a pod list was refused.
#[derive(Debug, thiserror::Error)]
pub enum PodListError {
    /// Larger than `MAX_BYTES`.
    #[error("pod list larger than {MAX_BYTES} bytes")]
    TooLarge,
    /// Not a `v1.PodList`.
    #[error("not a pod list: {0}")]
    Json(#[from] serde_json::Error),
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    init_container_statuses: Vec<ContainerStatus>,
    #[serde(default)]
    ephemeral_container_statuses: Vec<ContainerStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStatus {
    #[serde(default)]
    name: String,
    /// `containerd://<id>`, `cri-o://<id>`, `docker://<id>`; absent while it is created.
    #[serde(default, rename = "containerID")]
    container_id: String,
}

/// Decodes a pod list into an [`Index`].
pub fn decode(bytes: &[u8]) -> Result<Index, PodListError> {
    if bytes.len() > MAX_BYTES {
        return Err(PodListError::TooLarge);
    }
    let list: PodList = serde_json::from_slice(bytes)?;
    let mut index = Index::default();
    for pod in list.items.into_iter().take(MAX_PODS) {
        let names = PodNames {
            namespace: pod.metadata.namespace,
            pod: pod.metadata.name,
            container: String::new(),
        };
        let s = pod.status;
        for c in s
            .container_statuses
            .into_iter()
            .chain(s.init_container_statuses)
            .chain(s.ephemeral_container_statuses)
            .take(MAX_CONTAINERS)
        {
            let id = c
                .container_id
                .rsplit_once("://")
                .map_or(c.container_id.as_str(), |(_, id)| id);
            if id.is_empty() {
                continue;
            }
            index.containers.insert(
                id.to_ascii_lowercase(),
                PodNames {
                    container: c.name,
                    ..names.clone()
                },
            );
        }
        if !pod.metadata.uid.is_empty() {
            index
                .pods
                .insert(pod.metadata.uid.to_ascii_lowercase(), names);
        }
    }
    Ok(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_pod_list() {
        let json = br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
          {"metadata":{"name":"web-1","namespace":"shop","uid":"0A1B2C3D-4e5f-6789-abcd-ef0123456789",
            "labels":{"app":"web"}},
           "spec":{"containers":[{"name":"nginx","image":"nginx"}]},
           "status":{"phase":"Running",
             "initContainerStatuses":[{"name":"init","containerID":"containerd://aaaa"}],
             "containerStatuses":[{"name":"nginx","containerID":"containerd://ABCDEF0123","ready":true},
                                  {"name":"sidecar"}]}},
          {"metadata":{"name":"pending","namespace":"default","uid":"11111111-2222-3333-4444-555555555555"},
           "status":{"phase":"Pending"}}]}"#;
        let index = decode(json).expect("decodes");
        let nginx = &index.containers["abcdef0123"];
        assert_eq!(
            (
                nginx.namespace.as_str(),
                nginx.pod.as_str(),
                nginx.container.as_str()
            ),
            ("shop", "web-1", "nginx")
        );
        assert_eq!(index.containers["aaaa"].container, "init");
        assert_eq!(index.containers.len(), 2, "no id, no entry");
        assert_eq!(
            index.pods["0a1b2c3d-4e5f-6789-abcd-ef0123456789"].pod,
            "web-1"
        );
        assert_eq!(
            index.pods["11111111-2222-3333-4444-555555555555"].namespace,
            "default"
        );
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(decode(b"").is_err());
        assert!(decode(b"[1,2]").is_err());
        assert!(decode(br#"{"items":[{"metadata":{"name":5}}]}"#).is_err());
        assert_eq!(decode(b"{}").expect("empty list"), Index::default());
        let big = vec![b' '; MAX_BYTES + 1];
        assert!(matches!(decode(&big), Err(PodListError::TooLarge)));
    }
}
