//! Symbolizing a real recording up front, a file at a time over threads (what every report
//! does), gives exactly the frames that looking each address up alone gives: same names,
//! inlined frames, files, lines and fallbacks, kernel and user. The profile keeps the
//! test's workloads (sh, python3, ls and their libraries), whose files are small enough for
//! a debug build to symbolize in seconds.

use std::path::Path;
use std::process::Command;

use energy_bpf::{
    analysis::{self, ModelOverride},
    attribute::Options,
    output::{functions, table::RowKey},
    profile::{self, Filter, KERNEL_MAPPING},
    record::read_file,
};

use crate::util::{Workload, bin, require_root, run, text};

#[test]
fn batched_symbols_equal_one_by_one_lookups_on_a_real_recording() {
    if !require_root("batched_symbols_equal_one_by_one_lookups_on_a_real_recording") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    // Some user code in a few binaries (sh, python3 and their libraries) besides whatever
    // else runs on the machine, and the kernel under all of them.
    let load = [
        Workload::spawn("while :; do :; done", Some(0)),
        Workload::spawn(
            "exec python3 -c 'import json\nwhile True: json.loads(json.dumps(list(range(200))))'",
            Some(1),
        ),
        Workload::spawn("while :; do ls -R /usr/lib > /dev/null; done", None),
    ];
    // The two loops run in their own shells; the third shell only starts `ls`.
    for w in &load[..2] {
        crate::util::wait_running(w.pid(), 50_000_000);
    }
    let file = dir.path().join("sym.ebpr");
    let out = run(&[
        "record",
        "-F",
        "999",
        "-d",
        "3",
        "-o",
        file.to_str().expect("path"),
    ]);
    drop(load);
    assert!(out.status.success(), "record: {}", text(&out));
    let mut rec = read_file(&file).expect("recording reads back");
    // Live symbolization is what is compared here: the names the recording stored are set
    // aside (`stored_names_equal_live_ones_and_outlive_the_binary` checks those).
    rec.symbols = Default::default();

    let cfg = analysis::config(&rec, Options::default(), &ModelOverride::default());
    let weights = analysis::sample_values(&rec, &analysis::analyze(&rec, &cfg));
    let mut batched = analysis::symbolizer_for(&rec);
    let filter = Filter {
        comms: ["sh", "dash", "bash", "python3", "ls"]
            .map(String::from)
            .to_vec(),
        ..Filter::default()
    };
    let prof = profile::build(&rec, &weights, &mut batched, &filter);
    // The samples the filter kept, in order (what the profile's samples are, then residuals).
    let comm = |tid: u32| rec.threads.get(&tid).map_or("", |t| t.comm.as_str());
    let kept = rec.samples.iter().filter(|s| {
        filter
            .comms
            .iter()
            .any(|c| c == comm(s.tid) || c == comm(s.tgid))
    });

    // The same addresses, each looked up alone through a fresh symbolizer.
    let mut alone = analysis::symbolizer_for(&rec);
    let no_mappings = Vec::new();
    let (mut kernel, mut user) = (0usize, 0usize);
    let mut seen = std::collections::HashSet::new();
    for (s, ps) in kept.zip(&prof.samples) {
        let mappings = rec.mappings.get(&s.tgid).unwrap_or(&no_mappings);
        for &loc in &ps.locations {
            let l = &prof.locations[loc as usize];
            let Some(m) = l.mapping else {
                continue; // Python frames, JIT frames, unmapped addresses
            };
            let is_kernel = prof.mappings[m as usize].path == KERNEL_MAPPING;
            if !seen.insert((is_kernel, s.tgid, l.address)) {
                continue;
            }
            let expected = if is_kernel {
                kernel += 1;
                alone.kernel(l.address)
            } else {
                user += 1;
                alone.user(l.address, mappings)
            };
            let got: Vec<_> = l
                .frames
                .iter()
                .map(|&f| prof.frames[f as usize].clone())
                .collect();
            assert_eq!(
                got, expected,
                "address {:#x} of pid {} ({})",
                l.address, s.tgid, prof.mappings[m as usize].path
            );
        }
    }
    let (b, a) = (batched.stats(), alone.stats());
    eprintln!(
        "{kernel} kernel and {user} user addresses compared; batched {b:?}, one by one {a:?}"
    );
    assert!(
        kernel >= 20 && user >= 50,
        "too few addresses to compare: {kernel} kernel, {user} user"
    );
    assert!(
        a.resolved >= 50,
        "most addresses should resolve to symbols: {a:?}"
    );
    assert_eq!(b.resolved, a.resolved, "resolved counts");
    assert_eq!(
        b.build_id_mismatches, a.build_id_mismatches,
        "build-id mismatches"
    );

    // Self energy per function (what `diff` shows) from a profile whose callers are not
    // symbolized equals that of the whole profile, to the bit.
    let leaves =
        profile::build_leaves(&rec, &weights, &mut analysis::symbolizer_for(&rec), &filter);
    let domain: Vec<String> = prof
        .value_types
        .iter()
        .find_map(|v| v.name.strip_prefix("energy_").map(str::to_string))
        .into_iter()
        .collect();
    assert_eq!(domain.len(), 1, "an energy value: {:?}", prof.value_types);
    let self_rows = |p: &profile::Profile| -> std::collections::BTreeMap<String, (f64, f64, f64)> {
        functions::by_function(p, &domain)
            .rows
            .into_iter()
            .filter_map(|r| {
                let RowKey::Function { name, .. } = r.key else {
                    return None;
                };
                let e = r.energy.first()?;
                (r.samples > 0 || e.joules != 0.0)
                    .then_some((name, (e.joules, e.ci_low, e.ci_high)))
            })
            .collect()
    };
    let (full, leaf) = (self_rows(&prof), self_rows(&leaves));
    assert!(full.len() >= 10, "too few functions: {full:?}");
    assert_eq!(
        full, leaf,
        "self energy per function, whole stacks vs leaves only"
    );
}

