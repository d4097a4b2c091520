//! Symbolization tested for real on our workload (`tests/workloads/burn.c`).

use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// Source of the workload.
fn burn_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/workloads/burn.c")
}

/// Builds burn with frame pointers and debug info into `dir`.
pub(super) fn build_burn(dir: &Path) -> PathBuf {
    let out = dir.join("burn");
    let status = Command::new("gcc")
        .args(["-O0", "-g", "-fno-omit-frame-pointer", "-fno-inline", "-o"])
        .arg(&out)
        .arg(burn_source())
        .status()
        .expect("run gcc (install gcc to run these tests)");
    assert!(status.success(), "gcc failed to build burn.c");
    out
}

/// File offset of symbol `name` in `bin` (`nm` value translated through the executable
/// LOAD segment from `readelf -lW`).
pub(super) fn symbol_file_offset(bin: &Path, name: &str) -> u64 {
    let nm = Command::new("nm").arg(bin).output().expect("run nm");
    let text = String::from_utf8_lossy(&nm.stdout);
    let vaddr = text
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let (v, _, n) = (f.next()?, f.next()?, f.next()?);
            (n == name)
                .then(|| u64::from_str_radix(v, 16).ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("{name} not in nm output"));
    let re = Command::new("readelf")
        .args(["-lW"])
        .arg(bin)
        .output()
        .expect("run readelf");
    let text = String::from_utf8_lossy(&re.stdout);
    for l in text.lines().filter(|l| l.trim_start().starts_with("LOAD")) {
        let f: Vec<&str> = l.split_whitespace().collect();
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex");
        let (off, va, memsz) = (hex(f[1]), hex(f[2]), hex(f[5]));
        if (va..va + memsz).contains(&vaddr) {
            return vaddr - va + off;
        }
    }
    panic!("{name} at {vaddr:#x} is in no LOAD segment");
}

/// Line range [first, last] of the body of C function `name` in burn.c.
fn source_lines(name: &str) -> (u32, u32) {
    let src = std::fs::read_to_string(burn_source()).expect("read burn.c");
    let lines: Vec<&str> = src.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.contains(&format!("void {name}(void)")))
        .expect("function in source");
    let end = start
        + lines[start..]
            .iter()
            .position(|l| *l == "}")
            .expect("closing brace");
    (start as u32 + 1, end as u32 + 1)
}

fn last_frame(frames: &[Frame]) -> &Frame {
    frames.last().expect("at least one frame")
}

#[test]
fn resolves_workload_functions_live_and_after_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = build_burn(dir.path());
    let mut child = Command::new(&bin).arg("10").spawn().expect("spawn burn");
    let pid = child.id();
    let exe = bin.canonicalize().expect("canonical path");
    let mut maps = Vec::new();
    for _ in 0..200 {
        maps = process_mappings(pid, 1).expect("read maps");
        if maps.iter().any(|m| Path::new(&m.path) == exe) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let m = maps
        .iter()
        .find(|m| Path::new(&m.path) == exe)
        .cloned()
        .expect("burn's executable mapping");
    assert_eq!(m.build_id, read_build_id(&exe));
    assert!(!m.build_id.is_empty(), "gcc links with a build-id");

    let addr_of = |name: &str| m.start + symbol_file_offset(&bin, name) - m.file_offset + 4;
    let check = |sym: &mut Symbolizer| {
        for name in ["hot_heavy", "hot_light"] {
            let frames = sym.user(addr_of(name), &maps);
            let f = last_frame(&frames);
            assert_eq!(f.function, name);
            assert!(
                f.file.as_deref().is_some_and(|p| p.ends_with("burn.c")),
                "{f:?}"
            );
            let (first, last) = source_lines(name);
            let line = f.line.expect("DWARF line");
            assert!(
                (first..=last).contains(&line),
                "{name} line {line} not in {first}..={last}"
            );
            assert_eq!(f.module, m.path);
            assert!(!f.is_kernel() && !f.inlined);
        }
    };
    let mut sym = Symbolizer::with_kallsyms(None);
    check(&mut sym);
    assert_eq!(sym.stats().resolved, 2);
    check(&mut sym);
    assert_eq!(
        sym.stats().resolved,
        2,
        "second lookup comes from the cache"
    );

    child.kill().expect("kill burn");
    child.wait().expect("reap burn");
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    // The process is gone; the mappings in hand (as in a recording) are enough.
    check(&mut Symbolizer::with_kallsyms(None));
}

