//! Deploying on Kubernetes (deploy/kubernetes/):
//! - every manifest passes `kubernetes-validate --strict` against the Kubernetes 1.30
//!   schemas it ships (offline), and a broken one fails it; the ServiceMonitor, a CRD with
//!   no schema there, is checked against the Service it selects;
//! - the agent runs as `nobody` holding exactly the DaemonSet's capabilities (ambient, via
//!   `setpriv`): it loads the probes, reads a root-only powercap counter, loads unwind
//!   tables of a root process, answers /healthz and /readyz, and shows that process on
//!   /metrics; dropping any one capability gets a line naming it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::util::{self, BusyEmulator, Daemon, Workload, get};

/// The Kubernetes version the manifests promise to apply to.
const KUBE_VERSION: &str = "1.30.0";

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifests_dir())
        .expect("deploy/kubernetes")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        // kustomize's own file is no Kubernetes object (tests/kustomize.rs renders it).
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 7, "manifests missing: {files:?}");
    files
}

/// Every YAML document of `file`, as JSON (PyYAML, which kubernetes-validate brings).
pub fn documents(file: &Path) -> Vec<Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import json,sys,yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))",
        ])
        .arg(file)
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", util::text(&out));
    serde_json::from_slice(&out.stdout).expect("YAML as JSON")
}

pub fn kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifests"))
}

/// The documents of every numbered manifest, the ones the strict validation checks.
pub fn all_documents() -> Vec<Value> {
    manifests().iter().flat_map(|f| documents(f)).collect()
}

/// `kubernetes-validate --strict -k 1.30.0 FILES`: (success, output).
pub fn validate(files: &[PathBuf]) -> (bool, String) {
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "-k", KUBE_VERSION])
        .args(files)
        .output()
        .expect(
            "kubernetes-validate is not installed: run `cargo xtask setup` (pip install kubernetes-validate)",
        );
    (out.status.success(), util::text(&out))
}

