//! The Grafana dashboards of `deploy/grafana/` proven against data: a real Prometheus
//! (Debian's package) scrapes a real agent every second; the agent reads an emulated RAPL
//! package driven by the machine's busy time (`util::BusyEmulator`) and names pods from a
//! fake kubelet, while a busy process runs in a pod's container, another on the host and a
//! fake VM beside them, at a fixed grid intensity. Then every PromQL
//! expression of every panel and every template variable's query runs through
//! Prometheus's HTTP API, template variables substituted with the values their own queries
//! return. Each must return data; a metric or label the agent does not export, `rate()` or
//! `increase()` over a gauge, a counter read raw, or a unit that does not fit the query
//! fails the test (and a planted bad query shows the checks do fail).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    k8s_names::{APP_ID, Cgroup, UID, fake_kubelet, root},
    util::{self, BusyEmulator, Daemon, Workload, get, spawn_agent},
};

use crate::util::PROMETHEUS;
/// What `$__rate_interval` becomes: four 1 s scrapes and some.
const RATE_INTERVAL: &str = "10s";

fn dashboards() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/grafana")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
}

/// GET `path` from Prometheus; its `data` on success, its error text otherwise.
fn api(prom: &str, path: &str) -> Result<Value, String> {
    let (status, body) = get(prom, path).map_err(|e| format!("GET {path}: {e}"))?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status} {body}: {e}"))?;
    if status != 200 || v["status"] != "success" {
        return Err(format!("{status}: {}", v["error"]));
    }
    Ok(v["data"].clone())
}

/// An instant query's result (vector or scalar), as a JSON array of series.
fn instant(prom: &str, expr: &str) -> Result<Vec<Value>, String> {
    let data = api(
        prom,
        &format!("/api/v1/query?query={}", util::url_encode(expr)),
    )?;
    Ok(match data["resultType"].as_str() {
        Some("scalar") => vec![data["result"].clone()],
        _ => data["result"].as_array().cloned().unwrap_or_default(),
    })
}

/// A PromQL token: an identifier, a string literal, or one punctuation character.
#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
}

fn tokens(expr: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_alphanumeric() || c == '_' || c == ':' || c == '.' {
            let mut s = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_alphanumeric() || c == '_' || c == ':' || c == '.' {
                    s.push(c);
                    chars.next();
                } else {
                    break;
                }
            }
            out.push(Tok::Ident(s));
        } else if c == '"' || c == '\'' {
            chars.next();
            let mut s = String::new();
            while let Some(d) = chars.next() {
                match d {
                    '\\' => s.extend(chars.next()),
                    d if d == c => break,
                    d => s.push(d),
                }
            }
            out.push(Tok::Str(s));
        } else {
            chars.next();
            if !c.is_whitespace() {
                out.push(Tok::Punct(c));
            }
        }
    }
    out
}

/// What an expression names: metrics, labels it reads, labels `label_replace` makes, and
/// for each `rate`/`increase`/`irate` the metric it takes.
#[derive(Debug, Default)]
struct Names {
    metrics: BTreeSet<String>,
    labels: BTreeSet<String>,
    made: BTreeSet<String>,
    rated: BTreeSet<String>,
}

