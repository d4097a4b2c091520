//! Helpers shared by the integration tests.
#![allow(dead_code, reason = "not every module uses every helper")]

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

/// The `energy-bpf` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_energy-bpf"))
}

/// Whether we can load eBPF (root). Tests that need it fail loudly when not root, since
/// the suite is meant to run as root; set ENERGY_BPF_SKIP_PRIVILEGED=1 to skip them with a
/// printed reason instead (e.g. on a laptop without sudo).
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    if std::env::var_os("ENERGY_BPF_SKIP_PRIVILEGED").is_some() {
        eprintln!("SKIPPED {test}: needs root to load eBPF (ENERGY_BPF_SKIP_PRIVILEGED set)");
        return false;
    }
    panic!(
        "{test} needs root to load eBPF probes; run the suite as root (CI does) or set ENERGY_BPF_SKIP_PRIVILEGED=1"
    );
}

/// Serialises tests that load probes or burn CPU, so one test's load never skews another's
/// timeline on our 2-CPU machines. Hold the guard for the whole test.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `energy-bpf ARGS` to completion.
pub fn run(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("run energy-bpf")
}

/// stdout+stderr of an output, for messages.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A background shell workload, killed on drop.
pub struct Workload(pub Child);

impl Workload {
    /// `sh -c SCRIPT`, optionally pinned to a CPU with taskset.
    pub fn spawn(script: &str, cpu: Option<u32>) -> Self {
        let mut cmd = match cpu {
            Some(c) => {
                let mut cmd = Command::new("taskset");
                cmd.args(["-c", &c.to_string(), "sh", "-c", script]);
                cmd
            }
            None => {
                let mut cmd = Command::new("sh");
                cmd.args(["-c", script]);
                cmd
            }
        };
        Self(cmd.stdout(Stdio::null()).spawn().expect("spawn workload"))
    }

    /// Process id (taskset execs sh, so this is the shell).
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Parses `report --format json`.
pub fn report_json(file: &Path) -> serde_json::Value {
    report_json_with(file, &[])
}

/// `report --format json ARGS FILE`, parsed.
pub fn report_json_with(file: &Path, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["report", "--format", "json"];
    all.extend_from_slice(args);
    all.push(file.to_str().expect("utf-8 path"));
    let out = run(&all);
    assert!(
        out.status.success(),
        "report {args:?} failed: {}",
        text(&out)
    );
    serde_json::from_slice(&out.stdout).expect("report JSON parses")
}

/// The process entry with this pid in a report.
pub fn process(report: &serde_json::Value, pid: u32) -> Option<&serde_json::Value> {
    report["processes"]
        .as_array()?
        .iter()
        .find(|p| p["pid"] == pid)
}

/// `energy-bpf record` running in the background; returns once it says it is recording.
pub struct Recorder {
    child: Child,
    stderr: std::sync::mpsc::Receiver<String>,
}

impl Recorder {
    /// Starts `energy-bpf record ARGS` and waits (up to 30 s) until capture is attached.
    pub fn start(args: &[&str]) -> Self {
        use std::io::BufRead as _;
        let mut child = Command::new(bin())
            .arg("record")
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn energy-bpf record");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut seen = String::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("Ctrl-C to stop") => break,
                Ok(line) => seen.push_str(&line),
                Err(_) => panic!("record did not start within 30 s: {seen}"),
            }
        }
        Self { child, stderr: rx }
    }

    /// Stops it with SIGINT like Ctrl-C; returns its remaining stderr. Panics if it failed.
    pub fn stop(mut self) -> String {
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let status = self.child.wait().expect("wait record");
        let rest: String = self.stderr.try_iter().collect::<Vec<_>>().join("\n");
        assert!(status.success(), "record failed ({status}): {rest}");
        rest
    }
}

/// A fake powercap tree under `dir/sys` with one package zone, `intel-rapl:0`: the sysfs
/// root to pass as `--sysfs-root`, and the tree.
pub fn one_package(dir: &Path) -> (PathBuf, energy_bpf::energy::fake::FakePowercap) {
    use energy_bpf::energy::fake::{FakePowercap, ZoneSpec};
    let sysfs = dir.join("sys");
    let tree = FakePowercap::create(
        &sysfs,
        &[ZoneSpec::new("intel-rapl:0", "package-0", 262_143_328_850)],
    )
    .expect("fake powercap");
    (sysfs, tree)
}

