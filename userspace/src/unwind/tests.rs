//! The compiler against `readelf --debug-dump=frames-interp` (binutils' own CFA
//! interpreter) on a C program built here without frame pointers, and on the system libc.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use super::cache::{CacheError, DecodeError, TableSource, decode, encode};
use super::*;

/// Functions with different frame shapes: a leaf with no frame, one that saves rbp as an
/// ordinary callee-saved register, one whose VLA forces an rbp-based CFA.
const PROGRAM: &str = r#"
#include <stdlib.h>
#include <string.h>
__attribute__((noinline)) long leaf(long x) { return x * 3 + 1; }
__attribute__((noinline)) long many(long a, long b, long c) {
    long r = 0;
    for (long i = 0; i < a; i++) {
        long p = leaf(i) , q = leaf(b + i), s = leaf(c ^ i), t = leaf(p + q), u = leaf(s - t), v = leaf(u * a);
        r += p * q + s * t + u * v + leaf(r);
    }
    return r;
}
__attribute__((noinline)) long vla(int n) {
    char buf[n];
    memset(buf, n, n);
    return leaf(buf[n / 2]) + many(n, buf[0], buf[1]);
}
int main(int argc, char **argv) { return (int)vla(argc + 16) & 1; }
"#;

fn build_program(dir: &Path) -> PathBuf {
    let src = dir.join("frames.c");
    let bin = dir.join("frames");
    std::fs::write(&src, PROGRAM).unwrap();
    let st = Command::new("gcc")
        .args(["-O2", "-fomit-frame-pointer", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("gcc runs (the tests build their C workloads)");
    assert!(st.success(), "gcc failed");
    bin
}

/// One interpreted row: (loc, cfa, rbp, ra) as readelf prints them.
struct Expected {
    loc: u64,
    cfa: String,
    rbp: String,
    ra: String,
}

fn readelf_rows(bin: &Path) -> Vec<Expected> {
    let out = Command::new("readelf")
        .arg("--debug-dump=frames-interp")
        .arg(bin)
        .output()
        .unwrap();
    // readelf exits 1 on libc without a message; the rows it printed are what count.
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    let mut cols: Vec<String> = Vec::new();
    // CIEs print their initial rows too (at LOC 0); only FDE rows describe code.
    let mut in_fde = false;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"LOC") {
            cols = words.iter().map(|w| w.to_string()).collect();
            continue;
        }
        if line.contains(" FDE ") || line.contains(" CIE ") {
            in_fde = line.contains(" FDE ");
            cols.clear();
            continue;
        }
        if words.is_empty() {
            in_fde = false;
        }
        if !in_fde {
            continue;
        }
        let Ok(loc) = u64::from_str_radix(words[0], 16) else {
            continue;
        };
        if cols.is_empty() || words.len() != cols.len() {
            continue;
        }
        let get = |name: &str| {
            cols.iter()
                .position(|c| c == name)
                .map_or("u".to_string(), |i| words[i].to_string())
        };
        rows.push(Expected {
            loc,
            cfa: get("CFA"),
            rbp: get("rbp"),
            ra: get("ra"),
        });
    }
    rows
}

