//! Tests of the pprof writer: the profile decoded back with prost.

use super::*;
use crate::output::testdata;
use std::io::Read;

#[test]
fn round_trips_through_gzip_and_matches_golden() {
    let p = testdata::profile();
    let mut out = Vec::new();
    Pprof {
        default_value: None,
    }
    .write_profile(&p, &mut out)
    .expect("write");
    assert_eq!(&out[..2], &[0x1f, 0x8b], "gzip magic");
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&out[..])
        .read_to_end(&mut raw)
        .expect("gunzip");
    let back = pprof::Profile::decode(&raw[..]).expect("decode");
    let st = |i: i64| back.string_table[i as usize].as_str();
    let types: Vec<(&str, &str)> = back
        .sample_type
        .iter()
        .map(|v| (st(v.r#type), st(v.unit)))
        .collect();
    assert_eq!(
        types,
        vec![
            ("samples", "count"),
            ("cpu", "nanoseconds"),
            ("energy_package", "microjoules"),
            ("energy_dram", "microjoules")
        ]
    );
    assert_eq!(st(back.default_sample_type), "energy_package");
    assert_eq!(back.sample.len(), 5);
    assert_eq!(back.sample[0].value, vec![1, 10_000_000, 300_000, 30_000]);
    // Leaf first: the inlined `square` inside `hot_heavy`, one location.
    let leaf = &back.location[back.sample[0].location_id[0] as usize - 1];
    let func = &back.function[leaf.line[0].function_id as usize - 1];
    assert_eq!(
        (st(func.name), st(func.filename), leaf.line[0].line),
        ("square", "/src/burn.c", 8)
    );
    let labels: Vec<(&str, String)> = back.sample[2]
        .label
        .iter()
        .map(|l| {
            (
                st(l.key),
                if l.str != 0 {
                    st(l.str).to_string()
                } else {
                    l.num.to_string()
                },
            )
        })
        .collect();
    assert_eq!(
        labels,
        vec![
            ("pid", "100".into()),
            ("tid", "101".into()),
            ("comm", "burn".into()),
            ("cpu", "1".into()),
            ("cgroup", "7".into())
        ]
    );
    assert_eq!(back.duration_nanos, 2_000_000_000);
    assert_eq!(back.period, 10_000_000);
    testdata::assert_golden("profile.pb", &raw);
}

fn decode(p: &Profile) -> pprof::Profile {
    let bytes = to_pprof(p, None).encode_to_vec();
    pprof::Profile::decode(&bytes[..]).expect("decode")
}

/// Function names of a location's lines, innermost first.
fn names<'p>(back: &'p pprof::Profile, l: &pprof::Location) -> Vec<&'p str> {
    l.line
        .iter()
        .map(|line| {
            let f = &back.function[line.function_id as usize - 1];
            back.string_table[f.name as usize].as_str()
        })
        .collect()
}

#[test]
fn one_location_per_address_with_its_inline_chain_and_mapping() {
    let back = decode(&testdata::profile());
    let st = |i: i64| back.string_table[i as usize].as_str();
    // Locations: ids 1..=n, one per (mapping, address), real addresses but for the
    // synthetic frame, which has no mapping.
    let mut seen = std::collections::HashSet::new();
    for (i, l) in back.location.iter().enumerate() {
        assert_eq!(l.id, i as u64 + 1);
        assert!(seen.insert((l.mapping_id, l.address)), "{l:?} repeated");
        assert!(!l.is_folded);
        let synthetic = names(&back, l) == [crate::profile::NO_STACK_SAMPLE];
        assert_eq!(l.address == 0, synthetic, "{l:?}");
        assert_eq!(l.mapping_id == 0, synthetic, "{l:?}");
    }
    // The inlined chain is one location: `square` (innermost) then `hot_heavy`.
    let leaf = &back.location[back.sample[0].location_id[0] as usize - 1];
    assert_eq!(leaf.address, 0x5555_5555_5150);
    assert_eq!(names(&back, leaf), vec!["square", "hot_heavy"]);
    assert_eq!(
        leaf.line.iter().map(|l| l.line).collect::<Vec<_>>(),
        vec![8, 12]
    );
    // hot_heavy sampled at another address: its own location, same function.
    let other = &back.location[back.sample[1].location_id[0] as usize - 1];
    assert_ne!(other.id, leaf.id);
    assert_eq!(names(&back, other), vec!["hot_heavy"]);
    assert_eq!(other.line[0].function_id, leaf.line[1].function_id);
    assert_eq!(
        back.sample[0].location_id.len(),
        2,
        "square+hot_heavy, main"
    );

    // Mappings: the main binary first, with its build-id; every field as recorded.
    let m: Vec<(&str, u64, u64, u64, &str)> = back
        .mapping
        .iter()
        .map(|m| {
            (
                st(m.filename),
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                st(m.build_id),
            )
        })
        .collect();
    assert_eq!(
        m,
        vec![
            (
                "/opt/burn",
                0x5555_5555_5000,
                0x5555_5555_6000,
                0x1000,
                "deadbeef"
            ),
            (
                "[kernel.kallsyms]",
                0xffff_ffff_8100_0000,
                0xffff_ffff_8100_2000,
                0xffff_ffff_8100_0000,
                ""
            ),
            (
                "/usr/lib/libc.so.6",
                0x7f00_0000_0000,
                0x7f00_0010_0000,
                0,
                ""
            ),
        ]
    );
    assert!(
        back.mapping
            .iter()
            .enumerate()
            .all(|(i, m)| m.id == i as u64 + 1)
    );
    assert_eq!(leaf.mapping_id, 1);
    // What symbolization found: all of it in burn, names only in the kernel, nothing in
    // libc (its one frame is `libc.so.6+0x1234`).
    let flags: Vec<[bool; 4]> = back
        .mapping
        .iter()
        .map(|m| {
            [
                m.has_functions,
                m.has_filenames,
                m.has_line_numbers,
                m.has_inline_frames,
            ]
        })
        .collect();
    assert_eq!(
        flags,
        vec![
            [true, true, true, true],
            [true, false, false, false],
            [false, false, false, false]
        ]
    );
}

