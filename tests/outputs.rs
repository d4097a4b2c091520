//! Outputs open in the tools people already use: the pprof file in `go tool pprof`, the
//! flamegraph SVG in headless Chromium (screenshot taken), with the workload's functions
//! (`tests/workloads/burn.c`) by name.
//!
//! The `assert_*` and `check_recording` helpers take files made by `energy-bpf record` /
//! `flamegraph`; one test drives them with a recording of `burn` made by the real recorder
//! (root), another with a profile exported from a synthetic recording whose addresses are
//! real ones of a running `burn`.

use std::path::{Path, PathBuf};
use std::process::Command;

use energy_bpf::output::{ProfileSink, collapsed, pprof, svg};
use energy_bpf::pb::v1::{Header, Sample, ThreadInfo};
use energy_bpf::profile::{self, Filter, SampleValues};
use energy_bpf::record::Recording;
use energy_bpf::symbolize::{Symbolizer, process_mappings};

/// The two hot functions of the workload.
pub const BURN_FUNCTIONS: [&str; 2] = ["hot_heavy", "hot_light"];

/// Builds `tests/workloads/burn.c` with frame pointers and DWARF into `dir`.
pub fn build_burn(dir: &Path) -> PathBuf {
    let src = crate::util::workload("burn.c");
    let out = dir.join("burn");
    crate::util::gcc(
        &src,
        &out,
        &["-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline"],
    )
}

/// Installs a Debian package when `probe` is not on PATH (CI runs as root).
fn ensure_tool(probe: &str, package: &str) {
    if Command::new("sh")
        .args(["-c", &format!("command -v {probe}")])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return;
    }
    eprintln!("{probe} missing: installing Debian package {package}");
    let ok = Command::new("sh")
        .args(["-c", &format!("apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package}")])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "cannot install {package}: run `apt-get install -y {package}` as root"
    );
}

/// `go tool pprof -top FILE` succeeds and lists every one of `functions`.
pub fn assert_pprof_lists(pprof_file: &Path, functions: &[&str]) {
    ensure_tool("go", "golang-go");
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(pprof_file)
        // pprof keeps a cache under $HOME; keep it out of the real one.
        .env("HOME", home.path())
        .env("PPROF_TMPDIR", home.path())
        .output()
        .expect("run go tool pprof");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "go tool pprof failed on {}: {}",
        pprof_file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    for f in functions {
        assert!(
            text.contains(f),
            "go tool pprof -top does not list {f}:\n{text}"
        );
    }
}

fn chromium(args: &[&str], url: &str) -> std::process::Output {
    ensure_tool("chromium", "chromium");
    let profile = tempfile::tempdir().expect("tempdir");
    Command::new("timeout")
        .arg("120")
        .arg("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium")
}

/// Headless Chromium parses the SVG without an XML error, its DOM names `functions`, and a
/// screenshot is written to `png`.
pub fn assert_svg_opens(svg_file: &Path, functions: &[&str], png: &Path) {
    let abs = svg_file.canonicalize().expect("svg path");
    let url = format!("file://{}", abs.display());
    let dom = chromium(&["--dump-dom"], &url);
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.status.success(),
        "chromium --dump-dom failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    assert!(
        !dom_text.contains("parsererror")
            && !dom_text.contains("This page contains the following errors"),
        "Chromium reports an XML error in {}",
        svg_file.display()
    );
    for f in functions {
        assert!(dom_text.contains(f), "the rendered SVG does not name {f}");
    }
    let shot = format!("--screenshot={}", png.display());
    let out = chromium(&[&shot, "--window-size=1200,800"], &url);
    assert!(
        out.status.success(),
        "chromium screenshot failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(png).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG"), "screenshot is not a PNG");
    assert!(
        bytes.len() > 10_000,
        "screenshot of {} bytes looks blank",
        bytes.len()
    );
}

