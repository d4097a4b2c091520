//! Makes the fuzz seed corpus (`fuzz/seeds/`) from a real recording: its header and first
//! chunks, each trimmed to a few events so a seed is a few KiB, written as version 3,
//! version 2 and cut short; the trimmed chunks' switch columns; and two BTF blobs, one
//! built by hand and the head of the running kernel's.
//!
//! `cargo run --example fuzz_seeds -- RECORDING fuzz/seeds`
use std::{fs, path::Path, process::ExitCode};

use energy_bpf::{
    pb::v1::{Chunk, Header, Record, Trailer, record::Kind},
    record::{MAGIC, Writer, columns, frame},
};
use prost::Message as _;

/// Chunks kept, and entries kept per list in each.
const CHUNKS: usize = 3;
const PER_LIST: usize = 12;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [recording, out] = args.as_slice() else {
        eprintln!("usage: fuzz_seeds RECORDING SEEDS_DIR");
        return ExitCode::FAILURE;
    };
    match run(Path::new(recording), Path::new(out)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fuzz_seeds: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(recording: &Path, out: &Path) -> Result<(), String> {
    let bytes = fs::read(recording).map_err(|e| format!("{}: {e}", recording.display()))?;
    let (header, chunks, trailer) = parse(&bytes)?;
    let chunks: Vec<Chunk> = chunks.into_iter().take(CHUNKS).map(trim).collect();
    for dir in ["recording", "columns", "btf"] {
        fs::create_dir_all(out.join(dir)).map_err(|e| e.to_string())?;
    }
    let rec_dir = out.join("recording");
    for version in [3, 2] {
        let path = rec_dir.join(format!("real-v{version}.ebpr"));
        let header = Header {
            format_version: version,
            command_line: vec!["energy-bpf".into(), "record".into()],
            ..header.clone()
        };
        let mut w = Writer::create(&path, &header).map_err(|e| e.to_string())?;
        for c in &chunks {
            w.chunk(c.clone()).map_err(|e| e.to_string())?;
        }
        w.finish(trailer.clone()).map_err(|e| e.to_string())?;
    }
    // Cut inside the last chunk, as a killed recorder leaves it.
    let v3 = fs::read(rec_dir.join("real-v3.ebpr")).map_err(|e| e.to_string())?;
    write(&rec_dir.join("real-v3-cut.ebpr"), &v3[..v3.len() * 3 / 4])?;
    for (i, c) in chunks.iter().enumerate() {
        if !c.switches.is_empty() {
            let cols = columns::to_columns(&c.switches).encode_to_vec();
            write(&out.join(format!("columns/chunk-{i}.bin")), &cols)?;
        }
    }
    write(&out.join("btf/tiny.btf"), &tiny_btf())?;
    if let Ok(vmlinux) = fs::read("/sys/kernel/btf/vmlinux") {
        write(
            &out.join("btf/vmlinux-head.btf"),
            &vmlinux[..vmlinux.len().min(4096)],
        )?;
    }
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), String> {
    fs::write(path, bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// The header, chunks (switch columns turned into events) and trailer of a version 3 file.
fn parse(bytes: &[u8]) -> Result<(Header, Vec<Chunk>, Trailer), String> {
    let mut rest = bytes.get(MAGIC.len()..).ok_or("too short")?;
    let header = match Record::decode_length_delimited(&mut rest).map_err(|e| e.to_string())? {
        Record {
            kind: Some(Kind::Header(h)),
        } => h,
        _ => return Err("no header".into()),
    };
    let mut rest = rest.get(4..).ok_or("no header checksum")?;
    let (mut chunks, mut trailer) = (Vec::new(), Trailer::default());
    while let frame::Frame::Whole { payload, len } = frame::parse(rest) {
        match Record::decode(payload).map_err(|e| e.to_string())?.kind {
            Some(Kind::Chunk(mut c)) => {
                if let Some(cols) = c.switch_columns.take() {
                    c.switches = columns::from_columns(&cols).map_err(|e| e.to_string())?;
                }
                chunks.push(c);
            }
            Some(Kind::Trailer(t)) => trailer = t,
            _ => {}
        }
        rest = &rest[len..];
    }
    Ok((header, chunks, trailer))
}

fn trim(mut c: Chunk) -> Chunk {
    c.switches.truncate(PER_LIST * 4);
    c.samples.truncate(PER_LIST);
    for s in &mut c.samples {
        s.kernel_stack.truncate(PER_LIST);
        s.user_stack.truncate(PER_LIST);
    }
    c.process_events.truncate(PER_LIST);
    c.threads.truncate(PER_LIST);
    // Keep the shape, not this machine's command lines and paths.
    for t in &mut c.threads {
        t.cmdline = t.comm.clone();
    }
    c.mappings.truncate(4);
    for m in &mut c.mappings {
        if !m.path.starts_with("/usr/") {
            m.path = "/usr/bin/program".into();
        }
    }
    c.readings.truncate(PER_LIST);
    c
}

/// BTF with an int and `struct task_struct { int pid; int tgid; }`
/// (include/uapi/linux/btf.h: 24-byte header, 12-byte btf_type, 12-byte btf_member).
fn tiny_btf() -> Vec<u8> {
    let strings = b"\0int\0task_struct\0pid\0tgid\0";
    let (int, task, pid, tgid) = (1u32, 5u32, 17u32, 21u32);
    let mut types = Vec::new();
    let mut u32s = |v: &[u32]| {
        v.iter()
            .for_each(|x| types.extend_from_slice(&x.to_le_bytes()))
    };
    // [1] INT "int": kind 1, size 4, encoding signed, 32 bits.
    u32s(&[int, 1 << 24, 4, (1 << 24) | 32]);
    // [2] STRUCT "task_struct": kind 4, vlen 2, size 8; members at bit offsets 0 and 32.
    u32s(&[task, (4 << 24) | 2, 8, pid, 1, 0, tgid, 1, 32]);
    let mut btf = Vec::new();
    btf.extend_from_slice(&0xeb9f_u16.to_le_bytes());
    btf.extend_from_slice(&[1, 0]); // version, flags
    for v in [
        24u32,
        0,
        types.len() as u32,
        types.len() as u32,
        strings.len() as u32,
    ] {
        btf.extend_from_slice(&v.to_le_bytes());
    }
    btf.extend_from_slice(&types);
    btf.extend_from_slice(strings);
    btf
}