/// Checks every readelf row against the compiled table; returns how many were checked.
fn compare(bin: &Path, table: &UnwindTable) -> usize {
    let expected = readelf_rows(bin);
    assert!(
        !expected.is_empty(),
        "readelf printed no rows for {}",
        bin.display()
    );
    for e in &expected {
        let row = table
            .find(e.loc)
            .unwrap_or_else(|| panic!("no row at {:#x}", e.loc));
        let what = format!(
            "{:#x}: readelf {} rbp={} ra={}, ours {row:?}",
            e.loc, e.cfa, e.rbp, e.ra
        );
        if matches!(row.kind, unwind_kind::SIGNAL | unwind_kind::PLT) {
            assert_eq!(e.cfa, "exp", "{what}");
            continue;
        }
        let cfa = e.cfa.strip_prefix("rsp+").map(|o| (unwind_reg::RSP, o));
        let cfa = cfa.or(e.cfa.strip_prefix("rbp+").map(|o| (unwind_reg::RBP, o)));
        let rbp = match e.rbp.as_str() {
            "u" | "s" => Some(0),
            c => c.strip_prefix("c").and_then(|o| o.parse::<i16>().ok()),
        };
        let end = e.ra == "u";
        match (cfa, rbp, e.ra.as_str()) {
            (Some((reg, off)), Some(rbp), "c-8" | "u") => {
                assert_eq!(
                    (row.cfa_reg, row.cfa_offset),
                    (reg, off.parse().unwrap()),
                    "{what}"
                );
                assert_eq!(row.rbp_offset, rbp, "{what}");
                let kind = if end {
                    unwind_kind::END_OF_STACK
                } else {
                    unwind_kind::NORMAL
                };
                assert_eq!(row.kind, kind, "{what}");
            }
            _ => assert_eq!(row.kind, unwind_kind::UNSUPPORTED, "{what}"),
        }
    }
    expected.len()
}

fn symbol(bin: &Path, name: &str) -> u64 {
    let out = Command::new("nm").arg(bin).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.ends_with(&format!(" {name}")))
        .unwrap();
    u64::from_str_radix(line.split_whitespace().next().unwrap(), 16).unwrap()
}

#[test]
fn unwind_rows_match_readelf_on_a_program_without_frame_pointers() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_program(dir.path());
    let table = compile_file(&bin).unwrap();
    let checked = compare(&bin, &table);
    assert!(checked > 10, "only {checked} rows");
    // The shapes the program was written for are there.
    let leaf = table.find(symbol(&bin, "leaf")).unwrap();
    assert_eq!(
        (leaf.cfa_reg, leaf.cfa_offset, leaf.kind),
        (unwind_reg::RSP, 8, unwind_kind::NORMAL)
    );
    let vla = symbol(&bin, "vla");
    let vla_rows = table.rows.iter().filter(|r| r.pc >= vla && r.pc < vla + 64);
    assert!(
        vla_rows.clone().any(|r| r.cfa_reg == unwind_reg::RBP),
        "vla has an rbp-based CFA"
    );
    assert!(
        vla_rows.clone().any(|r| r.rbp_offset == -16),
        "vla saves rbp at CFA-16"
    );
    // _start marks the end of the stack.
    let start = table.find(symbol(&bin, "_start")).map(|r| r.kind);
    assert!(
        matches!(start, None | Some(unwind_kind::END_OF_STACK)),
        "{start:?}"
    );
    assert!(table.stats.plt_rows > 0, "the PLT is marked");
    // In-memory compilation agrees with the lazy file reader.
    assert_eq!(compile_elf(&std::fs::read(&bin).unwrap()).unwrap(), table);
}

#[test]
fn unwind_rows_match_readelf_on_libc() {
    let libc = Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let table = compile_file(libc).unwrap();
    let checked = compare(libc, &table);
    assert!(checked > 10_000, "only {checked} rows");
    assert!(
        table.rows.iter().any(|r| r.kind == unwind_kind::SIGNAL),
        "__restore_rt is marked"
    );
    assert!(
        table.rows.windows(2).all(|w| w[0].pc < w[1].pc),
        "sorted, unique"
    );
}

