use super::*;

fn report(estimated: bool) -> Report {
    let row = |pid, comm: &str, j: f64, share| ReportRow {
        key: RowKey::Process {
            pid,
            comm: comm.into(),
        },
        cpu_ns: j * 1e9,
        samples: (j * 100.0) as u64,
        energy: vec![EnergyCell {
            joules: j,
            ci_low: j * 0.9,
            ci_high: j * 1.1,
        }],
        total_energy: None,
        power_w: j / 10.0,
        share,
        cpu_share: Vec::new(),
    };
    Report {
        by: By::Process,
        domains: vec!["package".into()],
        rows: vec![
            row(1, "init", 1.0, 0.1),
            row(42, "burn, \"x\"", 6.0, 0.6),
            row(7, "sshd", 3.0, 0.3),
        ],
        estimated,
        title: "energy-bpf on box, 10.0 s, model".into(),
        notes: Vec::new(),
        cpus: Vec::new(),
        duration_ns: 0,
        footer: Vec::new(),
        model_row: None,
        co2e_g_per_j: None,
    }
}

fn render_str(r: &Report, opts: &RenderOptions, format: Format) -> String {
    let mut out = Vec::new();
    render(r, opts, format, &mut out).expect("render");
    String::from_utf8(out).expect("utf-8")
}

#[test]
fn table_sorted_by_energy_with_estimated_tag() {
    let text = render_str(&report(true), &RenderOptions::default(), Format::Table);
    let want = "\
energy-bpf on box, 10.0 s, model [estimated]
PID  COMM       CPU_S  SAMPLES  PACKAGE_J    PACKAGE_CI95  POWER_W  SHARE_PCT
 42  burn, \"x\"  6.000      600      6.000  [5.400, 6.600]     0.60       60.0
  7  sshd       3.000      300      3.000  [2.700, 3.300]     0.30       30.0
  1  init       1.000      100      1.000  [0.900, 1.100]     0.10       10.0
energy is estimated (modelled, not measured); intervals are 95%
";
    assert_eq!(text, want);
}

#[test]
fn sort_by_named_column_and_limit() {
    let opts = RenderOptions {
        sort: Some("comm".into()),
        limit: Some(2),
    };
    let text = render_str(&report(false), &opts, Format::Csv);
    let want = "\
pid,comm,cpu_s,samples,package_j,package_ci_low,package_ci_high,power_w,share_pct,estimated
42,\"burn, \"\"x\"\"\",6,600,6,5.4,6.6000000000000005,0.6,60,false
1,init,1,100,1,0.9,1.1,0.1,10,false
";
    assert_eq!(text, want);
    let opts = RenderOptions {
        sort: Some("pid".into()),
        limit: None,
    };
    let text = render_str(&report(false), &opts, Format::Csv);
    let pids: Vec<&str> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split(',').next())
        .collect();
    assert_eq!(pids, vec!["42", "7", "1"]);
}

#[test]
fn unknown_or_ambiguous_sort_column_is_an_error() {
    let mut out = Vec::new();
    for bad in ["watts", "package"] {
        let opts = RenderOptions {
            sort: Some(bad.into()),
            limit: None,
        };
        let err = render(&report(false), &opts, Format::Table, &mut out).expect_err(bad);
        assert!(err.to_string().contains("columns are pid, comm"), "{err}");
    }
}

#[test]
fn json_has_meta_and_rows() {
    let text = render_str(&report(true), &RenderOptions::default(), Format::Json);
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["estimated"], true);
    assert_eq!(v["rows"][0]["pid"], 42);
    assert_eq!(
        v["rows"][0]["package_ci95"],
        serde_json::json!([5.4, 6.6000000000000005])
    );
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(3));
}

#[test]
fn thread_rows_without_energy_sort_by_cpu() {
    let r = Report {
        by: By::Thread,
        domains: vec![],
        rows: vec![
            ReportRow {
                key: RowKey::Thread {
                    pid: 1,
                    tid: 2,
                    comm: "a".into(),
                },
                cpu_ns: 1e9,
                samples: 10,
                energy: vec![],
                total_energy: None,
                power_w: 0.0,
                share: 0.0,
                cpu_share: Vec::new(),
            },
            ReportRow {
                key: RowKey::Thread {
                    pid: 1,
                    tid: 3,
                    comm: "b".into(),
                },
                cpu_ns: 2e9,
                samples: 20,
                energy: vec![],
                total_energy: None,
                power_w: 0.0,
                share: 0.0,
                cpu_share: Vec::new(),
            },
        ],
        estimated: false,
        title: "t".into(),
        notes: Vec::new(),
        cpus: Vec::new(),
        duration_ns: 0,
        footer: Vec::new(),
        model_row: None,
        co2e_g_per_j: None,
    };
    let text = render_str(&r, &RenderOptions::default(), Format::Csv);
    assert_eq!(text, "pid,tid,comm,cpu_s,samples\n1,3,b,2,20\n1,2,a,1,10\n");
}

#[test]
fn cpu_columns_notes_a_cut_note_and_footer_rows_stay_last() {
    let mut r = report(true);
    r.duration_ns = 10_000_000_000;
    r.cpus = vec![0, 1];
    for (row, shares) in r.rows.iter_mut().zip([[0.1, 0.0], [0.3, 0.3], [0.0, 0.3]]) {
        row.cpu_share = shares.to_vec();
    }
    r.notes = vec!["energy: 10.000 J, 1.00 W; idle/static 0.000 J; 2 events lost".into()];
    r.footer = vec![ReportRow {
        key: RowKey::Label("[total]".into()),
        cpu_ns: 0.0,
        samples: 0,
        energy: vec![EnergyCell {
            joules: 10.0,
            ci_low: 10.0,
            ci_high: 10.0,
        }],
        total_energy: None,
        power_w: 1.0,
        share: 1.0,
        cpu_share: Vec::new(),
    }];
    let opts = RenderOptions {
        sort: None,
        limit: Some(1),
    };
    let text = render_str(&r, &opts, Format::Table);
    let want = "\
energy-bpf on box, 10.0 s, model [estimated]
energy: 10.000 J, 1.00 W; idle/static 0.000 J; 2 events lost
PID  COMM       CPU_S  CPU_PCT  CPU0_PCT  CPU1_PCT  SAMPLES  PACKAGE_J      PACKAGE_CI95  POWER_W  SHARE_PCT
 42  burn, \"x\"  6.000     60.0      30.0      30.0      600      6.000    [5.400, 6.600]     0.60       60.0
... 2 more rows not shown (--limit 3 shows them all)
  -  [total]                                                    10.000  [10.000, 10.000]     1.00      100.0
energy is estimated (modelled, not measured); intervals are 95%
";
    assert_eq!(text, want);
    let csv = render_str(&r, &opts, Format::Csv);
    assert_eq!(
        csv.lines().last(),
        Some("-,[total],,,,,,10,10,10,1,100,true")
    );
}

#[test]
fn json_carries_the_model_row_only_when_there_is_one() {
    let text = render_str(&report(true), &RenderOptions::default(), Format::Json);
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert!(
        v.get("model_row").is_none() && v.get("model_error").is_none(),
        "{v}"
    );
    let mut r = report(true);
    r.model_row = Some((
        "Intel Xeon Platinum 8280 → Cascade Lake-SP, 46 servers, ±9%".into(),
        9.0,
    ));
    let text = render_str(&r, &RenderOptions::default(), Format::Json);
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(
        v["model_row"],
        "Intel Xeon Platinum 8280 → Cascade Lake-SP, 46 servers, ±9%"
    );
    assert_eq!(v["model_error"], 9.0);
}
