//! User stacks walked with unwind tables through the real sampler: programs built without
//! frame pointers (C at -O2, a Rust release binary, Debian's python3) recorded with
//! `--unwind dwarf`, their collapsed stacks checked for whole call chains.

use std::{collections::HashMap, path::Path, process::Command};

use crate::util::{report_json, require_root, run, text, workload};

/// Collapsed stacks (`comm;frame;...` → weight) of `file`, CPU time as weight.
fn collapsed(file: &Path) -> HashMap<String, u64> {
    crate::util::collapsed(file, &["--domain", "cpu-time"])
}

/// Share of `comm`'s weight whose stack has a frame for which `frame` holds.
fn share(stacks: &HashMap<String, u64>, comm: &str, frame: impl Fn(&str) -> bool) -> (f64, u64) {
    let mine = stacks
        .iter()
        .filter(|(s, _)| s.split(';').next() == Some(comm));
    let (mut hit, mut total) = (0, 0);
    for (s, &n) in mine {
        total += n;
        if s.split(';').any(&frame) {
            hit += n;
        }
    }
    (hit as f64 / total.max(1) as f64, total)
}

/// Share of the weight of stacks whose leaf is `leaf` that have `caller` right above it.
fn caller_share(stacks: &HashMap<String, u64>, leaf: &str, caller: &str) -> (f64, u64) {
    let (mut hit, mut total) = (0, 0);
    for (s, &n) in stacks {
        let frames: Vec<&str> = s.split(';').collect();
        // The leaf is the last user frame: kernel frames (`_[k]`) may sit above it.
        let Some(i) = frames.iter().rposition(|f| !f.ends_with("_[k]")) else {
            continue;
        };
        if !frames[i].ends_with(leaf) {
            continue;
        }
        total += n;
        if i > 0 && frames[i - 1].ends_with(caller) {
            hit += n;
        }
    }
    (hit as f64 / total.max(1) as f64, total)
}

/// `record --unwind MODE -F 199 -- ARGV` into `dir/NAME.ebpr`.
fn record(dir: &Path, name: &str, mode: &str, argv: &[&str]) -> std::path::PathBuf {
    let file = dir.join(format!("{name}.ebpr"));
    let mut args = vec![
        "record",
        "--energy-source",
        "model",
        "--unwind",
        mode,
        "-F",
        "199",
        "-o",
        file.to_str().expect("path"),
        "--",
    ];
    args.extend_from_slice(argv);
    let out = run(&args);
    assert!(out.status.success(), "record failed: {}", text(&out));
    file
}

fn build(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn c_without_frame_pointers_reaches_main_and_keeps_callers() {
    if !require_root("c_without_frame_pointers_reaches_main_and_keeps_callers") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = dir.path().join("nofp");
    build(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&prog)
            .arg(workload("nofp.c")),
        "gcc",
    );
    let prog = prog.to_str().expect("path");

    let file = record(dir.path(), "dwarf", "dwarf", &[prog, "5"]);
    let stacks = collapsed(&file);
    let (main, total) = share(&stacks, "nofp", |f| f == "main");
    let (caller, leaf) = caller_share(&stacks, "inner", "outer");
    eprintln!(
        "C -O2 -fomit-frame-pointer, unwind tables: {:.1}% reach main, {:.1}% of inner show outer",
        main * 100.0,
        caller * 100.0
    );
    assert!(total > 0, "no samples of nofp: {stacks:?}");
    assert!(
        main >= 0.95,
        "{:.1}% of nofp's samples reach main with unwind tables (want >= 95%): {stacks:#?}",
        main * 100.0
    );
    assert!(leaf > 0, "no samples in inner: {stacks:#?}");
    assert!(
        caller >= 0.95,
        "{:.1}% of inner's samples show outer as its caller: {stacks:#?}",
        caller * 100.0
    );
    let unwind = &report_json(&file)["unwind"];
    assert!(
        unwind["dwarf"].as_u64() > Some(0),
        "report counts table-walked samples: {unwind}"
    );

    // The same program by frame pointers: the walk cannot leave the leaf, which is why the
    // tables exist (and what makes the check above able to fail).
    let file = record(dir.path(), "fp", "fp", &[prog, "2"]);
    let stacks = collapsed(&file);
    let (main, total) = share(&stacks, "nofp", |f| f == "main");
    eprintln!("C, frame pointers: {:.1}% reach main", main * 100.0);
    assert!(total > 0, "no samples of nofp by frame pointers");
    assert!(
        main < 0.5,
        "frame pointers reached main in {:.1}% of samples of a -fomit-frame-pointer build",
        main * 100.0
    );
    let unwind = &report_json(&file)["unwind"];
    assert_eq!(unwind["dwarf"], 0, "--unwind fp walks no tables: {unwind}");
}

#[test]
fn rust_release_binary_without_frame_pointers_reaches_main() {
    if !require_root("rust_release_binary_without_frame_pointers_reaches_main") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = dir.path().join("nofp_rs");
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    build(
        Command::new(rustc)
            .args([
                "--edition",
                "2021",
                "--crate-name",
                "nofp_rs",
                "-C",
                "opt-level=3",
                "-C",
                "force-frame-pointers=no",
                "-C",
                "debuginfo=0",
                "-o",
            ])
            .arg(&prog)
            .arg(workload("nofp.rs")),
        "rustc",
    );
    let file = record(
        dir.path(),
        "rs",
        "dwarf",
        &[prog.to_str().expect("path"), "5"],
    );
    let stacks = collapsed(&file);
    let (main, total) = share(&stacks, "nofp_rs", |f| f == "nofp_rs::main");
    eprintln!(
        "Rust release, unwind tables: {:.1}% reach main",
        main * 100.0
    );
    assert!(total > 0, "no samples of nofp_rs: {stacks:?}");
    assert!(
        main >= 0.95,
        "{:.1}% of nofp_rs's samples reach nofp_rs::main: {stacks:#?}",
        main * 100.0
    );
    let (caller, leaf) = caller_share(&stacks, "nofp_rs::inner", "nofp_rs::outer");
    assert!(leaf > 0, "no samples in nofp_rs::inner: {stacks:#?}");
    assert!(
        caller >= 0.95,
        "{:.1}% of inner's samples show outer as its caller: {stacks:#?}",
        caller * 100.0
    );
}