/// The fake machine of the end-to-end energy tests: under a fresh temporary folder, a
/// powercap tree with one package zone (`intel-rapl:0`) and a topology of one package of two
/// CPUs (0 and 1), whose `energy_uj` an emulator in the test writes.
pub struct FakePackage {
    /// The temporary folder, removed on drop; other files of the test may go here too.
    pub dir: tempfile::TempDir,
    /// The sysfs root to pass as `--sysfs-root`.
    pub sysfs: PathBuf,
    /// The package counter's `energy_uj`.
    pub energy_uj: PathBuf,
    /// The powercap tree (its own emulator: [`FakePowercap::spawn`]).
    ///
    /// [`FakePowercap::spawn`]: energy_bpf::energy::fake::FakePowercap::spawn
    pub tree: energy_bpf::energy::fake::FakePowercap,
}

/// Builds a [`FakePackage`] whose two CPUs are cores of their own.
pub fn two_cpu_package() -> FakePackage {
    let fake = package_without_topology();
    energy_bpf::energy::fake::topology(&fake.sysfs, 1, 2).expect("fake topology");
    fake
}

/// Builds a [`FakePackage`] whose two CPUs are SMT siblings of one core (core 0).
pub fn smt_pair_package() -> FakePackage {
    let fake = package_without_topology();
    let cpu_dir = fake.sysfs.join("devices/system/cpu");
    std::fs::create_dir_all(&cpu_dir).expect("cpu dir");
    std::fs::write(cpu_dir.join("online"), "0-1\n").expect("online");
    for id in 0..2 {
        let topo = cpu_dir.join(format!("cpu{id}/topology"));
        std::fs::create_dir_all(&topo).expect("topology dir");
        std::fs::write(topo.join("physical_package_id"), "0\n").expect("package");
        std::fs::write(topo.join("core_id"), "0\n").expect("core");
    }
    fake
}

fn package_without_topology() -> FakePackage {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sysfs, tree) = one_package(dir.path());
    let energy_uj = tree.zone_dir("intel-rapl:0").join("energy_uj");
    FakePackage {
        dir,
        sysfs,
        energy_uj,
        tree,
    }
}

/// CLOCK_MONOTONIC of the first and the last energy reading of a recording: the span whose
/// measured energy the report splits (an emulator's truth is what it put in over it).
pub fn reading_span(file: &Path) -> (u64, u64) {
    let rec = energy_bpf::record::read_file(file).expect("recording reads back");
    let ts = rec.readings.iter().map(|r| r.ts_ns);
    (
        ts.clone().min().expect("readings"),
        ts.max().expect("readings"),
    )
}

