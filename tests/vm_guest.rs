//! Energy inside a virtual machine, end to end with a real qemu guest (TCG): on the host the
//! real agent, on the emulated RAPL package (`util::two_cpu_package`, `util::BusyEmulator`),
//! recognises the qemu process and writes the VM's measured energy into its directory
//! (`--vm-share`), shared into the guest read-only; the guest's `energy-bpf` reads it as its
//! `hypervisor` source while two guest processes burn 3:1. The guest's numbers are checked
//! against what the agent wrote and against the burners' own CPU clocks, read inside the
//! guest; the share is checked read-only from inside; the agent is killed and restarted
//! mid-recording. Skips, saying why, only where qemu cannot start a guest here.
#[path = "vm_guest/image.rs"]
mod image;
#[path = "vm_guest/share_log.rs"]
mod share_log;

use std::{
    path::Path,
    time::{Duration, Instant},
};

use crate::util::{self, spawn_agent};
use share_log::ShareLog;

/// The emulated package's static power, W (given to the agent as `--static-power-w`).
const HOST_STATIC_W: f64 = 3.0;

/// The guest's script, run chrooted into the host's root. It records two windows: a steady
/// one until the lighter burner has had 3 s of CPU (cap 120 s of guest time), and one in
/// which the host's writer is killed and restarted (the host says when, through files in
/// the scratch directory). `@S@`: the scratch directory, `@BIN@`: this build's binary.
const GUEST_SH: &str = r#"
S=@S@; B=@BIN@; H=/run/energy-bpf/host
cd $S
# The host agent writes the share once it has seen this VM.
i=0; while [ ! -e $H/energy-bpf.json ] && [ $i -lt 120 ]; do sleep 0.5; i=$((i+1)); done
$B sources > sources.txt 2>&1; echo $? > sources.rc
# The share is read-only to the guest, root or not.
(echo 0 > $H/energy-bpf.json) 2> write.err; echo $? > write.rc
(mkdir $H/planted) 2>> write.err; echo $? >> write.rc
(echo 0 > $H/intel-rapl:0/energy_uj) 2>> write.err; echo $? >> write.rc
# Two burners on vCPU 1, 3:1 by their nice weights (1024 : 335); energy-bpf on vCPU 0.
taskset -c 1 sh -c 'while :; do :; done' & A=$!
taskset -c 1 nice -n 5 sh -c 'while :; do :; done' & L=$!
echo "$A $L" > pids
cat > window.sh <<END
cpu() { cut -d' ' -f1 /proc/\$1/schedstat; }
a0=\$(cpu $A); l0=\$(cpu $L); i=0
touch \$1.started
while [ \$((\$(cpu $L) - l0)) -lt 3000000000 ] && [ \$i -lt 240 ]; do sleep 0.5; i=\$((i+1)); done
if [ \$1 = restart ]; then
  while [ ! -e resumed ] && [ \$i -lt 240 ]; do sleep 0.5; i=\$((i+1)); done; sleep 4
fi
echo \$((\$(cpu $A) - a0)) \$((\$(cpu $L) - l0)) > \$1.cpu
END
$B record --unwind fp -F 49 -o steady.ebpr -- sh window.sh steady > steady.err 2>&1
echo $? > steady.rc
$B record --unwind fp -F 49 -o restart.ebpr -- sh window.sh restart > restart.err 2>&1
echo $? > restart.rc
kill $A $L
echo finished > finished
"#;

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// The hypervisor package source's readings of a recording: (energy µJ, flag), in time
/// order.
fn readings(file: &Path) -> Vec<(f64, String)> {
    let rec = energy_bpf::record::read_file(file).expect("recording reads back");
    let ids: Vec<u32> = rec
        .sources
        .iter()
        .filter(|s| s.kind == "hypervisor" && s.name.contains("package"))
        .map(|s| s.id)
        .collect();
    assert_eq!(
        ids.len(),
        1,
        "one hypervisor package source: {:?}",
        rec.sources
    );
    let mut out: Vec<(u64, f64, String)> = rec
        .readings
        .iter()
        .filter(|r| r.source_id == ids[0])
        .map(|r| (r.ts_ns, r.energy_uj, r.flag.clone()))
        .collect();
    out.sort_by_key(|r| r.0);
    out.into_iter().map(|(_, e, f)| (e, f)).collect()
}

