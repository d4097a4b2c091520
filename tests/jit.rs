//! JIT-compiled code named from perf maps through the real recorder: a Node script
//! (`--perf-basic-prof`) and a Java program (`-XX:+DumpPerfMapAtExit`), each with two hot
//! functions at 3:1 work (`tests/workloads/burn.js`, `Burn.java`). The map file is deleted
//! before any report, so names must come from the recording. Frame kinds are checked in
//! the outputs people open: SVG colours, `go tool pprof` (function, file, line), OTLP
//! (`profile.frame.type`, decoded with the official definitions).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::{report_json, report_json_with, require_root, run, text, workload};

/// Collapsed stacks of process `pid` (`comm;frame;...` → weight) in `domain`.
fn collapsed(file: &Path, pid: u32, domain: &str) -> HashMap<String, u64> {
    crate::util::collapsed(file, &["--domain", domain, "--pid", &pid.to_string()])
}

/// Weight of stacks with a frame for which `frame` holds, and the total.
fn weight(stacks: &HashMap<String, u64>, frame: impl Fn(&str) -> bool) -> (u64, u64) {
    let total = stacks.values().sum();
    let hit = stacks
        .iter()
        .filter(|(s, _)| s.split(';').skip(1).any(&frame))
        .map(|(_, n)| n)
        .sum();
    (hit, total)
}