fn names(expr: &str) -> Names {
    let t = tokens(expr);
    let mut n = Names::default();
    let mut i = 0;
    while i < t.len() {
        match &t[i] {
            Tok::Ident(id) if id.starts_with("energy_bpf_") => {
                n.metrics.insert(id.clone());
            }
            Tok::Ident(id)
                if ["rate", "increase", "irate"].contains(&id.as_str())
                    && t.get(i + 1) == Some(&Tok::Punct('(')) =>
            {
                if let Some(Tok::Ident(m)) = t[i + 2..]
                    .iter()
                    .find(|x| matches!(x, Tok::Ident(s) if s.starts_with("energy_bpf_")))
                {
                    n.rated.insert(m.clone());
                }
            }
            Tok::Ident(id) if id == "label_replace" => {
                // The string arguments at the call's own level (not a selector's values):
                // label_replace(v, "dst", "replacement", "src", "regex").
                let mut depth = 0i32;
                let mut strings = Vec::new();
                for x in &t[i + 1..] {
                    match x {
                        Tok::Punct('(' | '{') => depth += 1,
                        Tok::Punct(')' | '}') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        Tok::Str(s) if depth == 1 => strings.push(s),
                        _ => {}
                    }
                }
                if let [dst, _, src, ..] = strings[..] {
                    n.made.insert(dst.clone());
                    n.labels.insert(src.clone());
                }
            }
            Tok::Ident(id)
                if [
                    "by",
                    "without",
                    "on",
                    "ignoring",
                    "group_left",
                    "group_right",
                ]
                .contains(&id.as_str())
                    && t.get(i + 1) == Some(&Tok::Punct('(')) =>
            {
                i += 2;
                while i < t.len() && t[i] != Tok::Punct(')') {
                    if let Tok::Ident(l) = &t[i] {
                        n.labels.insert(l.clone());
                    }
                    i += 1;
                }
            }
            Tok::Punct('{') => {
                i += 1;
                while i < t.len() && t[i] != Tok::Punct('}') {
                    if let (Tok::Ident(l), Some(Tok::Punct('=' | '!'))) = (&t[i], t.get(i + 1)) {
                        n.labels.insert(l.clone());
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    n
}

/// What Prometheus holds of the agent: label names per series name, and type per family.
struct Exported {
    labels: BTreeMap<String, BTreeSet<String>>,
    types: BTreeMap<String, BTreeSet<String>>,
}

impl Exported {
    fn read(prom: &str) -> Self {
        let series = api(
            prom,
            &format!(
                "/api/v1/series?match[]={}",
                util::url_encode("{__name__=~\"energy_bpf_.*\"}")
            ),
        )
        .expect("series");
        let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in series.as_array().expect("series list") {
            let obj = s.as_object().expect("labels");
            let name = obj["__name__"].as_str().expect("name").to_owned();
            labels
                .entry(name)
                .or_default()
                .extend(obj.keys().filter(|k| *k != "__name__").cloned());
        }
        let meta = api(prom, "/api/v1/metadata").expect("metadata");
        let types = meta
            .as_object()
            .expect("metadata map")
            .iter()
            .map(|(k, v)| {
                let kinds = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|m| m["type"].as_str().map(String::from))
                    .collect();
                (k.clone(), kinds)
            })
            .collect();
        Self { labels, types }
    }

    /// The type of series `name`: `x_total` of a counter family `x` is a counter (a
    /// family name may also hold a gauge, as the window processing summary does).
    fn kind(&self, name: &str) -> Option<&str> {
        let own = self.types.get(name);
        let family = name.strip_suffix("_total").and_then(|f| self.types.get(f));
        if name.ends_with("_total")
            && (own.is_some_and(|k| k.contains("counter"))
                || family.is_some_and(|k| k.contains("counter")))
        {
            return Some("counter");
        }
        own.and_then(|k| {
            k.iter()
                .find(|k| *k != "counter")
                .or_else(|| k.iter().next())
        })
        .map(String::as_str)
    }
}

/// What is wrong with `expr` (already substituted) against what the agent exports; empty
/// when nothing. A panel's unit is checked when `unit` is given.
fn problems(expr: &str, exported: &Exported, unit: Option<&str>) -> Vec<String> {
    let n = names(expr);
    let mut out = Vec::new();
    let mut known: BTreeSet<String> = ["instance", "job"].map(String::from).into();
    known.extend(n.made.iter().cloned());
    for m in &n.metrics {
        match exported.labels.get(m) {
            Some(l) => known.extend(l.iter().cloned()),
            None => out.push(format!("metric `{m}` is not exported")),
        }
    }
    for l in n.labels.difference(&known) {
        out.push(format!("label `{l}` is on none of {:?}", n.metrics));
    }
    for m in &n.metrics {
        let kind = exported.kind(m);
        let rated = n.rated.contains(m);
        if rated && kind != Some("counter") {
            out.push(format!(
                "rate/increase over `{m}`, a {kind:?}, not a counter"
            ));
        }
        if !rated && kind == Some("counter") {
            out.push(format!(
                "counter `{m}` read raw, not through rate() or increase()"
            ));
        }
    }
    if let Some(unit) = unit {
        let joules = n.metrics.iter().all(|m| m.ends_with("_joules_total"));
        let ratio = expr.contains(" / ");
        let want = if !joules || n.metrics.is_empty() {
            None
        } else if ratio {
            Some("percentunit")
        } else if expr.contains("increase(") {
            Some("joule")
        } else if expr.contains("rate(") {
            Some("watt")
        } else {
            None
        };
        if want.is_some_and(|w| w != unit) {
            out.push(format!("unit `{unit}`, but the query gives {want:?}"));
        }
        if ![
            "watt",
            "joule",
            "percentunit",
            "bytes",
            "s",
            "cps",
            "short",
            "none",
            "massg",
        ]
        .contains(&unit)
        {
            out.push(format!("unit `{unit}` is none of the agreed ones"));
        }
    }
    out
}

/// One query of a dashboard: where it is, its text and its panel's unit.
struct Query {
    at: String,
    expr: String,
    unit: Option<String>,
}

fn panels(v: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in v["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(panels(p));
    }
    out
}

fn queries(file: &Path, dash: &Value) -> Vec<Query> {
    let name = file.file_name().expect("name").to_string_lossy();
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(Query {
                at: format!("{name}: panel {:?} {}", p["title"], t["refId"]),
                expr: t["expr"].as_str().expect("expr").to_owned(),
                unit: p["fieldConfig"]["defaults"]["unit"]
                    .as_str()
                    .map(String::from),
            });
        }
    }
    out
}

/// Each template variable's values, from its own `label_values(metric, label)` query.
fn variables(prom: &str, dash: &Value) -> Result<BTreeMap<String, (bool, Vec<String>)>, String> {
    let mut out = BTreeMap::new();
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        let name = v["name"].as_str().expect("variable name").to_owned();
        match v["type"].as_str() {
            Some("datasource") => {
                if v["query"] != "prometheus" {
                    return Err(format!("${name} is not a Prometheus data source"));
                }
            }
            Some("query") => {
                let q = v["query"]["query"].as_str().unwrap_or_default();
                let inner = q
                    .strip_prefix("label_values(")
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(|| format!("${name}: `{q}` is not label_values(metric, label)"))?;
                let (metric, label) = inner
                    .split_once(',')
                    .ok_or_else(|| format!("${name}: `{q}` names no label"))?;
                let values = api(
                    prom,
                    &format!(
                        "/api/v1/label/{}/values?match[]={}",
                        label.trim(),
                        util::url_encode(metric.trim())
                    ),
                )?;
                let values: Vec<String> = values
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect();
                if values.is_empty() {
                    return Err(format!("${name}: `{q}` has no values"));
                }
                out.insert(name, (v["multi"] == true, values));
            }
            other => return Err(format!("${name}: variable type {other:?}")),
        }
    }
    Ok(out)
}

/// `expr` with Grafana's variables replaced: a multi-value variable by all its values as a
/// regex alternation, a single one by its first value.
fn substitute(expr: &str, vars: &BTreeMap<String, (bool, Vec<String>)>, range: &str) -> String {
    let mut e = expr
        .replace("$__rate_interval", RATE_INTERVAL)
        .replace("$__interval", "1s")
        .replace("$__range", range);
    for (name, (multi, values)) in vars {
        let value = if *multi {
            values.join("|")
        } else {
            values[0].clone()
        };
        e = e
            .replace(&format!("${{{name}}}"), &value)
            .replace(&format!("${name}"), &value);
    }
    e
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    if !util::require_root("every_dashboard_query_returns_data_from_a_real_prometheus") {
        return;
    }
    assert!(
        Path::new(PROMETHEUS).exists(),
        "{PROMETHEUS} missing: run `cargo xtask setup` (it installs Debian's prometheus)"
    );
    let files = dashboards();
    assert!(files.len() >= 3, "dashboards: {files:?}");
    let _guard = util::exclusive();

    let fake = util::two_cpu_package();
    let _emulator = BusyEmulator::start(&fake.energy_uj, 5.0, 10.0);
    let tmp = fake.dir.path();
    let (ca, cert, _, key) = util::certificates(tmp);
    let token = tmp.join("token");
    std::fs::write(&token, format!("{}\n", crate::k8s_names::TOKEN)).expect("token");
    let (_kubelet, kube_port) = fake_kubelet(tmp, &cert, &key);
    let pod = format!(
        "{}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        root(),
        UID.replace('-', "_")
    );
    let app_cg = Cgroup::create(&Path::new(&pod).join(format!("cri-containerd-{APP_ID}.scope")));
    let app = Workload::spawn("while :; do :; done", None);
    app_cg.enter(app.pid());
    let _host = Workload::spawn("while :; do :; done", None);
    // A virtual machine: the fake hypervisor of the VM tests, one vCPU thread at 30%.
    let qemu = util::gcc(
        &util::workload("fake_vm.c"),
        &tmp.join("qemu-system-x86_64"),
        &["-O1", "-pthread"],
    );
    let _vm = Daemon(
        Command::new(&qemu)
            .args(["-name", "guest=web,debug-threads=on", "-smp", "1"])
            .env("FAKE_VM_VCPU_PCT", "30")
            .env("FAKE_VM_IO_PCT", "5")
            .spawn()
            .expect("start the fake VM"),
    );
    let vm_share = tmp.join("vms");

    let url = format!("https://127.0.0.1:{kube_port}/pods");
    let sysfs = fake.sysfs.to_str().expect("utf-8 path");
    let (_agent, agent_addr, _log) = spawn_agent(
        tmp,
        &[
            "--energy-source",
            "powercap",
            "--sysfs-root",
            sysfs,
            "--kube-pods-url",
            &url,
            "--kube-ca",
            ca.to_str().expect("utf-8"),
            "--kube-token",
            token.to_str().expect("utf-8"),
            "--vm-share",
            vm_share.to_str().expect("utf-8"),
            "--static-power-w",
            "5",
            "--carbon-intensity",
            "350",
        ],
    );

    let (_prometheus, prom) = util::prometheus(tmp, "energy-bpf", &agent_addr);
    let started = Instant::now();

    // Run every query until it has data, with a cap: rates need a few scrapes, pod names a
    // kubelet poll.
    let mut pending: Vec<(PathBuf, Query)> = Vec::new();
    for file in &files {
        let dash: Value =
            serde_json::from_str(&std::fs::read_to_string(file).expect("read dashboard"))
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", file.display()));
        assert!(
            dash["uid"].is_string() && dash["title"].is_string(),
            "{}: no uid or title",
            file.display()
        );
        let qs = queries(file, &dash);
        assert!(qs.len() >= 5, "{}: {} queries", file.display(), qs.len());
        pending.extend(qs.into_iter().map(|q| (file.clone(), q)));
    }
    let total = pending.len();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let cap = Duration::from_secs(90);
    let mut exported = None;
    while !pending.is_empty() && started.elapsed() < cap {
        std::thread::sleep(Duration::from_millis(500));
        let range = format!("{}s", started.elapsed().as_secs().max(5));
        let ex = Exported::read(&prom);
        pending.retain(|(file, q)| {
            let dash: Value =
                serde_json::from_str(&std::fs::read_to_string(file).expect("read dashboard"))
                    .expect("dashboard JSON");
            let vars = match variables(&prom, &dash) {
                Ok(v) => v,
                Err(e) => {
                    last.insert(q.at.clone(), e);
                    return true;
                }
            };
            let expr = substitute(&q.expr, &vars, &range);
            let wrong = problems(&expr, &ex, q.unit.as_deref());
            if !wrong.is_empty() {
                last.insert(q.at.clone(), format!("{expr}: {wrong:?}"));
                return true;
            }
            match instant(&prom, &expr) {
                Ok(r) if !r.is_empty() => false,
                Ok(_) => {
                    last.insert(q.at.clone(), format!("{expr}: empty result"));
                    true
                }
                Err(e) => {
                    last.insert(q.at.clone(), format!("{expr}: {e}"));
                    true
                }
            }
        });
        exported = Some(ex);
    }
    let failing: Vec<String> = pending
        .iter()
        .map(|(_, q)| format!("{}: {}", q.at, last.get(&q.at).map_or("", String::as_str)))
        .collect();
    assert!(
        failing.is_empty(),
        "{} of {total} dashboard queries failed within {cap:?}:\n{}",
        failing.len(),
        failing.join("\n")
    );
    eprintln!(
        "{total} dashboard queries returned data after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // The checks do bite: a metric, a label and a rate the agent does not have.
    let ex = exported.expect("Prometheus was read");
    let bad = [
        (
            "sum(rate(energy_bpf_pod_joules_total[10s]))",
            "metric `energy_bpf_pod_joules_total`",
        ),
        (
            "sum by (podname) (rate(energy_bpf_container_joules_total[10s]))",
            "label `podname`",
        ),
        ("rate(energy_bpf_process_watts[10s])", "not a counter"),
        ("energy_bpf_node_joules_total", "read raw"),
    ];
    for (expr, said) in bad {
        let p = problems(expr, &ex, None);
        assert!(
            p.iter().any(|x| x.contains(said)),
            "`{expr}` passed the checks: {p:?}"
        );
    }
    assert!(
        problems(
            "sum(rate(energy_bpf_node_joules_total[10s]))",
            &ex,
            Some("joule")
        )
        .iter()
        .any(|x| x.contains("unit")),
        "a joules rate shown in J passed"
    );
}

/// The provisioning file loads the dashboards' folder, and every dashboard chooses its
/// data source through `${datasource}` on every panel and query.
#[test]
fn dashboards_use_the_datasource_variable_and_are_provisioned() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana");
    let provider = std::fs::read_to_string(dir.join("provisioning/dashboards.yaml"))
        .expect("deploy/grafana/provisioning/dashboards.yaml");
    assert!(
        provider.contains("apiVersion: 1") && provider.contains("type: file"),
        "{provider}"
    );
    let files = dashboards();
    assert!(files.len() >= 2, "{files:?}");
    let mut uids = BTreeSet::new();
    for file in files {
        let dash: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("JSON");
        assert!(
            uids.insert(dash["uid"].as_str().expect("uid").to_owned()),
            "{}: uid used twice",
            file.display()
        );
        let vars = dash["templating"]["list"].as_array().expect("templating");
        assert!(
            vars.iter()
                .any(|v| v["name"] == "datasource" && v["type"] == "datasource"),
            "{}: no $datasource variable",
            file.display()
        );
        for p in panels(&dash).into_iter().filter(|p| p["type"] != "row") {
            let mut sources = vec![&p["datasource"]];
            sources.extend(
                p["targets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| &t["datasource"]),
            );
            for ds in sources {
                assert_eq!(
                    ds["uid"],
                    "${datasource}",
                    "{}: panel {} does not use ${{datasource}}",
                    file.display(),
                    p["title"]
                );
            }
        }
    }
}
