//! Grams of CO2e end to end: recordings of a constant load by the real probes (energy from
//! the model, so on any machine), intensities from a fake API of the Electricity Maps shape
//! (tests/support/fake_carbon_api.py: HTTPS on loopback, a certificate signed by a CA made
//! here). An intensity step from 100 to 500 g/kWh halfway through: each half's grams are
//! its joules × its intensity. Faults (server down, garbage, slow, expired certificate):
//! the report still completes on the labelled yearly average and says so once. `sci` on a
//! `record --repeat 5` recording agrees with `report`'s joules × intensity.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::util::{self, Daemon, bin, exclusive, require_root, text};

const TOKEN: &str = "fake-carbon-token";
const WINDOW_S: f64 = 0.5;

/// Starts the fake API with `points` (`[unix_ns, g_per_kwh]`) in `mode`; returns it and its
/// base URL.
fn fake_api(
    dir: &Path,
    cert: &Path,
    key: &Path,
    mode: &str,
    points: &[(u64, f64)],
) -> (Daemon, String) {
    let history = dir.join(format!("history-{mode}.json"));
    std::fs::write(&history, serde_json::to_string(points).expect("json")).expect("history");
    let port_file = dir.join(format!("port-{mode}-{}", cert.display().to_string().len()));
    let _ = std::fs::remove_file(&port_file);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/support/fake_carbon_api.py");
    let child = Command::new("python3")
        .arg(script)
        .args([cert, key])
        .arg(TOKEN)
        .arg(mode)
        .args([&history, &port_file])
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 fake carbon API");
    let server = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(p) = std::fs::read_to_string(&port_file) {
            return (server, format!("https://127.0.0.1:{}", p.trim()));
        }
        assert!(Instant::now() < deadline, "fake carbon API did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Records a constant load (a busy loop on one CPU) on the model for `secs`.
fn record_constant_load(dir: &Path, secs: u32) -> PathBuf {
    let file = dir.join("load.ebpr");
    let _load = util::Workload::spawn("while :; do :; done", None);
    let out = util::run(&[
        "record",
        "--energy-source",
        "model",
        "-F",
        "99",
        "-d",
        &secs.to_string(),
        "-o",
        file.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "record failed: {}", text(&out));
    file
}

/// (capture start, CLOCK_MONOTONIC ns; the wall clock then, Unix ns).
fn clocks(file: &Path) -> (u64, u64) {
    let rec = energy_bpf::record::read_file(file).expect("read recording");
    (rec.header.start_ns, rec.header.start_unix_ns)
}

fn report(file: &Path, args: &[&str]) -> (serde_json::Value, Output) {
    let out = Command::new(bin())
        .args([
            "report",
            "--format",
            "json",
            "--window",
            &WINDOW_S.to_string(),
        ])
        .args(args)
        .arg(file)
        .output()
        .expect("run report");
    assert!(
        out.status.success(),
        "report {args:?} failed: {}",
        text(&out)
    );
    (
        serde_json::from_slice(&out.stdout).expect("report JSON"),
        out,
    )
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn each_half_of_an_intensity_step_costs_its_joules_times_its_intensity() {
    if !require_root("each_half_of_an_intensity_step_costs_its_joules_times_its_intensity") {
        return;
    }
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, _, key) = util::certificates(dir.path());
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("token");
    let file = record_constant_load(dir.path(), 4);
    let (start_ns, start_unix) = clocks(&file);
    // The step lands on a window boundary in the middle of the recording.
    let step_unix = start_unix + 2_000_000_000;
    let points = [(start_unix - 3_600_000_000_000, 100.0), (step_unix, 500.0)];
    let (_server, url) = fake_api(dir.path(), &cert, &key, "ok", &points);
    let (doc, out) = report(
        &file,
        &[
            "--carbon-api",
            &url,
            "--carbon-zone",
            "FR",
            "--carbon-token-file",
            token.to_str().expect("utf-8"),
            "--carbon-ca",
            ca.to_str().expect("utf-8"),
        ],
    );
    let windows = doc["windows"].as_array().expect("windows");
    let (mut halves_j, mut halves_g) = ([0.0f64; 2], [0.0f64; 2]);
    for w in windows {
        let unix = |k: &str| start_unix + (w[k].as_u64().expect("bound") - start_ns);
        let (a, b) = (unix("start_ns"), unix("end_ns"));
        let carbon = &w["carbon"];
        assert_eq!(carbon["source"], "live history FR", "{w:#}");
        let half = if b <= step_unix + 1_000 {
            0
        } else if a + 1_000 >= step_unix {
            1
        } else {
            panic!("a window straddles the step: {a}..{b} vs {step_unix}");
        };
        let want = [100.0, 500.0][half];
        assert!(
            close(carbon["g_per_kwh"].as_f64().expect("g"), want, 1e-9),
            "{w:#}"
        );
        let j = w["total_j"].as_f64().expect("total_j");
        halves_j[half] += j;
        halves_g[half] += carbon["co2e_g"].as_f64().expect("co2e_g");
        // The processes' grams add up to the window's measured grams less idle.
        let procs: f64 = w["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .map(|p| p["co2e_g"].as_f64().expect("process co2e_g"))
            .sum();
        let idle = carbon["idle_co2e_g"].as_f64().expect("idle");
        assert!(
            close(procs + idle, carbon["co2e_g"].as_f64().expect("g"), 0.01),
            "{w:#}"
        );
    }
    for (half, g) in [(0, 100.0), (1, 500.0)] {
        assert!(halves_j[half] > 0.0, "no energy in half {half}");
        let want = halves_j[half] / 3.6e6 * g;
        assert!(
            close(halves_g[half], want, 0.01),
            "half {half}: {} g vs {want} g from {} J",
            halves_g[half],
            halves_j[half]
        );
    }
    // The second half emits 5× per joule: with a constant load, about 5× the grams.
    let ratio = (halves_g[1] / halves_j[1]) / (halves_g[0] / halves_j[0]);
    assert!(close(ratio, 5.0, 0.01), "{ratio}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("failing"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_failing_live_source_falls_back_to_the_labelled_yearly_average_and_says_so_once() {
    if !require_root(
        "a_failing_live_source_falls_back_to_the_labelled_yearly_average_and_says_so_once",
    ) {
        return;
    }
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, expired, key) = util::certificates(dir.path());
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).expect("token");
    let file = record_constant_load(dir.path(), 3);
    let (_, start_unix) = clocks(&file);
    let points = [(start_unix - 600_000_000_000, 250.0)];
    // A port nothing listens on: bound, then closed.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("https://127.0.0.1:{}", l.local_addr().expect("addr").port())
    };
    let garbage = fake_api(dir.path(), &cert, &key, "garbage", &points);
    let slow = fake_api(dir.path(), &cert, &key, "slow", &points);
    let stale = fake_api(dir.path(), &expired, &key, "ok", &points);
    let yearly = energy_bpf::carbon::zones::lookup("FR").expect("FR");
    for (fault, url, why) in [
        ("down", &down, "connect"),
        ("garbage", &garbage.1, "not an Electricity Maps answer"),
        ("slow", &slow.1, "no answer within"),
        ("expired certificate", &stale.1, "TLS"),
    ] {
        let (doc, out) = report(
            &file,
            &[
                "--carbon-api",
                url,
                "--carbon-zone",
                "FR",
                "--carbon-token-file",
                token.to_str().expect("utf-8"),
                "--carbon-ca",
                ca.to_str().expect("utf-8"),
            ],
        );
        let windows = doc["windows"].as_array().expect("windows");
        assert!(windows.len() >= 4, "{fault}: {} windows", windows.len());
        for w in windows {
            let c = &w["carbon"];
            assert_eq!(c["fallback"], true, "{fault}: {w:#}");
            assert_eq!(
                c["g_per_kwh"].as_f64(),
                Some(yearly.g_per_kwh),
                "{fault}: {w:#}"
            );
            let source = c["source"].as_str().expect("source");
            assert!(
                source.starts_with("fallback: yearly average FR 2024") && source.contains(why),
                "{fault}: {source}"
            );
            let j = w["total_j"].as_f64().expect("total_j");
            assert!(close(
                c["co2e_g"].as_f64().expect("g"),
                j / 3.6e6 * yearly.g_per_kwh,
                1e-9
            ));
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            stderr
                .matches("carbon intensity source for FR failing")
                .count(),
            1,
            "{fault}: said once, not per window: {stderr}"
        );
    }
}

#[test]
fn sci_per_run_agrees_with_report_joules_times_intensity() {
    if !require_root("sci_per_run_agrees_with_report_joules_times_intensity") {
        return;
    }
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("runs.ebpr");
    let out = Command::new(bin())
        .args([
            "record",
            "--energy-source",
            "model",
            "-F",
            "99",
            "--repeat",
            "5",
            "-o",
        ])
        .arg(&file)
        .args([
            "--",
            "sh",
            "-c",
            "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done",
        ])
        .output()
        .expect("record");
    assert!(out.status.success(), "record failed: {}", text(&out));
    let report = util::report_json_with(&file, &["--carbon-intensity", "400"]);
    let total_j = report["total_j"].as_f64().expect("total_j");
    let report_g = report["carbon"]["co2e_g"].as_f64().expect("co2e_g");
    assert!(close(report_g, total_j / 3.6e6 * 400.0, 1e-9));
    let out = util::run(&[
        "sci",
        file.to_str().expect("utf-8"),
        "--carbon-intensity",
        "400",
        "--embodied-g-per-hour",
        "30",
    ]);
    assert!(out.status.success(), "sci failed: {}", text(&out));
    let sci: serde_json::Value = serde_json::from_slice(&out.stdout).expect("sci JSON");
    assert_eq!(sci["units"].as_f64(), Some(5.0), "{sci:#}");
    assert!(
        sci["method"]
            .as_str()
            .expect("method")
            .starts_with("SCI = (E·I + M) / R")
    );
    let t = &sci["total"];
    let f = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{k}: {sci:#}"));
    assert!(close(f("e_j_per_unit"), total_j / 5.0, 0.001), "{sci:#}");
    assert!(
        close(f("operational_g_per_unit"), report_g / 5.0, 0.001),
        "{sci:#}"
    );
    // Embodied apart: 30 g/h over the recording's hours, per run.
    let hours = report["duration_ns"].as_f64().expect("duration_ns") / 3.6e12;
    assert!(
        close(f("embodied_g_per_unit"), 30.0 * hours / 5.0, 0.001),
        "{sci:#}"
    );
    assert!(close(
        f("sci_g_per_unit"),
        f("operational_g_per_unit") + f("embodied_g_per_unit"),
        1e-9
    ));
    // The flamegraph in grams: its stacks sum to the report's grams less the idle row's.
    let folded = crate::util::collapsed(&file, &["--unit", "co2e", "--carbon-intensity", "400"]);
    let stacks_ng: u64 = folded.values().sum();
    let busy_g = report_g - report["carbon"]["idle_co2e_g"].as_f64().expect("idle");
    assert!(
        close(stacks_ng as f64 / 1e9, busy_g, 0.01),
        "{stacks_ng} ng vs {busy_g} g"
    );
    // `diff` in grams: every joule figure at the one intensity, the interval with it.
    let out = util::run(&[
        "diff",
        file.to_str().expect("utf-8"),
        file.to_str().expect("utf-8"),
        "--by",
        "process",
        "--format",
        "json",
        "--carbon-intensity",
        "400",
    ]);
    assert!(out.status.success(), "diff failed: {}", text(&out));
    let d: serde_json::Value = serde_json::from_slice(&out.stdout).expect("diff JSON");
    let g_per_j = 400.0 / 3.6e6;
    let c = &d["carbon"];
    assert_eq!(c["unit"], "gCO2e/run", "{c:#}");
    for (g, j) in [
        (&c["base_g"], &d["total"]["base_j"]),
        (&c["delta_g"], &d["total"]["delta_j"]),
        (&c["ci95_g"][0], &d["total"]["ci95"][0]),
        (&c["ci95_g"][1], &d["total"]["ci95"][1]),
    ] {
        let (g, j) = (g.as_f64().expect("grams"), j.as_f64().expect("joules"));
        assert!((g - j * g_per_j).abs() <= 1e-12 + 1e-9 * g.abs(), "{c:#}");
    }
    // The command's row carries most of the energy and its share of M.
    let rows = sci["rows"].as_array().expect("rows");
    let sh = rows.iter().find(|r| r["command"] == "sh").expect("sh row");
    assert!(sh["e_j"].as_f64().expect("e_j") > 0.0);
    assert!(sh["m_g"].as_f64().expect("m_g") < f("m_g"));
}

/// (labels, value) of every sample of `name`.
fn samples<'a>(metrics: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    metrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?;
            let (labels, value) = match rest.strip_prefix('{') {
                Some(r) => r.rsplit_once("} ")?,
                None => ("", rest.strip_prefix(' ')?),
            };
            Some((labels, value.parse().ok()?))
        })
        .collect()
}

