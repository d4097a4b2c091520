//! Golden report outputs: one small fixed recording (the fuzz seed `real-v3.ebpr`, 3.1 s
//! on a 2-CPU VM, modelled energy) through `report` as a table, JSON and CSV. Each output
//! must match its stored file byte for byte, and the three must carry the same energy per
//! process and the same total. A refactoring that changes any output fails here; an
//! intended change is stored again with `ENERGY_BPF_BLESS=1`.

use std::path::{Path, PathBuf};

use crate::util::{run, text};

fn manifest(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// `report --format FORMAT` of the seed recording, with an empty calibration file so a
/// machine's own calibration cannot change the numbers.
fn report(format: &str, dir: &Path) -> String {
    let calibration = dir.join("calibration.json");
    std::fs::write(&calibration, r#"{"version":1,"hosts":{}}"#).expect("calibration");
    let seed = manifest("fuzz/seeds/recording/real-v3.ebpr");
    let out = run(&[
        "report",
        seed.to_str().expect("path"),
        "--format",
        format,
        "--calibration",
        calibration.to_str().expect("path"),
    ]);
    assert!(
        out.status.success(),
        "report --format {format}: {}",
        text(&out)
    );
    String::from_utf8(out.stdout).expect("utf-8 report")
}

fn golden(name: &str, got: &str) {
    let path = manifest("tests/golden").join(name);
    if std::env::var_os("ENERGY_BPF_BLESS").is_some() {
        std::fs::write(&path, got).expect("store golden output");
        return;
    }
    let want = std::fs::read_to_string(&path).expect("golden file (ENERGY_BPF_BLESS=1 stores it)");
    assert!(
        got == want,
        "{name} changed; got:\n{got}\nwant:\n{want}\n(ENERGY_BPF_BLESS=1 stores an intended change)"
    );
}

#[test]
fn report_table_json_and_csv_match_the_golden_outputs_and_each_other() {
    // Three debug-build reports would skew a timing test running beside it.
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let table = report("table", dir.path());
    let json = report("json", dir.path());
    let csv = report("csv", dir.path());
    golden("report.txt", &table);
    golden("report.json", &json);
    golden("report.csv", &csv);

    // The same joules per process in every format: JSON and CSV to the last bits, the
    // table as printed (3 decimals).
    let doc: serde_json::Value = serde_json::from_str(&json).expect("report JSON");
    let processes = doc["processes"].as_array().expect("processes");
    assert!(processes.len() >= 3, "the recording has processes");
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().expect("csv header").split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).expect(name);
    let (pid_col, comm_col, j_col) = (col("pid"), col("comm"), col("package_j"));
    // Process rows by pid; `[idle/static]` and `[total]` (pid `-`) by name.
    let csv_j: std::collections::HashMap<String, f64> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let key = if f[pid_col] == "-" {
                f[comm_col]
            } else {
                f[pid_col]
            };
            (key.to_string(), f[j_col].parse().expect("joules"))
        })
        .collect();
    let mut attributed = 0.0;
    for p in processes {
        let pid = p["pid"].to_string();
        let j = p["energy_j"]["package"].as_f64().expect("package joules");
        attributed += j;
        // Within rounding: the JSON document sums a process's joules in another order
        // than the table/CSV rows do (9.54147516 vs 9.541475160000001 for one process).
        let c = *csv_j
            .get(&pid)
            .unwrap_or_else(|| panic!("pid {pid} in the CSV"));
        assert!(
            (c - j).abs() <= 1e-12 * j.abs().max(1.0),
            "pid {pid}: CSV {c} vs JSON {j}"
        );
        let row = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(pid.as_str()))
            .unwrap_or_else(|| panic!("pid {pid} in the table"));
        assert!(
            row.split_whitespace().any(|w| w == format!("{j:.3}")),
            "pid {pid}: table row {row:?} lacks {j:.3}"
        );
    }
    assert_eq!(csv_j.len(), processes.len() + 2, "the same rows");
    // The totals: every format's processes plus idle/static make the measured energy.
    let total = doc["total_j"].as_f64().expect("total_j");
    let idle = doc["idle_j"].as_f64().expect("idle_j");
    let unknown = doc["unknown_j"].as_f64().unwrap_or(0.0);
    assert!(
        (attributed + idle + unknown - total).abs() <= 1e-9 * total.max(1.0),
        "attributed {attributed} + idle {idle} + unknown {unknown} != total {total}"
    );
    assert_eq!(csv_j.get("[total]"), Some(&total), "CSV total vs JSON");
    assert_eq!(csv_j.get("[idle/static]"), Some(&idle), "CSV idle vs JSON");
    let total_row = table
        .lines()
        .find(|l| l.contains("[total]"))
        .expect("total row");
    assert!(
        total_row
            .split_whitespace()
            .any(|w| w == format!("{total:.3}")),
        "table total {total_row:?} vs {total:.3}"
    );
}