#[test]
fn debian_python3_reaches_libc_start() {
    if !require_root("debian_python3_reaches_libc_start") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let script = dir.path().join("loop.py");
    std::fs::write(
        &script,
        "import time\n\
         def inner(n):\n    s = 0\n    for i in range(n):\n        s += i * i\n    return s\n\
         end = time.time() + 5\n\
         while time.time() < end:\n    inner(10000)\n",
    )
    .expect("write script");
    // Debian's own interpreter, not whichever python3 is first on PATH.
    let python = "/usr/bin/python3";
    assert!(
        Path::new(python).exists(),
        "{python} missing: apt-get install -y python3"
    );
    let file = record(
        dir.path(),
        "py",
        "dwarf",
        &[python, script.to_str().expect("path")],
    );
    let stacks = collapsed(&file);
    let (start, total) = share(&stacks, "python3", |f| f == "__libc_start_call_main");
    eprintln!(
        "python3, unwind tables: {:.1}% reach __libc_start_call_main",
        start * 100.0
    );
    assert!(total > 0, "no samples of python3: {stacks:?}");
    assert!(
        start >= 0.80,
        "{:.1}% of python3's samples reach __libc_start_call_main (want >= 80%); {}",
        start * 100.0,
        report_json(&file)["unwind"]
    );
}

#[test]
fn a_library_loaded_later_is_walked_and_symbolized() {
    if !require_root("a_library_loaded_later_is_walked_and_symbolized") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = dir.path().join("libhot.so");
    let prog = dir.path().join("dlmain");
    build(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
            .arg(&lib)
            .arg(workload("dlopen_lib.c")),
        "gcc (library)",
    );
    build(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&prog)
            .arg(workload("dlopen_main.c"))
            .arg("-ldl"),
        "gcc (program)",
    );
    let file = record(
        dir.path(),
        "dl",
        "dwarf",
        &[
            prog.to_str().expect("path"),
            lib.to_str().expect("path"),
            "3",
        ],
    );
    let stacks = collapsed(&file);
    // The tables were loaded before the library was mapped: the first walk into it finds
    // a PC in no known mapping, the process's tables and recorded mappings are re-read,
    // and from then on its frames are walked and named.
    let (caller, leaf) = caller_share(&stacks, "lib_inner", "lib_outer");
    let (main, _) = share(&stacks, "dlmain", |f| f == "lib_inner");
    eprintln!(
        "dlopen: {:.1}% of lib_inner show lib_outer; lib_inner in {:.1}% of samples",
        caller * 100.0,
        main * 100.0
    );
    assert!(leaf > 0, "no samples named lib_inner: {stacks:#?}");
    assert!(
        caller >= 0.90,
        "{:.1}% of lib_inner's samples show lib_outer as caller: {stacks:#?}",
        caller * 100.0
    );
    let through_main: u64 = stacks
        .iter()
        .filter(|(s, _)| s.contains(";main;lib_outer;lib_inner"))
        .map(|(_, n)| n)
        .sum();
    assert!(
        through_main as f64 >= 0.90 * leaf as f64,
        "lib_inner reached through main in {through_main} of {leaf}: {stacks:#?}"
    );
}

#[test]
fn samples_taken_in_the_kernel_keep_their_whole_user_stack() {
    if !require_root("samples_taken_in_the_kernel_keep_their_whole_user_stack") {
        return;
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    if (v.next().unwrap_or(0), v.next().unwrap_or(0)) < (5, 15) {
        eprintln!(
            "SKIPPED: kernel {release} has no bpf_task_pt_regs (5.15); kernel-mode samples use frame pointers there"
        );
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = dir.path().join("syscalls");
    build(
        Command::new("gcc")
            .args(["-O2", "-fomit-frame-pointer", "-o"])
            .arg(&prog)
            .arg(workload("syscalls.c")),
        "gcc",
    );
    let file = record(
        dir.path(),
        "sys",
        "dwarf",
        &[prog.to_str().expect("path"), "3"],
    );
    let stacks = collapsed(&file);
    let (in_kernel, total) = share(&stacks, "syscalls", |f| f.ends_with("_[k]"));
    let (main, _) = share(&stacks, "syscalls", |f| f == "main");
    eprintln!(
        "syscalls: {:.1}% of samples in the kernel, {:.1}% reach main",
        in_kernel * 100.0,
        main * 100.0
    );
    assert!(total > 0, "no samples of syscalls: {stacks:?}");
    // Reading /dev/zero 64 KiB at a time keeps it in the kernel most of the time: the user
    // stack then comes from the registers saved at kernel entry (Linux 5.15+).
    assert!(in_kernel >= 0.5, "{:.1}% in the kernel", in_kernel * 100.0);
    assert!(
        main >= 0.95,
        "{:.1}% of samples reach main, kernel-mode ones included: {stacks:#?}",
        main * 100.0
    );
}
