//! Builds the eBPF probes with the pinned nightly (aya-build) and compiles the protobuf
//! schemas with protox + prost-build, so no external `protoc` is needed.
use std::{fs, path::Path};

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    quietly(build_probes)?;
    build_protos()
}

/// Runs `f` with this script's stdout going to a log file. aya-build forwards every line of
/// the probe build as a `cargo:warning`, which buries a newcomer's first build under dozens
/// of warnings; here the cargo directives pass through, the build's own lines stay in
/// `$OUT_DIR/probes-build.log`, and they are printed only when the build fails.
fn quietly(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    use std::io::{BufRead as _, Write as _};
    use std::os::fd::AsRawFd as _;

    let out_dir = std::env::var("OUT_DIR").context("OUT_DIR is not set")?;
    let log_path = Path::new(&out_dir).join("probes-build.log");
    let log =
        fs::File::create(&log_path).with_context(|| format!("creating {}", log_path.display()))?;
    std::io::stdout().flush().context("flushing stdout")?;
    // SAFETY: dup/dup2/close on this process's own descriptors; fd 1 is restored below
    // before anything else writes to it.
    let saved = unsafe { libc::dup(1) };
    anyhow::ensure!(saved >= 0, "dup(1) failed");
    // SAFETY: as above; `log` outlives the redirection.
    let redirected = unsafe { libc::dup2(log.as_raw_fd(), 1) };
    anyhow::ensure!(redirected >= 0, "dup2 failed");
    let result = f();
    let flushed = std::io::stdout().flush();
    // SAFETY: restores the saved descriptor and closes the copy.
    unsafe {
        libc::dup2(saved, 1);
        libc::close(saved);
    }
    flushed.context("flushing stdout")?;
    let mut hidden = Vec::new();
    for line in std::io::BufReader::new(fs::File::open(&log_path)?).lines() {
        let line = line?;
        match line.strip_prefix("cargo:warning=") {
            // A skipped build is worth a warning; compiler progress is not.
            Some(text) if !text.contains("skipping eBPF build") => hidden.push(text.to_owned()),
            _ => println!("{line}"),
        }
    }
    if result.is_err() {
        for line in &hidden {
            eprintln!("{line}");
        }
    }
    result
}

fn pinned_toolchain(root_dir: &Path) -> anyhow::Result<String> {
    let path = root_dir.join("rust-toolchain.toml");
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .find_map(|line| {
            let rest = line
                .trim()
                .strip_prefix("channel")?
                .trim()
                .strip_prefix('=')?;
            Some(rest.trim().trim_matches('"').to_owned())
        })
        .ok_or_else(|| anyhow!("no `channel = ...` in {}", path.display()))
}

fn build_probes() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let probes = packages
        .into_iter()
        .find(|p| p.name.as_str() == "energy-bpf-probes")
        .ok_or_else(|| anyhow!("energy-bpf-probes package not found"))?;
    let root_dir = probes
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("manifest path has no parent"))?;
    let toolchain = pinned_toolchain(root_dir.as_std_path())?;
    let package = aya_build::Package {
        name: probes.name.as_str(),
        root_dir: root_dir.as_str(),
        ..Default::default()
    };
    aya_build::build_ebpf([package], aya_build::Toolchain::Custom(&toolchain))
        .with_context(|| format!("building eBPF probes with {toolchain}; run `cargo xtask setup`"))
}

fn build_protos() -> anyhow::Result<()> {
    let protos = [
        "../proto/energy_bpf.proto",
        "../proto/profile.proto",
        "../proto/agent.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["../proto"]).context("compiling .proto files")?;
    prost_build::Config::new()
        .compile_fds(fds)
        .context("generating Rust from .proto files")?;
    // OTLP profiles, pinned to one opentelemetry-proto release (proto/otlp/README.md).
    let otlp = [
        "../proto/otlp/opentelemetry/proto/collector/profiles/v1development/profiles_service.proto",
    ];
    println!("cargo:rerun-if-changed=../proto/otlp");
    let fds =
        protox::compile(otlp, ["../proto/otlp"]).context("compiling the OTLP .proto files")?;
    prost_build::Config::new()
        .compile_fds(fds)
        .context("generating Rust from the OTLP .proto files")?;
    Ok(())
}
