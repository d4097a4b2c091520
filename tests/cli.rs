//! The command line as a new user meets it, through the real binary: a typo never costs a
//! recording, nonsense values are refused with a reason, the help says what the output
//! holds, binary outputs stay off terminals, cut tables say so.

use std::path::{Path, PathBuf};

use crate::util::{require_root, run, text};

/// One recording of a second with a busy shell, shared by the tests that only read it.
fn recording() -> &'static Path {
    static REC: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    &REC.get_or_init(|| {
        let _guard = crate::util::exclusive();
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("cli.ebpr");
        let busy = crate::util::Workload::spawn("while :; do :; done", None);
        let out = run(&["record", "-d", "1", "-o", file.to_str().expect("path")]);
        drop(busy);
        assert!(out.status.success(), "record failed: {}", text(&out));
        (dir, file)
    })
    .1
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A refused value exits 2 with clap's one `error:` line naming the reason.
fn refused(args: &[&str], reason: &str) {
    let out = run(args);
    let msg = text(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} must be refused: {msg}"
    );
    let line = msg
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("{args:?}: no error line: {msg}"));
    assert!(line.contains(reason), "{args:?}: {line}");
}

#[test]
fn a_command_that_fails_to_start_leaves_the_previous_recording_untouched() {
    if !require_root("a_command_that_fails_to_start_leaves_the_previous_recording_untouched") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("x.ebpr");
    let old = dir.path().join("x.ebpr.old");
    std::fs::copy(recording(), &file).expect("copy");
    let before = std::fs::read(&file).expect("read");
    let _guard = crate::util::exclusive();
    let out = run(&["record", "-d", "2", "-o", path(&file), "--", "nosuchcmd"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("nosuchcmd"), "{}", text(&out));
    assert_eq!(
        std::fs::read(&file).expect("read"),
        before,
        "a typo must not touch the previous recording"
    );
    assert!(
        !old.exists(),
        "nothing to keep aside when nothing was recorded"
    );

    // A recording that starts keeps the previous one as FILE.old, as perf does.
    let out = run(&["record", "-d", "5", "-o", path(&file), "--", "true"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("kept as"), "says so: {}", text(&out));
    assert_eq!(std::fs::read(&old).expect("read .old"), before);
    assert_ne!(std::fs::read(&file).expect("read"), before);
    assert_eq!(crate::util::report_json(&file)["truncated"], false);
}

#[test]
fn negative_relative_times_work_as_the_help_shows() {
    if !require_root("negative_relative_times_work_as_the_help_shows") {
        return;
    }
    let rec = recording();
    for args in [
        vec!["report", path(rec), "--from", "-15m"],
        vec!["report", path(rec), "--from", "-15m", "--to", "now"],
        vec!["report", "--from", "-1h", path(rec)],
        vec!["report", path(rec), "--from=-15m"],
    ] {
        let out = run(&args);
        assert!(out.status.success(), "{args:?}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("energy-bpf report"),
            "{args:?}: {}",
            text(&out)
        );
    }
}

#[test]
fn nonsense_values_are_refused_with_a_reason() {
    refused(&["record", "-d", "-1"], "positive number of seconds");
    refused(
        &["record", "-d=-1", "--", "true"],
        "positive number of seconds",
    );
    refused(
        &["record", "-d", "0", "--", "true"],
        "positive number of seconds",
    );
    refused(&["record", "-F", "0", "--", "true"], "1 to 10000 Hz");
    refused(&["top", "-F", "0"], "1 to 10000 Hz");
    refused(&["agent", "-F", "0"], "1 to 10000 Hz");
    refused(&["top", "-n", "0"], "at least 1");
    refused(&["report", "--limit", "0", "x.ebpr"], "at least 1");
    refused(&["diff", "--limit", "0", "a", "b"], "at least 1");
    refused(&["calibrate", "-d", "-5"], "positive number of seconds");
}

/// The backquoted names of `report --help`'s `json` entry: those before `--by function`
/// and those after.
fn json_help_fields() -> (Vec<String>, Vec<String>) {
    let out = run(&["report", "--help"]);
    assert!(out.status.success(), "{}", text(&out));
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("- json:"))
        .unwrap_or_else(|| panic!("no json entry in report --help:\n{help}"));
    let (process, function) = line
        .split_once("`--by function`")
        .unwrap_or_else(|| panic!("the json help names --by function: {line}"));
    let names = |s: &str| -> Vec<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(|n| n.trim_end_matches("[]").to_string())
            .collect()
    };
    (names(process), names(function))
}

