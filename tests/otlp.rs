//! OTLP profiles, checked by a receiver built from the official definitions: Python's
//! grpcio-tools compiles the pinned `proto/otlp` files (tests/support/otlp_receiver.py), so
//! nothing here trusts our own generated structs.

use std::{path::Path, process::Command};

use crate::util::{Workload, require_root, run, text};

/// Runs the Python receiver: `decode FILE` → its JSON summary.
pub fn decode(file: &Path) -> serde_json::Value {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/support/otlp_receiver.py"
    );
    let out = Command::new("python3")
        .args([script, "decode", file.to_str().expect("utf-8 path")])
        .output()
        .expect("run python3 (cargo xtask setup installs grpcio-tools)");
    assert!(
        out.status.success(),
        "the official-definition receiver rejected {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("receiver prints JSON")
}

/// A C program with known function names (outer_energy -> hot_leaf_energy), built with frame
/// pointers and symbols so its stacks symbolize on any machine.
pub fn c_workload(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("burn.c");
    std::fs::write(
        &src,
        "__attribute__((noinline)) static unsigned long hot_leaf_energy(unsigned long x) {\n\
           for (int i = 0; i < 1000; i++) x = x * 6364136223846793005UL + 1;\n\
           return x;\n\
         }\n\
         __attribute__((noinline)) static unsigned long outer_energy(unsigned long x) {\n\
           return hot_leaf_energy(x) ^ 7;\n\
         }\n\
         int main(void) { volatile unsigned long s = 1; for (;;) s = outer_energy(s); }\n",
    )
    .expect("write burn.c");
    let bin = dir.join("burn_energy");
    crate::util::gcc(&src, &bin, &["-O0", "-g", "-fno-omit-frame-pointer"])
}

#[test]
fn flamegraph_otlp_decodes_with_the_official_definitions_and_conserves_energy() {
    if !require_root("flamegraph_otlp_decodes_with_the_official_definitions_and_conserves_energy") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = c_workload(dir.path());
    let burn = Workload::spawn(&format!("exec {}", bin.display()), Some(0));
    let file = dir.path().join("x.ebpr");
    let path = file.to_str().expect("utf-8");
    let out = run(&[
        "record",
        "-d",
        "2",
        "-F",
        "199",
        "--energy-source",
        "model",
        "-o",
        path,
    ]);
    drop(burn);
    assert!(out.status.success(), "{}", text(&out));
    let pb = dir.path().join("x.pb");
    let out = run(&[
        "flamegraph",
        path,
        "--format",
        "otlp",
        "-o",
        pb.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out));

    let got = decode(&pb);
    let profiles = got["profiles"].as_array().expect("profiles");
    let cpu = &profiles[0];
    assert_eq!(cpu["sample_type"], serde_json::json!(["samples", "count"]));
    assert_eq!(
        cpu["period_type"],
        serde_json::json!(["cpu", "nanoseconds"])
    );
    let energy = profiles
        .iter()
        .find(|p| p["attributes"]["energy.zone"] == "package")
        .expect("a package energy profile");
    assert_eq!(
        energy["sample_type"],
        serde_json::json!(["energy", "microjoules"])
    );
    assert_eq!(
        energy["period_type"],
        serde_json::json!(["energy", "microjoules"])
    );
    assert_eq!(energy["period"], 1);
    assert_eq!(energy["attributes"]["energy.estimated"], true);
    for key in [
        "thread.id",
        "thread.name",
        "process.pid",
        "process.executable.name",
        "cpu.logical_number",
    ] {
        assert!(
            energy["sample_attributes"]
                .as_array()
                .expect("keys")
                .iter()
                .any(|k| k == key),
            "{key} missing: {}",
            energy["sample_attributes"]
        );
    }
    for r in ["host.name", "os.kernel"] {
        assert!(energy["resource"].get(r).is_some(), "{r} missing");
    }
    let functions = energy["functions"].as_array().expect("functions");
    for f in ["hot_leaf_energy", "outer_energy", "main"] {
        assert!(
            functions.iter().any(|x| x == f),
            "{f} not among {} functions",
            functions.len()
        );
    }
    assert!(
        energy["build_ids"].as_u64().expect("count") > 0,
        "mappings carry build-ids"
    );

    // Conservation across the wire: the profile's µJ are the energy the report gives
    // processes (everything but idle/static and unknown), per process too.
    let report = crate::util::report_json(&file);
    let attributed = report["total_j"].as_f64().expect("total_j")
        - report["idle_j"].as_f64().expect("idle_j")
        - report["unknown_j"].as_f64().expect("unknown_j");
    let total = energy["total"].as_f64().expect("total");
    assert!(
        (total - attributed * 1e6).abs() <= 2.0,
        "profile {total} µJ vs report {} µJ",
        attributed * 1e6
    );
    let burn_pid = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["comm"] == "burn_energy")
        .expect("the workload is in the report");
    let want = burn_pid["energy_j"]["package"].as_f64().expect("joules") * 1e6;
    let got = energy["by_pid"][burn_pid["pid"].to_string()]
        .as_f64()
        .expect("the workload's samples");
    // Rounding is exact for the whole profile, within a µJ per sample for one process.
    assert!(
        (got - want).abs() <= want * 1e-5 + 2.0,
        "workload: profile {got} µJ vs report {want} µJ"
    );
}

