//! From a sample's raw Python frames (code object, checksum, offset) to the recording's
//! frame ids and the table that names them ([`crate::pb::v1::PythonFrame`]), read from the
//! live process while it runs. Everything is cached and bounded: code objects per process,
//! and frame ids for the recording.

use std::collections::HashMap;
use std::sync::Arc;

use energy_bpf_abi::{PyFrame, py_frame, py_stop};

use super::code::{CodeInfo, read_code};
use super::memory::Memory;
use super::offsets::Table;
use crate::pb::v1 as pb;

/// Code objects cached per process; past this, the cache starts over.
const MAX_CODES: usize = 1 << 16;

/// Frame ids remembered; past this, new ids are made again (the rows already written stay
/// valid).
const MAX_IDS: usize = 1 << 20;

/// Function name of a frame whose code object could not be read or was replaced.
pub const UNKNOWN: &str = "<unknown>";

/// What the probe sent for one sample.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawFrames {
    /// [`py_stop`].
    pub stop: u32,
    /// Innermost first.
    pub frames: Vec<PyFrame>,
}

/// The sample's Python stop reason, as the recording has it.
fn stop_of(stop: u32) -> pb::PythonStop {
    match stop {
        py_stop::END => pb::PythonStop::PythonEnd,
        py_stop::DEPTH => pb::PythonStop::PythonDepth,
        py_stop::READ_FAULT => pb::PythonStop::PythonReadFault,
        py_stop::NO_THREAD => pb::PythonStop::PythonNoThread,
        py_stop::TAIL_CALL => pb::PythonStop::PythonTailCall,
        _ => pb::PythonStop::PythonOff,
    }
}

/// How many frames each evaluation-loop call holds, innermost first, from the frames'
/// [`py_frame::ENTRY`] bits; frames after the last entry frame (a cut walk) are a group
/// of their own.
pub fn groups(frames: &[PyFrame]) -> Vec<u32> {
    let mut out = Vec::new();
    let mut n = 0;
    for f in frames {
        n += 1;
        if f.offset & py_frame::ENTRY != 0 {
            out.push(n);
            n = 0;
        }
    }
    if n > 0 {
        out.push(n);
    }
    out
}

struct Process {
    table: Table,
    mem: Option<Memory>,
    codes: HashMap<(u64, u32), Option<Arc<CodeInfo>>>,
}

/// Names Python frames for one capture.
#[derive(Default)]
pub struct Namer {
    procs: HashMap<u32, Process>,
    ids: HashMap<(u32, u64, u32, u32), u64>,
    by_name: HashMap<(String, String, u32), u64>,
    next_id: u64,
    /// Code objects that could not be read or no longer matched.
    pub unreadable: u64,
}

impl Namer {
    /// A process whose interpreter uses `table`.
    pub fn add(&mut self, tgid: u32, table: Table) {
        let mem = Memory::open(tgid).ok();
        self.procs.insert(
            tgid,
            Process {
                table,
                mem,
                codes: HashMap::new(),
            },
        );
    }

    /// A process exited or exec'd.
    pub fn forget(&mut self, tgid: u32) {
        self.procs.remove(&tgid);
    }

    /// Fills `sample`'s Python stack from `raw`, appending the rows of frames named for the
    /// first time to `rows`.
    pub fn name(
        &mut self,
        raw: &RawFrames,
        sample: &mut pb::Sample,
        rows: &mut Vec<pb::PythonFrame>,
    ) {
        sample.python_stop = stop_of(raw.stop) as i32;
        if raw.frames.is_empty() {
            return;
        }
        let tgid = sample.tgid;
        if self.ids.len() > MAX_IDS {
            self.ids.clear();
            self.by_name.clear();
        }
        sample.python_groups = groups(&raw.frames);
        sample.python_stack = raw.frames.iter().map(|f| self.id(tgid, f, rows)).collect();
    }

    fn id(&mut self, tgid: u32, f: &PyFrame, rows: &mut Vec<pb::PythonFrame>) -> u64 {
        let offset = f.offset & py_frame::OFFSET_MASK;
        let key = (tgid, f.code, f.checksum, offset);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        let (function, file, line) = match self.code(tgid, f) {
            Some((info, table)) => {
                let line = info.line(&table, offset).unwrap_or(0);
                (info.name.clone(), info.file.clone(), line)
            }
            None => (UNKNOWN.to_string(), String::new(), 0),
        };
        let named = (function, file, line);
        let id = match self.by_name.get(&named) {
            Some(&id) => id,
            None => {
                self.next_id += 1;
                let id = self.next_id;
                rows.push(pb::PythonFrame {
                    id,
                    function: named.0.clone(),
                    file: named.1.clone(),
                    line: named.2,
                });
                self.by_name.insert(named, id);
                id
            }
        };
        self.ids.insert(key, id);
        id
    }

    fn code(&mut self, tgid: u32, f: &PyFrame) -> Option<(Arc<CodeInfo>, Table)> {
        let p = self.procs.get_mut(&tgid)?;
        if p.codes.len() > MAX_CODES {
            p.codes.clear();
        }
        let key = (f.code, f.checksum);
        let info = match p.codes.get(&key) {
            Some(info) => info.clone(),
            None => {
                let info = p
                    .mem
                    .as_ref()
                    .and_then(|mem| read_code(mem, &p.table, f.code, f.checksum).ok())
                    .map(Arc::new);
                if info.is_none() {
                    self.unreadable += 1;
                }
                p.codes.insert(key, info.clone());
                info
            }
        };
        info.map(|i| (i, p.table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(offset: u32) -> PyFrame {
        PyFrame {
            code: 1,
            checksum: 2,
            offset,
        }
    }

    #[test]
    fn groups_split_at_entry_frames() {
        let e = py_frame::ENTRY;
        assert_eq!(groups(&[f(1), f(2 | e), f(3 | e), f(4)]), vec![2, 1, 1]);
        assert_eq!(groups(&[f(e), f(e)]), vec![1, 1]);
        assert!(groups(&[]).is_empty());
    }

    #[test]
    fn an_unknown_process_names_frames_unknown_once() {
        let mut n = Namer::default();
        let raw = RawFrames {
            stop: py_stop::END,
            frames: vec![f(1), f(py_frame::ENTRY | 1)],
        };
        let mut s = pb::Sample {
            tgid: u32::MAX,
            ..Default::default()
        };
        let mut rows = Vec::new();
        n.name(&raw, &mut s, &mut rows);
        assert_eq!(s.python_stack.len(), 2);
        assert_eq!(
            s.python_stack[0], s.python_stack[1],
            "same code, same offset"
        );
        assert_eq!(s.python_groups, vec![2]);
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].function, UNKNOWN);
        assert_eq!(s.python_stop(), pb::PythonStop::PythonEnd);
    }
}
