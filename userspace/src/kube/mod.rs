//! Names of Kubernetes pods, namespaces and containers for the cgroups the agent sees.
//! `crate::container` reads the container id and pod UID from a cgroup path; this module
//! turns them into `namespace`, `pod` and `container` names from the node's pod list
//! (the API server's `/api/v1/pods?fieldSelector=spec.nodeName=NODE`, or the kubelet's
//! `/pods`: both answer a `v1.PodList`).
//!
//! Threads: `Resolver::names` is called from the capture thread while it publishes a
//! window; it only reads a cached index under a short lock. A thread of the resolver's own
//! fetches the list at start, again when a lookup misses (at most once per
//! `MIN_REFRESH`) and every `MAX_AGE` so deleted pods are forgotten. The index is
//! replaced whole, so it is bounded by one list ([`podlist::MAX_PODS`]). With no list to be
//! had, lookups answer `None` and the metrics keep today's ids; the failure is logged once
//! (then at debug) and its recovery once.
//!
//! Security: https only, the server verified against a CA file, the bearer token read from
//! a file and never logged; the answer is bounded (`podlist::MAX_BYTES`) before it is
//! parsed.

pub(crate) mod fetch;
pub mod podlist;

use std::{
    path::PathBuf,
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

pub(crate) use podlist::{Index, PodNames};

use crate::container::ContainerRef;

/// Shortest time between two fetches asked for by misses (a node's new pod is named within
/// this; an unknown container costs at most one request per this).
pub(crate) const MIN_REFRESH: Duration = Duration::from_secs(15);
/// A list older than this is fetched again even without a miss.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(300);

/// Where the pod list comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KubeSettings {
    /// `https://…/api/v1/pods?fieldSelector=spec.nodeName%3DNODE` or `https://NODE_IP:10250/pods`.
    pub pods_url: String,
    /// PEM file of the CA that signed the server's certificate.
    pub ca: PathBuf,
    /// File holding the bearer token (the service account's).
    pub token: Option<PathBuf>,
}

/// Why pod names cannot be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeError {
    /// The URL is not usable.
    #[error("pod list URL `{0}`: {1}")]
    Url(String, &'static str),
    /// The CA file cannot be used.
    #[error("CA file {0}: {1}")]
    Ca(PathBuf, String),
    /// The token file cannot be read.
    #[error("token file {0}: {1}")]
    Token(PathBuf, String),
    /// TLS could not be set up.
    #[error("TLS: {0}")]
    Tls(String),
    /// The request failed.
    #[error("{0}")]
    Http(String),
    /// The server said no.
    #[error("HTTP status {0}{hint}", hint = status_hint(*.0))]
    Status(u16),
    /// The answer is not a pod list.
    #[error(transparent)]
    PodList(#[from] podlist::PodListError),
    /// The fetch thread could not start.
    #[error("cannot start the pod list thread: {0}")]
    Thread(String),
}

fn status_hint(status: u16) -> &'static str {
    match status {
        401 => " (the token was refused)",
        403 => " (RBAC: the service account needs `list` on pods)",
        _ => "",
    }
}

/// Looks names up; cheap and non-blocking (see the module doc).
pub(crate) struct Resolver {
    shared: Arc<Shared>,
}

struct Shared {
    index: Mutex<Index>,
    /// Set by a miss, cleared by the fetch thread.
    wanted: Mutex<bool>,
    wake: Condvar,
}

