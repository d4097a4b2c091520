//! The agent's web view in a real browser: Debian's headless Chromium driven through
//! `chromedriver` (WebDriver over plain HTTP on loopback). The agent runs as a user starts
//! it (no recordings: flamegraphs come from the stacks it holds in memory) on an emulated
//! RAPL package driven by the machine's busy time; two busy C processes share one CPU at
//! nice 0 and nice 5, so the kernel gives them CPU time about 3:1 (weights 1024 and 335).
//! Checked:
//! - the page's chart shows both processes, and the series the page fetched put their power
//!   at 3.0 ± 0.3 : 1;
//! - clicking the heavier row draws its energy flamegraph, whose hottest frame is the
//!   program's hot function;
//! - comparing two ranges draws a differential flamegraph;
//! - a screenshot of each view is saved under `target/test-artifacts/`;
//! - by VM, a fake VM beside them is a row, and that row's flamegraph holds its code and
//!   no other process's;
//! - then an agent with `--record-dir` serves the heavier process's flamegraph from its
//!   recordings, with the same hottest frame.
//!
//! Also, without a browser: a non-loopback address without a token refuses to start, a
//! wrong token gets 401, an oversized range 400 with its reason, a POST 405, and every
//! answer carries the Content-Security-Policy.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use crate::util::{self, BusyEmulator, Daemon, Workload, free_port, spawn_agent};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// One HTTP/1.1 request with `Connection: close`: (status, headers, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> std::io::Result<(u32, String, Vec<u8>)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let payload = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if body.is_some() {
        req.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            payload.len()
        ));
    }
    req.push_str("\r\n");
    req.push_str(&payload);
    s.write_all(req.as_bytes())?;
    // Read the head, then the body by its length (a server may keep the connection open
    // whatever the request said), or to the end.
    let mut raw = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    let split = loop {
        if let Some(p) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut buf)?;
        if n == 0 {
            break raw.len();
        }
        raw.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let lower = head.to_ascii_lowercase();
    let length = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    let mut body = raw.get(split + 4..).unwrap_or_default().to_vec();
    match length {
        Some(len) => {
            while body.len() < len {
                let n = s.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&buf[..n]);
            }
        }
        None => {
            s.read_to_end(&mut body)?;
        }
    }
    if lower.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, head, body))
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap_or("0")
                .trim(),
            16,
        )
        .unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = b.get(start + size + 2..).unwrap_or_default();
    }
    out
}

fn base64(text: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let digits: Vec<u8> = text.bytes().filter_map(val).collect();
    digits
        .chunks(4)
        .flat_map(|c| {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |acc, (i, &d)| acc | (u32::from(d) << (18 - 6 * i)));
            let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            bytes[..c.len().saturating_sub(1)].to_vec()
        })
        .collect()
}

/// A WebDriver session of headless Chromium, ended on drop.
struct Browser {
    _driver: Daemon,
    addr: String,
    session: String,
}

impl Browser {
    fn start() -> Self {
        let port = free_port();
        let driver = Daemon(
            Command::new(CHROMEDRIVER)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn chromedriver"),
        );
        let addr = format!("127.0.0.1:{port}");
        assert!(
            util::until(Duration::from_secs(30), || {
                http(&addr, "GET", "/status", &[], None).is_ok_and(|(s, _, b)| {
                    s == 200 && String::from_utf8_lossy(&b).contains("ready")
                })
            }),
            "chromedriver did not answer in 30 s"
        );
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1100,1300"]
            }
        }}});
        let (status, _, body) =
            http(&addr, "POST", "/session", &[], Some(&caps)).expect("new session");
        let v: Value = serde_json::from_slice(&body).expect("session JSON");
        assert_eq!(status, 200, "new session: {v}");
        let session = v["value"]["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        Self {
            _driver: driver,
            addr,
            session,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        let (status, _, raw) =
            http(&self.addr, method, &path, &[], body.as_ref()).expect("WebDriver call");
        let v: Value = serde_json::from_slice(&raw).expect("WebDriver JSON");
        assert_eq!(status, 200, "{method} {path}: {v}");
        v["value"].clone()
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    fn eval(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
    }

    /// Evaluates `script` until it returns something truthy, up to `cap`.
    fn wait(&self, script: &str, cap: Duration, what: &str) -> Value {
        let mut last = Value::Null;
        let ok = util::until(cap, || {
            last = self.eval(script);
            !(last.is_null() || last == false || last == "" || last == 0)
        });
        assert!(ok, "{what} within {cap:?} (last: {last})");
        last
    }

    fn click(&self, css: &str) {
        let found = self.call(
            "POST",
            "/element",
            Some(json!({ "using": "css selector", "value": css })),
        );
        let id = found
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .expect("element id")
            .to_owned();
        self.call("POST", &format!("/element/{id}/click"), Some(json!({})));
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let png = base64(self.call("GET", "/screenshot", None).as_str().expect("png"));
        assert!(png.starts_with(b"\x89PNG"), "screenshot is not a PNG");
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts");
        std::fs::create_dir_all(&dir).expect("artefact dir");
        let file = dir.join(name);
        std::fs::write(&file, png).expect("write screenshot");
        eprintln!("screenshot: {}", file.display());
        file
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let path = format!("/session/{}", self.session);
        let _ = http(&self.addr, "DELETE", &path, &[], None);
    }
}

