//! `energy-bpf agent` scraped by a real Prometheus (Debian's package, installed by
//! `cargo xtask setup`) on loopback, every second. Through Prometheus's query API:
//! - a pinned busy process's joules rate matches its share of the node's active energy,
//!   the share measured independently from /proc CPU times;
//! - per zone, process series sum to the node's `mode="active"` series within 0.1% at
//!   every scrape, while a second busy process runs, is killed and folds into `[exited]`;
//! - counters never reset;
//! - SIGTERM ends the agent with status 0.

use std::{
    path::Path,
    process::Command,
    sync::mpsc,
    thread,
    time::{Duration, SystemTime},
};

use serde_json::Value;

use crate::util::{self, Daemon, Workload, get, spawn_agent, start_agent_with};

use crate::util::PROMETHEUS;

/// Starts the agent and returns it with the address it logged for `/metrics`.
fn start_agent(dir: &Path) -> (Daemon, String, mpsc::Receiver<String>) {
    start_agent_with(dir, &[])
}

/// An instant query at `time` (unix seconds): (labels, value) per series.
fn query(prom: &str, q: &str, time: f64) -> Vec<(Value, f64)> {
    let path = format!("/api/v1/query?query={}&time={time:.3}", util::url_encode(q));
    let (status, body) = get(prom, &path).expect("query Prometheus");
    assert_eq!(status, 200, "{q}: {body}");
    let v: Value = serde_json::from_str(&body).expect("Prometheus JSON");
    v["data"]["result"]
        .as_array()
        .expect("vector result")
        .iter()
        .map(|r| {
            let value = r["value"][1]
                .as_str()
                .expect("value")
                .parse()
                .expect("number");
            (r["metric"].clone(), value)
        })
        .collect()
}

/// A range query: (labels, [(t, value)]) per series.
fn query_range(prom: &str, q: &str, start: f64, end: f64) -> Vec<(Value, Vec<(f64, f64)>)> {
    let path = format!(
        "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step=1",
        util::url_encode(q)
    );
    let (status, body) = get(prom, &path).expect("query Prometheus");
    assert_eq!(status, 200, "{q}: {body}");
    let v: Value = serde_json::from_str(&body).expect("Prometheus JSON");
    v["data"]["result"]
        .as_array()
        .expect("matrix result")
        .iter()
        .map(|r| {
            let points = r["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|p| {
                    (
                        p[0].as_f64().expect("t"),
                        p[1].as_str().expect("v").parse().expect("number"),
                    )
                })
                .collect();
            (r["metric"].clone(), points)
        })
        .collect()
}

fn now_unix() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// (CPU time of `pid`, busy CPU time of the machine), in clock ticks.
fn cpu_ticks(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("busy process stat");
    // Fields after the `(comm)`: state is field 3, utime 14, stime 15.
    let after = stat.rsplit_once(") ").expect("stat shape").1;
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let proc_ticks = f[11] + f[12];
    let (cpu, _) = util::proc_stat_cpu();
    // user nice system idle iowait irq softirq: busy is everything but idle and iowait.
    let busy = cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6];
    (proc_ticks, busy)
}

