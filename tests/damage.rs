//! Damaged recordings: the damage is reported, never shown as real numbers, and no damaged
//! file makes a command use more than 200 MiB + 20 × its size of memory (heap).

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use energy_bpf::{
    pb::v1::{Record, record::Kind},
    record::{MAGIC, frame},
};
use prost::Message as _;

use crate::util::{bin, require_root, run, text};

/// A 3 s recording of a busy loop at 999 Hz: many chunks, most of them samples.
fn busy_recording(dir: &Path) -> PathBuf {
    let busy = crate::util::Workload::spawn("while :; do :; done", None);
    let file = dir.join("busy.ebpr");
    // Stacks of the busy shell only (switches stay system-wide): what symbolizing the
    // machine's other programs costs depends on which run and how much DWARF they carry,
    // not on the file, and the bound is about the file.
    let pid = busy.pid().to_string();
    let out = run(&[
        "record",
        "-F",
        "999",
        "-d",
        "3",
        "-p",
        &pid,
        "-o",
        file.to_str().expect("path"),
    ]);
    drop(busy);
    assert!(out.status.success(), "record failed: {}", text(&out));
    file
}

/// A version 3 file cut into its parts: the bytes up to the first frame (magic, header,
/// header checksum) and each frame's (offset, payload).
struct Frames {
    head: Vec<u8>,
    records: Vec<(usize, Record)>,
}

fn frames(bytes: &[u8]) -> Frames {
    let first = bytes
        .windows(4)
        .position(|w| w == frame::SYNC)
        .expect("a version 3 frame");
    let mut records = Vec::new();
    let mut at = first;
    while let frame::Frame::Whole { payload, len } = frame::parse(&bytes[at..]) {
        records.push((at, Record::decode(payload).expect("record decodes")));
        at += len;
    }
    assert_eq!(at, bytes.len(), "the whole file is frames");
    Frames {
        head: bytes[..first].to_vec(),
        records,
    }
}

impl Frames {
    /// The file again, with valid checksums around whatever was changed.
    fn encode(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        for (_, r) in &self.records {
            frame::encode(&r.encode_to_vec(), &mut out).expect("frame");
        }
        out
    }

    /// The same records in the framing of version 2 (no checksums).
    fn encode_version_2(&self) -> Vec<u8> {
        let mut rest = &self.head[MAGIC.len()..];
        let mut header = Record::decode_length_delimited(&mut rest).expect("header");
        if let Some(Kind::Header(h)) = &mut header.kind {
            h.format_version = 2;
        }
        let mut out = MAGIC.to_vec();
        for r in std::iter::once(&header).chain(self.records.iter().map(|(_, r)| r)) {
            r.encode_length_delimited(&mut out).expect("encode");
        }
        out
    }

    fn chunks_mut(&mut self) -> impl Iterator<Item = &mut energy_bpf::pb::v1::Chunk> {
        self.records
            .iter_mut()
            .filter_map(|(_, r)| match &mut r.kind {
                Some(Kind::Chunk(c)) => Some(c),
                _ => None,
            })
    }
}