/// Nanoseconds `pid` has run, all threads (`/proc/PID/schedstat` of the main thread: the
/// workloads here are single-threaded).
fn ran_ns(pid: u32) -> u64 {
    util::on_cpu_ns(pid)
}

#[test]
fn web_view_charts_two_processes_at_3_to_1_and_draws_the_heavier_ones_code() {
    if !util::require_root(
        "web_view_charts_two_processes_at_3_to_1_and_draws_the_heavier_ones_code",
    ) {
        return;
    }
    for tool in [CHROMIUM, CHROMEDRIVER] {
        assert!(
            Path::new(tool).exists(),
            "{tool} missing: run `cargo xtask setup` (it installs Debian's chromium and chromium-driver)"
        );
    }
    if !util::unless_cpu_taken(
        "web_view_charts_two_processes_at_3_to_1_and_draws_the_heavier_ones_code",
        "the 3:1 split comes from two processes alone on CPU 1",
    ) {
        return;
    }
    let _guard = util::exclusive();
    let fake = util::two_cpu_package();
    let _emulator = BusyEmulator::start(&fake.energy_uj, 5.0, 10.0);
    let tmp = fake.dir.path();
    let bin = crate::otlp::c_workload(tmp);
    let heavy = Workload::spawn(&format!("exec {}", bin.display()), Some(1));
    let light = Workload::spawn(&format!("exec nice -n 5 {}", bin.display()), Some(1));
    util::wait_running(heavy.pid(), 50_000_000);
    util::wait_running(light.pid(), 10_000_000);
    // A virtual machine on CPU 0 (the fake hypervisor of the VM tests): a row of the chart
    // by VM, and that row's flamegraph.
    let qemu = util::gcc(
        &util::workload("fake_vm.c"),
        &tmp.join("qemu-system-x86_64"),
        &["-O1", "-pthread"],
    );
    let _vm = Daemon(
        Command::new("taskset")
            .args(["-c", "0"])
            .arg(&qemu)
            .args(["-name", "guest=web,debug-threads=on", "-smp", "1"])
            .env("FAKE_VM_VCPU_PCT", "30")
            .spawn()
            .expect("start the fake VM"),
    );

    let sysfs = fake.sysfs.to_str().expect("utf-8 path");
    let (agent, addr, _log) = spawn_agent(
        tmp,
        &[
            "--energy-source",
            "powercap",
            "--sysfs-root",
            sysfs,
            // The emulator draws the same watts per busy CPU-second for every process: the
            // time split is its truth (a regression fitted on a loaded machine's classes
            // need not be).
            "--power-model",
            "time",
        ],
    );
    let ran0 = (ran_ns(heavy.pid()), ran_ns(light.pid()));

    let browser = Browser::start();
    let started = Instant::now();
    browser.open(&format!("http://{addr}/"));
    let (hp, lp) = (heavy.pid(), light.pid());
    // Both rows charted, and at least 15 windows behind the page's series.
    let both = format!(
        "const s = typeof state !== 'undefined' && state.series; if (!s || s.windows < 15) return false; \
         const names = [...document.querySelectorAll('#chart path.area')].map(p => p.dataset.name); \
         const pids = s.series.map(r => r.pid); \
         return pids.includes({hp}) && pids.includes({lp}) && names.some(n => n.endsWith('({hp})')) && names.some(n => n.endsWith('({lp})'));"
    );
    browser.wait(&both, Duration::from_secs(90), "both processes charted");
    // The power ratio from the series the page fetched, over the windows where both ran.
    let series = browser.eval("return state.series;");
    let ran1 = (ran_ns(hp), ran_ns(lp));
    let mean = |pid: u32| -> f64 {
        let row = series["series"]
            .as_array()
            .expect("series")
            .iter()
            .find(|r| r["pid"] == pid)
            .unwrap_or_else(|| panic!("no row for {pid}: {series}"));
        // Skip the first two windows (the agent's start).
        let w: Vec<f64> = row["watts"]
            .as_array()
            .expect("watts")
            .iter()
            .skip(2)
            .filter_map(Value::as_f64)
            .collect();
        w.iter().sum::<f64>() / w.len().max(1) as f64
    };
    let ratio = mean(hp) / mean(lp);
    let cpu_ratio = (ran1.0 - ran0.0) as f64 / (ran1.1 - ran0.1).max(1) as f64;
    eprintln!(
        "web view: heavy {:.3} W, light {:.3} W, ratio {ratio:.3} (CPU time ratio {cpu_ratio:.3}) after {:.1} s",
        mean(hp),
        mean(lp),
        started.elapsed().as_secs_f64()
    );
    assert!(
        (ratio - 3.0).abs() <= 0.3,
        "power ratio {ratio:.3}, want 3.0 ± 0.3 (CPU time ratio {cpu_ratio:.3})"
    );
    let estimated = series["estimated"].as_bool().expect("estimated flag");
    assert!(!estimated, "powercap energy shown as estimated");
    // Measured, not asserted: how fast the page painted and the series came back.
    let timing = browser.eval(
        "const p = performance.getEntriesByType('paint').find(e => e.name === 'first-contentful-paint'); \
         const s = performance.getEntriesByType('resource').filter(e => e.name.includes('/api/v1/series')); \
         return {first_paint_ms: p ? p.startTime : null, series_ms: s.length ? s[s.length - 1].duration : null};",
    );
    eprintln!("web view timing: {timing}");
    browser.screenshot("webview-power.png");

    // Which code: the heavier row's flamegraph.
    browser.click(&format!("tr.row[data-pid=\"{hp}\"]"));
    let hottest = browser.wait(
        "return document.body.dataset.loaded === 'profile' && document.getElementById('flame').dataset.hottest;",
        Duration::from_secs(60),
        "the heavier process's flamegraph",
    );
    let note = browser.eval("return document.getElementById('flame-note').textContent;");
    eprintln!("flamegraph of {hp}: hottest frame {hottest}; {note}");
    assert_eq!(
        hottest, "hot_leaf_energy",
        "the flamegraph's hottest frame ({note})"
    );
    assert!(
        note.as_str().is_some_and(|n| n.contains("in memory")),
        "the note says where the stacks came from: {note}"
    );
    let frames = browser.eval("return document.querySelectorAll('#flame g.frame').length;");
    assert!(frames.as_u64().unwrap_or(0) >= 3, "{frames} frames drawn");
    browser.screenshot("webview-flamegraph.png");

    // Compare: the first half of the chart's range against the second.
    browser.eval(
        "const t = state.series.times_ms; const mid = t[Math.floor(t.length / 2)]; \
         state.a = [t[0], mid]; state.b = [mid, t[t.length - 1]]; state.row = null; return true;",
    );
    browser.click("#run-diff");
    browser.wait(
        "return document.body.dataset.loaded === 'diff' && document.querySelectorAll('#diff g.frame').length;",
        Duration::from_secs(60),
        "the differential flamegraph",
    );
    browser.eval("document.getElementById('diff').scrollIntoView(false); return true;");
    browser.screenshot("webview-compare.png");
    let note = browser.eval("return document.getElementById('diff-note').textContent;");
    assert!(
        note.as_str()
            .is_some_and(|n| n.contains("no significance test")),
        "{note}"
    );
    drop(browser);

    // By VM: the VM's row, and its flamegraph from the processes that made the row.
    let get = |path: &str| -> Value {
        let (status, _, body) = http(&addr, "GET", path, &[], None).expect("GET");
        let v = serde_json::from_slice(&body).unwrap_or(Value::Null);
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
        v
    };
    let vms = get("/api/v1/series?range=300&by=vm");
    let names: Vec<&str> = vms["series"]
        .as_array()
        .expect("series")
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(
        names.contains(&"web") && names.contains(&"[host]"),
        "{names:?}"
    );
    let t = vms["times_ms"].as_array().expect("times");
    let (from, to) = (
        t[0].as_u64().expect("ms") - 1000,
        t[t.len() - 1].as_u64().expect("ms"),
    );
    let p = get(&format!(
        "/api/v1/profile?from={from}&to={to}&by=vm&name=web"
    ));
    let stacks: Vec<&str> = p["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter_map(|s| s[0].as_str())
        .collect();
    eprintln!(
        "the VM's flamegraph: {} J in {} stacks",
        p["total"],
        stacks.len()
    );
    assert!(
        stacks.iter().any(|s| s.contains(";burn"))
            && !stacks.iter().any(|s| s.contains("hot_leaf")),
        "the VM's stacks, and only its: {stacks:?}"
    );
    drop(agent);

    // With recordings: the same flamegraph from them.
    let rec = tmp.join("rec");
    let (_agent, addr, _log) = spawn_agent(
        tmp,
        &[
            "--energy-source",
            "powercap",
            "--sysfs-root",
            sysfs,
            "--record-dir",
            rec.to_str().expect("utf-8 path"),
            "--power-model",
            "time",
        ],
    );
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64)
    };
    let from_ms = unix_ms();
    let (mut last, mut hottest) = (String::new(), None);
    // Until the recordings hold a second of the process's energy (a file is written when
    // it rotates), a minute and a half at most.
    util::until(Duration::from_secs(90), || {
        std::thread::sleep(Duration::from_secs(1));
        let path = format!("/api/v1/profile?from={from_ms}&to={}&row={hp}", unix_ms());
        let Ok((status, _, body)) = http(&addr, "GET", &path, &[], None) else {
            return false;
        };
        last = format!("{status} {}", String::from_utf8_lossy(&body));
        let Some(p) = serde_json::from_slice::<Value>(&body)
            .ok()
            .filter(|_| status == 200)
        else {
            return false;
        };
        assert_eq!(p["from"], "recordings", "{p}");
        hottest = hottest_leaf(&p).filter(|_| p["total"].as_f64().unwrap_or(0.0) > 1.0);
        hottest.is_some()
    });
    let hottest = hottest.unwrap_or_else(|| panic!("no flamegraph from the recordings: {last}"));
    eprintln!("flamegraph of {hp} from the recordings: hottest frame {hottest}");
    assert_eq!(hottest, "hot_leaf_energy", "{last}");
}

