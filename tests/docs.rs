//! The documentation stays true: every relative link in README.md and docs/*.md resolves
//! (file and heading); every `energy-bpf SUBCOMMAND --flag` in README's `sh` blocks is a
//! flag of that subcommand, and the lines that need no root run against a recording made
//! here; docs/agent.md's metrics reference lists exactly what a real agent's `/metrics`
//! serves.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use crate::util::{require_root, run, text};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// README.md and every docs/*.md.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(page: &str) -> BTreeSet<String> {
    prose(page)
        .iter()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| slug(h.trim_start_matches('#')))
        .collect()
}

/// Targets of `[text](target)` links in the prose of `page`.
fn links(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(page) {
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].trim().to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

#[test]
fn every_relative_link_in_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("dir").join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
                continue;
            }
            if !anchor.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let heads = anchors(&std::fs::read_to_string(&target).expect("read"));
                if !heads.contains(anchor) {
                    broken.push(format!("{}: {link}: no such heading", page.display()));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn readme_is_a_front_door() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; move detail to docs/"
    );
    for cmd in ["sudo cargo xtask run top", "sudo cargo xtask test"] {
        assert!(readme.contains(cmd), "README must keep `{cmd}`");
    }
}

/// The lines of README's `sh` blocks, comments cut.
fn readme_sh_lines() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README");
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = !in_sh && t == "```sh";
            continue;
        }
        if in_sh {
            let code = t.split(" #").next().unwrap_or("").trim();
            if !code.is_empty() {
                out.push(code.to_string());
            }
        }
    }
    out
}

/// Each `energy-bpf SUB ARGS` in `line` (split at `&&`, `|`, `;`): sub and its flags.
fn invocations(line: &str) -> Vec<(String, Vec<String>)> {
    line.split(['|', ';'])
        .flat_map(|s| s.split("&&"))
        .filter_map(|part| {
            let words: Vec<&str> = part.split_whitespace().collect();
            // The program, not a word such as a namespace (`kubectl -n energy-bpf ...`).
            let at = match words.as_slice() {
                ["energy-bpf", ..] => 0,
                ["sudo", "energy-bpf", ..] => 1,
                _ => return None,
            };
            let sub = words.get(at + 1)?.to_string();
            let flags = words[at + 2..]
                .iter()
                .take_while(|w| **w != "--")
                .filter(|w| w.starts_with('-') && w.len() > 1)
                .map(|w| w.split('=').next().unwrap_or(w).to_string())
                .collect();
            Some((sub, flags))
        })
        .collect()
}

#[test]
fn readme_commands_use_flags_their_subcommand_has() {
    let lines = readme_sh_lines();
    let mut checked = 0;
    for line in &lines {
        for (sub, flags) in invocations(line) {
            let out = run(&[&sub, "--help"]);
            assert!(
                out.status.success(),
                "README runs `energy-bpf {sub}`, which has no --help: {}",
                text(&out)
            );
            let help = String::from_utf8_lossy(&out.stdout);
            for flag in flags {
                let listed = if flag.starts_with("--") {
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n"))
                } else {
                    help.contains(&format!("{flag}, "))
                };
                assert!(listed, "README: `{line}`: {sub} --help has no {flag}");
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 15,
        "only {checked} flags found in README's sh blocks"
    );
}

#[test]
fn readme_commands_that_need_no_root_run_against_a_recording() {
    if !require_root("readme_commands_that_need_no_root_run_against_a_recording") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let _guard = crate::util::exclusive();
        let busy = crate::util::Workload::spawn("while :; do :; done", None);
        let out = std::process::Command::new(crate::util::bin())
            .args(["record", "-d", "1", "-o", "x.ebpr"])
            .current_dir(dir.path())
            .output()
            .expect("record");
        drop(busy);
        assert!(out.status.success(), "record: {}", text(&out));
    }
    for side in ["base.ebpr", "new.ebpr"] {
        std::fs::copy(dir.path().join("x.ebpr"), dir.path().join(side)).expect("copy");
    }
    let bin_dir = crate::util::bin().parent().expect("bin dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut ran = 0;
    for line in readme_sh_lines() {
        if !line.starts_with("energy-bpf ") {
            continue;
        }
        // `top --connect` needs a running agent (tests/agent.rs covers it).
        if line.starts_with("energy-bpf top") {
            eprintln!("not run here (needs an agent's socket): {line}");
            continue;
        }
        let out = std::process::Command::new("sh")
            .args(["-c", &line])
            .current_dir(dir.path())
            .env("PATH", &path)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("sh");
        assert!(
            out.status.success(),
            "README: `{line}` failed: {}",
            text(&out)
        );
        ran += 1;
    }
    assert!(ran >= 10, "only {ran} README lines ran");
    for made in ["x.svg", "x.pb.gz", "x.folded", "diff.svg"] {
        let len = std::fs::metadata(dir.path().join(made))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 0, "README's commands should have written {made}");
    }
}

/// The metric names of docs/agent.md's reference table, each with whether it is always
/// present.
fn metrics_reference() -> Vec<(String, bool)> {
    let page = std::fs::read_to_string(root().join("docs/agent.md")).expect("docs/agent.md");
    let section = page
        .split("## Metrics reference")
        .nth(1)
        .expect("a `## Metrics reference` section in docs/agent.md");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
            let name = cells[0].trim_matches('`').to_string();
            let always = cells.last().is_some_and(|c| *c == "always");
            (name, always)
        })
        .collect()
}