/// The Python receiver serving OTLP/gRPC on a free port, writing each request to `dir`.
pub struct Receiver {
    /// Killed on drop.
    _child: crate::util::Daemon,
    pub port: u16,
}

impl Receiver {
    pub fn start(dir: &Path, port: u16, stall: bool) -> Self {
        use std::io::BufRead as _;
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/support/otlp_receiver.py"
        );
        let mut cmd = Command::new("python3");
        cmd.args([script, "serve", &port.to_string()])
            .arg(dir)
            .stdout(std::process::Stdio::piped());
        if stall {
            cmd.arg("--stall");
        }
        let mut child = cmd.spawn().expect("start the receiver");
        let stdout = child.stdout.take().expect("stdout");
        let child = crate::util::Daemon(child);
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("receiver output");
        assert_eq!(line.trim(), "ready", "the receiver did not start");
        Self {
            _child: child,
            port,
        }
    }
}

/// Requests received so far (files `N.json`).
fn received(dir: &Path) -> usize {
    (1..)
        .take_while(|n| dir.join(format!("{n}.json")).exists())
        .count()
}

fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited {secs} s for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// The value of one metric line (`name{labels} value`) whose labels contain `filter`.
fn metric(addr: &str, name: &str, filter: &str) -> f64 {
    let (status, body) = crate::util::get(addr, "/metrics").expect("scrape");
    assert_eq!(status, 200);
    body.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// With an intensity, each zone's energy profile in `request` has a co2e profile beside
/// it: sample type `co2e`/`nanograms`, the same zone and estimated label, and a total of the
/// energy profile's µJ at `g_per_kwh` (within 1%, or 2 ng of rounding).
fn co2e_beside_energy(request: &serde_json::Value, g_per_kwh: f64) {
    let profiles = request["profiles"].as_array().expect("profiles");
    let energy: Vec<&serde_json::Value> = profiles
        .iter()
        .filter(|p| p["sample_type"] == serde_json::json!(["energy", "microjoules"]))
        .collect();
    assert!(!energy.is_empty(), "no energy profile: {request}");
    for e in energy {
        let zone = &e["attributes"]["energy.zone"];
        let co2e = profiles
            .iter()
            .find(|p| p["sample_type"][0] == "co2e" && p["attributes"]["energy.zone"] == *zone)
            .unwrap_or_else(|| panic!("no co2e profile beside the {zone} energy profile"));
        assert_eq!(
            co2e["sample_type"],
            serde_json::json!(["co2e", "nanograms"])
        );
        assert_eq!(
            co2e["period_type"],
            serde_json::json!(["co2e", "nanograms"])
        );
        assert_eq!(
            co2e["attributes"]["energy.estimated"], e["attributes"]["energy.estimated"],
            "the co2e profile keeps the energy's estimated label"
        );
        assert!(
            co2e["attributes"]
                .get("energy.attributed_microjoules")
                .is_none(),
            "attributed µJ belong to the energy profile only: {}",
            co2e["attributes"]
        );
        let uj = e["total"].as_f64().expect("µJ");
        let ng = co2e["total"].as_f64().expect("ng");
        // µJ × 1e-6 J × g/kWh / 3.6e6 J/kWh × 1e9 ng/g.
        let want = uj * g_per_kwh / 3.6e6 * 1e3;
        assert!(
            (ng - want).abs() <= (want * 0.01).max(2.0),
            "{zone}: {ng} ng sent for {uj} µJ at {g_per_kwh} g/kWh ({want} ng)"
        );
    }
}

#[test]
fn the_agent_exports_energy_profiles_and_survives_a_collector_outage() {
    if !require_root("the_agent_exports_energy_profiles_and_survives_a_collector_outage") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let got = dir.path().join("received");
    std::fs::create_dir(&got).expect("mkdir");
    let bin = c_workload(dir.path());
    let _burn = Workload::spawn(&format!("exec {}", bin.display()), Some(0));
    let port = crate::util::free_port();
    let receiver = Receiver::start(&got, port, false);
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let (agent, addr, logs) = crate::util::start_agent_with(
        dir.path(),
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-header",
            "authorization=Bearer sekrit-token",
            "--profile-interval",
            "2",
            "-F",
            "199",
            "--carbon-intensity",
            "400",
        ],
    );
    wait_for("two exported profiles", 30, || received(&got) >= 2);
    for n in 1..=received(&got) {
        let summary: serde_json::Value = serde_json::from_slice(
            &std::fs::read(got.join(format!("{n}.json"))).expect("a request"),
        )
        .expect("summary JSON");
        co2e_beside_energy(&summary, 400.0);
    }

    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(got.join("2.json")).expect("the second request"))
            .expect("summary JSON");
    let profiles = summary["profiles"].as_array().expect("profiles");
    assert_eq!(
        profiles[0]["sample_type"],
        serde_json::json!(["samples", "count"])
    );
    let energy = profiles
        .iter()
        .find(|p| p["attributes"]["energy.zone"] == "package")
        .expect("an energy profile");
    assert_eq!(
        energy["period_type"],
        serde_json::json!(["energy", "microjoules"])
    );
    // Conservation across the wire: the values add up to what the agent's windows gave
    // threads (its own totals, carried beside them).
    let total = energy["total"].as_f64().expect("total");
    let attributed = energy["attributes"]["energy.attributed_microjoules"]
        .as_f64()
        .expect("the agent's attributed energy");
    assert!(attributed > 0.0);
    assert!(
        (total - attributed).abs() <= 2.0,
        "{total} µJ sent vs {attributed} µJ attributed"
    );
    let functions = energy["functions"].as_array().expect("functions");
    assert!(
        functions.iter().any(|f| f == "hot_leaf_energy"),
        "symbolized on the agent: {} functions",
        functions.len()
    );
    for key in [
        "thread.id",
        "process.pid",
        "process.executable.name",
        "cpu.logical_number",
    ] {
        assert!(
            energy["sample_attributes"]
                .as_array()
                .expect("keys")
                .iter()
                .any(|k| k == key),
            "{key}"
        );
    }
    let headers: serde_json::Value =
        serde_json::from_slice(&std::fs::read(got.join("headers-1.json")).expect("headers"))
            .expect("headers JSON");
    assert_eq!(headers["authorization"], "Bearer sekrit-token");

    // The collector goes away for 10 s: capture goes on, failures are counted, and export
    // resumes when it is back.
    let before = received(&got);
    let windows_before = metric(&addr, "energy_bpf_windows_total", "");
    drop(receiver);
    // At least 10 s, and until a failure is counted and 5 windows closed (60 s cap).
    let down = std::time::Instant::now();
    let failed = || metric(&addr, "energy_bpf_export_total", "outcome=\"failed\"");
    let windows = || metric(&addr, "energy_bpf_windows_total", "");
    crate::util::until(std::time::Duration::from_secs(60), || {
        down.elapsed() >= std::time::Duration::from_secs(10)
            && failed() > 0.0
            && windows() >= windows_before + 5.0
    });
    assert!(failed() > 0.0, "failed exports are counted");
    assert!(
        windows() >= windows_before + 5.0,
        "capture went on while the collector was down: {} windows after {windows_before}",
        windows()
    );
    let _receiver = Receiver::start(&got, port, false);
    wait_for("export to resume", 45, || received(&got) > before);
    drop(agent);
    let logged: String = logs.try_iter().collect::<Vec<_>>().join("\n");
    assert!(
        !logged.contains("sekrit"),
        "a header value reached the log:\n{logged}"
    );
}

