//! Names stored at the end of a recording: gathered, resolved, written, read back and used
//! exactly as live symbolization names the same addresses, and kept within the bounds.

use std::path::Path;

use super::super::tests::{build_burn, symbol_file_offset};
use super::*;
use crate::pb::v1::{Header, Sample, Trailer};
use crate::profile::{self, Filter};
use crate::record::{FORMAT_VERSION, Writer, read_file, symbols::check};
use crate::symbolize::{prefetch_together, read_build_id};

const KALLSYMS: &str =
    "ffffffff81000000 T _stext\nffffffff81000100 T do_syscall_64\nffffffff81000200 t schedule\n";

fn mapping(path: &Path, build_id: Vec<u8>, start: u64) -> Mapping {
    Mapping {
        tgid: 1,
        start,
        end: start + 0x10_0000,
        file_offset: 0,
        path: path.to_string_lossy().into_owned(),
        build_id,
        ts_ns: 0,
    }
}

#[test]
fn names_stored_at_the_end_read_back_and_name_what_live_lookups_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = build_burn(dir.path());
    let kallsyms = dir.path().join("kallsyms");
    std::fs::write(&kallsyms, KALLSYMS).expect("write kallsyms");
    let at = |name: &str| 0x10_0000 + symbol_file_offset(&bin, name);
    let (heavy, light, main) = (at("hot_heavy"), at("hot_light"), at("main"));
    let gone = dir.path().join("gone.so");
    let chunk = Chunk {
        mappings: vec![
            mapping(&bin, read_build_id(&bin), 0x10_0000),
            mapping(&gone, Vec::new(), 0x40_0000),
        ],
        samples: vec![
            Sample {
                tid: 1,
                tgid: 1,
                user_stack: vec![heavy + 3, main + 9, 0x40_0123],
                kernel_stack: vec![0xffff_ffff_8100_0150, 0xffff_ffff_8100_0211],
                ..Sample::default()
            },
            Sample {
                tid: 1,
                tgid: 1,
                // An address in no mapping: nothing to store, a report names it anyway.
                user_stack: vec![light + 1, 0x90_0000],
                ..Sample::default()
            },
        ],
        ..Chunk::default()
    };
    let mut collector = Collector::default();
    collector.add(&chunk);
    assert_eq!(collector.len(), (5, 2));

    let path = dir.path().join("rec.ebpr");
    let header = Header {
        format_version: FORMAT_VERSION,
        ..Header::default()
    };
    let mut w = Writer::create(&path, &header).expect("create");
    w.chunk(chunk).expect("chunk");
    let mut at_end = Symbolizer::with_kallsyms(Some(kallsyms.clone()));
    let tables = collector.tables(&mut at_end);
    assert_eq!(tables.len(), 1);
    assert!(check(&tables[0]).is_ok());
    for t in &tables {
        w.symbols(t.clone()).expect("symbols");
    }
    w.finish(Trailer::default()).expect("finish");
    let rec = read_file(&path).expect("read");
    assert_eq!(*rec.symbols, tables, "the tables read back as written");

    // What a report looks up: exactly what the recorder gathered, less the unmapped one.
    let (user, kernel) = profile::needed(&rec, &Filter::default(), false);
    assert_eq!((user.len(), kernel.len()), (5, 2));
    let mut live = Symbolizer::with_kallsyms(Some(kallsyms.clone()));
    let mut stored = Symbolizer::with_kallsyms(None);
    stored.use_stored(&rec.symbols);
    // Prefetching sends nothing to blazesym: every mapped address is stored.
    let request = vec![(&mut stored, user.clone(), kernel.clone())];
    assert_eq!(prefetch_together(request), 0);
    for &(addr, maps) in &user {
        assert_eq!(stored.user(addr, maps), live.user(addr, maps), "{addr:#x}");
    }
    for &addr in &kernel {
        assert_eq!(stored.kernel(addr), live.kernel(addr), "{addr:#x}");
    }
    let s = stored.stats();
    assert_eq!(s.stored, 6, "4 offsets in 2 files and 2 kernel addresses");
    assert_eq!(
        (s.resolved, s.unresolved),
        (0, 1),
        "only the unmapped address was looked up live"
    );
    let leaf = |s: &mut Symbolizer, addr| {
        let maps = &rec.mappings[&1];
        s.user(addr, maps).last().expect("a frame").function.clone()
    };
    assert_eq!(leaf(&mut stored, heavy + 3), "hot_heavy");
    assert_eq!(
        leaf(&mut stored, 0x40_0122),
        "gone.so+0x122",
        "unresolved stays unresolved"
    );

    // The binary gone: a fresh report's symbolizer still names it from the recording.
    std::fs::remove_file(&bin).expect("delete burn");
    let mut after = Symbolizer::with_kallsyms(None);
    after.use_stored(&rec.symbols);
    assert_eq!(leaf(&mut after, light + 1), "hot_light");
    assert_eq!(leaf(&mut after, main + 8), "main");
    let mut without = Symbolizer::with_kallsyms(None);
    assert_ne!(leaf(&mut without, light + 1), "hot_light");
}