/// The host's energy for the VM over the guest's window. Every guest reading must be a
/// value the host wrote, less the value the guest opened the counter at (found here): then
/// the window is from the first to the last reading, in the host's own numbers.
fn host_window_uj(log: &ShareLog, guest: &[(f64, String)], from_recording_start: bool) -> f64 {
    let values: Vec<u64> = log.writes().iter().map(|w| w.1).collect();
    let base = values
        .iter()
        .copied()
        .find(|&b| guest.iter().all(|(e, _)| values.contains(&(b + *e as u64))))
        .unwrap_or_else(|| panic!("guest readings {guest:?} are not host values {values:?}"));
    // From the recording's first read, the report leaves out the head up to the first
    // update the guest saw: the share's value at that read is an update made before the
    // recording began (`attribute::interval::without_stale_head`). A stretch after a gap
    // starts at a read that saw an update, and keeps its first interval.
    let first = if from_recording_start {
        guest
            .iter()
            .map(|(e, _)| *e as u64)
            .find(|&e| e > 0)
            .expect("a reading after an update")
    } else {
        guest.first().expect("readings").0 as u64
    };
    let last = guest.last().expect("readings").0 as u64;
    ((base + last) - (base + first)) as f64
}

#[test]
fn a_guest_reads_its_measured_energy_from_the_host_and_splits_it_by_process() {
    if !util::require_root("vm_guest") {
        return;
    }
    if let Some(why) = image::unavailable() {
        eprintln!("SKIPPED vm_guest: {why}");
        return;
    }
    let _guard = util::exclusive();
    let fake = util::two_cpu_package();
    let _emulator = util::BusyEmulator::start(&fake.energy_uj, HOST_STATIC_W, 10.0);
    let tmp = fake.dir.path();
    let scratch = tmp.join("scratch");
    // The VM's directory is made before the VM starts, as a launcher does: a 9p export is
    // bound to the directory qemu opened. The agent takes it over.
    let share = tmp.join("vms/e2e-guest");
    std::fs::create_dir_all(&scratch).expect("scratch");
    std::fs::create_dir_all(&share).expect("share");
    let script = GUEST_SH
        .replace("@S@", &scratch.display().to_string())
        .replace("@BIN@", &util::bin().display().to_string());
    std::fs::write(scratch.join("guest.sh"), script).expect("guest.sh");
    let mut guest = image::Guest::boot("e2e-guest", tmp, &scratch, &share);
    let static_w_text = HOST_STATIC_W.to_string();
    let flags = [
        "--energy-source",
        "powercap",
        "--sysfs-root",
        fake.sysfs.to_str().expect("utf-8 path"),
        "--vm-share",
        share.parent().and_then(Path::to_str).expect("utf-8 path"),
        "--vm-static",
        "vcpus",
        // Given: with a VM always busy the agent could not identify it.
        "--static-power-w",
        &static_w_text,
    ];
    let mut agent = Some(spawn_agent(tmp, &flags).0);
    let log = ShareLog::start(&share);
    // Once the guest has tried its writes: whether any reached the host's directory.
    let mut planted = None;
    // The restart: once the guest's second window runs, the agent is killed (SIGKILL) for
    // longer than two intervals (the guest must say the share went stale), then started
    // again on the same share.
    let (mut phase, mut killed_at) = (0, Instant::now());
    let mut tick = || {
        if planted.is_none() && read(&scratch, "write.rc").lines().count() == 3 {
            planted = Some(share.join("planted").exists());
        }
        match phase {
            0 if scratch.join("restart.started").exists() => {
                std::thread::sleep(Duration::from_secs(2));
                drop(agent.take());
                killed_at = Instant::now();
                phase = 1;
            }
            1 if killed_at.elapsed() > Duration::from_millis(3500) => {
                agent = Some(spawn_agent(tmp, &flags).0);
                std::fs::write(scratch.join("resumed"), "").expect("resumed");
                phase = 2;
            }
            _ => {}
        }
    };
    let ended = guest.wait(Duration::from_secs(480), &mut tick);
    drop(agent);
    assert!(
        ended && scratch.join("finished").exists(),
        "the guest did not finish (powered off: {ended}); its log:\n{}\nconsole:\n{}",
        read(&scratch, "guest.log"),
        guest.console_text()
    );
    let writes = log.writes();
    assert!(
        writes
            .windows(2)
            .all(|w| w[1].0 == w[0].0 + 1 && w[1].1 >= w[0].1),
        "the host's writes were not all seen, or went down: {:?}",
        writes.iter().map(|w| (w.0, w.1)).collect::<Vec<_>>()
    );

    // `sources` in the guest: the host's share, measured.
    let sources = read(&scratch, "sources.txt");
    eprintln!("guest `energy-bpf sources`:\n{sources}");
    assert_eq!(read(&scratch, "sources.rc").trim(), "0", "{sources}");
    assert!(
        sources.contains("measured by the host, shared at /run/energy-bpf/host, updated every 1 s")
            && sources.contains("In use: hypervisor intel-rapl:0 (package-0)")
            && !sources.contains("ESTIMATED"),
        "{sources}"
    );

    // The share is read-only from inside, and the host's files are the host's.
    let errs = read(&scratch, "write.err");
    let rcs = read(&scratch, "write.rc");
    assert!(
        rcs.lines().count() == 3 && rcs.lines().all(|rc| rc != "0"),
        "a guest write into the share succeeded: rc {rcs:?}: {errs}"
    );
    assert!(
        errs.lines()
            .all(|l| l.contains("Read-only file system") || l.contains("Permission denied")),
        "{errs}"
    );
    assert_eq!(
        planted,
        Some(false),
        "the guest planted a directory in the share"
    );

    // The steady window: the guest's total is the host's energy over the same window, and
    // the split follows the burners' CPU clocks.
    let steady_err = read(&scratch, "steady.err");
    assert_eq!(read(&scratch, "steady.rc").trim(), "0", "{steady_err}");
    let file = scratch.join("steady.ebpr");
    let guest_readings = readings(&file);
    assert!(
        guest_readings.iter().all(|(_, f)| f.is_empty()),
        "a steady window has no gap: {guest_readings:?}"
    );
    let host_j = host_window_uj(&log, &guest_readings, true) / 1e6;
    let report = util::report_json(&file);
    let total_j = report["total_j"].as_f64().expect("total_j");
    eprintln!("steady window: guest total {total_j:.3} J, host's energy for the VM {host_j:.3} J");
    assert!(
        (total_j - host_j).abs() <= 0.02 * host_j,
        "guest {total_j} J vs host {host_j} J"
    );
    // The guest's static power is the host's share for the VM, origin `host`.
    let statics = &report["static"];
    let package = statics
        .as_array()
        .and_then(|s| {
            s.iter()
                .find(|s| s["source"].as_str().is_some_and(|n| n.contains("package")))
        })
        .unwrap_or_else(|| panic!("no package static power: {statics}"));
    let static_w = package["static_w"].as_f64().expect("static_w");
    // The host's static share for the VM, from its own numbers, before the restart.
    let static_w_host = {
        let steady = writes
            .windows(2)
            .position(|w| w[1].3 - w[0].3 > Duration::from_millis(2500))
            .map_or(&writes[..], |i| &writes[..=i]);
        let (a, b) = (
            steady.first().expect("writes"),
            steady.last().expect("writes"),
        );
        (b.2 - a.2) as f64 / 1e6 / (b.3 - a.3).as_secs_f64()
    };
    eprintln!(
        "steady window: guest static power {static_w:.3} W, origin {} (the host's share: {static_w_host} W)",
        package["origin"]
    );
    assert_eq!(package["origin"]["kind"], "host", "{package}");
    // The guest times the share by the host's clock (`counted_us`); the truth here is timed
    // by this test's 50 ms polls over the steady stretch.
    assert!(
        (static_w - static_w_host).abs() <= 0.02 * static_w_host,
        "{package}"
    );
    assert_eq!(report["estimated"], false, "the guest's energy is measured");
    let pids: Vec<u32> = read(&scratch, "pids")
        .split_whitespace()
        .map(|p| p.parse().expect("pid"))
        .collect();
    let cpu: Vec<f64> = read(&scratch, "steady.cpu")
        .split_whitespace()
        .map(|n| n.parse().expect("cpu ns"))
        .collect();
    let joules = |pid: u32| {
        util::process(&report, pid)
            .and_then(|p| p["energy_j"]["package"].as_f64())
            .unwrap_or_else(|| panic!("no energy for burner {pid}: {report}"))
    };
    let (heavy, light) = (joules(pids[0]), joules(pids[1]));
    let (energy_ratio, cpu_ratio) = (heavy / light, cpu[0] / cpu[1]);
    eprintln!(
        "steady window: burners {heavy:.3} J : {light:.3} J = {energy_ratio:.2}, their CPU \
         clocks in the guest {cpu_ratio:.2}"
    );
    assert!(
        (energy_ratio - 3.0).abs() <= 0.3 && (energy_ratio - cpu_ratio).abs() <= 0.3,
        "energy split {energy_ratio:.2}, CPU clocks {cpu_ratio:.2}, wanted 3.0 ± 0.3 and equal"
    );
    let text = util::text(&util::run(&["report", file.to_str().expect("utf-8")]));
    assert!(
        !text.to_lowercase().contains("estimated"),
        "the guest's energy is measured: {text}"
    );

    // The restart window: no negative or doubled energy, the gap flagged and said.
    let restart_err = read(&scratch, "restart.err");
    assert_eq!(read(&scratch, "restart.rc").trim(), "0", "{restart_err}");
    if let Some(line) = restart_err.lines().find(|l| l.contains("stopped updating")) {
        eprintln!("restart window, the guest said: {line}");
    }
    assert!(
        restart_err.contains("stopped updating"),
        "the guest did not say the share went stale: {restart_err}"
    );
    let restart = readings(&scratch.join("restart.ebpr"));
    assert!(
        restart.windows(2).all(|w| w[1].0 >= w[0].0),
        "energy went down: {restart:?}"
    );
    assert!(
        restart
            .iter()
            .any(|(_, f)| f.contains("hypervisor share") && f.contains("flagged a gap")),
        "the restart was not flagged: {restart:?}"
    );
    // Not doubled, not invented: between gaps, every reading is a value the host wrote, so
    // what the guest counted is the host's energy over those stretches, and the report's
    // total is what was counted.
    let mut counted_j = 0.0;
    let mut counted_stretches = 0;
    let mut segment: Vec<(f64, String)> = Vec::new();
    for r in restart.iter().chain([&(f64::NAN, "end".to_owned())]) {
        if !r.1.is_empty() && !segment.is_empty() {
            let base = segment[0].0;
            let rebased: Vec<(f64, String)> =
                segment.iter().map(|(e, f)| (e - base, f.clone())).collect();
            let first_stretch = counted_stretches == 0;
            counted_j += host_window_uj(&log, &rebased, first_stretch) / 1e6;
            counted_stretches += 1;
            segment.clear();
        }
        segment.push(r.clone());
    }
    let restart_j = util::report_json(&scratch.join("restart.ebpr"))["total_j"]
        .as_f64()
        .expect("total_j");
    eprintln!(
        "restart window: guest total {restart_j:.3} J, host's energy over its stretches {counted_j:.3} J"
    );
    assert!(
        restart_j > 0.0 && (restart_j - counted_j).abs() <= 0.02 * counted_j,
        "{restart_j} J vs {counted_j} J"
    );
}
