//! The loaded probes: attach, drain, decode, count losses.

use std::{path::Path, thread, time::Duration};

use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{
        BtfTracePoint, PerfEvent,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use energy_bpf_abi::{ProcEvent, SampleEvent, SwitchEvent, comm_bytes, counter, proc_kind};

use super::{btf, host};
use crate::pb::v1::{self as pb, process_event::Kind};

const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Why capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Privilege, BTF or kernel-version problem found before loading.
    #[error(transparent)]
    Preflight(#[from] host::PreflightError),
    /// The kernel rejected the object (the verifier log is in the source).
    #[error("loading eBPF probes failed: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    /// A program could not be loaded or attached.
    #[error("attaching probe {program} failed: {source}")]
    Attach {
        /// Program name.
        program: &'static str,
        /// aya's error (carries the verifier log when the verifier refused it).
        source: Box<aya::programs::ProgramError>,
    },
    /// A map the object must contain was missing or of the wrong type.
    #[error("eBPF map {0} missing or of the wrong type")]
    Map(&'static str),
    /// Kernel BTF could not be read.
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
    /// Listing online CPUs failed.
    #[error("cannot list online CPUs: {0}")]
    Cpus(#[source] std::io::Error),
}

/// A task's `comm` as the kernel keeps it: NUL-padded bytes. Kept raw on the hot path (one
/// per switch event) and turned into a `String` only when a thread is new or renamed.
pub type Comm = [u8; energy_bpf_abi::COMM_LEN];

/// `comm` as text.
pub fn comm_string(raw: &Comm) -> String {
    String::from_utf8_lossy(comm_bytes(raw)).into_owned()
}

/// One decoded probe event, in the recording's types.
#[derive(Debug)]
pub enum Event {
    /// A context switch.
    Switch(pb::SwitchEvent),
    /// A stack sample (and the sampled task's raw comm).
    Sample(pb::Sample, Comm),
    /// A lifecycle event.
    Process(pb::ProcessEvent),
}

/// Loaded and attached probes. Dropping detaches everything.
pub struct Probes {
    _ebpf: Ebpf,
    switches: RingBuf<MapData>,
    samples: RingBuf<MapData>,
    procs: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    cpus: Vec<u32>,
    /// Whether the probes could read the task switched in (task_struct offsets known).
    pub next_known: bool,
}

impl Probes {
    /// Loads and attaches every probe; samples stacks at `sample_hz` on each online CPU.
    pub fn start(sample_hz: u64) -> Result<Self, CaptureError> {
        host::preflight(Path::new(VMLINUX_BTF))?;
        let (pid_off, tgid_off) = match btf::task_pid_offsets(Path::new(VMLINUX_BTF)) {
            Ok(offsets) => offsets,
            Err(err) => {
                tracing::warn!("{err}; fork children and the last run on each CPU will be unknown");
                (0, 0)
            }
        };
        let mut ebpf = EbpfLoader::new()
            .override_global("TASK_PID_OFFSET", &pid_off, true)
            .override_global("TASK_TGID_OFFSET", &tgid_off, true)
            .load(super::PROBES_OBJECT)
            .map_err(|e| CaptureError::Load(Box::new(e)))?;
        let kernel_btf = Btf::from_sys_fs().map_err(|e| CaptureError::Load(Box::new(e.into())))?;
        for (program, tracepoint) in [
            ("sched_switch", "sched_switch"),
            ("sched_process_exec", "sched_process_exec"),
            ("sched_process_fork", "sched_process_fork"),
            ("sched_process_exit", "sched_process_exit"),
        ] {
            let attach = |ebpf: &mut Ebpf| -> Result<(), aya::programs::ProgramError> {
                let prog: &mut BtfTracePoint = ebpf
                    .program_mut(program)
                    .ok_or(aya::programs::ProgramError::NotLoaded)?
                    .try_into()?;
                prog.load(tracepoint, &kernel_btf)?;
                prog.attach()?;
                Ok(())
            };
            attach(&mut ebpf).map_err(|e| CaptureError::Attach {
                program,
                source: Box::new(e),
            })?;
        }
        let cpus = aya::util::online_cpus().map_err(|(_, err)| CaptureError::Cpus(err))?;
        let attach_sampler = |ebpf: &mut Ebpf| -> Result<(), aya::programs::ProgramError> {
            let prog: &mut PerfEvent = ebpf
                .program_mut("sample_stack")
                .ok_or(aya::programs::ProgramError::NotLoaded)?
                .try_into()?;
            prog.load()?;
            for &cpu in &cpus {
                prog.attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(sample_hz),
                    false,
                )?;
            }
            Ok(())
        };
        attach_sampler(&mut ebpf).map_err(|e| CaptureError::Attach {
            program: "sample_stack",
            source: Box::new(e),
        })?;
        let mut ring = |name: &'static str| -> Result<RingBuf<MapData>, CaptureError> {
            let map = ebpf.take_map(name).ok_or(CaptureError::Map(name))?;
            RingBuf::try_from(map).map_err(|_| CaptureError::Map(name))
        };
        let (switches, samples, procs) = (ring("SWITCHES")?, ring("SAMPLES")?, ring("PROCS")?);
        let counters = ebpf
            .take_map("COUNTERS")
            .and_then(|m| PerCpuArray::try_from(m).ok())
            .ok_or(CaptureError::Map("COUNTERS"))?;
        let probes = Self {
            _ebpf: ebpf,
            switches,
            samples,
            procs,
            counters,
            cpus,
            next_known: pid_off != 0,
        };
        probes.sweep_cpus();
        Ok(probes)
    }

    /// Online CPUs the sampler is attached to.
    pub fn cpus(&self) -> &[u32] {
        &self.cpus
    }

    /// Forces a context switch on every CPU by running a short pinned thread there, so each
    /// CPU's timeline has a known task from this moment on even if one thread never yields.
    pub fn sweep_cpus(&self) {
        let handles: Vec<_> = self
            .cpus
            .iter()
            .map(|&cpu| {
                thread::spawn(move || {
                    // SAFETY: cpu_set_t is plain data; sched_setaffinity on the calling thread.
                    unsafe {
                        let mut set: libc::cpu_set_t = std::mem::zeroed();
                        libc::CPU_SET(cpu as usize, &mut set);
                        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                    }
                    thread::sleep(Duration::from_micros(200));
                })
            })
            .collect();
        for h in handles {
            let _ = h.join();
        }
    }

    /// Drains every ring buffer into `sink`. Returns the number of events.
    pub fn drain(&mut self, mut sink: impl FnMut(Event)) -> usize {
        let mut n = 0;
        while let Some(item) = self.switches.next() {
            if let Some(e) = read::<SwitchEvent>(&item) {
                sink(decode_switch(&e));
                n += 1;
            }
        }
        while let Some(item) = self.samples.next() {
            if let Some(e) = read::<SampleEvent>(&item) {
                sink(decode_sample(&e));
                n += 1;
            }
        }
        while let Some(item) = self.procs.next() {
            if let Some(e) = read::<ProcEvent>(&item) {
                sink(Event::Process(decode_proc(&e)));
                n += 1;
            }
        }
        n
    }

    /// The in-kernel loss counters, summed over CPUs.
    pub fn losses(&self) -> pb::LossCounters {
        let get = |index: u32| {
            self.counters
                .get(&index, 0)
                .map(|values| values.iter().sum::<u64>())
                .unwrap_or(0)
        };
        pb::LossCounters {
            switch_dropped: get(counter::SWITCH_DROPPED),
            sample_dropped: get(counter::SAMPLE_DROPPED),
            process_dropped: get(counter::PROC_DROPPED),
            stack_errors: get(counter::STACK_ERRORS),
            idle_samples: get(counter::IDLE_SAMPLES),
            vanished_processes: 0,
        }
    }
}

fn read<T: Copy>(bytes: &[u8]) -> Option<T> {
    (bytes.len() >= std::mem::size_of::<T>())
        // SAFETY: length checked; T is a Pod ABI struct valid for any bit pattern;
        // read_unaligned tolerates the ring buffer's 8-byte alignment.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

fn decode_switch(e: &SwitchEvent) -> Event {
    Event::Switch(pb::SwitchEvent {
        ts_ns: e.ts_ns,
        cpu: e.cpu,
        tid: e.prev_tid,
        tgid: e.prev_tgid,
        cgroup_id: e.cgroup_id,
        preempted: e.prev_state == 0,
        next_known: e.next_known != 0,
        next_tid: e.next_tid,
        next_tgid: e.next_tgid,
    })
}

fn decode_sample(e: &SampleEvent) -> Event {
    let k = (e.kernel_depth as usize).min(e.kernel_stack.len());
    let u = (e.user_depth as usize).min(e.user_stack.len());
    Event::Sample(
        pb::Sample {
            ts_ns: e.ts_ns,
            cpu: e.cpu,
            tid: e.tid,
            tgid: e.tgid,
            cgroup_id: e.cgroup_id,
            kernel_stack: e.kernel_stack[..k].to_vec(),
            user_stack: e.user_stack[..u].to_vec(),
        },
        e.comm,
    )
}

fn decode_proc(e: &ProcEvent) -> pb::ProcessEvent {
    let kind = match e.kind {
        proc_kind::EXEC => Kind::Exec,
        proc_kind::FORK => Kind::Fork,
        proc_kind::EXIT => Kind::Exit,
        _ => Kind::Unspecified,
    };
    pb::ProcessEvent {
        ts_ns: e.ts_ns,
        kind: kind as i32,
        tid: e.tid,
        tgid: e.tgid,
        child_tid: e.child_tid,
        child_tgid: e.child_tgid,
        comm: comm_string(&e.comm),
    }
}