/// Scrapes until `done` holds (30 s at most); the last body.
fn scrape_until(addr: &str, mut done: impl FnMut(&str) -> bool) -> String {
    let mut body = String::new();
    let ok = util::until(Duration::from_secs(30), || {
        body = crate::util::get(addr, "/metrics")
            .map(|r| r.1)
            .unwrap_or_default();
        done(&body)
    });
    assert!(ok, "not within 30 s:\n{body}");
    body
}

#[test]
fn the_agent_exports_grams_at_the_live_intensity_and_keeps_going_on_the_fallback() {
    if !require_root(
        "the_agent_exports_grams_at_the_live_intensity_and_keeps_going_on_the_fallback",
    ) {
        return;
    }
    let _guard = exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, cert, _, key) = util::certificates(dir.path());
    let token = dir.path().join("token");
    std::fs::write(&token, TOKEN).expect("token");
    let now = energy_bpf::carbon::unix_now_ns();
    let (_ok, ok_url) = fake_api(
        dir.path(),
        &cert,
        &key,
        "ok",
        &[(now - 60_000_000_000, 420.0)],
    );
    let (_bad, bad_url) = fake_api(dir.path(), &cert, &key, "garbage", &[(now, 420.0)]);
    let _load = util::Workload::spawn("while :; do :; done", None);
    for (url, want_source, want_g) in [(&ok_url, "live", 420.0), (&bad_url, "fallback", 33.0)] {
        let state = tempfile::tempdir().expect("state dir");
        let (agent, addr, log) = crate::util::start_agent_with(
            state.path(),
            &[
                "--carbon-api",
                url,
                "--carbon-zone",
                "FR",
                "--carbon-token-file",
                token.to_str().expect("utf-8"),
                "--carbon-ca",
                ca.to_str().expect("utf-8"),
            ],
        );
        let windows = |b: &str| {
            samples(b, "energy_bpf_windows_total")
                .first()
                .map_or(0.0, |s| s.1)
        };
        let body = scrape_until(&addr, |b| windows(b) >= 4.0);
        let intensity = samples(&body, "energy_bpf_grid_intensity");
        assert_eq!(intensity.len(), 1, "{body}");
        assert!(
            intensity[0]
                .0
                .contains(&format!("source=\"{want_source}\"")),
            "{intensity:?}"
        );
        assert_eq!(intensity[0].1, want_g, "{intensity:?}");
        // Node grams are the node's joules at that intensity (every window the same one),
        // and the process series with idle sum to them.
        let node_j: f64 = samples(&body, "energy_bpf_node_joules_total")
            .iter()
            .map(|s| s.1)
            .sum();
        let grams = samples(&body, "energy_bpf_co2e_grams_total");
        let node_g: f64 = grams
            .iter()
            .filter(|s| s.0.starts_with("mode="))
            .map(|s| s.1)
            .sum();
        assert!(node_g > 0.0, "{body}");
        assert!(
            close(node_g, node_j / 3.6e6 * want_g, 0.01),
            "{node_g} g vs {node_j} J"
        );
        let idle_g = grams
            .iter()
            .find(|s| s.0 == "mode=\"idle\"")
            .map_or(0.0, |s| s.1);
        let procs_g: f64 = grams
            .iter()
            .filter(|s| s.0.contains("comm="))
            .map(|s| s.1)
            .sum();
        assert!(
            close(procs_g + idle_g, node_g, 0.01),
            "{procs_g} + {idle_g} vs {node_g}"
        );
        assert!(
            grams.iter().any(|s| s.0.contains("pid=") && s.1 > 0.0),
            "{body}"
        );
        // It keeps going: more windows, more grams.
        let before = node_g;
        let w0 = windows(&body);
        let body = scrape_until(&addr, |b| windows(b) >= w0 + 3.0);
        let after: f64 = samples(&body, "energy_bpf_co2e_grams_total")
            .iter()
            .filter(|s| s.0.starts_with("mode="))
            .map(|s| s.1)
            .sum();
        assert!(
            after > before,
            "grams stopped growing: {before} then {after}"
        );
        drop(agent);
        let lines: Vec<String> = log.try_iter().collect();
        let said = lines
            .iter()
            .filter(|l| l.contains("carbon intensity source for FR failing"))
            .count();
        assert_eq!(said, usize::from(want_source == "fallback"), "{lines:#?}");
    }
}