impl Resolver {
    /// Starts the fetch thread; the first list is asked for at once.
    pub fn start(settings: &KubeSettings) -> Result<Self, KubeError> {
        let client = fetch::Client::new(&settings.pods_url, &settings.ca, settings.token.clone())?;
        let shared = Arc::new(Shared {
            index: Mutex::new(Index::default()),
            wanted: Mutex::new(true),
            wake: Condvar::new(),
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| KubeError::Thread(e.to_string()))?;
        let worker = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("energy-bpf-kube".into())
            .spawn(move || refresh_loop(&worker, &client, &runtime))
            .map_err(|e| KubeError::Thread(e.to_string()))?;
        Ok(Self { shared })
    }

    /// A resolver over a fixed index, with no fetching (tests).
    #[cfg(test)]
    pub fn fixed(index: Index) -> Self {
        Self {
            shared: Arc::new(Shared {
                index: Mutex::new(index),
                wanted: Mutex::new(false),
                wake: Condvar::new(),
            }),
        }
    }

    /// The names of the container (or, for a pod-level cgroup, the pod) `c` refers to;
    /// the pod's names for a container the list does not have yet, `None` for cgroups
    /// outside Kubernetes or not in the list. Anything not found asks for a fresh list.
    pub fn names(&self, c: &ContainerRef) -> Option<PodNames> {
        if c.is_empty() {
            return None;
        }
        let (found, complete) = {
            let index = lock(&self.shared.index);
            match c
                .container_id
                .as_ref()
                .and_then(|id| index.containers.get(id))
            {
                Some(names) => (Some(names.clone()), true),
                // The pod's names, until a list has the container too.
                None => (
                    c.pod_uid
                        .as_ref()
                        .and_then(|uid| index.pods.get(uid))
                        .cloned(),
                    c.container_id.is_none(),
                ),
            }
        };
        if found.is_none() || !complete {
            *lock(&self.shared.wanted) = true;
            self.shared.wake.notify_one();
        }
        found
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn refresh_loop(shared: &Shared, client: &fetch::Client, runtime: &tokio::runtime::Runtime) {
    let mut last: Option<Instant> = None;
    let mut failing = false;
    loop {
        // Wait for a miss or for the list to age.
        {
            let mut wanted = lock(&shared.wanted);
            let deadline = last.map_or_else(Instant::now, |t| t + MAX_AGE);
            while !*wanted && Instant::now() < deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                wanted = shared
                    .wake
                    .wait_timeout(wanted, left)
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .0;
            }
            *wanted = false;
        }
        // Rate limit: misses of containers that never appear cost one request per period.
        if let Some(t) = last {
            std::thread::sleep(MIN_REFRESH.saturating_sub(t.elapsed()));
        }
        last = Some(Instant::now());
        match runtime
            .block_on(client.get())
            .and_then(|body| Ok(podlist::decode(&body)?))
        {
            Ok(index) => {
                if failing {
                    tracing::info!("pod names: the pod list at {} answers again", client.url());
                    failing = false;
                }
                tracing::debug!(
                    pods = index.pods.len(),
                    containers = index.containers.len(),
                    "pod list refreshed"
                );
                *lock(&shared.index) = index;
            }
            Err(err) if failing => tracing::debug!("pod list: {err}"),
            Err(err) => {
                failing = true;
                tracing::warn!(
                    "no pod names: cannot read the pod list at {}: {err}; metrics keep container_id and pod_uid (retrying at most every {} s)",
                    client.url(),
                    MIN_REFRESH.as_secs()
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_first_then_pod() {
        let names = |ns: &str, pod: &str, c: &str| PodNames {
            namespace: ns.into(),
            pod: pod.into(),
            container: c.into(),
        };
        let mut index = Index::default();
        index
            .containers
            .insert("abc".into(), names("shop", "web-1", "app"));
        index.pods.insert("u-1".into(), names("shop", "web-1", ""));
        let r = Resolver::fixed(index);
        let c = |id: Option<&str>, uid: Option<&str>| ContainerRef {
            container_id: id.map(Into::into),
            pod_uid: uid.map(Into::into),
            runtime: None,
        };
        assert_eq!(
            r.names(&c(Some("abc"), Some("u-1"))),
            Some(names("shop", "web-1", "app"))
        );
        // A pod-level cgroup, or a container the list does not have yet: the pod's names.
        assert_eq!(
            r.names(&c(None, Some("u-1"))),
            Some(names("shop", "web-1", ""))
        );
        assert!(!*lock(&r.shared.wanted), "a pod-level cgroup is complete");
        assert_eq!(
            r.names(&c(Some("new"), Some("u-1"))),
            Some(names("shop", "web-1", ""))
        );
        assert!(*lock(&r.shared.wanted), "a new container asks for a list");
        *lock(&r.shared.wanted) = false;
        // Outside Kubernetes, or unknown: nothing, and a refresh is asked for.
        assert_eq!(r.names(&c(None, None)), None);
        assert_eq!(r.names(&c(Some("docker1"), None)), None);
        assert!(*lock(&r.shared.wanted));
    }
}