#[test]
fn unwind_cache_round_trips_and_rejects_damage() {
    let dir = tempfile::tempdir().unwrap();
    let bin = build_program(dir.path());
    let cache = UnwindCache::open(dir.path().join("cache")).unwrap();
    let (built, src) = cache.table(&bin).unwrap();
    assert_eq!(src, TableSource::Built);
    let (cached, src) = cache.table(&bin).unwrap();
    assert_eq!(src, TableSource::Cached);
    assert_eq!(built, cached);
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir.path().join("cache")), 0o700);
    let file = std::fs::read_dir(dir.path().join("cache"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert_eq!(mode(&file), 0o600);

    let mut bytes = encode(&built);
    assert_eq!(decode(&bytes).unwrap(), built);
    bytes[60] ^= 1;
    assert_eq!(decode(&bytes), Err(DecodeError::Checksum));
    assert!(matches!(
        decode(&bytes[..40]),
        Err(DecodeError::Header { .. })
    ));
    // A damaged file is rebuilt, not trusted.
    std::fs::write(&file, &bytes).unwrap();
    assert_eq!(cache.table(&bin).unwrap().1, TableSource::Built);
}

#[test]
fn unwind_cache_keys_files_without_a_build_id_by_stat() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("n.c");
    let bin = dir.path().join("n");
    let build = |body: &str| {
        std::fs::write(&src, body).unwrap();
        let mut gcc = Command::new("gcc");
        gcc.args(["-O2", "-Wl,--build-id=none", "-o"])
            .arg(&bin)
            .arg(&src);
        assert!(gcc.status().unwrap().success(), "gcc failed");
    };
    build("int main(void) { return 0; }");
    let cache = UnwindCache::open(dir.path().join("cache")).unwrap();
    let (table, src) = cache.table(&bin).unwrap();
    assert_eq!(src, TableSource::BuiltByStat);
    assert!(!table.rows.is_empty());
    let (again, src) = cache.table(&bin).unwrap();
    assert_eq!(
        (src, &again),
        (TableSource::Cached, &table),
        "unchanged: read back"
    );
    // A rebuilt file is a different file, whatever its name.
    std::thread::sleep(std::time::Duration::from_millis(20));
    build("int f(int x) { return x * 3; } int main(int c, char **v) { return f(c); }");
    assert_eq!(cache.table(&bin).unwrap().1, TableSource::BuiltByStat);
}

#[test]
fn unwind_cache_skips_a_table_larger_than_asked_without_reading_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = UnwindCache::open(dir.path().join("cache")).unwrap();
    let exe = std::env::current_exe().unwrap();
    let (table, _) = cache.table(&exe).unwrap();
    let n = table.rows.len();
    assert!(n > 10);
    assert!(
        cache.table_at_most(&exe, n - 1).unwrap().is_none(),
        "cached, too big"
    );
    assert_eq!(
        cache.table_at_most(&exe, n).unwrap().map(|t| t.1),
        Some(TableSource::Cached)
    );
}

#[test]
fn unwind_cache_refuses_a_shared_directory() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(
        UnwindCache::open(dir.path()),
        Err(CacheError::InsecureDir { .. })
    ));
}

#[test]
fn unwind_compiler_survives_garbage() {
    assert!(compile_elf(b"not an elf").is_err());
    let t = compile_eh_frame(&[0xff; 64], 0x1000).unwrap();
    assert!(t.rows.is_empty());
    assert!(t.stats.skipped > 0);
}

#[test]
fn unwind_cache_keeps_within_its_budget_removing_the_least_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let table = compile_elf(&std::fs::read(&exe).unwrap()).unwrap();
    let size = encode(&table).len() as u64;
    // Room for a little under three tables: storing a third takes it over and trims to
    // three quarters, which two tables fit.
    let cache = UnwindCache::open(dir.path())
        .unwrap()
        .with_budget(size * 29 / 10);
    let pause = || std::thread::sleep(std::time::Duration::from_millis(20));
    cache.store(b"a", &table).unwrap();
    pause();
    cache.store(b"b", &table).unwrap();
    pause();
    assert!(cache.load(b"a").is_some(), "a used after b was stored");
    pause();
    cache.store(b"c", &table).unwrap();
    assert!(
        cache.load(b"b").is_none(),
        "b, least recently used, removed"
    );
    assert!(cache.load(b"a").is_some() && cache.load(b"c").is_some());
    // A table larger than the whole budget is still kept, alone.
    let small = UnwindCache::open(dir.path()).unwrap().with_budget(size / 2);
    small.store(b"d", &table).unwrap();
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["64.unw"], "only d's file ({:02x}) is left", b'd');
}