fn frame(i: usize) -> Frame {
    Frame {
        function: format!("f{i}"),
        file: Some(format!("/src/{i}.c")),
        line: Some(i as u32),
        module: "/bin/x".into(),
        inlined: i.is_multiple_of(2),
        kind: FrameKind::Native,
    }
}

#[test]
fn large_tables_split_within_the_bounds_a_reader_checks() {
    let mut tables = Tables::default();
    let n = MAX_STRINGS; // two strings each: about two tables' worth
    let none = Frame::unresolved("/bin/x", u64::MAX, FrameKind::Native);
    for i in 0..n {
        tables.add(Some(("/bin/x", &[7])), i as u64, &[frame(i)], &none);
    }
    // Left out: a name over the bound, a chain over the frame bound.
    let mut long = frame(0);
    long.function = "x".repeat(MAX_STRING_LEN + 1);
    tables.add(Some(("/bin/x", &[7])), 1 << 40, &[long], &none);
    let deep: Vec<Frame> = (0..=MAX_FRAMES).map(frame).collect();
    tables.add(Some(("/bin/x", &[7])), 1 << 41, &deep, &none);
    // Unresolved: stored with no frames.
    let unresolved = Frame::unresolved("[kernel]", 0xffff_1234, FrameKind::Kernel);
    tables.add(
        None,
        0xffff_1234,
        std::slice::from_ref(&unresolved),
        &unresolved,
    );
    let out = tables.finish();
    assert!(out.len() >= 2, "{} tables", out.len());
    let mut addresses = 0;
    for t in &out {
        assert_eq!(check(t), Ok(()));
        assert!(t.strings.len() <= MAX_STRINGS);
        addresses += t.files.iter().map(|f| f.addresses.len()).sum::<usize>();
        assert!(t.files.iter().all(|f| f.build_id == [7]));
    }
    assert_eq!(addresses, n, "every storable address once");
    let kernel: Vec<_> = out.iter().flat_map(|t| &t.kernel).collect();
    assert_eq!(kernel.len(), 1);
    assert!(kernel[0].frames.is_empty());

    // Read back, each address gives its frame.
    let mut s = Symbolizer::with_kallsyms(None);
    s.use_stored(&std::sync::Arc::new(out.clone()));
    let maps = [Mapping {
        start: 0,
        end: u64::MAX,
        path: "/bin/x".into(),
        ..Mapping::default()
    }];
    for i in [0, 1, n / 2, n - 1] {
        assert_eq!(s.user(i as u64, &maps), vec![frame(i)]);
    }
    assert_eq!(s.kernel(0xffff_1234), vec![unresolved]);
}

#[test]
fn the_collector_keeps_at_most_its_bound_of_addresses() {
    let mut c = Collector::default();
    let sample = |first: u64, n: u64| Sample {
        tgid: 1,
        user_stack: (first..first + n).map(|a| a * 2).collect(),
        ..Sample::default()
    };
    let chunk = |first, n| Chunk {
        samples: vec![sample(first, n)],
        ..Chunk::default()
    };
    c.add(&chunk(0, MAX_COLLECTED as u64 - 1));
    assert_eq!(c.len(), (MAX_COLLECTED - 1, 0));
    assert_eq!(c.skipped(), 0);
    // One more fits; the next two new ones do not, a known one is no loss.
    c.add(&chunk(MAX_COLLECTED as u64 - 1, 3));
    c.add(&chunk(0, 1));
    assert_eq!(c.len(), (MAX_COLLECTED, 0));
    assert_eq!(c.skipped(), 2);
}
