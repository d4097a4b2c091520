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
    let status = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(status.success(), "gcc failed");
    bin
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