#[test]
fn manifests_pass_strict_schema_validation() {
    let files = manifests();
    let (ok, text) = validate(&files);
    assert!(ok, "kubernetes-validate --strict failed:\n{text}");
    let docs = all_documents();
    for d in &docs {
        let (k, name) = (d["kind"].as_str().unwrap_or("?"), &d["metadata"]["name"]);
        if k == "ServiceMonitor" {
            assert!(
                text.contains("Couldn't find schema for kind ServiceMonitor"),
                "the validator learned ServiceMonitor; check it strictly:\n{text}"
            );
            continue;
        }
        let line = format!(
            "passed for resource {}/{}",
            k.to_lowercase(),
            name.as_str().unwrap_or("?")
        );
        assert!(text.contains(&line), "no `{line}` in:\n{text}");
    }

    // The validator must be able to fail: an unknown field and a wrong type.
    let tmp = tempfile::tempdir().expect("tempdir");
    let ds = std::fs::read_to_string(manifests_dir().join("30-daemonset.yaml")).expect("daemonset");
    for (what, broken) in [
        (
            "unknown field",
            ds.replace("hostPID: true", "hostPID: true\n      hostPIDs: true"),
        ),
        (
            "wrong type",
            ds.replace("hostPID: true", "hostPID: \"yes\""),
        ),
    ] {
        assert_ne!(broken, ds, "{what}: the edit did not apply");
        let f = tmp.path().join("broken.yaml");
        std::fs::write(&f, broken).expect("write");
        let (ok, text) = validate(&[f]);
        assert!(!ok, "{what} passed strict validation:\n{text}");
    }

    // The ServiceMonitor (a CRD; no schema ships with the validator) checked by hand
    // against the Service it must select and the port it must scrape.
    let svc = kind(&docs, "Service");
    let sm = kind(&docs, "ServiceMonitor");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    for (k, v) in sm["spec"]["selector"]["matchLabels"]
        .as_object()
        .expect("selector")
    {
        assert_eq!(
            &svc["metadata"]["labels"][k], v,
            "ServiceMonitor selects label {k}"
        );
    }
    let port = &sm["spec"]["endpoints"][0]["port"];
    assert!(
        svc["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| &p["name"] == port),
        "the Service has no port named {port}"
    );
    assert_eq!(
        sm["spec"]["namespaceSelector"]["matchNames"][0],
        svc["metadata"]["namespace"]
    );
}

#[test]
fn daemonset_is_least_privilege() {
    let docs = all_documents();
    let ds = kind(&docs, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert!(pod["hostNetwork"].is_null(), "no host network");
    assert_eq!(
        pod["tolerations"][0]["operator"], "Exists",
        "runs on every node"
    );
    let c = &pod["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert!(c["resources"]["limits"]["memory"].is_string());
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    let env: Vec<&Value> = c["env"].as_array().expect("env").iter().collect();
    assert!(
        env.iter()
            .any(|e| e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"),
        "node name from the downward API"
    );
    // RBAC: read-only verbs on pods and nodes, nothing else.
    let role = kind(&docs, "ClusterRole");
    for rule in role["rules"].as_array().expect("rules") {
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .expect("verbs")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(verbs, ["get", "list", "watch"], "{rule}");
        for r in rule["resources"].as_array().expect("resources") {
            assert!(r == "pods" || r == "nodes", "unexpected resource {r}");
        }
    }
    // Every host path is mounted read-only except the state directory.
    let host_volumes: Vec<&str> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter(|v| v["hostPath"].is_object())
        .filter_map(|v| v["name"].as_str())
        .collect();
    for m in c["volumeMounts"].as_array().expect("mounts") {
        let name = m["name"].as_str().unwrap_or("");
        if host_volumes.contains(&name) && name != "state" {
            assert_eq!(m["readOnly"], true, "host mount {name} is writable");
        }
    }
}

/// The capabilities the DaemonSet adds, as `setpriv` names them (`bpf`, `perfmon`, ...).
fn daemonset_caps() -> Vec<String> {
    let docs = all_documents();
    let ds = kind(&docs, "DaemonSet");
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
        .as_array()
        .expect("capabilities.add")
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_lowercase)
        .collect()
}

/// A scratch tree nobody can use: a root-only fake powercap counter driven by busy CPU
/// time, and writable socket, state and cache directories.
pub struct Scratch {
    pub dir: tempfile::TempDir,
    pub sysfs: PathBuf,
    pub energy_uj: PathBuf,
}

pub fn scratch() -> Scratch {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let (sysfs, tree) = util::one_package(dir.path());
    let energy_uj = tree.zone_dir("intel-rapl:0").join("energy_uj");
    // Like the real file since CVE-2020-8694.
    std::fs::set_permissions(&energy_uj, std::fs::Permissions::from_mode(0o400)).expect("chmod");
    for sub in ["run", "state", "cache"] {
        let d = dir.path().join(sub);
        std::fs::create_dir(&d).expect("mkdir");
        std::os::unix::fs::chown(&d, Some(65534), Some(65534)).expect("chown to nobody");
    }
    Scratch {
        dir,
        sysfs,
        energy_uj,
    }
}

/// `setpriv` as nobody/nogroup with exactly `caps` inheritable and ambient, running the
/// agent on the fake counter. Returns the child and its stderr lines.
fn agent_as_nobody(s: &Scratch, caps: &[String]) -> (Daemon, mpsc::Receiver<String>) {
    let list = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid", "nobody", "--regid", "nogroup", "--clear-groups"])
        .args(["--inh-caps", &list, "--ambient-caps", &list])
        .arg(util::bin())
        .args(["agent", "--interval", "1", "--metrics-addr", "127.0.0.1:0"])
        .args([
            "--energy-source",
            "powercap",
            "--unwind",
            "dwarf",
            "--sysfs-root",
        ])
        .arg(&s.sysfs)
        .arg("--socket")
        .arg(s.dir.path().join("run/agent.sock"))
        .arg("--state-dir")
        .arg(s.dir.path().join("state"))
        .env("XDG_CACHE_HOME", s.dir.path().join("cache"))
        .env("HOME", "/nonexistent");
    spawn_logged(cmd)
}

/// Spawns `cmd` with its stderr lines sent to the receiver.
pub fn spawn_logged(mut cmd: Command) -> (Daemon, mpsc::Receiver<String>) {
    use std::io::BufRead as _;
    let mut child = cmd
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    (Daemon(child), rx)
}

/// Waits for a stderr line containing `needle` (or the end of the stream); returns it and
/// everything seen before.
pub fn wait_line(
    rx: &mpsc::Receiver<String>,
    needle: &str,
    within: Duration,
) -> (Option<String>, String) {
    let deadline = Instant::now() + within;
    let mut seen = String::new();
    while let Ok(line) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if line.contains(needle) {
            return (Some(line), seen);
        }
        seen.push_str(&line);
        seen.push('\n');
    }
    (None, seen)
}

/// The value of the first sample on `/metrics` whose line contains every `part`.
pub fn sample(metrics: &str, name: &str, parts: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(name))
        .find(|l| parts.iter().all(|p| l.contains(p)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn agent_runs_as_nobody_with_the_daemonsets_capabilities() {
    if !util::require_root("agent_runs_as_nobody_with_the_daemonsets_capabilities") {
        return;
    }
    let _x = util::exclusive();
    let caps = daemonset_caps();
    let s = scratch();
    let _emulator = BusyEmulator::start(&s.energy_uj, 5.0, 10.0);
    // A root process: another user's, for the agent.
    let busy = Workload::spawn("while :; do :; done", None);
    let (_agent, rx) = agent_as_nobody(&s, &caps);
    let (line, seen) = wait_line(&rx, "metrics at http://", Duration::from_secs(60));
    let line =
        line.unwrap_or_else(|| panic!("agent as nobody with {caps:?} did not start:\n{seen}"));
    assert!(
        !seen.contains("missing CAP_"),
        "a capability reported missing:\n{seen}"
    );
    let addr = util::metrics_addr(&line).expect("address");
    // Ready after the first window; the busy process shows with energy and unwind tables.
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = format!("pid=\"{}\"", busy.pid());
    loop {
        let (h, hbody) = get(&addr, "/healthz").expect("GET /healthz");
        let (r, rbody) = get(&addr, "/readyz").expect("GET /readyz");
        let (m, metrics) = get(&addr, "/metrics").expect("GET /metrics");
        assert_eq!(m, 200);
        let joules = sample(&metrics, "energy_bpf_process_joules_total", &[&pid]);
        let tables = sample(
            &metrics,
            "energy_bpf_unwind_tables",
            &["what=\"processes\""],
        );
        if h == 200
            && r == 200
            && joules.is_some_and(|j| j > 0.0)
            && tables.is_some_and(|t| t >= 1.0)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "as nobody with {caps:?}: /healthz {h} {hbody}, /readyz {r} {rbody}, busy joules {joules:?}, unwind tables {tables:?}\n{}",
            metrics
                .lines()
                .filter(|l| l.contains("process_joules") || l.contains("unwind"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // No capability beyond the DaemonSet's: the kernel's view of the agent.
    let agent_pid = _agent.0.id();
    let status = std::fs::read_to_string(format!("/proc/{agent_pid}/status")).expect("status");
    let uid = status.lines().find(|l| l.starts_with("Uid:")).expect("Uid");
    assert!(
        uid.split_whitespace().skip(1).all(|u| u == "65534"),
        "{uid}"
    );
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .expect("CapEff")
        .trim();
    let eff = u64::from_str_radix(eff, 16).expect("hex");
    assert_eq!(
        eff.count_ones() as usize,
        caps.len(),
        "CapEff {eff:x} vs {caps:?}"
    );
}

#[test]
fn each_missing_capability_is_named() {
    if !util::require_root("each_missing_capability_is_named") {
        return;
    }
    let _x = util::exclusive();
    let caps = daemonset_caps();
    let s = scratch();
    for drop in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != drop).cloned().collect();
        let name = format!("CAP_{}", drop.to_uppercase());
        let (_agent, rx) = agent_as_nobody(&s, &fewer);
        // Fatal ones end the agent with an error naming it; CAP_SYS_PTRACE is a warning.
        let (line, seen) = wait_line(&rx, &name, Duration::from_secs(60));
        let line = line.unwrap_or_else(|| panic!("without {name}: no line naming it:\n{seen}"));
        assert!(line.contains("missing"), "without {name}: {line}");
        eprintln!("without {name}: {line}");
    }
}