/// An emulated RAPL package counter driven by the machine's real busy CPU time:
/// `static_w` W plus `per_cpu_w` W per busy CPU, busy being elapsed time × CPUs minus the
/// idle time of `/proc/stat` ([`machine_idle_ns`]), written into `energy_uj` every 10 ms (the file's
/// resolution; at 2 ms the writer's own wake-ups showed up as ~0.1 busy CPU that the
/// timeline, rightly, does not see). Every process, the tests' own and whatever
/// else runs here, draws the same watts per CPU-second: that is the model the time split
/// assumes, so a process's truth is `per_cpu_w` × its CPU time. Stops on drop.
pub struct BusyEmulator {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The machine's `cpu` line of `/proc/stat` (user nice system idle iowait irq softirq ...,
/// in clock ticks) and the number of CPUs it sums.
pub fn proc_stat_cpu() -> (Vec<u64>, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let mut lines = stat.lines();
    let ticks = lines
        .next()
        .expect("cpu line")
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let cpus = lines.take_while(|l| l.starts_with("cpu")).count().max(1) as u64;
    (ticks, cpus)
}

/// Idle CPU time of the machine so far (idle + iowait of every CPU), ns, and the number
/// of CPUs. Unlike user and system time, which the tick samples, idle time is measured at
/// each idle entry and exit on tickless kernels, so busy = elapsed × CPUs − idle is exact
/// to the 10 ms the file prints.
pub fn machine_idle_ns() -> (u64, u64) {
    let (ticks, cpus) = proc_stat_cpu();
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .unwrap_or(100)
        .max(1);
    // user nice system idle iowait ...
    ((ticks[3] + ticks[4]) * 1_000_000_000 / hz, cpus)
}

impl BusyEmulator {
    /// Starts writing `energy_uj`.
    pub fn start(energy_uj: &Path, static_w: f64, per_cpu_w: f64) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let out = std::fs::OpenOptions::new()
            .write(true)
            .open(energy_uj)
            .expect("energy_uj");
        let thread = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                use std::os::unix::fs::FileExt as _;
                let t0 = std::time::Instant::now();
                let (idle0, cpus) = machine_idle_ns();
                while !stop.load(Ordering::Relaxed) {
                    let dt_ns = t0.elapsed().as_nanos() as f64;
                    let idle = machine_idle_ns().0.saturating_sub(idle0) as f64;
                    let busy = (dt_ns * cpus as f64 - idle).max(0.0);
                    // W × ns = nJ; /1000 = µJ, in whole µJ like the real counter. Rewritten
                    // in place with a fixed width, so every read sees a whole number.
                    let uj = (static_w * dt_ns + per_cpu_w * busy) / 1000.0;
                    out.write_all_at(format!("{:020}\n", uj as u64).as_bytes(), 0)
                        .expect("write energy_uj");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            })
        };
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for BusyEmulator {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Compiles the C file `src` with gcc and `flags` into `out`, and returns `out`.
pub fn gcc(src: &Path, out: &Path, flags: &[&str]) -> PathBuf {
    let status = std::process::Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .status()
        .expect("run gcc: install it (apt-get install -y gcc)");
    assert!(status.success(), "gcc failed to build {}", src.display());
    out.to_path_buf()
}

/// Polls `done` every 50 ms until it holds or `cap` has passed; whether it held. For a
/// test that needs a workload to have produced enough (events, bytes, readings): run it
/// until it has, with a cap, instead of assuming how much a fixed time produces.
pub fn until(cap: std::time::Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() >= cap {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Waits until process `pid` has been on a CPU for `ns` (its main thread, from
/// `/proc/PID/schedstat`): a workload spawned in the background is running, however long
/// this machine takes to start it. Panics after 30 s, naming the process.
pub fn wait_running(pid: u32, ns: u64) {
    let on_cpu = || on_cpu_ns(pid);
    assert!(
        until(std::time::Duration::from_secs(30), || on_cpu() >= ns),
        "workload {pid} ran only {} ns of CPU in 30 s (wanted {ns} ns before measuring)",
        on_cpu()
    );
}

/// Nanoseconds process `pid`'s main thread has been on a CPU (`/proc/PID/schedstat`), 0
/// once it is gone.
pub fn on_cpu_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
}

/// The CPU `cargo xtask test --slow-machine` keeps busy with a spinner, if any.
pub fn busy_cpu() -> Option<u32> {
    std::env::var("ENERGY_BPF_TEST_BUSY_CPU").ok()?.parse().ok()
}

/// Skips a test under `--slow-machine` that cannot hold with a CPU taken, printing why;
/// true when it should run.
pub fn unless_cpu_taken(test: &str, why: &str) -> bool {
    match busy_cpu() {
        Some(cpu) => {
            eprintln!("SKIPPED {test}: CPU {cpu} is kept busy (--slow-machine): {why}");
            false
        }
        None => true,
    }
}

/// A file of `tests/workloads/`.
pub fn workload(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/workloads")
        .join(name)
}

/// The seconds of a workload's `time_s HEAVY LIGHT` line (the thread CPU time it measured
/// in each of its two functions), when it printed one with light above 0.
pub fn time_s(stdout: &[u8]) -> Option<[f64; 2]> {
    let text = String::from_utf8_lossy(stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("time_s "))?;
    let mut it = line.split_whitespace().map(str::parse::<f64>);
    let (heavy, light) = (it.next()?.ok()?, it.next()?.ok()?);
    (light > 0.0).then_some([heavy, light])
}

/// Collapsed stacks (`comm;frame;...` → weight) of `flamegraph --format collapsed ARGS
/// FILE`, summed per stack.
pub fn collapsed(file: &Path, args: &[&str]) -> std::collections::HashMap<String, u64> {
    let mut all = vec!["flamegraph", "--format", "collapsed"];
    all.extend_from_slice(args);
    all.push(file.to_str().expect("utf-8 path"));
    let out = run(&all);
    assert!(out.status.success(), "flamegraph failed: {}", text(&out));
    let mut stacks = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let (stack, n) = line.rsplit_once(' ').expect("collapsed line");
        *stacks.entry(stack.to_owned()).or_insert(0) += n.parse::<u64>().expect("weight");
    }
    stacks
}

/// The `host:port` of the metrics listener from the agent's start-up line
/// (`… metrics at http://HOST:PORT/metrics`), if `line` is that line.
pub fn metrics_addr(line: &str) -> Option<String> {
    let rest = line.split("metrics at http://").nth(1)?;
    Some(rest.trim_end_matches("/metrics").trim().to_string())
}

// The agent as the tests run it: started, scraped, stopped.

/// A child process killed on drop (the test may panic mid-way).
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent on the estimated model (no counter needed), with more flags.
pub fn start_agent_with(dir: &Path, extra: &[&str]) -> (Daemon, String, mpsc::Receiver<String>) {
    let mut args = vec!["--energy-source", "model"];
    args.extend_from_slice(extra);
    spawn_agent(dir, &args)
}

/// The agent with 1 s windows, a free metrics port, its socket and state in `dir`, and
/// `extra` flags (which must choose the energy source).
pub fn spawn_agent(dir: &Path, extra: &[&str]) -> (Daemon, String, mpsc::Receiver<String>) {
    let mut child = Command::new(bin())
        .args(["agent", "--interval", "1"])
        .args(["--metrics-addr", "127.0.0.1:0", "--socket"])
        .arg(dir.join("agent.sock"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn energy-bpf agent");
    let stderr = child.stderr.take().expect("stderr");
    let agent = Daemon(child);
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = String::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(addr) = metrics_addr(&line) {
                    return (agent, addr, rx);
                }
                seen.push_str(&line);
                seen.push('\n');
            }
            Err(_) => panic!("agent did not log its metrics address within 30 s:\n{seen}"),
        }
    }
}

/// A loopback port free now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// GET over HTTP/1.0: (status, body).
pub fn get(addr: &str, path: &str) -> std::io::Result<(u32, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// Debian's Prometheus (installed by `cargo xtask setup`).
pub const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Debian's Prometheus scraping `target` every second as job `job`, its config and data in
/// `dir`; returns it with its address once it answers ready (30 s cap).
pub fn prometheus(dir: &Path, job: &str, target: &str) -> (Daemon, String) {
    let prom = format!("127.0.0.1:{}", free_port());
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: {job}\n    scrape_timeout: 1s\n    static_configs:\n      - targets: ['{target}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let daemon = Daemon(
        Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn prometheus"),
    );
    assert!(
        until(Duration::from_secs(30), || matches!(
            get(&prom, "/-/ready"),
            Ok((200, _))
        )),
        "Prometheus not ready in 30 s"
    );
    (daemon, prom)
}

/// CA, a server certificate for 127.0.0.1 valid now and one that expired yesterday:
/// (ca.pem, cert.pem, expired.pem, key.pem).
pub fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=energy-bpf test CA",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "key.pem",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    for (out, days) in [("cert.pem", "1"), ("expired.pem", "-1")] {
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            out,
            "-days",
            days,
            "-extfile",
            "ext.cnf",
        ]);
    }
    (
        dir.join("ca.pem"),
        dir.join("cert.pem"),
        dir.join("expired.pem"),
        dir.join("key.pem"),
    )
}

/// `q` percent-encoded for a URL's query string (RFC 3986 unreserved characters kept).
pub fn url_encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