/// A live Python process's profile names its Python functions with file and line, as
/// `flamegraph --format otlp` does for a recording: the agent keeps the frame names its
/// chunks carry.
#[test]
fn the_agent_exports_python_function_names() {
    if !require_root("the_agent_exports_python_function_names") {
        return;
    }
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        eprintln!("SKIPPED the_agent_exports_python_function_names: no /usr/bin/python3");
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let got = dir.path().join("received");
    std::fs::create_dir(&got).expect("mkdir");
    let script = crate::util::workload("py_hot.py");
    let src = std::fs::read_to_string(&script).expect("workload");
    let train_line = src
        .lines()
        .position(|l| l.contains("TRAIN_LINE"))
        .expect("marker")
        + 1;
    let mut child = Command::new("taskset")
        .args(["-c", "1"])
        .arg(python)
        .arg(&script)
        .arg("40")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start python3");
    let receiver = Receiver::start(&got, crate::util::free_port(), false);
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let (agent, _addr, _logs) = crate::util::start_agent_with(
        dir.path(),
        &[
            "--otlp-endpoint",
            &endpoint,
            "--profile-interval",
            "1",
            "-F",
            "199",
        ],
    );
    // The loop's body line, or its `for` line just above.
    let named = |place: &str| {
        place == format!("train_step (py_hot.py:{train_line})")
            || place == format!("train_step (py_hot.py:{})", train_line - 1)
    };
    let mut seen = Vec::new();
    let found = (|| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut n = 1;
        while std::time::Instant::now() < deadline {
            let file = got.join(format!("{n}.json"));
            if !file.exists() {
                std::thread::sleep(std::time::Duration::from_millis(200));
                continue;
            }
            n += 1;
            let summary: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&file).expect("request")).expect("JSON");
            for p in summary["profiles"].as_array().expect("profiles") {
                let places = p["places"].as_array().expect("places");
                if let Some(place) = places.iter().filter_map(|v| v.as_str()).find(|v| named(v)) {
                    assert_eq!(p["frame_types"]["train_step"], "cpython", "{p}");
                    return Some(place.to_owned());
                }
                seen.extend(places.iter().filter_map(|v| v.as_str().map(str::to_owned)));
            }
        }
        None
    })();
    drop(agent);
    let _ = child.kill();
    let _ = child.wait();
    seen.sort();
    seen.dedup();
    let found = found.unwrap_or_else(|| {
        panic!("no train_step (py_hot.py:{train_line}) in 30 s of profiles; named: {seen:?}")
    });
    eprintln!("agent profile names {found}");
}