#[test]
fn sixteen_flipped_bytes_in_a_chunk_are_reported_not_shown_as_data() {
    if !require_root("sixteen_flipped_bytes_in_a_chunk_are_reported_not_shown_as_data") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = busy_recording(dir.path());
    let mut bytes = std::fs::read(&file).expect("read");
    let parts = frames(&bytes);
    // The chunk frame holding the middle of the file; flip 16 bytes in its middle.
    let middle = bytes.len() / 2;
    let k = parts
        .records
        .iter()
        .rposition(|(at, _)| *at <= middle)
        .expect("a frame");
    let (start, end) = (parts.records[k].0, parts.records[k + 1].0);
    assert!(end - start > 64, "chunk of {} bytes", end - start);
    let flip = (start + end) / 2 - 8;
    for b in &mut bytes[flip..flip + 16] {
        *b ^= 0xa5;
    }
    let damaged = dir.path().join("damaged.ebpr");
    std::fs::write(&damaged, &bytes).expect("write");

    let out = run(&["report", damaged.to_str().expect("path")]);
    assert!(
        out.status.success(),
        "a damaged file still reports: {}",
        text(&out)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("1 record damaged") && stderr.contains("s of data lost"),
        "report says what was damaged: {stderr}"
    );
    let json = crate::util::report_json(&damaged);
    assert_eq!(json["damage"]["records_damaged"], 1, "{:#}", json["damage"]);
    let lost = json["damage"]["lost_s"].as_f64().expect("lost_s");
    assert!(lost > 0.0 && lost < 1.5, "one drain's worth lost: {lost} s");
    assert_eq!(
        json["truncated"], false,
        "the trailer after the damage is read"
    );
    let whole = crate::util::report_json(&file);
    assert_eq!(whole["damage"]["records_damaged"], 0);
    assert_eq!(json["duration_ns"], whole["duration_ns"]);

    let svg = dir.path().join("flame.svg");
    let out = run(&[
        "flamegraph",
        "-o",
        svg.to_str().expect("path"),
        damaged.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("1 record damaged"),
        "flamegraph says so too: {}",
        text(&out)
    );
}

/// What a bounded run left: its output and its peak resident memory.
struct Bounded {
    out: Output,
    max_rss: u64,
}

/// Runs `energy-bpf ARGS` with its heap limited to 200 MiB + 20 × `input` bytes, killed
/// after 120 s, and measures its peak RSS (its `VmHWM`, polled every 2 ms). `RLIMIT_DATA` (brk and private writable
/// mappings) is the memory the input can make grow; `RLIMIT_AS` would also count the
/// read-only mappings of the binaries that symbolization opens, whose size depends on the
/// machine, not on the file.
fn run_bounded(args: &[&str], input: u64) -> Bounded {
    use std::io::Read as _;

    let limit = bound(input);
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A failed allocation must abort at once, not capture a backtrace first.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    // SAFETY: setrlimit is async-signal-safe; the closure touches no other state.
    unsafe {
        cmd.pre_exec(move || {
            let rlim = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &rlim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    #[allow(clippy::zombie_processes, reason = "reaped by wait4 below")]
    let mut child = cmd.spawn().expect("run energy-bpf");
    let pid = child.id() as libc::pid_t;
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    // The peak of the program's own memory, polled from /proc while it runs. Not wait4's
    // ru_maxrss: the child is forked from this test process, and the RSS that copy had
    // before exec (this process's, however large other tests made it) counts there too.
    let polling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let poller = {
        let polling = std::sync::Arc::clone(&polling);
        std::thread::spawn(move || {
            let mut peak: Option<u64> = None;
            while polling.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(hwm) = exec_peak_kib(pid) {
                    peak = Some(peak.map_or(hwm, |p| p.max(hwm)));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        })
    };
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let hung = finished.recv_timeout(Duration::from_secs(120)).is_err();
        if hung {
            // SAFETY: kill on our own child, not yet reaped (the main thread is waiting).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        hung
    });
    // wait4 rather than Child::wait: its RSS is the fallback where no poll saw the program.
    let mut status = 0;
    // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child, with pointers to live locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    polling.store(false, std::sync::atomic::Ordering::Relaxed);
    let polled_kib = poller.join().expect("poller");
    let _ = done.send(());
    let hung = watchdog.join().expect("watchdog");
    let out = Output {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        stdout: stdout.join().expect("stdout"),
        stderr: stderr.join().expect("stderr"),
    };
    assert!(!hung, "{args:?} still running after 120 s: {}", text(&out));
    Bounded {
        out,
        // ru_maxrss (KiB on Linux), which over-counts, only where no poll saw the program.
        max_rss: polled_kib.unwrap_or(usage.ru_maxrss as u64) * 1024,
    }
}

/// `VmHWM` of process `pid` (KiB) once it runs our binary (before exec it is a copy of
/// this test process, whose peak is not the program's).
fn exec_peak_kib(pid: libc::pid_t) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let name = status.lines().find_map(|l| l.strip_prefix("Name:"))?.trim();
    if name != "energy-bpf" {
        return None;
    }
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The memory any command may use for an input of `bytes`: 200 MiB + 20 × its size.
fn bound(bytes: u64) -> u64 {
    (200 << 20) + 20 * bytes
}

#[test]
fn damaged_files_stay_within_the_memory_bound() {
    if !require_root("damaged_files_stay_within_the_memory_bound") {
        return;
    }
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = busy_recording(dir.path());
    let bytes = std::fs::read(&file).expect("read");
    let parts = frames(&bytes);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![("whole", bytes.clone())];

    // The damage that once took 24 GB: an end time centuries away, with a valid checksum
    // (a crafted file) and in a version 2 file (no checksum at all).
    let mut far_end = frames(&bytes);
    for (_, r) in &mut far_end.records {
        if let Some(Kind::Trailer(t)) = &mut r.kind {
            t.end_ns = u64::MAX - 1;
        }
    }
    cases.push(("end time u64::MAX, valid checksums", far_end.encode()));
    cases.push(("end time u64::MAX, version 2", far_end.encode_version_2()));

    // Every timestamp of every other chunk pushed 30 years ahead, and the rest back to 0.
    let mut leaps = frames(&bytes);
    for (i, c) in leaps.chunks_mut().enumerate() {
        let shift = |t: &mut u64| *t = if i % 2 == 0 { *t + (1 << 60) } else { 0 };
        c.samples.iter_mut().for_each(|s| shift(&mut s.ts_ns));
        c.readings.iter_mut().for_each(|r| shift(&mut r.ts_ns));
        c.process_events
            .iter_mut()
            .for_each(|p| shift(&mut p.ts_ns));
    }
    cases.push(("timestamps leaping", leaps.encode()));

    // Random damage: 64 bursts of flipped bytes, seeded so a failure replays.
    let mut random = bytes.clone();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = parts.head.len() + (x as usize % (random.len() - parts.head.len() - 8));
        for b in &mut random[at..at + 8] {
            *b ^= (x >> 8) as u8 | 1;
        }
    }
    cases.push(("64 random bursts", random));

    for (what, data) in cases {
        let path = dir.path().join("case.ebpr");
        std::fs::write(&path, &data).expect("write");
        let p = path.to_str().expect("path");
        let svg = dir.path().join("case.svg");
        for args in [
            vec!["report", "--format", "json", p],
            vec!["report", "--by", "function", p],
            vec!["flamegraph", "-o", svg.to_str().expect("path"), p],
        ] {
            let run = run_bounded(&args, data.len() as u64);
            let (out, msg) = (&run.out, text(&run.out));
            assert!(
                run.max_rss <= bound(data.len() as u64),
                "{what}: {args:?} peaked at {} MiB",
                run.max_rss >> 20
            );
            assert!(
                out.status.success() || msg.contains("no samples to show"),
                "{what}: {args:?} failed within 200 MiB + 20 × {} bytes: {msg}",
                data.len()
            );
            assert!(!msg.contains("panicked"), "{what}: {msg}");
            if what != "whole" {
                assert!(
                    msg.contains("damaged") || msg.contains("cut short"),
                    "{what}: {args:?} says nothing: {msg}"
                );
            }
        }
    }
}

/// Records that decode to far more than their size (empty messages two bytes each, one-byte
/// column entries that each become a 56-byte event) are skipped and said to be, so that
/// every command that reads recordings stays within 200 MiB + 20 × the file's size.
#[test]
fn dense_crafted_records_stay_within_the_memory_bound() {
    use energy_bpf::{
        pb::v1::{
            Chunk, EnergyReading, EnergySource, Header, Sample, SwitchColumns, SwitchEvent, Trailer,
        },
        record::{FORMAT_VERSION, Writer},
    };

    const START: u64 = 1_000_000_000;
    let dir = tempfile::tempdir().expect("tempdir");
    let n = 1usize << 20;
    // Built one at a time and dropped before the commands run: a child's peak RSS counts
    // what it shared with this process when forked.
    let shapes: [(&str, &dyn Fn() -> Chunk); 5] = [
        ("empty energy sources", &|| Chunk {
            sources: vec![EnergySource::default(); n],
            ..Default::default()
        }),
        ("empty switch events", &|| Chunk {
            switches: vec![SwitchEvent::default(); n],
            ..Default::default()
        }),
        ("empty samples", &|| Chunk {
            samples: vec![Sample::default(); n],
            ..Default::default()
        }),
        ("empty readings", &|| Chunk {
            readings: vec![EnergyReading::default(); n],
            ..Default::default()
        }),
        ("one-byte switch columns", &|| Chunk {
            switch_columns: Some(SwitchColumns {
                cpu: vec![0],
                cpu_run_length: vec![n as u32],
                ts_delta_ns: vec![1; n],
                flags: vec![12; n],
                ..Default::default()
            }),
            ..Default::default()
        }),
    ];
    for (what, chunk) in shapes {
        // Eight chunks of 2 MiB: 16 MiB, some 40 times that once decoded.
        let series = dir.path().join(what.replace(' ', "_"));
        std::fs::create_dir(&series).expect("mkdir");
        let file = series.join("energy-bpf-1000-0.ebpr");
        let header = Header {
            format_version: FORMAT_VERSION,
            start_ns: START,
            cpus: vec![energy_bpf::pb::v1::Cpu::default()],
            ..Default::default()
        };
        let mut w = Writer::create(&file, &header).expect("create");
        for _ in 0..8 {
            w.chunk(chunk()).expect("chunk");
        }
        w.finish(Trailer {
            end_ns: START + 1_000_000,
            ..Default::default()
        })
        .expect("finish");
        let size = std::fs::metadata(&file).expect("stat").len();
        assert!(size > 15 << 20, "{what}: {size} bytes");
        let (p, d) = (file.to_str().expect("path"), series.to_str().expect("path"));
        let svg = dir.path().join("dense.svg");
        for args in [
            vec!["report", "--format", "json", p],
            vec!["flamegraph", "-o", svg.to_str().expect("path"), p],
            vec!["top", "--batch", "-n", "3", "--replay", p],
            // The agent's directory of rotating files.
            vec!["report", d],
        ] {
            let run = run_bounded(&args, size);
            let msg = text(&run.out);
            assert!(
                run.max_rss <= bound(size),
                "{what}: {args:?} peaked at {} MiB, over 200 MiB + 20 × {} MiB",
                run.max_rss >> 20,
                size >> 20
            );
            assert!(
                run.out.status.success() || msg.contains("no samples to show"),
                "{what}: {args:?}: {msg}"
            );
            assert!(!msg.contains("panicked"), "{what}: {msg}");
            assert!(
                msg.contains("skipped as too large to decode within the memory bound"),
                "{what}: {args:?} does not say what it left out: {msg}"
            );
            eprintln!(
                "{what}: {} peaked at {} MiB (bound {} MiB)",
                args[0],
                run.max_rss >> 20,
                bound(size) >> 20
            );
        }
    }
}

/// A context-switch storm is the densest real recording (a switch in about 3 bytes of
/// columns, 56 once decoded): it must read whole, not be taken for a crafted file, and
/// every command that reads it must stay within 200 MiB + 20 × its size.
///
/// How many switches a second holds depends on the machine, so the ping-pong runs until
/// the recording is dense enough (`STORM_BYTES`), not for a fixed time; `STORM_CAP` bounds
/// it on a machine too slow to get there, and then the test says how dense it got and
/// checks the rest.
#[test]
fn a_context_switch_storm_reads_whole() {
    if !require_root("a_context_switch_storm_reads_whole") {
        return;
    }
    // More than an allowance of 48 MiB + 4 × the file's size would hold once decoded
    // (4 MiB of columns), with room for the chunk in flight when the workload is stopped.
    const STORM_BYTES: u64 = 9 << 19;
    const STORM_CAP: Duration = Duration::from_secs(90);
    let _guard = crate::util::exclusive();
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = crate::util::gcc(
        &crate::util::workload("pingpong.c"),
        &dir.path().join("pingpong"),
        &["-O2"],
    );
    let file = dir.path().join("storm.ebpr");
    let stop = dir.path().join("stop");
    let recorder = Command::new(bin())
        .args(["record", "--energy-source", "model", "-o"])
        .arg(&file)
        // Both ends on one CPU: every round trip is two switches there, back to back.
        .args(["--", "taskset", "-c", "0"])
        .arg(&prog)
        .arg(STORM_CAP.as_secs().to_string())
        .arg(&stop)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn record");
    let dense = crate::util::until(STORM_CAP, || {
        std::fs::metadata(&file).is_ok_and(|m| m.len() > STORM_BYTES)
    });
    std::fs::write(&stop, b"").expect("write the stop file");
    let out = recorder.wait_with_output().expect("wait for record");
    assert!(out.status.success(), "record failed: {}", text(&out));
    let size = std::fs::metadata(&file).expect("stat").len();
    let report = crate::util::report_json(&file);
    let msg = text(&out);
    // The workload's own clock: how long the storm ran.
    let ran_s: f64 = msg
        .lines()
        .find_map(|l| {
            l.strip_prefix("pingpong: ")?
                .split(" in ")
                .nth(1)?
                .strip_suffix(" s")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the workload did not say how long it ran: {msg}"));
    let recorded_s = report["duration_ns"].as_f64().unwrap_or(0.0) / 1e9;
    eprintln!(
        "switch storm: {} KiB for {recorded_s:.1} s (workload {ran_s:.1} s), damage {}",
        size >> 10,
        report["damage"]
    );
    if dense {
        // Dense enough that an allowance of 48 MiB + 4 × the file's size would drop records.
        assert!(size > 4 << 20, "only {size} bytes: not a storm");
    } else {
        eprintln!(
            "switch storm: this machine made only {} KiB of switches in {} s (wanted {} KiB); \
             the rest is still checked",
            size >> 10,
            STORM_CAP.as_secs(),
            STORM_BYTES >> 10
        );
    }
    assert_eq!(
        report["damage"]["records_oversized"], 0,
        "{}",
        report["damage"]
    );
    assert_eq!(
        report["damage"]["records_damaged"], 0,
        "{}",
        report["damage"]
    );
    // Whole: the recording spans the storm (the recorder starts before the command and
    // stops after it).
    assert!(
        recorded_s >= 0.98 * ran_s,
        "whole: {recorded_s:.3} s recorded of a {ran_s:.3} s storm: {report:#}"
    );
    let (p, svg) = (file.to_str().expect("path"), dir.path().join("storm.svg"));
    for args in [
        vec!["report", "--format", "json", p],
        vec!["flamegraph", "-o", svg.to_str().expect("path"), p],
        vec!["top", "--batch", "--replay", p],
    ] {
        let run = run_bounded(&args, size);
        let msg = text(&run.out);
        eprintln!(
            "switch storm: {} peaked at {} MiB (bound {} MiB)",
            args[0],
            run.max_rss >> 20,
            bound(size) >> 20
        );
        assert!(
            run.max_rss <= bound(size),
            "{args:?} peaked at {} MiB, over 200 MiB + 20 × {} MiB",
            run.max_rss >> 20,
            size >> 20
        );
        assert!(run.out.status.success(), "{args:?}: {msg}");
    }
}