#[test]
fn the_json_help_names_the_fields_report_prints() {
    if !require_root("the_json_help_names_the_fields_report_prints") {
        return;
    }
    let (process_fields, function_fields) = json_help_fields();
    assert!(process_fields.len() >= 5 && function_fields.len() >= 4);
    let doc = crate::util::report_json(recording());
    let first = &doc["processes"][0];
    for name in &process_fields {
        assert!(
            doc.get(name).is_some() || first.get(name).is_some(),
            "report --help names `{name}`, which report --format json does not print:\n{doc:#}"
        );
    }
    let doc = crate::util::report_json_with(recording(), &["--by", "function"]);
    let row = &doc["rows"][0];
    for name in &function_fields {
        assert!(
            doc.get(name).is_some() || row.get(name).is_some(),
            "report --help names `{name}`, which --by function does not print:\n{row:#}"
        );
    }
}

/// Runs `energy-bpf ARGS` with its stdout on a terminal (util-linux `script`); returns
/// the exit code and what the terminal got.
fn on_a_terminal(args: &[&str]) -> Option<(i32, String)> {
    let line = std::iter::once(path(&crate::util::bin()).to_string())
        .chain(args.iter().map(|a| format!("'{a}'")))
        .collect::<Vec<_>>()
        .join(" ");
    let out = std::process::Command::new("script")
        .args(["-eqc", &line, "/dev/null"])
        .output();
    match out {
        Ok(out) => Some((out.status.code().unwrap_or(-1), text(&out))),
        Err(err) => {
            eprintln!("SKIPPED terminal check: cannot run script(1): {err}");
            None
        }
    }
}

#[test]
fn binary_outputs_are_never_written_to_a_terminal() {
    if !require_root("binary_outputs_are_never_written_to_a_terminal") {
        return;
    }
    let rec = path(recording());
    for (args, hint) in [
        (vec!["flamegraph", rec], "-o flame.svg"),
        (
            vec!["flamegraph", "--format", "pprof", rec],
            "-o FILE.pb.gz",
        ),
        (vec!["flamegraph", "--format", "otlp", rec], "-o FILE.pb"),
    ] {
        let Some((code, got)) = on_a_terminal(&args) else {
            return;
        };
        assert_ne!(code, 0, "{args:?} on a terminal must be refused: {got}");
        assert!(got.contains(hint), "{args:?}: hint missing: {got}");
        assert!(got.len() < 1000, "{args:?} wrote its output anyway");
        assert!(!got.contains("<svg"), "{args:?}: {got}");
    }
    // Text formats still go to a terminal.
    if let Some((code, got)) = on_a_terminal(&["flamegraph", "--format", "collapsed", rec]) {
        assert_eq!(code, 0, "{got}");
    }
}

#[test]
fn test_only_flags_are_hidden_from_help() {
    for cmd in ["record", "top", "agent", "calibrate", "sources"] {
        let out = run(&[cmd, "--help"]);
        assert!(out.status.success(), "{cmd} --help: {}", text(&out));
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in ["--sysfs-root", "--dev-cpu-root", "--progress-file"] {
            assert!(!help.contains(flag), "{cmd} --help shows {flag}:\n{help}");
        }
    }
}