#[test]
fn a_collector_that_never_answers_costs_bounded_memory() {
    if !require_root("a_collector_that_never_answers_costs_bounded_memory") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let got = dir.path().join("received");
    std::fs::create_dir(&got).expect("mkdir");
    let _burn = Workload::spawn("while :; do :; done", Some(0));
    let port = crate::util::free_port();
    let _receiver = Receiver::start(&got, port, true);
    let endpoint = format!("http://127.0.0.1:{port}");
    let (agent, addr, _logs) = crate::util::start_agent_with(
        dir.path(),
        &[
            "--otlp-endpoint",
            &endpoint,
            "--profile-interval",
            "1",
            "-F",
            "199",
        ],
    );
    // Anonymous memory only: stalled calls and queued profiles live on the heap. File pages
    // are not a leak: the symbolizer maps binaries (the agent's own, with its debug info,
    // among them) and their resident pages rise and fall by ~150 MiB as it reads them.
    let rss = |field: &str| {
        let status = std::fs::read_to_string(format!("/proc/{}/status", agent.0.id()))
            .expect("agent status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{field} in /proc/PID/status"))
    };
    wait_for("the queue to overflow and drop", 40, || {
        metric(&addr, "energy_bpf_export_total", "outcome=\"dropped\"") > 0.0
    });
    // Two spans of 10 s after the first drop: a leak of stalled calls or queued profiles
    // would show as a rise from one to the next, hence the peak per span.
    let peak = |secs: u64| {
        (0..secs)
            .map(|_| {
                std::thread::sleep(std::time::Duration::from_secs(1));
                (rss("RssAnon:"), rss("RssFile:"))
            })
            .fold((0, 0), |(a, f), (a1, f1)| (a.max(a1), f.max(f1)))
    };
    peak(5); // the first profiles' binaries
    let (first, first_file) = peak(10);
    let (second, second_file) = peak(10);
    eprintln!(
        "agent peak RSS, anonymous {first} -> {second} KiB, file-backed {first_file} -> \
         {second_file} KiB"
    );
    assert!(
        second <= first + 64 * 1024,
        "peak anonymous RSS rose from {first} KiB to {second} KiB while the collector \
         stalled (file-backed: {first_file} and {second_file} KiB)"
    );
    let dropped = metric(&addr, "energy_bpf_export_total", "outcome=\"dropped\"");
    assert!(
        dropped >= 5.0,
        "profiles keep being dropped, not queued: {dropped}"
    );
    assert!(metric(&addr, "energy_bpf_export_queue_depth", "sink=\"otlp\"") <= 8.0);
}