/// `file` less the stored names of its user code (`SymbolTable.files`): a report of the
/// copy resolves user addresses live, as for a recording made before names were stored.
/// The kernel's stored names stay: kallsyms names the recorder's own BPF programs only
/// while they are loaded, so a later live lookup of those addresses differs by design.
fn without_stored_user_names(file: &Path, out: &Path) -> usize {
    use energy_bpf::pb::v1::{Record, record::Kind};
    use energy_bpf::record::frame::{self, Frame};
    use prost::Message as _;
    let bytes = std::fs::read(file).expect("read recording");
    // The magic, the header (a varint length and the record) and its CRC32C.
    let mut after_magic = &bytes[8..];
    let len = prost::decode_length_delimiter(&mut after_magic).expect("header length");
    let header_end = bytes.len() - after_magic.len() + len + 4;
    let mut kept = bytes[..header_end].to_vec();
    let mut rest = &bytes[header_end..];
    let mut stripped = 0;
    while let Frame::Whole { payload, len } = frame::parse(rest) {
        match Record::decode(payload).expect("record decodes") {
            Record {
                kind: Some(Kind::Symbols(mut table)),
            } => {
                stripped += table.files.len();
                table.files.clear();
                let record = Record {
                    kind: Some(Kind::Symbols(table)),
                };
                frame::encode(&record.encode_to_vec(), &mut kept).expect("frame");
            }
            _ => kept.extend_from_slice(&rest[..len]),
        }
        rest = &rest[len..];
    }
    assert!(rest.is_empty(), "{} bytes left unparsed", rest.len());
    std::fs::write(out, kept).expect("write copy");
    stripped
}

/// `energy-bpf ARGS` in `dir` (so the file names in its output are the same everywhere).
fn output_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run energy-bpf");
    assert!(out.status.success(), "{args:?}: {}", text(&out));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

#[test]
fn stored_names_equal_live_ones_and_outlive_the_binary() {
    if !require_root("stored_names_equal_live_ones_and_outlive_the_binary") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let src = crate::util::workload("burn.c");
    let burn = crate::util::gcc(
        &src,
        &dir.path().join("burn-copy"),
        &["-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline"],
    );
    let (stored, live) = (dir.path().join("stored"), dir.path().join("live"));
    for d in [&stored, &live] {
        std::fs::create_dir(d).expect("mkdir");
    }
    let file = stored.join("rec.ebpr");
    let workload = Command::new(&burn).arg("30").spawn().expect("start burn");
    let pid = workload.id().to_string();
    let out = run(&[
        "record",
        "-F",
        "999",
        "-d",
        "2",
        "-p",
        &pid,
        "-o",
        file.to_str().expect("path"),
    ]);
    let mut workload = workload;
    let _ = workload.kill();
    let _ = workload.wait();
    assert!(out.status.success(), "record: {}", text(&out));
    assert!(
        text(&out).contains("stored the names of"),
        "record says what it stored: {}",
        text(&out)
    );
    let rec = read_file(&file).expect("recording reads back");
    let names: usize = rec
        .symbols
        .iter()
        .map(|t| t.files.iter().map(|f| f.addresses.len()).sum::<usize>() + t.kernel.len())
        .sum();
    assert!(names >= 3, "too few stored names: {names}");
    let stripped = without_stored_user_names(&file, &live.join("rec.ebpr"));
    assert!(stripped >= 1, "the names of burn's file at least");

    // With the binary in place: the stored names give byte for byte what live ones give.
    let views: [&[&str]; 4] = [
        &["report", "--by", "function", "rec.ebpr"],
        &["report", "--by", "function", "--format", "json", "rec.ebpr"],
        &["diff", "rec.ebpr", "rec.ebpr", "--format", "json"],
        &["flamegraph", "--format", "collapsed", "rec.ebpr"],
    ];
    for args in views {
        let (s, l) = (output_in(&stored, args), output_in(&live, args));
        assert_eq!(s, l, "{args:?}: stored names differ from live ones");
    }
    let table = output_in(&stored, views[0]);
    assert!(table.contains("hot_heavy"), "{table}");

    // The binary gone: the stored names still name its functions; live ones cannot.
    std::fs::remove_file(&burn).expect("delete the binary");
    let kept = output_in(&stored, views[0]);
    assert!(kept.contains("hot_heavy"), "stored names kept: {kept}");
    assert!(kept.contains("hot_light"), "stored names kept: {kept}");
    let lost = output_in(&live, views[0]);
    assert!(
        !lost.contains("hot_heavy") && lost.contains("burn-copy+0x"),
        "without stored names the binary's code is unnamed: {lost}"
    );
}
