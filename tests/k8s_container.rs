//! The agent as the DaemonSet runs it, as far as this machine allows: in a cgroup of its
//! own, with a private cgroup namespace and mount namespace (`unshare --cgroup --mount`),
//! its own cgroup2 mount at /sys/fs/cgroup, and the host paths bind-mounted where
//! deploy/kubernetes/30-daemonset.yaml mounts them (/host/sys with the host's cgroup tree
//! at /host/sys/fs/cgroup, the ConfigMap at /etc/energy-bpf, empty /run, state and cache
//! directories), started with the ConfigMap's own agent.toml. It must read the energy
//! counter through /host/sys, see a host process by its host PID, and name that process's
//! container and pod from a cgroup path that /proc prints relative to its namespace.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use crate::{
    k8s::{self, sample},
    k8s_names::{APP_ID, Cgroup, UID, root},
    util::{self, BusyEmulator, Workload, get},
};

#[test]
fn agent_in_namespaces_with_the_manifests_mounts() {
    if !util::require_root("agent_in_namespaces_with_the_manifests_mounts") {
        return;
    }
    let _x = util::exclusive();
    let docs = k8s::all_documents();
    let toml = k8s::kind(&docs, "ConfigMap")["data"]["agent.toml"]
        .as_str()
        .expect("agent.toml in the ConfigMap")
        .to_string();
    let s = k8s::scratch();
    std::fs::create_dir_all(s.sysfs.join("fs/cgroup")).expect("mountpoint");
    let etc = s.dir.path().join("etc");
    std::fs::create_dir(&etc).expect("mkdir");
    std::fs::write(etc.join("agent.toml"), toml).expect("agent.toml");
    let _emulator = BusyEmulator::start(&s.energy_uj, 5.0, 10.0);

    // A pod's container on the host, and the agent's own cgroup beside the pods.
    let pod = format!(
        "{}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        root(),
        UID.replace('-', "_")
    );
    let app_cg = Cgroup::create(&Path::new(&pod).join(format!("cri-containerd-{APP_ID}.scope")));
    let agent_cg = Cgroup::create(&Path::new(root()).join("energy-bpf-agent.slice/agent.scope"));
    let busy = Workload::spawn("while :; do :; done", None);
    app_cg.enter(busy.pid());

    // Mountpoints that the manifests' paths need on this host (empty directories; only
    // the ones made here are removed).
    let made: Vec<&str> = [
        "/host/sys",
        "/etc/energy-bpf",
        "/run/energy-bpf",
        "/var/lib/energy-bpf",
        "/var/cache/energy-bpf",
    ]
    .into_iter()
    .filter(|d| !Path::new(d).exists())
    .collect();
    for d in &made {
        std::fs::create_dir_all(d).expect("mountpoint");
    }
    struct Cleanup(Vec<&'static str>);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for d in &self.0 {
                let _ = std::fs::remove_dir(d);
            }
            let _ = std::fs::remove_dir("/host");
        }
    }
    let _cleanup = Cleanup(made);

    // The shell enters the agent's cgroup, then the namespaces, mounts as the kubelet
    // would, and execs the agent.
    let script = format!(
        r#"set -e
echo $$ > {agent_cg}/cgroup.procs
exec unshare --cgroup --mount --propagation private sh -c '
set -e
mount --bind {sysfs} /host/sys
mount --bind {host_cg} /host/sys/fs/cgroup
mount -o remount,bind,ro /host/sys/fs/cgroup
mount -t tmpfs tmpfs /sys/fs/cgroup
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount --bind {etc} /etc/energy-bpf
mount -t tmpfs tmpfs /run/energy-bpf
mount -t tmpfs tmpfs /var/lib/energy-bpf
mount -t tmpfs tmpfs /var/cache/energy-bpf
cat /proc/self/cgroup >&2
exec {bin} agent --config=/etc/energy-bpf/agent.toml --interval 1 --metrics-addr 127.0.0.1:0 --energy-source powercap
'"#,
        agent_cg = agent_cg.0.display(),
        sysfs = s.sysfs.display(),
        host_cg = root(),
        etc = etc.display(),
        bin = util::bin().display(),
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script]);
    let (_agent, log) = k8s::spawn_logged(cmd);
    let (line, seen) = k8s::wait_line(&log, "metrics at http://", Duration::from_secs(60));
    let line = line.unwrap_or_else(|| panic!("agent in namespaces did not start:\n{seen}"));
    assert!(
        seen.lines().any(|l| l == "0::/"),
        "not in a cgroup namespace of its own:\n{seen}"
    );
    let addr = util::metrics_addr(&line).expect("address");
    let pid = format!("pid=\"{}\"", busy.pid());
    let id = format!("container_id=\"{APP_ID}\"");
    let uid = format!("pod_uid=\"{UID}\"");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (r, body) = get(&addr, "/readyz").expect("GET /readyz");
        let (_, metrics) = get(&addr, "/metrics").expect("GET /metrics");
        let joules = sample(
            &metrics,
            "energy_bpf_process_joules_total",
            &[&pid, &id, &uid],
        );
        let source = metrics
            .lines()
            .any(|l| l.starts_with("energy_bpf_source_info") && l.contains("powercap"));
        if r == 200 && source && joules.is_some_and(|j| j > 0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz {r} {body}; powercap source {source}; busy process {joules:?}:\n{}",
            metrics
                .lines()
                .filter(|l| l.contains(&pid) || l.starts_with("energy_bpf_source_info"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
