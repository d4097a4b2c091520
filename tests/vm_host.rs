//! Virtual machines seen from the host, through the real agent and probes on the emulated
//! RAPL package (`util::two_cpu_package`, `util::BusyEmulator`). The VMs are fakes made of
//! real processes: `tests/workloads/fake_vm.c` run as `qemu-system-x86_64` or
//! `firecracker` with the hypervisor's flags, one thread per vCPU named as the hypervisor
//! names it, burning CPU.
//! - each VM gets its directory in `--vm-share` with the contract's files and modes;
//! - the VM's energy + every other process + idle = the package (0.5%), its vCPU and
//!   emulator threads apart, in the ratio of their measured CPU time;
//! - the agent killed and restarted: counters go on, never back, and the gap is flagged;
//! - a VM killed: its directory goes within one interval; a new VM of the same name
//!   starts clean.

use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::util::{self, BusyEmulator, Daemon, get, spawn_agent};

/// The agent's window, s.
const INTERVAL_S: f64 = 1.0;
/// The emulated package's static power, W (given to the agent as `--static-power-w 3`).
const STATIC_W: f64 = 3.0;

/// A fake VM process, killed on drop.
struct FakeVm(Child);

impl FakeVm {
    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for FakeVm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `fake_vm.c` built as `dir/qemu-system-x86_64` and `dir/firecracker`.
fn fake_hypervisors(dir: &Path) -> (PathBuf, PathBuf) {
    let qemu = util::gcc(
        &util::workload("fake_vm.c"),
        &dir.join("qemu-system-x86_64"),
        &["-O1", "-pthread"],
    );
    let fc = dir.join("firecracker");
    std::fs::copy(&qemu, &fc).expect("copy the fake hypervisor");
    (qemu, fc)
}

fn start_vm(program: &Path, args: &[&str], vcpu_pct: u32) -> FakeVm {
    let child = Command::new(program)
        .args(args)
        .env("FAKE_VM_VCPU_PCT", vcpu_pct.to_string())
        .env("FAKE_VM_IO_PCT", "5")
        .spawn()
        .expect("start the fake VM");
    let vm = FakeVm(child);
    util::wait_running(vm.pid(), 10_000_000);
    vm
}

/// The VM's metadata, once it has been written.
fn meta(share: &Path, name: &str) -> Option<Value> {
    let text = std::fs::read_to_string(share.join(name).join("energy-bpf.json")).ok()?;
    serde_json::from_str(&text).ok()
}

fn seq(m: &Value) -> u64 {
    m["seq"].as_u64().expect("seq")
}

/// Waits until the VM's metadata has `seq` ≥ `at_least` (cap 60 s).
fn wait_seq(share: &Path, name: &str, at_least: u64) -> Value {
    let mut last = None;
    let ok = util::until(Duration::from_secs(60), || {
        last = meta(share, name);
        last.as_ref().is_some_and(|m| seq(m) >= at_least)
    });
    assert!(
        ok,
        "{name}: no metadata with seq ≥ {at_least} within 60 s (last: {last:?})"
    );
    last.expect("metadata")
}

fn package_uj(share: &Path, name: &str) -> u64 {
    std::fs::read_to_string(share.join(name).join("intel-rapl:0/energy_uj"))
        .expect("energy_uj")
        .trim()
        .parse()
        .expect("a number")
}

/// `/metrics` as (name, labels) -> value.
fn scrape(addr: &str) -> BTreeMap<(String, BTreeMap<String, String>), f64> {
    let (_, body) = get(addr, "/metrics").expect("scrape");
    let mut out = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels: BTreeMap<String, String> = labels
            .split("\",")
            .filter_map(|kv| {
                let (k, v) = kv.split_once("=\"")?;
                Some((k.to_owned(), v.trim_end_matches('"').to_owned()))
            })
            .collect();
        if let Ok(v) = value.parse() {
            out.insert((name.to_owned(), labels), v);
        }
    }
    out
}