/// An -O1 program whose `outer` inlines `leaf`: a sample inside the inlined code, built
/// into a profile from a recording and exported, is one location with both functions.
#[test]
fn real_inlined_code_is_one_location_with_its_chain() {
    use crate::pb::v1::{Header, Mapping, Sample};
    use crate::profile::{Filter, SampleValues};
    use crate::record::Recording;
    use crate::symbolize::{Symbolizer, read_build_id};
    use std::process::Command;

    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("inl.c");
    std::fs::write(
        &src,
        "static volatile int sink;\n\
         static inline __attribute__((always_inline)) void leaf(int i) { sink += i * i; }\n\
         __attribute__((noinline)) void outer(int n) { for (int i = 0; i < n; i++) leaf(i); }\n\
         int main(int argc, char **argv) { (void)argv; outer(argc * 1000); return 0; }\n",
    )
    .expect("write source");
    let bin = dir.path().join("inl");
    let ok = Command::new("gcc")
        .args(["-O1", "-g", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run gcc (install gcc to run this test)");
    assert!(ok.success(), "gcc failed");

    // File offset of `outer` and its size, through the executable LOAD segment.
    let nm = Command::new("nm").arg("-S").arg(&bin).output().expect("nm");
    let nm = String::from_utf8_lossy(&nm.stdout);
    let (vaddr, size) = nm
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4 && f[3] == "outer").then(|| {
                let hex = |s: &str| u64::from_str_radix(s, 16).expect("hex");
                (hex(f[0]), hex(f[1]))
            })
        })
        .expect("outer in nm -S");
    let re = Command::new("readelf")
        .arg("-lW")
        .arg(&bin)
        .output()
        .expect("readelf");
    let re = String::from_utf8_lossy(&re.stdout);
    let offset = re
        .lines()
        .filter(|l| l.trim_start().starts_with("LOAD"))
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
            let (off, va, memsz) = (hex(f[1])?, hex(f[2])?, hex(f[5])?);
            (va..va + memsz)
                .contains(&vaddr)
                .then_some(vaddr - va + off)
        })
        .expect("outer in a LOAD segment");

    // One mapping of the whole file at BASE; find an address of `outer` in `leaf`.
    const BASE: u64 = 0x5600_0000_0000;
    let path = bin.to_str().expect("utf-8 path").to_string();
    let build_id = read_build_id(&bin);
    assert!(!build_id.is_empty(), "gcc links with a build-id");
    let mapping = Mapping {
        tgid: 1,
        start: BASE,
        end: BASE + 0x10_0000,
        file_offset: 0,
        path: path.clone(),
        build_id: build_id.clone(),
        ts_ns: 0,
    };
    let mut sym = Symbolizer::with_kallsyms(None);
    let addr = (BASE + offset..BASE + offset + size)
        .find(|&a| sym.user(a, std::slice::from_ref(&mapping)).len() > 1)
        .expect("an address of outer inside inlined leaf");

    let mut rec = Recording {
        header: Header {
            sample_hz: 100,
            ..Header::default()
        },
        end_ns: 1_000_000_000,
        ..Recording::default()
    };
    rec.mappings.insert(1, vec![mapping]);
    rec.samples.push(Sample {
        tid: 1,
        tgid: 1,
        user_stack: vec![addr],
        ..Sample::default()
    });
    let p = crate::profile::build(
        &rec,
        &SampleValues::cpu_time(&rec),
        &mut sym,
        &Filter::default(),
    );
    let back = decode(&p);
    let st = |i: i64| back.string_table[i as usize].as_str();
    assert_eq!(back.sample.len(), 1);
    assert_eq!(
        back.sample[0].location_id.len(),
        1,
        "one address, one location"
    );
    let l = &back.location[back.sample[0].location_id[0] as usize - 1];
    assert_eq!(l.address, addr);
    assert_eq!(names(&back, l), vec!["leaf", "outer"]);
    assert!(l.line.iter().all(|line| line.line > 0), "{l:?}");
    let m = &back.mapping[l.mapping_id as usize - 1];
    assert_eq!(st(m.filename), path);
    assert_eq!(st(m.build_id), hex(&build_id));
    assert_eq!(
        (m.memory_start, m.memory_limit, m.file_offset),
        (BASE, BASE + 0x10_0000, 0)
    );
    assert!(m.has_functions && m.has_filenames && m.has_line_numbers && m.has_inline_frames);
}
