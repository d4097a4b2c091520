//! Builds the eBPF probes with the pinned nightly (aya-build) and compiles the protobuf
//! schemas with protox + prost-build, so no external `protoc` is needed.
use std::{fs, path::Path};

use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    build_probes()?;
    build_protos()
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
    let protos = ["../proto/energy_bpf.proto", "../proto/profile.proto"];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(protos, ["../proto"]).context("compiling .proto files")?;
    prost_build::Config::new()
        .compile_fds(fds)
        .context("generating Rust from .proto files")?;
    Ok(())
}