/// Sum of the series of `name` whose labels include every pair of `with`.
fn sum(
    m: &BTreeMap<(String, BTreeMap<String, String>), f64>,
    name: &str,
    with: &[(&str, &str)],
) -> f64 {
    m.iter()
        .filter(|((n, l), _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .sum()
}

/// On-CPU ns of each thread of `pid` by name (`/proc/PID/task/TID/schedstat`).
fn thread_cpu(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("tasks")
        .flatten()
    {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(e.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        *out.entry(comm.trim_end().to_owned()).or_default() += ns;
    }
    out
}

fn agent_flags(sysfs: &Path, share: &Path) -> Vec<String> {
    [
        "--energy-source",
        "powercap",
        "--sysfs-root",
        sysfs.to_str().expect("utf-8 path"),
        "--vm-share",
        share.to_str().expect("utf-8 path"),
        "--vm-static",
        "vcpus",
        // The emulator's static power, given: with VMs always busy the agent could not
        // identify it, and the static share would be of nothing.
        "--static-power-w",
        "3",
    ]
    .map(String::from)
    .to_vec()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn each_vm_gets_its_directory_and_its_energy_conserves_the_package() {
    if !util::require_root("each_vm_gets_its_directory_and_its_energy_conserves_the_package") {
        return;
    }
    let _guard = util::exclusive();
    let fake = util::two_cpu_package();
    let _emulator = BusyEmulator::start(&fake.energy_uj, STATIC_W, 10.0);
    let (qemu, fc) = fake_hypervisors(fake.dir.path());
    let share = fake.dir.path().join("vms");
    let vm1 = start_vm(
        &qemu,
        &[
            "-name",
            "guest=web-1,debug-threads=on",
            "-smp",
            "1",
            "-m",
            "512",
        ],
        40,
    );
    let vm2 = start_vm(&fc, &["--id", "fc-2", "--vcpus", "1"], 20);
    let flags = agent_flags(&fake.sysfs, &share);
    let (_agent, addr, _log) = spawn_agent(fake.dir.path(), &strs(&flags));
    let m1 = wait_seq(&share, "web-1", 2);
    let cpu_before = thread_cpu(vm1.pid());
    let start_meta = m1.clone();
    let m1 = wait_seq(&share, "web-1", seq(&start_meta) + 6);
    let cpu_after = thread_cpu(vm1.pid());

    // The contract's files and modes.
    let root = std::fs::metadata(&share).expect("share");
    assert_eq!(root.mode() & 0o777, 0o755, "the share's root");
    for name in ["web-1", "fc-2"] {
        let dir = share.join(name);
        let mode = |p: &Path| std::fs::metadata(p).expect("exists").mode() & 0o777;
        assert_eq!(mode(&dir), 0o750, "{name}/");
        let pkg = dir.join("intel-rapl:0");
        assert_eq!(
            std::fs::read_to_string(pkg.join("name"))
                .expect("name")
                .trim(),
            "package-0"
        );
        let max: u64 = std::fs::read_to_string(pkg.join("max_energy_range_uj"))
            .expect("max_energy_range_uj")
            .trim()
            .parse()
            .expect("number");
        assert!(max >= 1 << 62, "max_energy_range_uj {max}");
        for f in ["name", "energy_uj", "max_energy_range_uj"] {
            assert_eq!(mode(&pkg.join(f)), 0o640, "{name}/intel-rapl:0/{f}");
        }
        assert_eq!(mode(&dir.join("energy-bpf.json")), 0o640);
        assert!(
            !pkg.join("intel-rapl:0:1").exists(),
            "the host has no dram zone, so neither has the VM"
        );
    }
    assert_eq!(m1["format"], 1);
    assert_eq!(m1["vm"], "web-1");
    assert_eq!(
        m1["instance"].as_str().expect("instance").split(':').next(),
        Some(vm1.pid().to_string().as_str())
    );
    assert_eq!(m1["vcpus"], 1, "from -smp");
    assert_eq!(m1["static_policy"], "vcpus");
    assert_eq!(m1["measured"], true);
    assert_eq!(m1["host_source"], "powercap");
    assert_eq!(m1["interval_ms"], 1000);
    assert_eq!(m1["gaps"], 0);
    let m2 = meta(&share, "fc-2").expect("fc-2 metadata");
    assert_eq!(m2["hypervisor"], "firecracker");
    assert_eq!(m2["vcpus"], 1, "counted from its fc_vcpu threads");
    let pkg = &m1["zones"]["package"];
    let (energy, stat) = (
        pkg["energy_uj"].as_u64().expect("energy_uj"),
        pkg["static_uj"].as_u64().expect("static_uj"),
    );
    assert!(
        package_uj(&share, "web-1") >= energy,
        "the file is as new as the metadata or newer"
    );
    assert!(
        stat > 0 && stat < energy,
        "static {stat} inside energy {energy}"
    );

    // vCPU and emulator threads apart, in the ratio of the CPU time they had.
    let threads = &m1["threads"];
    let d_vcpu = threads["vcpu_uj"].as_f64().expect("vcpu")
        - start_meta["threads"]["vcpu_uj"].as_f64().expect("vcpu");
    let d_emu = threads["emulator_uj"].as_f64().expect("emulator")
        - start_meta["threads"]["emulator_uj"]
            .as_f64()
            .expect("emulator");
    let ns = |m: &BTreeMap<String, u64>, vcpu: bool| -> f64 {
        m.iter()
            .filter(|(name, _)| name.starts_with("CPU ") == vcpu)
            .map(|(_, ns)| *ns as f64)
            .sum()
    };
    let cpu_vcpu = ns(&cpu_after, true) - ns(&cpu_before, true);
    let cpu_emu = ns(&cpu_after, false) - ns(&cpu_before, false);
    assert_eq!(
        threads["unsplit_uj"], 0,
        "named threads leave nothing unsplit"
    );
    assert!(
        d_vcpu > 0.0 && d_emu > 0.0,
        "vcpu {d_vcpu} µJ, emulator {d_emu} µJ"
    );
    let (got, want) = (d_vcpu / d_emu, cpu_vcpu / cpu_emu);
    assert!(
        (got / want - 1.0).abs() < 0.25,
        "vCPU:emulator energy {got:.2} against their CPU time {want:.2}"
    );

    // Conservation at a scrape: the VM's dynamic energy is its process's, and with every
    // other process and idle it makes the package. The VM sink runs after the metrics
    // sink, so a scrape may fall between them: scrape until one holds, with a cap.
    let mut last = String::new();
    let held = util::until(Duration::from_secs(20), || {
        let m = scrape(&addr);
        let package: f64 = sum(&m, "energy_bpf_node_joules_total", &[("zone", "package")]);
        let idle = sum(
            &m,
            "energy_bpf_node_joules_total",
            &[("zone", "package"), ("mode", "idle")],
        );
        let processes = sum(
            &m,
            "energy_bpf_process_joules_total",
            &[("zone", "package")],
        );
        let pid = vm1.pid().to_string();
        let vm_process = sum(
            &m,
            "energy_bpf_process_joules_total",
            &[("zone", "package"), ("pid", &pid)],
        );
        let vm_dynamic = sum(
            &m,
            "energy_bpf_vm_joules_total",
            &[("vm", "web-1"), ("zone", "package"), ("part", "dynamic")],
        );
        let vm_static = sum(
            &m,
            "energy_bpf_vm_joules_total",
            &[("vm", "web-1"), ("zone", "package"), ("part", "static")],
        );
        let others = processes - vm_process;
        last = format!(
            "package {package:.3} J: VM dynamic {vm_dynamic:.3} (its process {vm_process:.3}) + others {others:.3} + idle {idle:.3}; VM static {vm_static:.3}"
        );
        package > 0.0
            && vm_dynamic > 0.0
            && ((vm_dynamic + others + idle) - package).abs() <= 0.005 * package
            && (vm_dynamic - vm_process).abs() <= 0.005 * package
            && vm_static > 0.0
            && vm_static <= idle
    });
    assert!(
        held,
        "no scrape conserved the package within 0.5% in 20 s: {last}"
    );
    drop(vm2);
}

#[test]
fn vm_counters_survive_an_agent_restart_and_a_vm_that_exits_loses_its_directory() {
    if !util::require_root(
        "vm_counters_survive_an_agent_restart_and_a_vm_that_exits_loses_its_directory",
    ) {
        return;
    }
    let _guard = util::exclusive();
    let fake = util::two_cpu_package();
    let _emulator = BusyEmulator::start(&fake.energy_uj, STATIC_W, 10.0);
    let (qemu, _) = fake_hypervisors(fake.dir.path());
    let share = fake.dir.path().join("vms");
    let args = ["-name", "guest=db,debug-threads=on", "-smp", "2"];
    let mut vm = start_vm(&qemu, &args, 30);
    let flags = agent_flags(&fake.sysfs, &share);
    let agent: Daemon = spawn_agent(fake.dir.path(), &strs(&flags)).0;
    let before = wait_seq(&share, "db", 3);

    // Killed without a chance to flush; down for a while; restarted.
    drop(agent);
    let down = Instant::now();
    let left = package_uj(&share, "db");
    std::thread::sleep(Duration::from_millis(1500));
    let (_agent, _addr, _log) = spawn_agent(fake.dir.path(), &strs(&flags));
    let mut readings = vec![left];
    let after = {
        let mut last = None;
        let ok = util::until(Duration::from_secs(60), || {
            if let Ok(text) = std::fs::read_to_string(share.join("db/intel-rapl:0/energy_uj")) {
                readings.push(text.trim().parse().expect("a number"));
            }
            last = meta(&share, "db");
            last.as_ref().is_some_and(|m| seq(m) >= seq(&before) + 3)
        });
        assert!(ok, "the restarted agent did not go on writing: {last:?}");
        last.expect("metadata")
    };
    let down_ms = down.elapsed().as_millis() as u64;
    assert!(
        readings.windows(2).all(|w| w[1] >= w[0]),
        "energy_uj went back across the restart: {readings:?}"
    );
    assert_eq!(after["instance"], before["instance"]);
    assert_eq!(after["gaps"], before["gaps"].as_u64().expect("gaps") + 1);
    let gap = &after["last_gap"];
    assert_eq!(gap["reason"], "host agent restarted");
    let missing = gap["missing_ms"].as_u64().expect("missing_ms");
    assert!(
        (1000..=down_ms + 2000).contains(&missing),
        "missing {missing} ms for a stop of at least 1500 ms (≤ {down_ms} ms until checked)"
    );
    assert!(gap["seq"].as_u64().expect("seq") > seq(&before));
    let energy = |m: &Value| m["zones"]["package"]["energy_uj"].as_u64().expect("energy");
    assert!(energy(&after) > energy(&before));

    // The VM exits: its directory goes within one interval.
    let old_instance = after["instance"].clone();
    let old_energy = energy(&after);
    vm.kill();
    let killed = Instant::now();
    assert!(
        util::until(Duration::from_secs(10), || !share.join("db").exists()),
        "the directory of an exited VM is still there after 10 s"
    );
    let took = killed.elapsed();
    assert!(
        took.as_secs_f64() <= INTERVAL_S + 0.5,
        "the directory went {took:?} after the VM exited (interval {INTERVAL_S} s)"
    );

    // A new VM of the same name starts clean.
    let _vm = start_vm(&qemu, &args, 30);
    let fresh = wait_seq(&share, "db", 1);
    assert_ne!(fresh["instance"], old_instance);
    assert_eq!(fresh["gaps"], 0);
    assert!(fresh.get("last_gap").is_none_or(Value::is_null));
    assert!(seq(&fresh) < seq(&after));
    assert!(energy(&fresh) < old_energy);
}

#[test]
fn report_by_vm_lists_vcpu_and_emulator_threads_apart_and_sums_to_the_processes() {
    if !util::require_root(
        "report_by_vm_lists_vcpu_and_emulator_threads_apart_and_sums_to_the_processes",
    ) {
        return;
    }
    let _guard = util::exclusive();
    let fake = util::two_cpu_package();
    let _emulator = BusyEmulator::start(&fake.energy_uj, STATIC_W, 10.0);
    let (qemu, _) = fake_hypervisors(fake.dir.path());
    // One VM with named threads, one without (qemu's default): its split is lost.
    let named = start_vm(
        &qemu,
        &["-name", "guest=app,debug-threads=on", "-smp", "1"],
        50,
    );
    let unnamed = start_vm(&qemu, &["-name", "plain", "-smp", "2"], 20);
    let file = fake.dir.path().join("vms.ebpr");
    let rec = util::Recorder::start(&[
        "-o",
        file.to_str().expect("utf-8 path"),
        "--energy-source",
        "powercap",
        "--sysfs-root",
        fake.sysfs.to_str().expect("utf-8 path"),
    ]);
    // Until the named VM's vCPU has had a second of CPU while recorded.
    let vcpu_ns = || {
        thread_cpu(named.pid())
            .iter()
            .filter(|(n, _)| n.starts_with("CPU "))
            .map(|(_, ns)| *ns)
            .sum::<u64>()
    };
    let at_start = vcpu_ns();
    assert!(
        util::until(Duration::from_secs(60), || vcpu_ns()
            >= at_start + 1_000_000_000),
        "the fake VM's vCPU thread got under 1 s of CPU in 60 s"
    );
    rec.stop();

    let out = util::run(&[
        "report",
        "--by",
        "vm",
        "--format",
        "csv",
        file.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "report --by vm: {}", util::text(&out));
    let csv = String::from_utf8_lossy(&out.stdout).into_owned();
    let header: Vec<&str> = csv.lines().next().expect("header").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .unwrap_or_else(|| panic!("no {name} column: {header:?}"))
    };
    let (vm_col, j_col) = (col("vm"), col("package_j"));
    let rows: BTreeMap<String, f64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|c| c.len() > j_col)
        .map(|c| (c[vm_col].to_owned(), c[j_col].parse().unwrap_or(0.0)))
        .collect();
    for row in ["app vcpu", "app emulator", "plain unsplit", "[host]"] {
        assert!(
            rows.get(row).is_some_and(|j| *j > 0.0),
            "no energy in row {row}: {rows:?}"
        );
    }
    assert!(
        !rows.contains_key("plain vcpu"),
        "an unnamed VM cannot be split: {rows:?}"
    );

    // The VM rows are the processes' energy, thread by thread.
    let json = util::report_json(&file);
    let process_j = |pid: u32| {
        util::process(&json, pid).expect("the VM process in the report")["energy_j"]["package"]
            .as_f64()
            .expect("package J")
    };
    let by_vm = util::report_json_with(&file, &["--by", "vm"]);
    let vms = by_vm["vms"].as_array().expect("vms[]");
    let app = vms
        .iter()
        .find(|v| v["name"] == "app")
        .expect("app in vms[]");
    let dynamic = app["dynamic_j"]["package"].as_f64().expect("dynamic");
    let parts = app["vcpu_j"]["package"].as_f64().expect("vcpu")
        + app["emulator_j"]["package"].as_f64().expect("emulator");
    assert!(
        (dynamic - process_j(named.pid())).abs() <= 1e-6 * dynamic.max(1.0),
        "{dynamic} vs its process"
    );
    assert!(
        (dynamic - parts).abs() <= 1e-6 * dynamic.max(1.0),
        "vcpu + emulator {parts} vs {dynamic}"
    );
    let sum_rows: f64 = rows.values().sum();
    let app_rows = rows["app vcpu"] + rows["app emulator"];
    assert!(
        (app_rows - dynamic).abs() <= 0.01 * dynamic + 0.002,
        "table {app_rows} vs JSON {dynamic}"
    );
    assert!(sum_rows > app_rows, "{rows:?}");
    let plain = vms
        .iter()
        .find(|v| v["name"] == "plain")
        .expect("plain in vms[]");
    assert_eq!(
        plain["vcpus"], 2,
        "from -smp, though its threads are unnamed"
    );
    assert_eq!(plain["threads_named"], false);
    drop(unnamed);
}