#[test]
fn falls_back_to_module_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = build_burn(dir.path());
    let off = symbol_file_offset(&bin, "hot_heavy");
    let mapping = |path: &Path, build_id: Vec<u8>| Mapping {
        tgid: 1,
        start: 0x10_0000,
        end: 0x20_0000,
        file_offset: 0,
        path: path.to_string_lossy().into_owned(),
        build_id,
        ts_ns: 0,
    };
    let mut sym = Symbolizer::with_kallsyms(None);

    // Same file, recorded build-id differs (binary rebuilt since): no wrong names.
    let wrong = vec![mapping(&bin, vec![1, 2, 3, 4])];
    let frames = sym.user(0x10_0000 + off, &wrong);
    assert_eq!(
        frames,
        vec![Frame::unresolved(
            &bin.to_string_lossy(),
            off,
            crate::symbolize::FrameKind::Native
        )]
    );
    assert_eq!(last_frame(&frames).function, format!("burn+{off:#x}"));
    assert_eq!(sym.stats().build_id_mismatches, 1);

    // An offset inside the ELF header is no function.
    let right = vec![mapping(&bin, read_build_id(&bin))];
    assert_eq!(
        last_frame(&sym.user(0x10_0000 + 0x10, &right)).function,
        "burn+0x10"
    );

    // Stripped copy: the build-id still matches, the names are gone.
    let stripped = dir.path().join("burn-stripped");
    let ok = Command::new("strip")
        .args(["-s", "-o"])
        .arg(&stripped)
        .arg(&bin)
        .status()
        .expect("run strip");
    assert!(ok.success());
    let maps = vec![mapping(&stripped, read_build_id(&stripped))];
    assert_eq!(
        maps[0].build_id,
        read_build_id(&bin),
        "strip keeps the build-id note"
    );
    assert_eq!(
        last_frame(&sym.user(0x10_0000 + off, &maps)).function,
        format!("burn-stripped+{off:#x}")
    );

    // No mapping at all, and a file that vanished.
    assert_eq!(
        last_frame(&sym.user(0x42, &right)).function,
        "[unknown]+0x42"
    );
    let gone = vec![mapping(&dir.path().join("nope"), vec![])];
    assert_eq!(
        last_frame(&sym.user(0x10_0000 + 0x99, &gone)).function,
        "nope+0x99"
    );
}

#[test]
fn kernel_frames_from_kallsyms() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kallsyms = dir.path().join("kallsyms");
    std::fs::write(
        &kallsyms,
        "ffffffff81000000 T _stext\nffffffff81000100 T do_syscall_64\nffffffff81000200 t schedule\n",
    )
    .expect("write kallsyms");
    let mut sym = Symbolizer::with_kallsyms(Some(kallsyms));
    let frames = sym.kernel(0xffff_ffff_8100_0150);
    assert_eq!(last_frame(&frames).function, "do_syscall_64");
    assert!(last_frame(&frames).is_kernel());
    assert_eq!(
        last_frame(&sym.kernel(0xffff_ffff_8100_0210)).function,
        "schedule"
    );
    let mut none = Symbolizer::with_kallsyms(None);
    assert_eq!(
        last_frame(&none.kernel(0xffff_ffff_8100_0150)).function,
        "[kernel]+0xffffffff81000150"
    );
}

/// A SystemTap-style note has the same type number (3) as a GNU build-id: only the `GNU`
/// note is a build-id, whether or not another note comes first.
#[test]
fn build_id_is_the_gnu_note_not_any_note_of_its_type() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("notes.c");
    // A note named "stapsdt", type 3, 4 bytes of descriptor, in its own allocated section
    // (sections named .note.* sort before .note.gnu.build-id in the linked file).
    std::fs::write(
        &src,
        r#"__asm__(".pushsection .note.a_stapsdt,\"a\",@note\n.balign 4\n.long 8\n.long 4\n.long 3\n.asciz \"stapsdt\"\n.balign 4\n.long 0xdeadbeef\n.popsection\n");
int main(void) { return 0; }
"#,
    )
    .expect("write source");
    let build = |name: &str, build_id: &str| {
        let out = dir.path().join(name);
        let status = Command::new("gcc")
            .arg(format!("-Wl,--build-id={build_id}"))
            .arg("-o")
            .arg(&out)
            .arg(&src)
            .status()
            .expect("run gcc");
        assert!(status.success(), "gcc failed");
        out
    };
    let none = build("none", "none");
    assert_eq!(
        read_build_id(&none),
        Vec::<u8>::new(),
        "no GNU note, no build-id"
    );
    let sha1 = build("sha1", "sha1");
    let id = read_build_id(&sha1);
    let readelf = Command::new("readelf")
        .arg("-n")
        .arg(&sha1)
        .output()
        .expect("run readelf");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(id.len(), 20, "sha1 build-id");
    assert!(
        String::from_utf8_lossy(&readelf.stdout).contains(&format!("Build ID: {hex}")),
        "readelf agrees on {hex}"
    );
}

