//! Pod, namespace and container names from a fake kubelet: an HTTPS server on loopback
//! (tests/support/fake_kubelet.py, a certificate signed by a CA made here) serving a
//! recorded pod list to the agent's bearer token. Busy processes run in real cgroups named
//! as kubelet's systemd driver names them; their process and container series must carry
//! `namespace`, `pod` and `container`, and a container's series must still equal the sum of
//! its processes'. With no kubelet, the agent says so once and keeps the ids.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::util::{self, Daemon, Workload, get, start_agent_with};

pub const UID: &str = "6f1d2c3b-4a59-4e7f-9b1a-0c2d3e4f5a6b";
pub const APP_ID: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";
const SIDECAR_ID: &str = "0f9e8d7c6b5a49382716f5e4d3c2b1a00f9e8d7c6b5a49382716f5e4d3c2b1a0";
pub const TOKEN: &str = "fake-service-account-token";

/// The cgroup v2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
pub fn root() -> &'static str {
    energy_bpf::capture::host::cgroup2_mount()
}

/// A cgroup directory removed (after its processes are moved out) on drop.
pub struct Cgroup(pub PathBuf);

impl Cgroup {
    pub fn create(path: &Path) -> Self {
        assert!(
            Path::new(root()).join("cgroup.controllers").exists(),
            "{} is not a cgroup2 mount",
            root()
        );
        std::fs::create_dir_all(path).expect("mkdir cgroup");
        Self(path.to_owned())
    }

    pub fn enter(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("move into cgroup");
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(Path::new(root()).join("cgroup.procs"), pid);
            }
        }
        // Leaf first, then the slices made for it (rmdir fails on non-empty ones: fine).
        let mut dir = Some(self.0.as_path());
        while let Some(d) = dir {
            if d == Path::new(root()) || std::fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
}

/// The recorded pod list: the pod `shop/web-1` with containers `app` and `sidecar`, plus
/// a pod elsewhere that nothing runs in.
fn pod_list() -> String {
    serde_json::json!({
        "kind": "PodList", "apiVersion": "v1", "metadata": {},
        "items": [
            {
                "metadata": {"name": "web-1", "namespace": "shop", "uid": UID},
                "spec": {"nodeName": "node-a", "containers": [{"name": "app"}, {"name": "sidecar"}]},
                "status": {"phase": "Running", "containerStatuses": [
                    {"name": "app", "containerID": format!("containerd://{APP_ID}"), "ready": true},
                    {"name": "sidecar", "containerID": format!("containerd://{SIDECAR_ID}"), "ready": true},
                ]}
            },
            {
                "metadata": {"name": "db-0", "namespace": "data", "uid": "11111111-2222-3333-4444-555555555555"},
                "status": {"phase": "Running", "containerStatuses": [
                    {"name": "postgres", "containerID": "containerd://ffff"}
                ]}
            }
        ]
    })
    .to_string()
}