/// Runs `energy-bpf flamegraph` on a recording in every format and checks each output names
/// `functions` (SVG in Chromium, pprof in go tool pprof). `dir` receives the files.
pub fn check_recording(recording: &Path, functions: &[&str], dir: &Path) {
    let exe = env!("CARGO_BIN_EXE_energy-bpf");
    for (format, name) in [
        ("svg", "flame.svg"),
        ("collapsed", "flame.folded"),
        ("pprof", "flame.pb.gz"),
        ("speedscope", "flame.speedscope.json"),
    ] {
        let out_path = dir.join(name);
        let out = Command::new(exe)
            .args(["flamegraph", "--format", format, "-o"])
            .arg(&out_path)
            .arg(recording)
            .output()
            .expect("run energy-bpf flamegraph");
        assert!(
            out.status.success(),
            "energy-bpf flamegraph --format {format} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&out_path)
            .expect("output written")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name} must be private");
        match format {
            "pprof" => assert_pprof_lists(&out_path, functions),
            "svg" => assert_svg_opens(&out_path, functions, &dir.join("flame.png")),
            _ => {
                let text = std::fs::read_to_string(&out_path).expect("read output");
                for f in functions {
                    assert!(text.contains(f), "{format} output does not name {f}");
                }
            }
        }
    }
}

/// A recording of `burn` made by hand: real mappings of a live burn, samples at its hot
/// functions (3 heavy : 1 light), called from main.
fn synthetic_burn_recording(bin: &Path) -> Recording {
    let mut child = Command::new(bin).arg("10").spawn().expect("spawn burn");
    let pid = child.id();
    let exe = bin.canonicalize().expect("canonical");
    let mut maps = Vec::new();
    for _ in 0..200 {
        maps = process_mappings(pid, 0).expect("maps");
        if maps.iter().any(|m| Path::new(&m.path) == exe) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    child.kill().expect("kill burn");
    child.wait().expect("reap burn");
    let m = maps
        .iter()
        .find(|m| Path::new(&m.path) == exe)
        .expect("burn mapped")
        .clone();
    let nm = Command::new("nm").arg(bin).output().expect("nm");
    let nm = String::from_utf8_lossy(&nm.stdout);
    let sym = |name: &str| -> u64 {
        let v = nm
            .lines()
            .find_map(|l| {
                l.ends_with(&format!(" {name}"))
                    .then(|| l.split(' ').next())
                    .flatten()
            })
            .unwrap_or_else(|| panic!("{name} in nm"));
        // gcc's PIE text segment has file offset == vaddr: addr = start + vaddr - offset.
        m.start + u64::from_str_radix(v, 16).expect("hex") - m.file_offset
    };
    let (heavy, light, main) = (sym("hot_heavy") + 8, sym("hot_light") + 8, sym("main") + 20);
    let mut rec = Recording {
        header: Header {
            sample_hz: 99,
            hostname: "test".into(),
            ..Header::default()
        },
        end_ns: 1_000_000_000,
        ..Recording::default()
    };
    rec.threads.insert(
        pid,
        ThreadInfo {
            tid: pid,
            tgid: pid,
            comm: "burn".into(),
            ..ThreadInfo::default()
        },
    );
    rec.mappings.insert(pid, maps);
    for i in 0..40u64 {
        let leaf = if i % 4 == 3 { light } else { heavy };
        rec.samples.push(Sample {
            ts_ns: i * 10_000_000,
            cpu: (i % 2) as u32,
            tid: pid,
            tgid: pid,
            user_stack: vec![leaf, main],
            ..Sample::default()
        });
    }
    rec
}

#[test]
fn burn_profile_opens_in_go_pprof_and_chromium() {
    // gcc, go and Chromium would skew a timing test running beside them.
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = build_burn(dir.path());
    let rec = synthetic_burn_recording(&bin);
    let p = profile::build(
        &rec,
        &SampleValues::cpu_time(&rec),
        &mut Symbolizer::with_kallsyms(None),
        &Filter::default(),
    );

    let mut folded = Vec::new();
    collapsed::Collapsed {
        value: "cpu".into(),
    }
    .write_profile(&p, &mut folded)
    .expect("collapsed");
    let folded = String::from_utf8(folded).expect("utf-8");
    // 30 heavy and 10 light samples of 1e9/99 ns each.
    assert!(
        folded.contains("burn;main;hot_heavy 303030303\n"),
        "{folded}"
    );
    assert!(
        folded.contains("burn;main;hot_light 101010101\n"),
        "{folded}"
    );

    let pb = dir.path().join("burn.pb.gz");
    let mut f = std::fs::File::create(&pb).expect("create");
    pprof::Pprof {
        default_value: Some("cpu".into()),
    }
    .write_profile(&p, &mut f)
    .expect("pprof");
    assert_pprof_lists(&pb, &BURN_FUNCTIONS);

    let svg_path = dir.path().join("burn.svg");
    let mut f = std::fs::File::create(&svg_path).expect("create");
    svg::Svg {
        value: "cpu".into(),
        width: Some(1200),
    }
    .write_profile(&p, &mut f)
    .expect("svg");
    let png = std::env::var_os("ENERGY_BPF_SCREENSHOT")
        .map_or_else(|| dir.path().join("burn.png"), PathBuf::from);
    assert_svg_opens(&svg_path, &BURN_FUNCTIONS, &png);
}

/// Self energy (J) of `function` in `report --by function --format csv` output.
fn self_energy(csv: &str, function: &str) -> f64 {
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = header
        .iter()
        .position(|c| c.starts_with("self_") && c.ends_with("_j"))
        .unwrap_or_else(|| panic!("no self energy column in {csv}"));
    lines
        .find(|l| l.split(',').next() == Some(function))
        .and_then(|l| l.split(',').nth(col))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("report --by function has no {function} row:\n{csv}"))
}

