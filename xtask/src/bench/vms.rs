//! `cargo xtask bench vms [SECS] [N] [ROUNDS]`: the agent's CPU per running VM at 1 s updates.
//! N fake VMs (`tests/workloads/fake_vm.c` run as `qemu-system-x86_64 -name
//! guest=benchK,debug-threads=on -smp 1`: a `CPU 0/KVM` thread, an `IO iothread1` thread
//! and the main loop, each 2% busy in 10 ms periods) against the same N processes under a
//! name no hypervisor has (so the agent captures the same threads and switches but finds
//! no VM), and nothing extra, each phase SECS long under its own agent (`--interval 1
//! --vm-share DIR`), in ROUNDS rounds (medians: other load on the machine moves a phase).
//! Reports the agent's CPU in % of one CPU for: nothing extra, the N plain processes, the
//! N VMs; and per VM: (VMs − plain) / N, the cost of recognising VMs and writing their
//! directories, and (VMs − nothing) / N, everything a VM costs the agent.
use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use crate::util::{self, Result};

/// Runs the benchmark: `rounds` rounds of (nothing, plain processes, VMs), medians.
pub fn run(secs: u64, n: usize, rounds: usize) -> Result {
    let bin = super::release_bin()?;
    let dir = std::env::temp_dir().join(format!("energy-bpf-bench-vms-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let qemu = dir.join("qemu-system-x86_64");
    util::status(
        Command::new("gcc")
            .args(["-O2", "-pthread", "-o"])
            .arg(&qemu)
            .arg(util::root().join("tests/workloads/fake_vm.c")),
    )?;
    let plain = dir.join("plainproc");
    std::fs::copy(&qemu, &plain).map_err(|e| format!("copy: {e}"))?;
    println!(
        "# bench vms: the agent (--interval 1, model energy), {rounds} rounds of {secs} s phases; {n} processes with a `CPU 0/KVM`, an `IO iothread1` and a main thread at 2% each"
    );
    let (mut none, mut plains, mut vms) = (Vec::new(), Vec::new(), Vec::new());
    let mut written = 0;
    for round in 1..=rounds {
        none.push(phase(&bin, &dir, None, 0, secs)?);
        plains.push(phase(&bin, &dir, Some(&plain), n, secs)?);
        vms.push(phase(&bin, &dir, Some(&qemu), n, secs)?);
        written = std::fs::read_dir(dir.join("vms"))
            .map(|d| d.count())
            .unwrap_or(0);
        println!(
            "round {round}: agent CPU, % of one CPU: nothing extra {:.3}, {n} plain processes {:.3}, {n} VMs {:.3}",
            none[round - 1],
            plains[round - 1],
            vms[round - 1]
        );
        let _ = std::fs::remove_dir_all(dir.join("vms"));
    }
    let (none, plain_cpu, vms_cpu) = (
        super::median(&none),
        super::median(&plains),
        super::median(&vms),
    );
    println!(
        "medians: nothing extra {none:.3}%, {n} plain processes {plain_cpu:.3}%, {n} VMs {vms_cpu:.3}% of one CPU"
    );
    println!(
        "per VM: {:.4}% of one CPU for recognising it and writing its directory (VMs - plain processes), {:.4}% in all (VMs - nothing); {written} VM directories written",
        (vms_cpu - plain_cpu) / n.max(1) as f64,
        (vms_cpu - none) / n.max(1) as f64,
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Kills the fake VMs on drop.
struct Fleet(Vec<Child>);

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The agent's CPU in % of one CPU over `secs`, with `n` copies of `program` running.
fn phase(bin: &Path, dir: &Path, program: Option<&Path>, n: usize, secs: u64) -> Result<f64> {
    let mut fleet = Fleet(Vec::new());
    if let Some(program) = program {
        for k in 0..n {
            let child = Command::new(program)
                .args([
                    "-name",
                    &format!("guest=bench{k},debug-threads=on"),
                    "-smp",
                    "1",
                ])
                .env("FAKE_VM_VCPU_PCT", "2")
                .env("FAKE_VM_IO_PCT", "2")
                .spawn()
                .map_err(|e| format!("starting {}: {e}", program.display()))?;
            fleet.0.push(child);
        }
    }
    let mut agent = Command::new(bin)
        .args([
            "agent",
            "--interval",
            "1",
            "--metrics-addr",
            "127.0.0.1:0",
            "--socket",
        ])
        .arg(dir.join("agent.sock"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--vm-share")
        .arg(dir.join("vms"))
        .args(["--energy-source", "model"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the agent: {e}"))?;
    let pid = agent.id();
    let stderr = agent.stderr.take().ok_or("no stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("metrics at http://") => break,
            Some(Ok(_)) => {}
            _ => return Err("the agent exited before serving metrics".into()),
        }
    }
    thread::spawn(move || lines.for_each(drop));
    // The first windows allocate what the steady state reuses.
    thread::sleep(Duration::from_secs(5));
    let t0 = Instant::now();
    let cpu0 = super::agent::cpu_seconds(pid)?;
    thread::sleep(Duration::from_secs(secs));
    let cpu = super::agent::cpu_seconds(pid)? - cpu0;
    let pct = 100.0 * cpu / t0.elapsed().as_secs_f64();
    // SAFETY: kill with a valid pid of our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let _ = agent.wait();
    drop(fleet);
    Ok(pct)
}