#[test]
fn the_metrics_reference_lists_exactly_what_the_agent_serves() {
    if !require_root("the_metrics_reference_lists_exactly_what_the_agent_serves") {
        return;
    }
    let reference = metrics_reference();
    assert!(reference.len() >= 20, "{reference:?}");
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let (_agent, addr, _log) = crate::util::start_agent_with(dir.path(), &[]);
    let mut body = String::new();
    let ok = crate::util::until(std::time::Duration::from_secs(30), || {
        body = crate::util::get(&addr, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default();
        body.contains("energy_bpf_process_joules_total{")
            && body.contains("energy_bpf_windows_total ")
            && !body.contains("energy_bpf_windows_total 0\n")
    });
    assert!(ok, "no windows on /metrics within 30 s:\n{body}");
    let served: BTreeSet<String> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect();
    let listed: BTreeSet<String> = reference.iter().map(|(n, _)| n.clone()).collect();
    let missing: Vec<&String> = served.difference(&listed).collect();
    assert!(
        missing.is_empty(),
        "served on /metrics but not in docs/agent.md's reference: {missing:?}"
    );
    let absent: Vec<&String> = reference
        .iter()
        .filter(|(name, always)| *always && !served.contains(name))
        .map(|(name, _)| name)
        .collect();
    assert!(
        absent.is_empty(),
        "docs/agent.md says these are always present, /metrics lacks them: {absent:?}"
    );
}

/// Every subcommand's `--help` ends with three to five real examples of that subcommand,
/// and every flag in them is one of its flags.
#[test]
fn every_subcommand_help_ends_with_examples_whose_flags_exist() {
    let subs = [
        "record",
        "report",
        "sources",
        "top",
        "flamegraph",
        "agent",
        "calibrate",
        "diff",
        "model",
    ];
    for sub in subs {
        let out = run(&[sub, "--help"]);
        assert!(out.status.success(), "{sub} --help: {}", text(&out));
        let help = String::from_utf8_lossy(&out.stdout);
        let examples: Vec<&str> = help
            .split("\nExamples:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{sub} --help has no examples:\n{help}"))
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        assert!(
            (3..=5).contains(&examples.len()),
            "{sub} --help: {} examples: {examples:?}",
            examples.len()
        );
        for example in examples {
            let found = invocations(example);
            assert!(
                found.len() == 1 && found[0].0 == sub,
                "{sub} --help: `{example}` is not an example of {sub}"
            );
            for flag in &found[0].1 {
                let listed = if flag.starts_with("--") {
                    help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n"))
                } else {
                    help.contains(&format!("{flag}, "))
                };
                assert!(listed, "{sub} --help: `{example}`: no {flag}");
            }
        }
    }
}