/// The pid of the recorded process named `comm`.
fn pid_of(file: &Path, comm: &str) -> u32 {
    let report = report_json(file);
    let p = report["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["comm"] == comm))
        .unwrap_or_else(|| panic!("no {comm} process in {report}"));
    p["pid"].as_u64().expect("pid") as u32
}

/// `record --unwind dwarf -F 999 -- ARGV` into `dir/NAME.ebpr` (999 Hz: 1,000–2,000 samples
/// of the light function); returns the file and the workload's measured time ratio
/// heavy/light (its `time_s HEAVY LIGHT` line).
fn record(dir: &Path, name: &str, argv: &[&str]) -> (PathBuf, f64) {
    let file = dir.join(format!("{name}.ebpr"));
    let mut args = vec![
        "record",
        "--energy-source",
        "model",
        "--unwind",
        "dwarf",
        "-F",
        "999",
        "-o",
        file.to_str().expect("path"),
        "--",
    ];
    args.extend_from_slice(argv);
    let out = run(&args);
    assert!(out.status.success(), "record failed: {}", text(&out));
    let truth = crate::util::time_s(&out.stdout)
        .map(|[heavy, light]| heavy / light)
        .unwrap_or_else(|| panic!("{name} printed no `time_s HEAVY LIGHT`: {}", text(&out)));
    (file, truth)
}

/// Checks the two hot JIT functions of `pid` in `file`: names from the recording alone,
/// at least 85% of the energy under them, their energy ratio within the sampling error of
/// the time the workload measured in each (`truth`: the work is 3:1, but the compiled code
/// of the two need not run 3:1 in time); the walk crosses from the JIT frames back into
/// table-walked native code (`native_caller`); then the outputs.
///
/// The ratio of two sample counts n_h/n_l has a relative standard error of
/// sqrt(1/n_h + 1/n_l): 3.6% with 1,000 light samples. The bound is four of those, and never
/// under 10%; fewer than 500 light samples fail as too few to tell.
fn check(file: &Path, pid: u32, truth: f64, names: [&str; 2], native_caller: &str, what: &str) {
    let [heavy, light] = names;
    let stacks = collapsed(file, pid, "package");
    let is = |name: &str| {
        let name = name.to_string();
        move |f: &str| f.contains(&name) && f.ends_with("_[j]")
    };
    let (h, total) = weight(&stacks, is(heavy));
    let (l, _) = weight(&stacks, is(light));
    let share = (h + l) as f64 / total.max(1) as f64;
    let ratio = h as f64 / l.max(1) as f64;
    eprintln!(
        "{what}: {:.1}% of the process's energy under {heavy}/{light}, ratio {ratio:.2} for a measured {truth:.2} ({h} / {l} µJ of {total})",
        share * 100.0
    );
    assert!(total > 0, "{what}: no energy for pid {pid}: {stacks:?}");
    assert!(
        share >= 0.85,
        "{what}: {:.1}% under the hot functions (want >= 85%); top stacks: {:?}",
        share * 100.0,
        top(&stacks)
    );
    let [n_h, n_l] = [heavy, light].map(|name| samples(file, name));
    assert!(
        n_l >= 500,
        "{what}: {n_l} samples of {light}: too few to test the ratio"
    );
    let bound = (4.0 * (1.0 / n_h as f64 + 1.0 / n_l as f64).sqrt()).max(0.1);
    eprintln!(
        "{what}: {n_h} / {n_l} samples; bound ±{:.1}%",
        bound * 100.0
    );
    assert!(
        (ratio / truth - 1.0).abs() <= bound,
        "{what}: heavy/light = {ratio:.2} (want the measured {truth:.2} ± {:.1}%)",
        bound * 100.0
    );
    // Crossing: stacks through a hot JIT function reach native code above it.
    let (crossed, under_heavy) = weight(
        &stacks
            .iter()
            .filter(|(s, _)| s.split(';').any(is(heavy)))
            .map(|(s, n)| (s.clone(), *n))
            .collect(),
        |f| f == native_caller,
    );
    let crossed = crossed as f64 / under_heavy.max(1) as f64;
    eprintln!(
        "{what}: {:.1}% of {heavy}'s energy reaches {native_caller}",
        crossed * 100.0
    );
    assert!(
        crossed >= 0.5,
        "{what}: {:.1}% of {heavy}'s stacks reach {native_caller} (want >= 50%): {:?}",
        crossed * 100.0,
        top(&stacks)
    );
    outputs(file, pid, heavy, what);
}

/// Samples whose leaf is a JIT function named `name` (`report --by function`).
fn samples(file: &Path, name: &str) -> u64 {
    let report = report_json_with(file, &["--by", "function"]);
    report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .filter(|r| {
            r["module"] == "[jit]" && r["function"].as_str().is_some_and(|f| f.contains(name))
        })
        .filter_map(|r| r["samples"].as_u64())
        .sum()
}

fn top(stacks: &HashMap<String, u64>) -> Vec<(&String, &u64)> {
    let mut v: Vec<_> = stacks.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.truncate(5);
    v
}

/// SVG: the JIT frame is green; pprof: `go tool pprof` names it with its file (and line
/// where the runtime says it); OTLP: its location's `profile.frame.type`.
fn outputs(file: &Path, pid: u32, heavy: &str, what: &str) {
    let dir = file.parent().expect("dir");
    let pid_s = pid.to_string();
    let svg = dir.join(format!("{what}.svg"));
    let pb = dir.join(format!("{what}.pb.gz"));
    let otlp = dir.join(format!("{what}.otlp"));
    for (format, out) in [("svg", &svg), ("pprof", &pb), ("otlp", &otlp)] {
        let o = run(&[
            "flamegraph",
            "--format",
            format,
            "--pid",
            &pid_s,
            "-o",
            out.to_str().expect("path"),
            file.to_str().expect("path"),
        ]);
        assert!(
            o.status.success(),
            "flamegraph --format {format}: {}",
            text(&o)
        );
    }
    // SVG: the rectangle after the hot function's title is filled green.
    let text_svg = std::fs::read_to_string(&svg).expect("svg");
    let at = text_svg
        .find(&format!("<title>{heavy}"))
        .or_else(|| text_svg.find(heavy))
        .unwrap_or_else(|| panic!("{what}: the SVG does not draw {heavy}"));
    let rest = &text_svg[at..];
    let fill = rest.find("fill=\"rgb(").expect("a fill") + 10;
    let end = rest[fill..].find(')').expect("rgb(...)") + fill;
    let rgb: Vec<u32> = rest[fill..end]
        .split(',')
        .map(|c| c.trim().parse().expect("colour"))
        .collect();
    assert!(
        rgb[1] > rgb[0] + 80 && rgb[1] > rgb[2] + 80,
        "{what}: {heavy} is not green in the SVG: {rgb:?}"
    );
    // pprof: go tool pprof lists the function with its source file.
    let home = tempfile::tempdir().expect("tempdir");
    let o = Command::new("go")
        .args(["tool", "pprof", "-top", "-lines"])
        .arg(&pb)
        .env("HOME", home.path())
        .env("PPROF_TMPDIR", home.path())
        .output()
        .expect("run go tool pprof (apt-get install -y golang-go)");
    let listing = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "go tool pprof: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!("{what}: go tool pprof -top -lines:\n{listing}");
    assert!(
        listing.lines().any(|l| l.contains(heavy)),
        "{what}: go tool pprof does not list {heavy}:\n{listing}"
    );
    // OTLP, decoded by the official definitions.
    let decoded = crate::otlp::decode(&otlp);
    let types = &decoded["profiles"][0]["frame_types"];
    let kind = types
        .as_object()
        .and_then(|m| m.iter().find(|(f, _)| f.contains(heavy)))
        .map(|(_, t)| t.clone())
        .unwrap_or_else(|| panic!("{what}: no OTLP location names {heavy}: {types}"));
    let want = if what == "node" { "v8js" } else { "jvm" };
    assert_eq!(kind, want, "{what}: profile.frame.type of {heavy}");
}

/// Deletes the perf map of `pid` (as a runtime's cleanup would), and says whether there
/// was one.
fn delete_map(pid: u32) -> bool {
    std::fs::remove_file(format!("/tmp/perf-{pid}.map")).is_ok()
}

#[test]
fn node_functions_are_named_from_its_perf_map_after_it_is_gone() {
    if !require_root("node_functions_are_named_from_its_perf_map_after_it_is_gone") {
        return;
    }
    let _guard = crate::util::exclusive();
    let Some(node) = which("node") else {
        panic!("node missing: install nodejs (cargo xtask setup)");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("burn.js");
    std::fs::copy(workload("burn.js"), &script).expect("copy burn.js");
    // V8's own log (which --perf-basic-prof turns on) goes to the temp dir, not the cwd.
    let v8_log = format!("--logfile={}", dir.path().join("v8.log").display());
    let (file, truth) = record(
        dir.path(),
        "node",
        &[
            &node,
            "--perf-basic-prof",
            "--no-logfile-per-isolate",
            &v8_log,
            "--no-turbo-inlining",
            script.to_str().expect("path"),
            // Long enough that Node's start (V8 and OpenSSL set-up, ~0.5 s of CPU on a
            // loaded machine) is a small part of its energy.
            "15",
            // And on until hotLight has had 1 s of CPU (about 1,000 samples at 999 Hz),
            // however slow the machine, for at most 90 s.
            "1",
            "90",
        ],
    );
    let pid = pid_of(&file, "node");
    assert!(delete_map(pid), "node wrote no /tmp/perf-{pid}.map");
    check(
        &file,
        pid,
        truth,
        ["hotHeavy", "hotLight"],
        "__libc_start_call_main",
        "node",
    );
    // The names keep the script's file and line (where each function is defined).
    let source = std::fs::read_to_string(&script).expect("burn.js");
    let line_of = |f: &str| {
        1 + source
            .lines()
            .position(|l| l.starts_with(&format!("function {f}(")))
            .unwrap_or_else(|| panic!("burn.js defines {f}"))
    };
    let (heavy_at, light_at) = (
        format!("hotHeavy (burn.js:{})", line_of("hotHeavy")),
        format!("hotLight (burn.js:{})", line_of("hotLight")),
    );
    let out = run(&["report", "--by", "function", file.to_str().expect("path")]);
    let table = text(&out);
    assert!(out.status.success(), "report --by function: {table}");
    assert!(
        table.contains(&heavy_at) && table.contains(&light_at),
        "report --by function names the JS functions with file:line ({heavy_at}, \
         {light_at}):\n{table}"
    );
    // The busy thread shows its busiest JS function.
    let out = run(&["report", "--by", "thread", file.to_str().expect("path")]);
    let table = text(&out);
    assert!(out.status.success(), "report --by thread: {table}");
    assert!(
        table.contains(&format!("node [{heavy_at}]")),
        "report --by thread names node's busiest JS function:\n{table}"
    );
}

#[test]
fn java_methods_are_named_from_the_map_written_at_exit() {
    if !require_root("java_methods_are_named_from_the_map_written_at_exit") {
        return;
    }
    let _guard = crate::util::exclusive();
    let (Some(java), Some(javac)) = (which("java"), which("javac")) else {
        panic!(
            "java/javac missing: apt-get install -y openjdk-17-jdk-headless (cargo xtask setup)"
        );
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(&javac)
        .arg("-d")
        .arg(dir.path())
        .arg(workload("Burn.java"))
        .output()
        .expect("run javac");
    assert!(
        out.status.success(),
        "javac: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let classes = dir.path().to_str().expect("path").to_string();
    let (file, truth) = record(
        dir.path(),
        "java",
        &[
            &java,
            "-XX:+UnlockDiagnosticVMOptions",
            "-XX:+DumpPerfMapAtExit",
            "-XX:+PreserveFramePointer",
            "-XX:CompileCommand=quiet",
            "-XX:CompileCommand=dontinline,Burn::hot*",
            "-cp",
            &classes,
            "Burn",
            "8",
            // As for Node: on until hotLight has had 1 s of CPU, at most 90 s.
            "1",
            "90",
        ],
    );
    let pid = pid_of(&file, "java");
    assert!(delete_map(pid), "java wrote no /tmp/perf-{pid}.map");
    check(
        &file,
        pid,
        truth,
        ["Burn.hotHeavy", "Burn.hotLight"],
        "JavaMain",
        "java",
    );
}

/// The path of `tool` on PATH.
fn which(tool: &str) -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !path.is_empty()).then_some(path)
}