/// Symbolizers filled together get what each would get alone (frames and counts, a
/// rebuilt file unresolved only where its recorded build-id differs), while each distinct
/// file offset and kernel address goes to blazesym once.
#[test]
fn symbolizers_filled_together_resolve_each_address_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = build_burn(dir.path());
    let kallsyms = dir.path().join("kallsyms");
    std::fs::write(
        &kallsyms,
        "ffffffff81000000 T _stext\nffffffff81000100 T do_syscall_64\nffffffff81000200 t schedule\n",
    )
    .expect("write kallsyms");
    let mapping = |build_id: Vec<u8>| Mapping {
        tgid: 1,
        start: 0x10_0000,
        end: 0x20_0000,
        file_offset: 0,
        path: bin.to_string_lossy().into_owned(),
        build_id,
        ts_ns: 0,
    };
    let right = vec![mapping(read_build_id(&bin))];
    let rebuilt = vec![mapping(vec![1, 2, 3, 4])];
    let at = |name: &str| 0x10_0000 + symbol_file_offset(&bin, name);
    let (heavy, light, main) = (at("hot_heavy"), at("hot_light"), at("main"));
    let (k1, k2) = (0xffff_ffff_8100_0150, 0xffff_ffff_8100_0210);
    // (mappings, user addresses, kernel addresses) of three recordings of one machine.
    let wants: [(&[Mapping], Vec<u64>, Vec<u64>); 3] = [
        (&right, vec![heavy, light], vec![k1]),
        (&right, vec![heavy, main], vec![k1, k2]),
        (&rebuilt, vec![heavy], vec![k2]),
    ];
    let new = || Symbolizer::with_kallsyms(Some(kallsyms.clone()));
    let mut alone: Vec<Symbolizer> = wants.iter().map(|_| new()).collect();
    let mut sent_alone = 0;
    for (sym, (maps, user, kernel)) in alone.iter_mut().zip(&wants) {
        sent_alone += prefetch_together(vec![(
            sym,
            user.iter().map(|&a| (a, *maps)).collect(),
            kernel.clone(),
        )]);
    }
    let mut together: Vec<Symbolizer> = wants.iter().map(|_| new()).collect();
    let requests = together
        .iter_mut()
        .zip(&wants)
        .map(|(sym, (maps, user, kernel))| {
            let user: Vec<(u64, &[Mapping])> = user.iter().map(|&a| (a, *maps)).collect();
            (sym, user, kernel.clone())
        })
        .collect();
    // Alone: 2 + 2 offsets (the rebuilt file sends none), 1 + 2 + 1 kernel addresses.
    assert_eq!(sent_alone, 8);
    assert_eq!(
        prefetch_together(requests),
        5,
        "hot_heavy, hot_light, main and the two kernel addresses, once each"
    );
    for ((a, t), (maps, user, kernel)) in alone.iter_mut().zip(&mut together).zip(&wants) {
        let before = t.stats();
        assert_eq!(a.stats(), before);
        for &addr in user {
            assert_eq!(a.user(addr, maps), t.user(addr, maps));
        }
        for &addr in kernel {
            assert_eq!(a.kernel(addr), t.kernel(addr));
        }
        assert_eq!(t.stats(), before, "every lookup was a cache hit");
        assert_eq!(a.stats(), before);
    }
    let leaf = |s: &mut Symbolizer, addr, maps| last_frame(&s.user(addr, maps)).function.clone();
    assert_eq!(leaf(&mut together[0], heavy, &right), "hot_heavy");
    assert_eq!(leaf(&mut together[1], main, &right), "main");
    let off = heavy - 0x10_0000;
    assert_eq!(
        leaf(&mut together[2], heavy, &rebuilt),
        format!("burn+{off:#x}"),
        "the recording whose build-id the file no longer has gets no names from it"
    );
    assert_eq!(last_frame(&together[1].kernel(k2)).function, "schedule");
    assert_eq!(together[2].stats().build_id_mismatches, 1);
}