#[test]
fn a_cut_table_says_how_many_rows_it_left_out() {
    if !require_root("a_cut_table_says_how_many_rows_it_left_out") {
        return;
    }
    let rec = path(recording());
    let all = crate::util::report_json(recording())["processes"]
        .as_array()
        .expect("processes")
        .len();
    assert!(
        all > 2,
        "a second of a whole machine has more than two processes"
    );
    let out = run(&["report", rec, "--limit", "2"]);
    let table = String::from_utf8_lossy(&out.stdout);
    let want = format!(
        "... {} more rows not shown (--limit {all} shows them all)",
        all - 2
    );
    assert!(table.contains(&want), "want `{want}` in:\n{table}");
    let out = run(&["report", rec, "--limit", &all.to_string()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(!table.contains("more rows not shown"), "{table}");
}

#[test]
fn no_stack_sample_is_shown_under_the_ranked_functions() {
    if !require_root("no_stack_sample_is_shown_under_the_ranked_functions") {
        return;
    }
    let rec = path(recording());
    let out = run(&["report", rec, "--by", "function", "--limit", "2"]);
    assert!(out.status.success(), "{}", text(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("FUNCTION"))
        .expect("header");
    let Some(residual) = lines
        .iter()
        .position(|l| l.starts_with("[no stack sample]"))
    else {
        eprintln!("SKIPPED [no stack sample] placement: every thread had a sample:\n{table}");
        return;
    };
    let cut = lines
        .iter()
        .position(|l| l.starts_with("... "))
        .expect("the cut note");
    assert_eq!(
        cut,
        header + 3,
        "two ranked functions, then the note:\n{table}"
    );
    assert!(
        residual > cut,
        "the residual sits under the ranking:\n{table}"
    );
    // Sorted by samples it would rank last; by energy it may not: either way it is apart.
    let out = run(&[
        "report", rec, "--by", "function", "--format", "csv", "--limit", "1",
    ]);
    let csv = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        csv.lines().count(),
        3,
        "header, one function, the residual:\n{csv}"
    );
    assert!(
        csv.lines()
            .nth(2)
            .is_some_and(|l| l.starts_with("[no stack sample]")),
        "{csv}"
    );
}

#[test]
fn one_name_for_a_pid_filter_and_for_the_table_format() {
    if !require_root("one_name_for_a_pid_filter_and_for_the_table_format") {
        return;
    }
    let rec = recording();
    let doc = crate::util::report_json(rec);
    let pid = doc["processes"][0]["pid"]
        .as_u64()
        .expect("pid")
        .to_string();
    let only = crate::util::report_json_with(rec, &["-p", &pid]);
    let pids: Vec<String> = only["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| p["pid"].to_string())
        .collect();
    assert_eq!(pids, vec![pid.clone()], "report -p keeps that process only");
    let out = run(&["flamegraph", "-p", &pid, "--format", "collapsed", path(rec)]);
    assert!(out.status.success(), "flamegraph -p: {}", text(&out));
    let table = run(&["report", path(rec), "--format", "table"]);
    let text_format = run(&["report", path(rec), "--format", "text"]);
    assert!(text_format.status.success(), "{}", text(&text_format));
    assert_eq!(table.stdout, text_format.stdout, "`text` is `table`");
    let out = run(&["top", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("table") && help.contains("record`'s 99"),
        "{help}"
    );
    let out = run(&["record", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("at 49 Hz"),
        "the two defaults are explained: {help}"
    );
    let out = run(&["agent", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("in `top`, `-i` is the same beat"), "{help}");
}

#[test]
fn man_pages_and_completions_come_from_the_cli() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (man, completions) = (dir.path().join("man"), dir.path().join("completions"));
    let out = run(&[
        "assets",
        "--man",
        path(&man),
        "--completions",
        path(&completions),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let help = String::from_utf8_lossy(&run(&["--help"]).stdout).into_owned();
    // Every subcommand --help lists has its page, and its page its flags.
    let subs: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| *s != "help")
        .collect();
    assert!(subs.contains(&"record") && subs.len() >= 8, "{subs:?}");
    for sub in &subs {
        let page = man.join(format!("energy-bpf-{sub}.1"));
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(text.contains(".TH"), "{sub}: not a man page");
    }
    let record = std::fs::read_to_string(man.join("energy-bpf-record.1")).expect("record.1");
    assert!(
        record.contains("duration") && record.contains("freq"),
        "{record}"
    );
    assert!(
        !record.contains("sysfs\\-root") && !record.contains("sysfs-root"),
        "hidden flags stay out of the man page"
    );
    for file in ["energy-bpf.bash", "_energy-bpf", "energy-bpf.fish"] {
        let text = std::fs::read_to_string(completions.join(file)).expect(file);
        assert!(
            text.contains("record") && text.contains("duration"),
            "{file}"
        );
    }
}