#[test]
fn recorded_burn_opens_everywhere_with_energy_by_function() {
    if !crate::util::require_root("recorded_burn_opens_everywhere_with_energy_by_function") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = build_burn(dir.path());
    let file = dir.path().join("burn.ebpr");
    // The model, pinned: the labels checked below hold on machines with RAPL too.
    let out = crate::util::run(&[
        "record",
        "-F",
        "999",
        "--energy-source",
        "model",
        "-o",
        file.to_str().expect("utf-8 path"),
        "--",
        bin.to_str().expect("utf-8 path"),
        "4",
    ]);
    assert!(
        out.status.success(),
        "record failed: {}",
        crate::util::text(&out)
    );

    check_recording(&file, &BURN_FUNCTIONS, dir.path());
    // Whole stacks: the frame-pointer walk keeps main between libc and the hot functions.
    let folded = std::fs::read_to_string(dir.path().join("flame.folded")).expect("folded written");
    for f in BURN_FUNCTIONS {
        assert!(
            folded
                .lines()
                .any(|l| l.starts_with("burn;") && l.contains(&format!(";main;{f} "))),
            "no complete burn;...;main;{f} stack in:\n{}",
            folded.lines().take(10).collect::<Vec<_>>().join("\n")
        );
    }
    // The model gives the energy, and the title says so.
    let svg = std::fs::read_to_string(dir.path().join("flame.svg")).expect("svg written");
    let title = svg
        .split("<title>")
        .nth(1)
        .and_then(|t| t.split("</title>").next())
        .unwrap_or_default();
    let head: String = svg.chars().take(20_000).collect();
    assert!(
        head.contains("Energy (package):") && head.contains("(estimated)"),
        "flamegraph title must state the energy and `estimated` (first title: {title})"
    );

    let out = crate::util::run(&[
        "report",
        "--by",
        "function",
        "--format",
        "csv",
        file.to_str().expect("utf-8 path"),
    ]);
    assert!(
        out.status.success(),
        "report failed: {}",
        crate::util::text(&out)
    );
    let csv = String::from_utf8_lossy(&out.stdout).into_owned();
    let (heavy, light) = (
        self_energy(&csv, "hot_heavy"),
        self_energy(&csv, "hot_light"),
    );
    // hot_heavy does 3x the work per call of hot_light.
    assert!(
        heavy > 1.5 * light && light > 0.0,
        "hot_heavy {heavy} J vs hot_light {light} J:\n{csv}"
    );
    assert!(
        csv.lines().skip(1).all(|l| l.ends_with(",true")),
        "rows tagged estimated"
    );

    let out = crate::util::run(&[
        "report",
        "--by",
        "function",
        file.to_str().expect("utf-8 path"),
    ]);
    assert!(
        out.status.success(),
        "report failed: {}",
        crate::util::text(&out)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for f in BURN_FUNCTIONS {
        assert!(
            table.contains(f),
            "report --by function table lacks {f}:\n{table}"
        );
    }
    assert!(table.contains("[estimated]"), "{table}");
}
