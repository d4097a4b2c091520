//! The live side of VM recognition: what `/proc` says about a VM process now. A process
//! that vanished reads as `None` (it is the caller's to forget it), never as an error.

use std::{collections::BTreeMap, fs, path::PathBuf};

use super::detect::{self, Hypervisor, ThreadClass, VmRef};

/// A running VM process, as read from `/proc`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveVm {
    /// Process id.
    pub pid: u32,
    /// Start time in clock ticks since boot (`/proc/PID/stat` field 22): with the pid it
    /// names this process and no later one with the same pid.
    pub start_ticks: u64,
    /// Owner's group (the directory shared with the VM is given to it).
    pub gid: u32,
    /// What its arguments and cgroup say; `name` always set (after the program and pid
    /// when nothing names it).
    pub vm: VmRef,
}

impl LiveVm {
    /// `pid:starttime`, the VM instance: a new VM of the same name has another one.
    pub fn instance(&self) -> String {
        format!("{}:{}", self.pid, self.start_ticks)
    }

    /// The VM's name.
    pub fn name(&self) -> &str {
        self.vm.name.as_deref().unwrap_or("vm")
    }
}

fn proc_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
}

/// Start time of `pid` in clock ticks since boot, `None` once it is gone.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(proc_dir(pid).join("stat")).ok()?;
    // Field 22 counts after the ")" that closes comm, which may hold spaces.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    after.split(' ').nth(19)?.parse().ok()
}

/// Whether the process `pid` started at `start_ticks` still runs.
pub fn alive(pid: u32, start_ticks: u64) -> bool {
    self::start_ticks(pid) == Some(start_ticks)
}

/// Reads process `pid` and recognises it as a VM; `cgroup` is its cgroup path when the
/// caller knows it better (the pipeline resolves cgroup namespaces), else `/proc`'s.
pub fn read(pid: u32, cgroup: Option<&str>) -> Option<LiveVm> {
    let dir = proc_dir(pid);
    let comm = fs::read_to_string(dir.join("comm")).ok()?;
    let raw = fs::read(dir.join("cmdline")).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let args: Vec<&str> = text.split('\0').filter(|a| !a.is_empty()).collect();
    let own_cgroup;
    let cgroup = match cgroup {
        Some(c) => c,
        None => {
            own_cgroup = fs::read_to_string(dir.join("cgroup")).unwrap_or_default();
            own_cgroup
                .lines()
                .find_map(|l| l.strip_prefix("0::"))
                .unwrap_or("")
        }
    };
    let mut vm = detect::recognise(&args, comm.trim_end(), cgroup)?;
    let start_ticks = start_ticks(pid)?;
    let gid = fs::read_to_string(dir.join("status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Gid:"))
                .and_then(|g| g.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0);
    if vm.name.is_none() {
        vm.name = Some(format!("{}-{pid}", vm.hypervisor.name()));
    }
    Some(LiveVm {
        pid,
        start_ticks,
        gid,
        vm,
    })
}

/// The threads of VM process `pid` by id, with their class; empty once it is gone.
/// Names are read fresh: a thread names itself after it starts, so the name the capture
/// saw first may be its parent's.
pub fn threads(pid: u32, vm: &VmRef) -> BTreeMap<u32, ThreadClass> {
    let mut out = BTreeMap::new();
    let Ok(dir) = fs::read_dir(proc_dir(pid).join("task")) else {
        return out;
    };
    let names: Vec<(u32, String)> = dir
        .filter_map(|e| {
            let e = e.ok()?;
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = fs::read_to_string(e.path().join("comm")).ok()?;
            Some((tid, comm.trim_end().to_owned()))
        })
        .collect();
    let named = named_threads(vm, names.iter().map(|(_, c)| c.as_str()));
    for (tid, comm) in names {
        out.insert(tid, detect::classify(vm.hypervisor, &comm, named));
    }
    out
}

/// Whether a VM's threads are named: its arguments say so, or a vCPU thread has a name.
pub fn named_threads<'a>(vm: &VmRef, comms: impl IntoIterator<Item = &'a str>) -> bool {
    vm.named_threads
        || comms.into_iter().any(|c| {
            matches!(
                detect::classify(vm.hypervisor, c, false),
                ThreadClass::Vcpu(_)
            )
        })
}

/// Every running VM process (a walk of `/proc`, reading `comm` first and the rest only for
/// a hypervisor's): the agent's start-up view, before windows name processes.
pub fn scan() -> Vec<LiveVm> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let comm = fs::read_to_string(proc_dir(pid).join("comm")).ok()?;
        Hypervisor::of_program(comm.trim_end())?;
        read(pid, None)
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_alive_and_no_vm() {
        let pid = std::process::id();
        let start = start_ticks(pid).expect("own stat");
        assert!(alive(pid, start));
        assert!(!alive(pid, start + 1));
        assert_eq!(read(pid, None), None, "a test binary runs no VM");
    }

    #[test]
    fn threads_are_classed_by_their_names_read_fresh_from_proc() {
        // A thread of this process names itself like a qemu vCPU after it started.
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let handle = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() } as u32;
            let name = std::ffi::CString::new("CPU 3/KVM").expect("no NUL");
            // SAFETY: a NUL-terminated name under 16 bytes, for the calling thread.
            unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) };
            tx.send(tid).expect("send");
            let _ = stop_rx.recv();
        });
        let tid = rx.recv().expect("tid");
        let vm = detect::recognise(&["qemu-system-x86_64"], "", "/").expect("qemu");
        let classes = threads(std::process::id(), &vm);
        let _ = stop_tx.send(());
        handle.join().expect("join");
        assert_eq!(classes.get(&tid), Some(&ThreadClass::Vcpu(3)));
        let main = std::process::id();
        assert_eq!(
            classes.get(&main),
            Some(&ThreadClass::Emulator),
            "a named vCPU makes the other threads emulator work"
        );
    }

    #[test]
    fn a_process_whose_arguments_look_like_qemu_is_read_as_a_vm() {
        // A real process whose argv looks like qemu's: argv[0] set through bash's
        // `exec -a`, qemu's flags after the script (bash keeps them as $0, $1, ...).
        let mut child = std::process::Command::new("bash")
            .args([
                "-c",
                "exec -a qemu-system-x86_64 bash -c 'sleep 30; :' -name guest=unit-vm,debug-threads=on -smp 3",
            ])
            .spawn()
            .expect("spawn bash");
        let pid = child.id();
        let mut seen = None;
        for _ in 0..200 {
            seen = read(pid, Some("/"));
            if seen.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        let live = seen.expect("recognised within 2 s");
        assert_eq!(live.name(), "unit-vm");
        assert_eq!(live.vm.vcpus, Some(3));
        assert!(live.instance().starts_with(&format!("{pid}:")));
    }
}
