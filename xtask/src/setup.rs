//! `cargo xtask setup`: makes a fresh machine of our kind (Debian 12, root) able to build,
//! run and test everything. Each step checks first and does nothing when already done.
use std::process::Command;

use crate::util::{self, Result, output, status};

/// Debian packages: (package, command or file proving it is installed, why).
const APT: &[(&str, &str, &str)] = &[
    (
        "llvm-22-dev",
        "/usr/lib/llvm-22/bin/llvm-config",
        "bpf-linker links against LLVM 22",
    ),
    (
        "linux-perf",
        "/usr/bin/perf",
        "`bench overhead` compares against perf record",
    ),
    ("tmux", "/usr/bin/tmux", "the `top` test drives it in tmux"),
    (
        "golang-go",
        "/usr/bin/go",
        "`go tool pprof` reads our pprof in tests",
    ),
    (
        "chromium",
        "/usr/bin/chromium",
        "flamegraph SVGs are opened in headless Chromium in tests",
    ),
    (
        "chromium-driver",
        "/usr/bin/chromedriver",
        "the web view test drives headless Chromium through WebDriver",
    ),
    (
        "redis-server",
        "/usr/bin/redis-server",
        "`bench server` measures each tool's cost to a saturated redis",
    ),
    (
        "redis-tools",
        "/usr/bin/redis-benchmark",
        "`bench server` drives redis with redis-benchmark",
    ),
    (
        "prometheus",
        "/usr/bin/prometheus",
        "the agent test scrapes the agent with a real Prometheus",
    ),
    (
        "nodejs",
        "/usr/bin/node",
        "the JIT test names Node functions from its perf map",
    ),
    (
        "openjdk-17-jdk-headless",
        "/usr/bin/javac",
        "the JIT test names Java methods from the JVM's perf map",
    ),
    (
        "qemu-system-x86",
        "/usr/bin/qemu-system-x86_64",
        "the virtual-machine test boots a real guest (TCG: nested KVM hangs on our machines)",
    ),
    (
        "busybox-static",
        "/bin/busybox",
        "the virtual-machine test's initramfs is a static busybox",
    ),
    (
        "cpio",
        "/usr/bin/cpio",
        "the virtual-machine test packs its initramfs with cpio",
    ),
];

const BPF_LINKER_VERSION: &str = "0.13.0";

/// Python packages from PyPI: (requirement, module proving it is installed, why).
const PIP: &[(&str, &str, &str)] = &[
    (
        "grpcio-tools==1.76.0",
        "grpc_tools",
        "the OTLP tests compile the official .proto files into a receiver of their own",
    ),
    (
        "kubernetes-validate==1.37.0",
        "kubernetes_validate",
        "the Kubernetes tests validate deploy/kubernetes/ strictly against the 1.30 schemas it ships",
    ),
];

/// cargo-fuzz, for `cargo xtask fuzz` (the targets in `fuzz/`).
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Runs every setup step.
pub fn run() -> Result {
    apt()?;
    pip()?;
    nightly()?;
    bpf_linker()?;
    cargo_fuzz()?;
    crate::guest_kernel::ensure()
}

fn cargo_fuzz() -> Result {
    let current = output("cargo", &["fuzz", "--version"]).unwrap_or_default();
    if current.contains(CARGO_FUZZ_VERSION) {
        return Ok(());
    }
    status(Command::new("cargo").args([
        "install",
        "--locked",
        &format!("cargo-fuzz@{CARGO_FUZZ_VERSION}"),
    ]))
}

fn pip() -> Result {
    for (req, module, why) in PIP {
        let present = Command::new("python3")
            .args(["-c", &format!("import {module}")])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if present {
            continue;
        }
        eprintln!("xtask: installing {req}: {why}");
        status(Command::new("python3").args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            req,
        ]))?;
    }
    Ok(())
}

fn apt() -> Result {
    let missing: Vec<&str> = APT
        .iter()
        .filter(|(_, proof, _)| !std::path::Path::new(proof).exists())
        .map(|(pkg, _, why)| {
            eprintln!("xtask: installing {pkg}: {why}");
            *pkg
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        return Err(format!(
            "packages missing ({}); run `sudo cargo xtask setup`",
            missing.join(" ")
        ));
    }
    status(Command::new("apt-get").arg("update").arg("-qq"))?;
    status(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// The eBPF nightly pinned in `ebpf-probes/probes/rust-toolchain.toml`.
pub fn pinned_nightly() -> Result<String> {
    let path = util::root().join("ebpf-probes/probes/rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("channel")?
                .trim()
                .strip_prefix('=')
                .map(|v| v.trim().trim_matches('"').to_owned())
        })
        .ok_or_else(|| format!("no channel in {}", path.display()))
}

fn nightly() -> Result {
    let toolchain = pinned_nightly()?;
    let installed = output("rustup", &["toolchain", "list"]).unwrap_or_default();
    let has_src = output(
        "rustup",
        &[
            "component",
            "list",
            "--installed",
            "--toolchain",
            &toolchain,
        ],
    )
    .is_some_and(|c| c.lines().any(|l| l.starts_with("rust-src")));
    if installed.lines().any(|l| l.starts_with(&toolchain)) && has_src {
        return Ok(());
    }
    status(Command::new("rustup").args([
        "toolchain",
        "install",
        &toolchain,
        "--profile",
        "minimal",
        "--component",
        "rust-src",
    ]))
}

fn bpf_linker() -> Result {
    let current = output("bpf-linker", &["--version"]).unwrap_or_default();
    if current.contains(BPF_LINKER_VERSION) {
        return Ok(());
    }
    status(
        Command::new("cargo")
            .args([
                "install",
                "--locked",
                &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            ])
            .args(["--no-default-features", "--features", "llvm-22", "--force"])
            // bpf-linker's build finds LLVM through LLVM_PREFIX only; without it, it picks
            // the system LLVM 14 and fails with "unable to find library -lLLVM".
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
    )
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