#[test]
fn prometheus_scrapes_the_agent() {
    if !util::require_root("prometheus_scrapes_the_agent") {
        return;
    }
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} missing: run `cargo xtask setup` (it installs Debian's prometheus)"
    );
    let _guard = util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut agent, agent_addr, agent_log) = start_agent(dir.path());

    let (_prometheus, prom) = util::prometheus(dir.path(), "agent", &agent_addr);

    let busy = Workload::spawn("while :; do :; done", Some(1));
    let short = Workload::spawn("while :; do :; done", Some(0));
    let short_pid = short.pid();
    let begin = now_unix();
    thread::sleep(Duration::from_secs(6));
    let before_kill = now_unix();
    drop(short);
    // Three 1 s windows of lingering, plus a window and a scrape of lag.
    thread::sleep(Duration::from_secs(5));
    let (p0, all0) = cpu_ticks(busy.pid());
    let t0 = now_unix();
    thread::sleep(Duration::from_secs(10));
    let (p1, all1) = cpu_ticks(busy.pid());
    let t1 = now_unix();
    // Let the window holding t1 close and be scraped.
    thread::sleep(Duration::from_secs(3));
    let end = now_unix();

    let up = query(&prom, "up", end);
    assert!(up.iter().all(|(_, v)| *v == 1.0), "scrape failing: {up:?}");
    let sources = query(&prom, "energy_bpf_source_info{estimated=\"true\"}", end);
    assert!(
        !sources.is_empty(),
        "modelled source not labelled estimated"
    );
    // The model's static power is its idle power: identified, for every source.
    let identified = query(&prom, "energy_bpf_static_identified", end);
    assert!(
        !identified.is_empty() && identified.iter().all(|(_, v)| *v == 1.0),
        "static power identified: {identified:?}"
    );

    // The busy process's share of active energy equals its share of busy CPU time.
    // Counters lag wall time by about a window; the machine is steady over the span, so
    // both sides are read at the same instants.
    let lag = 1.5;
    let proc_j = |t: f64| -> f64 {
        query(
            &prom,
            &format!(
                "sum(energy_bpf_process_joules_total{{pid=\"{}\"}})",
                busy.pid()
            ),
            t + lag,
        )
        .first()
        .map_or(0.0, |(_, v)| *v)
    };
    let node_j = |t: f64| -> f64 {
        query(
            &prom,
            "sum(energy_bpf_node_joules_total{mode=\"active\"})",
            t + lag,
        )
        .first()
        .map_or(0.0, |(_, v)| *v)
    };
    let energy_share = (proc_j(t1) - proc_j(t0)) / (node_j(t1) - node_j(t0));
    let cpu_share = (p1 - p0) as f64 / (all1 - all0) as f64;
    eprintln!("busy process: {energy_share:.3} of active energy, {cpu_share:.3} of busy CPU time");
    assert!(
        (energy_share - cpu_share).abs() <= 0.1 * cpu_share + 0.02,
        "busy process: {energy_share:.3} of active energy, {cpu_share:.3} of busy CPU time"
    );

    // Per zone, process series sum to the node's active series at every scrape.
    let sums = query_range(
        &prom,
        "sum by (zone) (energy_bpf_process_joules_total) / sum by (zone) (energy_bpf_node_joules_total{mode=\"active\"})",
        begin,
        end,
    );
    assert!(!sums.is_empty(), "no process or node series");
    for (labels, points) in &sums {
        for (t, ratio) in points {
            assert!(
                (ratio - 1.0).abs() <= 1e-3,
                "zone {labels}: processes / active = {ratio} at {t}"
            );
        }
    }

    // Counters never decrease, across the exit and the fold.
    for family in [
        "energy_bpf_node_joules_total",
        "energy_bpf_process_joules_total",
        "energy_bpf_container_joules_total",
    ] {
        let resets = query(&prom, &format!("sum(resets({family}[25s]))"), end);
        assert!(
            resets.iter().all(|(_, v)| *v == 0.0),
            "{family} went down: {resets:?}"
        );
    }
    let node = query_range(&prom, "energy_bpf_node_joules_total", end - 20.0, end);
    for (labels, points) in &node {
        assert!(
            points.windows(2).all(|w| w[1].1 >= w[0].1),
            "{labels} decreased: {points:?}"
        );
    }

    // The killed process had its own series, and then its energy moved to [exited].
    let short_j = query(
        &prom,
        &format!("sum(energy_bpf_process_joules_total{{pid=\"{short_pid}\"}})"),
        before_kill,
    );
    let short_j = short_j.first().map_or(0.0, |(_, v)| *v);
    assert!(short_j > 0.0, "the short-lived process had no series");
    let gone = query(
        &prom,
        &format!("energy_bpf_process_joules_total{{pid=\"{short_pid}\"}}"),
        end,
    );
    assert!(
        gone.is_empty(),
        "exited process still has its series: {gone:?}"
    );
    let exited = query(
        &prom,
        "sum(energy_bpf_process_joules_total{comm=\"[exited]\"})",
        end,
    );
    assert!(
        exited.first().is_some_and(|(_, v)| *v >= short_j),
        "[exited] {exited:?} holds less than the exited process had ({short_j} J)"
    );

    // SIGTERM: finish the window, flush, exit 0.
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let status = agent.0.wait().expect("wait agent");
    let log: Vec<String> = agent_log.try_iter().collect();
    assert!(status.success(), "agent exited with {status}: {log:?}");
    assert!(
        log.iter().any(|l| l.contains("last window closed")),
        "no final window: {log:?}"
    );
}

/// The `energy-bpf` group's id, creating the group when this machine lacks it (what the
/// package's set-up does; the socket is group-readable only when the group exists).
fn energy_bpf_gid() -> u32 {
    let gid = || {
        let out = Command::new("getent")
            .args(["group", "energy-bpf"])
            .output()
            .expect("getent");
        String::from_utf8_lossy(&out.stdout)
            .split(':')
            .nth(2)
            .and_then(|g| g.trim().parse().ok())
    };
    if let Some(g) = gid() {
        return g;
    }
    let status = Command::new("groupadd")
        .args(["--system", "energy-bpf"])
        .status()
        .expect("groupadd");
    assert!(status.success(), "groupadd energy-bpf failed");
    gid().expect("the group exists now")
}