/// The leaf frame with the most energy of a `/api/v1/profile` answer.
fn hottest_leaf(p: &Value) -> Option<String> {
    let mut by_leaf = std::collections::BTreeMap::<String, f64>::new();
    for s in p["stacks"].as_array()? {
        let stack = s[0].as_str()?;
        let leaf = stack.rsplit(';').next()?;
        *by_leaf.entry(leaf.to_string()).or_default() += s[1].as_f64()?;
    }
    by_leaf
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(leaf, _)| leaf)
}

#[test]
fn web_view_refuses_exposure_without_a_token_and_guards_its_api() {
    if !util::require_root("web_view_refuses_exposure_without_a_token_and_guards_its_api") {
        return;
    }
    let _guard = util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    // Every interface, no token: refused before anything is loaded.
    let out = Command::new(util::bin())
        .args([
            "agent",
            "--energy-source",
            "model",
            "--metrics-addr",
            "0.0.0.0:0",
        ])
        .arg("--socket")
        .arg(dir.path().join("a.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .output()
        .expect("run agent");
    let err = util::text(&out);
    assert!(!out.status.success(), "agent started exposed: {err}");
    assert!(
        err.contains("--web-token-file") && err.contains("not loopback"),
        "{err}"
    );

    // With a token: the API asks for it.
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret-token\n").expect("token");
    let (_agent, addr, _log) = spawn_agent(
        dir.path(),
        &[
            "--energy-source",
            "model",
            "--web-token-file",
            token.to_str().expect("utf-8"),
        ],
    );
    let (status, head, page) = http(&addr, "GET", "/", &[], None).expect("GET /");
    assert_eq!(status, 200);
    let head = head.to_ascii_lowercase();
    assert!(
        head.contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{head}"
    );
    assert!(head.contains("x-content-type-options: nosniff"), "{head}");
    assert!(String::from_utf8_lossy(&page).contains("app.js"));
    let api = |auth: Option<&str>, path: &str| {
        let h: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        let (s, _, b) = http(&addr, "GET", path, &h, None).expect("GET api");
        (s, String::from_utf8_lossy(&b).to_string())
    };
    assert_eq!(api(None, "/api/v1/series").0, 401);
    assert_eq!(api(Some("Bearer wrong"), "/api/v1/series").0, 401);
    let ok = util::until(Duration::from_secs(30), || {
        let (s, b) = api(Some("Bearer s3cret-token"), "/api/v1/series?range=60");
        s == 200 && b.contains("\"series\":[{")
    });
    assert!(ok, "no series with the right token within 30 s");
    let (s, why) = api(Some("Bearer s3cret-token"), "/api/v1/series?range=100000");
    assert_eq!(s, 400, "{why}");
    assert!(why.contains("a day"), "{why}");
    let (s, why) = api(
        Some("Bearer s3cret-token"),
        "/api/v1/profile?from=0&to=7200000",
    );
    assert_eq!(s, 400, "{why}");
    assert!(why.contains("an hour"), "{why}");
    let (s, _, _) = http(&addr, "POST", "/api/v1/series", &[], Some(&json!({}))).expect("POST");
    assert_eq!(s, 405);
    // /metrics stays as it was: no token.
    assert_eq!(api(None, "/metrics").0, 200);
}

/// A process's resident and peak memory, bytes: (VmRSS, VmHWM).
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

#[test]
fn a_profile_over_a_gibibyte_of_recordings_reads_within_its_cap() {
    if !util::require_root("a_profile_over_a_gibibyte_of_recordings_reads_within_its_cap") {
        return;
    }
    let _guard = util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    // One real recording of the whole machine, then a store of 1 GiB of it: hard links
    // named as the agent names its files, one a second over the last hour (the reader
    // sees 1 GiB of files; the disk holds one).
    let base = dir.path().join("base.ebpr");
    let busy = Workload::spawn("while :; do :; done", None);
    let out = util::run(&[
        "record",
        "--energy-source",
        "model",
        "-F",
        "999",
        "-d",
        "3",
        "-o",
        base.to_str().expect("utf-8"),
    ]);
    drop(busy);
    assert!(out.status.success(), "{}", util::text(&out));
    let size = std::fs::metadata(&base).expect("base").len();
    let store = dir.path().join("store");
    std::fs::create_dir(&store).expect("store");
    let count = (1u64 << 30).div_ceil(size);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    for i in 0..count {
        let start_s = now_s - 3590 + i * 3580 / count;
        let name = format!("energy-bpf-{start_s:020}-{:06}.ebpr", i + 1);
        std::fs::hard_link(&base, store.join(name)).expect("link");
    }
    let (agent, addr, _log) = spawn_agent(
        dir.path(),
        &[
            "--energy-source",
            "model",
            "--record-dir",
            store.to_str().expect("utf-8"),
        ],
    );
    let pid = agent.0.id();
    // Settled: a few windows in.
    let settled = util::until(Duration::from_secs(30), || {
        http(&addr, "GET", "/api/v1/series?range=60", &[], None).is_ok_and(|(s, _, b)| {
            s == 200 && String::from_utf8_lossy(&b).contains("\"windows\":3")
        })
    });
    assert!(settled, "no windows within 30 s");
    let (rss0, hwm0) = memory(pid);
    // The resident memory, every 2 ms, while the request runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poll = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(memory(pid).0);
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        })
    };
    let to_ms = now_s * 1000;
    let path = format!("/api/v1/profile?from={}&to={to_ms}", to_ms - 3_599_000);
    let started = Instant::now();
    let (status, _, body) = http(&addr, "GET", &path, &[], None).expect("profile");
    let took = started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = poll.join().expect("poll");
    let (_, hwm1) = memory(pid);
    let p: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{status} {e}: {}", String::from_utf8_lossy(&body)));
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "1 GiB store ({count} files of {size} bytes): answered {status} in {:.1} s, read {} of the \
         files; agent RSS {:.0} MiB before, {:.0} MiB at most during (+{:.0} MiB); peak {:.0} -> {:.0} MiB",
        took.as_secs_f64(),
        p["files"],
        mib(rss0),
        mib(peak),
        mib(peak.saturating_sub(rss0)),
        mib(hwm0),
        mib(hwm1)
    );
    assert_eq!(status, 200, "{}", p["files"]);
    let files = &p["files"];
    let read = files[0].as_u64().expect("files read");
    assert!(
        files[1].as_u64() >= Some(count),
        "{files}: the store's files in the range"
    );
    assert!(
        read >= 2 && read * size <= 16 << 20,
        "{read} files of {size} bytes read"
    );
    assert!(
        p["total"].as_f64().unwrap_or(0.0) > 0.0,
        "no energy: {}",
        p["total"]
    );
    // The memory a request may take (docs/dashboards.md): 256 MiB over what the agent held.
    assert!(
        peak.saturating_sub(rss0) <= 256 << 20,
        "the request took {:.0} MiB",
        mib(peak.saturating_sub(rss0))
    );
}
