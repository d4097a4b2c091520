//! The capture side of the CPython frame walker (docs/ARCHITECTURE.md, "Python frames"):
//! which processes run a CPython it walks, their entries in the probe's `PY_PROCS` map, and
//! the naming of each sample's Python frames while the process lives.
//!
//! A process is looked at on its first sample, and again a few times shortly after while
//! the dynamic loader may still be mapping its libraries (a shared build maps `libpython`
//! after exec), on the capture thread. A look reads `/proc/PID/maps` and opens only files
//! named like a CPython; once a sample ran outside the loader, what was found is settled,
//! so a process that is no CPython costs one look, not one per retry. What was found
//! is recorded (`PythonProcess`), so `sources` and the report say which processes were
//! walked and why others were not.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData, ProgramArray};
use aya::programs::PerfEvent;
use energy_bpf_abi::PyProcess;

use crate::pb::v1 as pb;
use crate::python::discover::{self, Found};
use crate::python::{Namer, RawFrames};

/// Looks at a process that was not (yet) a CPython at most this many times...
const RETRIES: u32 = 20;
/// ...this far apart (a second in all: a shared build maps libpython within milliseconds
/// of exec).
const RETRY_EVERY: Duration = Duration::from_millis(50);

/// Processes remembered at once (walked or not); past this, new ones are not looked at.
const MAX_TRACKED: usize = 4 * energy_bpf_abi::PY_PROCESSES as usize;

/// Environment variable that turns the walker off (`0` or `off`).
const ENV_OFF: &str = "ENERGY_BPF_PYTHON";

/// Whether the walker should be loaded.
pub fn wanted() -> bool {
    !matches!(
        std::env::var(ENV_OFF).as_deref(),
        Ok("0") | Ok("off") | Ok("no") | Ok("false")
    )
}

enum State {
    Walked,
    /// Not a CPython so far: looked at `tries` times, the last at `at`.
    Pending {
        tries: u32,
        at: Instant,
    },
    /// Settled: not walked.
    Done,
}

/// What is known of a process, and when it was last looked at (monotonic ns): an exec
/// event drained after that look does not make it stale.
struct Known {
    state: State,
    looked_ns: u64,
}

/// The walker's maps and what it knows per process.
pub struct PythonWalker {
    procs: BpfHashMap<MapData, u32, PyProcess>,
    state: HashMap<u32, Known>,
    namer: Namer,
    /// Processes found or ruled out since the last chunk.
    found: Vec<pb::PythonProcess>,
}

/// Loads the walker program into its tail-call slot and takes its process map.
pub(super) fn start(ebpf: &mut aya::Ebpf) -> Result<PythonWalker, String> {
    let prog: &mut PerfEvent = ebpf
        .program_mut("walk_python")
        .ok_or("program walk_python missing")?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())?;
    prog.load()
        .map_err(|e| format!("the verifier refused it: {e}"))?;
    let fd = prog
        .fd()
        .and_then(|fd| fd.try_clone().map_err(Into::into))
        .map_err(|e| e.to_string())?;
    let mut progs = ebpf
        .map_mut("WALK_PROGS")
        .and_then(|m| ProgramArray::try_from(m).ok())
        .ok_or("map WALK_PROGS missing")?;
    progs.set(1, &fd, 0).map_err(|e| e.to_string())?;
    let procs: BpfHashMap<MapData, u32, PyProcess> = ebpf
        .take_map("PY_PROCS")
        .and_then(|m| BpfHashMap::try_from(m).ok())
        .ok_or("map PY_PROCS missing")?;
    Ok(PythonWalker {
        procs,
        state: HashMap::new(),
        namer: Namer::default(),
        found: Vec::new(),
    })
}

impl PythonWalker {
    /// One sample of a target process: looks at the process when due, and names the
    /// sample's Python frames into `sample` and `rows`.
    pub fn on_sample(
        &mut self,
        raw: &RawFrames,
        sample: &mut pb::Sample,
        rows: &mut Vec<pb::PythonFrame>,
    ) {
        let pc = sample.user_stack.first().copied();
        self.look(sample.tgid, sample.ts_ns, pc);
        self.namer.name(raw, sample, rows);
    }

    /// Looks at process `tgid` for a CPython, when due (first sight, or a retry), and loads
    /// it into the walker's map. `pc`: a user address the process ran at since its exec,
    /// if known (it tells whether the loader is done).
    pub fn look(&mut self, tgid: u32, ts_ns: u64, pc: Option<u64>) {
        let now = Instant::now();
        let tries = match self.state.get(&tgid).map(|k| &k.state) {
            None if self.state.len() >= MAX_TRACKED => return,
            None => 0,
            Some(State::Pending { tries, at }) if now.duration_since(*at) >= RETRY_EVERY => *tries,
            Some(_) => return,
        };
        let looked_ns = crate::clock::monotonic_ns();
        let set = |known: &mut HashMap<u32, Known>, state: State| {
            known.insert(tgid, Known { state, looked_ns });
        };
        let status = |version: String, status: String| pb::PythonProcess {
            tgid,
            version,
            status,
            ts_ns,
        };
        match discover::look(tgid, pc).map(|l| (l.found, l.loaded)) {
            Ok((Found::Walked(interp), _)) => {
                let version = interp.table.version.to_string();
                match self.procs.insert(tgid, interp.table.walk, 0) {
                    Ok(()) => {
                        self.namer.add(tgid, interp.table);
                        set(&mut self.state, State::Walked);
                        self.found.push(status(version, "walked".into()));
                    }
                    Err(err) => {
                        set(&mut self.state, State::Done);
                        self.found.push(status(
                            version,
                            format!("not walked: the process map is full ({err})"),
                        ));
                    }
                }
            }
            // A shared build's executable is mapped before its library: look again while
            // the loader may still be at work.
            Ok((Found::NotPython | Found::NoRuntime(_), false)) if tries + 1 < RETRIES => {
                set(
                    &mut self.state,
                    State::Pending {
                        tries: tries + 1,
                        at: now,
                    },
                );
            }
            Ok((found @ (Found::Unsupported(_) | Found::NoRuntime(_)), _)) => {
                set(&mut self.state, State::Done);
                if let Some((version, said)) = found.not_walked() {
                    if super::probe_log::enabled() {
                        tracing::warn!(target: "energy_bpf::probes", "python walk of {tgid}: {said}");
                    }
                    self.found.push(status(version, said));
                }
            }
            Ok((Found::NotPython, _)) => {
                set(&mut self.state, State::Done);
            }
            Err(err) => {
                tracing::debug!("python in {tgid}: {err}");
                set(&mut self.state, State::Done);
                self.found
                    .push(status(String::new(), format!("python not walked: {err}")));
            }
        }
    }

    /// Process `tgid` exec'd at `exec_ns` (the event, drained later): what was found by a
    /// look at or after it is of the new program and stays; anything older is forgotten.
    pub fn on_exec(&mut self, tgid: u32, exec_ns: u64) {
        if self
            .state
            .get(&tgid)
            .is_some_and(|k| k.looked_ns >= exec_ns)
        {
            return;
        }
        self.forget(tgid);
    }

    /// A process exited: what was known no longer applies.
    pub fn forget(&mut self, tgid: u32) {
        if matches!(
            self.state.remove(&tgid).map(|k| k.state),
            Some(State::Walked)
        ) {
            let _ = self.procs.remove(&tgid);
        }
        self.namer.forget(tgid);
    }

    /// Processes found or ruled out since the last call.
    pub fn take_found(&mut self) -> Vec<pb::PythonProcess> {
        std::mem::take(&mut self.found)
    }
}
