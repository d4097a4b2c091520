//! The capture side of the CPython frame walker (docs/ARCHITECTURE.md, "Python frames"):
//! which processes run a CPython it walks, their entries in the probe's `PY_PROCS` map, and
//! the naming of each sample's Python frames while the process lives.
//!
//! A process is looked at on its first sample, and again a few times shortly after (a
//! shared build maps `libpython` only after exec), on the capture thread: reading
//! `/proc/PID/maps` is cheap and only files named like a CPython are opened. What was found
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

/// The walker's maps and what it knows per process.
pub struct PythonWalker {
    procs: BpfHashMap<MapData, u32, PyProcess>,
    state: HashMap<u32, State>,
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
        self.look(sample.tgid, sample.ts_ns);
        self.namer.name(raw, sample, rows);
    }

    /// Looks at process `tgid` for a CPython, when due (first sight, or a retry), and loads
    /// it into the walker's map.
    pub fn look(&mut self, tgid: u32, ts_ns: u64) {
        let now = Instant::now();
        let tries = match self.state.get(&tgid) {
            None if self.state.len() >= MAX_TRACKED => return,
            None => 0,
            Some(State::Pending { tries, at }) if now.duration_since(*at) >= RETRY_EVERY => *tries,
            Some(_) => return,
        };
        let status = |version: String, status: String| pb::PythonProcess {
            tgid,
            version,
            status,
            ts_ns,
        };
        match discover::find(tgid) {
            Ok(Found::Walked(interp)) => {
                let version = interp.table.version.to_string();
                match self.procs.insert(tgid, interp.table.walk, 0) {
                    Ok(()) => {
                        self.namer.add(tgid, interp.table);
                        self.state.insert(tgid, State::Walked);
                        self.found.push(status(version, "walked".into()));
                    }
                    Err(err) => {
                        self.state.insert(tgid, State::Done);
                        self.found.push(status(
                            version,
                            format!("not walked: the process map is full ({err})"),
                        ));
                    }
                }
            }
            Ok(Found::Unsupported(v)) => {
                if super::probe_log::enabled() {
                    tracing::warn!(
                        target: "energy_bpf::probes",
                        "python walk of {tgid}: CPython {v} is not supported; native frames only"
                    );
                }
                self.state.insert(tgid, State::Done);
                self.found.push(status(
                    v.to_string(),
                    format!("python {v}: not supported, native frames only"),
                ));
            }
            Ok(Found::NotPython) if tries + 1 < RETRIES => {
                self.state.insert(
                    tgid,
                    State::Pending {
                        tries: tries + 1,
                        at: now,
                    },
                );
            }
            Ok(Found::NotPython) => {
                self.state.insert(tgid, State::Done);
            }
            Err(err) => {
                tracing::debug!("python in {tgid}: {err}");
                self.state.insert(tgid, State::Done);
                self.found
                    .push(status(String::new(), format!("python not walked: {err}")));
            }
        }
    }

    /// A process exec'd or exited: what was known no longer applies.
    pub fn forget(&mut self, tgid: u32) {
        if matches!(self.state.remove(&tgid), Some(State::Walked)) {
            let _ = self.procs.remove(&tgid);
        }
        self.namer.forget(tgid);
    }

    /// Processes found or ruled out since the last call.
    pub fn take_found(&mut self) -> Vec<pb::PythonProcess> {
        std::mem::take(&mut self.found)
    }
}