#[test]
fn top_without_root_reads_the_agent_socket_with_the_group_and_is_refused_without() {
    use std::os::unix::fs::PermissionsExt as _;
    if !util::require_root(
        "top_without_root_reads_the_agent_socket_with_the_group_and_is_refused_without",
    ) {
        return;
    }
    let _guard = util::exclusive();
    let gid = energy_bpf_gid();
    let dir = tempfile::tempdir().expect("tempdir");
    // The unprivileged user must be able to reach the socket's directory.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let busy = Workload::spawn("while :; do :; done", Some(0));
    let (_agent, _addr, _logs) = start_agent(dir.path());
    let socket = dir.path().join("agent.sock");
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o660, "group-readable socket");
    let top = |groups: &str| {
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup"])
            .arg(groups)
            .arg(util::bin())
            .args(["top", "--batch", "-n", "2", "--connect"])
            .arg(&socket)
            .output()
            .expect("setpriv")
    };
    let ok = top(&format!("--groups={gid}"));
    let text = util::text(&ok);
    assert!(ok.status.success(), "{text}");
    let pid = busy.pid().to_string();
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("energy-bpf top - source"))
            .count(),
        2,
        "two frames over the socket:\n{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().next() == Some(pid.as_str())),
        "the busy process {pid} is shown:\n{text}"
    );
    let denied = top("--clear-groups");
    let text = util::text(&denied);
    assert!(!denied.status.success());
    assert!(
        text.contains("permission denied") && text.contains("energy-bpf"),
        "a clear line without the group:\n{text}"
    );
}

/// `agent --record-dir`: the recorder writes rotating files that `report` reads, and a
/// SIGTERM closes the last one with a trailer (it does not read as cut short).
#[test]
fn agent_record_dir_writes_recordings_that_report_reads_whole() {
    if !util::require_root("agent_record_dir_writes_recordings_that_report_reads_whole") {
        return;
    }
    let _serial = util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = dir.path().join("recordings");
    let recs_arg = recs.to_str().expect("path");
    let busy = Workload::spawn("while :; do :; done", None);
    util::wait_running(busy.pid(), 50_000_000);
    let (mut agent, _addr, _log) = spawn_agent(dir.path(), &["--record-dir", recs_arg]);
    let sized = |min: u64| {
        std::fs::read_dir(&recs)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum::<u64>()
            })
            .unwrap_or(0)
            >= min
    };
    assert!(
        util::until(Duration::from_secs(60), || sized(64 << 10)),
        "the agent wrote under 64 KiB of recordings in 60 s"
    );
    // SAFETY: kill(2) with a valid pid and signal has no memory effects.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let status = agent.0.wait().expect("wait for the agent");
    assert!(status.success(), "agent exited with {status}");
    let files: Vec<_> = std::fs::read_dir(&recs)
        .expect("recordings")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(!files.is_empty(), "no recording in {}", recs.display());
    for file in &files {
        let json = util::report_json(file);
        assert_eq!(
            json["truncated"],
            Value::Bool(false),
            "{} reads as cut short",
            file.display()
        );
    }
    let all = util::report_json(&recs);
    assert!(
        util::process(&all, busy.pid()).is_some(),
        "the busy process is not in the report of {}",
        recs.display()
    );
}

/// The value of the unlabelled series `name` in the agent's exposition.
fn gauge(addr: &str, name: &str) -> Option<f64> {
    let (status, body) = get(addr, "/metrics").ok()?;
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes `name` until `done` holds for it, for at most `within`; the last value.
fn gauge_until(addr: &str, name: &str, within: Duration, done: impl Fn(f64) -> bool) -> f64 {
    let deadline = std::time::Instant::now() + within;
    loop {
        let value = gauge(addr, name);
        if let Some(v) = value.filter(|&v| done(v)) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} = {value:?} after {within:?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_agent_drains_once_a_second_and_sooner_while_a_ring_fills_fast() {
    if !util::require_root("the_agent_drains_once_a_second_and_sooner_while_a_ring_fills_fast") {
        return;
    }
    let _guard = util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    // At 999 Hz the stack-sample ring (16 MiB, each sample about 3.1 KiB) takes a third
    // of its size a second from two busy CPUs: over the quarter a poll may let fill.
    let (mut agent, addr, _log) = start_agent_with(dir.path(), &["-F", "999"]);
    let poll = "energy_bpf_poll_interval_seconds";
    // Quiet: once a second (the windows are a second long).
    let quiet = gauge_until(&addr, poll, Duration::from_secs(30), |v| v == 1.0);
    let lost =
        |addr: &str| gauge(addr, "energy_bpf_dropped_events_total{kind=\"sample\"}").unwrap_or(0.0);
    let lost_before = lost(&addr);
    let busy: Vec<Workload> = (0..2)
        .map(|cpu| Workload::spawn("while :; do :; done", Some(cpu)))
        .collect();
    let fast = gauge_until(&addr, poll, Duration::from_secs(30), |v| v < 1.0);
    thread::sleep(Duration::from_secs(3));
    let lost_busy = lost(&addr) - lost_before;
    drop(busy);
    let calm = gauge_until(&addr, poll, Duration::from_secs(30), |v| v == 1.0);
    eprintln!("poll interval: quiet {quiet} s, busy at 999 Hz {fast} s, quiet again {calm} s");
    // A poll divides the 1 s window evenly; the ring's rate asks for about 0.7 s, so two.
    assert!(fast <= 0.5 + 1e-9, "busy at 999 Hz: polls {fast} s apart");
    assert_eq!(lost_busy, 0.0, "samples lost while busy");
    // SAFETY: kill(2) on our own child's pid; no memory is passed.
    assert_eq!(unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) }, 0);
    let status = agent.0.wait().expect("wait for the agent");
    assert!(status.success(), "agent exit: {status}");
}