/// Starts the fake kubelet; returns it and its port.
pub fn fake_kubelet(dir: &Path, cert: &Path, key: &Path) -> (Daemon, u16) {
    let pods = dir.join("pods.json");
    std::fs::write(&pods, pod_list()).expect("pods.json");
    let port_file = dir.join("port");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/support/fake_kubelet.py");
    let child: Child = Command::new("python3")
        .arg(script)
        .args([cert, key])
        .arg(TOKEN)
        .args([&pods, &port_file])
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 fake kubelet");
    let server = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            return (server, p.trim().parse().expect("port"));
        }
        assert!(Instant::now() < deadline, "fake kubelet did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// (labels, value) of every sample of `name`.
fn samples<'a>(metrics: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.rsplit_once("} ")?;
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

#[test]
fn pod_names_from_a_fake_kubelet() {
    if !util::require_root("pod_names_from_a_fake_kubelet") {
        return;
    }
    let _x = util::exclusive();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (ca, cert, _, key) = util::certificates(tmp.path());
    let token = tmp.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let (_kubelet, port) = fake_kubelet(tmp.path(), &cert, &key);

    let pod = format!(
        "{}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        root(),
        UID.replace('-', "_")
    );
    let app_cg = Cgroup::create(&Path::new(&pod).join(format!("cri-containerd-{APP_ID}.scope")));
    let side_cg =
        Cgroup::create(&Path::new(&pod).join(format!("cri-containerd-{SIDECAR_ID}.scope")));
    let app = Workload::spawn("while :; do :; done", None);
    let sidecar = Workload::spawn("while :; do :; done", None);
    app_cg.enter(app.pid());
    side_cg.enter(sidecar.pid());

    let url = format!("https://127.0.0.1:{port}/pods");
    let got = tmp.path().join("otlp");
    std::fs::create_dir(&got).expect("mkdir");
    let receiver = crate::otlp::Receiver::start(&got, crate::util::free_port(), false);
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let (_agent, addr, log) = start_agent_with(
        tmp.path(),
        &[
            "--kube-pods-url",
            &url,
            "--kube-ca",
            ca.to_str().expect("utf-8"),
            "--kube-token",
            token.to_str().expect("utf-8"),
            "--otlp-endpoint",
            &endpoint,
            "--profile-interval",
            "2",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    let want = [
        (app.pid(), "app", APP_ID),
        (sidecar.pid(), "sidecar", SIDECAR_ID),
    ];
    let metrics = loop {
        let (status, metrics) = get(&addr, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200);
        let named = want.iter().all(|(pid, name, _)| {
            samples(&metrics, "energy_bpf_process_joules_total")
                .iter()
                .any(|(l, j)| {
                    l.contains(&format!("pid=\"{pid}\""))
                        && l.contains("namespace=\"shop\"")
                        && l.contains("pod=\"web-1\"")
                        && l.contains(&format!("container=\"{name}\""))
                        && *j > 0.0
                })
        });
        if named {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "no named series for the pod's processes within 40 s:\n{}",
            metrics
                .lines()
                .filter(|l| l.contains(UID))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    // Every process series of the pod carries all three names.
    let of_pod: Vec<(&str, f64)> = samples(&metrics, "energy_bpf_process_joules_total")
        .into_iter()
        .filter(|(l, _)| l.contains(&format!("pod_uid=\"{UID}\"")))
        .collect();
    assert!(of_pod.len() >= 2, "{of_pod:?}");
    for (l, _) in &of_pod {
        assert!(
            l.contains("namespace=\"shop\"")
                && l.contains("pod=\"web-1\"")
                && l.contains("container=\""),
            "a series of the pod without its names: {l}"
        );
    }
    // Container series carry the names and still sum their processes' series, per zone
    // (one scrape: the ledger publishes whole windows).
    for (_, name, id) in want {
        let containers = samples(&metrics, "energy_bpf_container_joules_total");
        let mine: Vec<&(&str, f64)> = containers
            .iter()
            .filter(|(l, _)| l.contains(&format!("container_id=\"{id}\"")))
            .collect();
        assert!(!mine.is_empty(), "no container series for {name}");
        for (l, total) in mine {
            assert!(
                l.contains(&format!("container=\"{name}\"")) && l.contains("namespace=\"shop\""),
                "{l}"
            );
            let zone = l
                .split("zone=\"")
                .nth(1)
                .and_then(|z| z.split('"').next())
                .expect("zone");
            let sum: f64 = of_pod
                .iter()
                .filter(|(p, _)| {
                    p.contains(&format!("container_id=\"{id}\""))
                        && p.contains(&format!("zone=\"{zone}\""))
                })
                .map(|(_, j)| j)
                .sum();
            assert!(
                (sum - total).abs() <= 1e-6 * total.max(1.0),
                "container {name} zone {zone}: series {total} J, its processes {sum} J"
            );
        }
    }
    // OTLP samples of the pod's processes carry the k8s.* attributes, with the same names
    // (profiles every 2 s; symbolizing on a loaded 2-CPU machine can take a while).
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let summaries: Vec<serde_json::Value> = (1..)
            .map(|n| got.join(format!("{n}.json")))
            .take_while(|f| f.exists())
            .filter_map(|f| serde_json::from_slice(&std::fs::read(f).ok()?).ok())
            .collect();
        let seen = |pid: u32, name: &str| {
            summaries.iter().any(|s| {
                s["profiles"].as_array().is_some_and(|ps| {
                    ps.iter().any(|p| {
                        p["k8s_by_pid"][pid.to_string()]
                            == serde_json::json!(["shop", "web-1", name])
                    })
                })
            })
        };
        if want.iter().all(|(pid, name, _)| seen(*pid, name)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no OTLP samples with k8s.* attributes for the pod's processes in {} requests: {:?}\n{}",
            summaries.len(),
            summaries
                .iter()
                .map(|s| s["profiles"][0]["k8s_by_pid"].clone())
                .collect::<Vec<_>>(),
            log.try_iter().collect::<Vec<_>>().join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn without_a_kubelet_ids_stay_and_it_is_said_once() {
    if !util::require_root("without_a_kubelet_ids_stay_and_it_is_said_once") {
        return;
    }
    let _x = util::exclusive();
    let tmp = tempfile::tempdir().expect("tempdir");
    let (ca, ..) = util::certificates(tmp.path());
    // A port nothing listens on.
    let port = crate::util::free_port();
    let url = format!("https://127.0.0.1:{port}/pods");
    let pod = format!(
        "{}/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        root(),
        UID.replace('-', "_")
    );
    let cg = Cgroup::create(&Path::new(&pod).join(format!("cri-containerd-{APP_ID}.scope")));
    let busy = Workload::spawn("while :; do :; done", None);
    cg.enter(busy.pid());
    let mut cmd = Command::new(util::bin());
    cmd.args(["agent", "--interval", "1", "--metrics-addr", "127.0.0.1:0"])
        .args([
            "--energy-source",
            "model",
            "--kube-pods-url",
            &url,
            "--kube-ca",
        ])
        .arg(&ca)
        .arg("--socket")
        .arg(tmp.path().join("agent.sock"))
        .arg("--state-dir")
        .arg(tmp.path().join("state"));
    // Every line from the start: the first fetch fails before the agent is up.
    let (_agent, log) = crate::k8s::spawn_logged(cmd);
    let (line, seen) = crate::k8s::wait_line(&log, "metrics at http://", Duration::from_secs(60));
    let line = line.unwrap_or_else(|| panic!("agent did not start:\n{seen}"));
    let addr = util::metrics_addr(&line).expect("address");
    let deadline = Instant::now() + Duration::from_secs(25);
    let mut said: Vec<String> = seen
        .lines()
        .filter(|l| l.contains("no pod names"))
        .map(str::to_owned)
        .collect();
    let mut with_id = false;
    while Instant::now() < deadline {
        said.extend(log.try_iter().filter(|l| l.contains("no pod names")));
        let (_, metrics) = get(&addr, "/metrics").expect("GET /metrics");
        with_id |= samples(&metrics, "energy_bpf_process_joules_total")
            .iter()
            .any(|(l, _)| {
                l.contains(&format!("pid=\"{}\"", busy.pid()))
                    && l.contains(&format!("container_id=\"{APP_ID}\""))
                    && !l.contains("namespace=")
            });
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(with_id, "the busy process lost its container id");
    assert_eq!(said.len(), 1, "said {} times: {said:?}", said.len());
    eprintln!("{}", said[0]);
}
