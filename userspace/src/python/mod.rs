//! CPython frames (docs/ARCHITECTURE.md, "Python frames"): finding a process's
//! interpreter and the offsets its version needs (`discover`, `offsets`), naming the
//! code objects the sampler saw from the live process (`code`, `linetable`), and
//! turning a sample's raw Python frames into the recording's frame ids and table
//! (`names`); which versions the machine runs now (`census`).

pub(crate) mod census;
pub(crate) mod code;
pub(crate) mod discover;
pub(crate) mod linetable;
pub(crate) mod memory;
pub(crate) mod names;
pub(crate) mod offsets;

pub use linetable::{LineFormat, line_at};
pub(crate) use names::{Namer, RawFrames};

use crate::symbolize::Frame;

/// Native function whose frames run Python code: each is one evaluation-loop call.
pub(crate) const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

/// Why a process's Python could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PythonError {
    /// A file or the process's memory could not be opened.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What the OS said.
        source: std::io::Error,
    },
    /// Reading the process's memory faulted.
    #[error("reading process memory at {0:#x} faulted")]
    Fault(u64),
    /// The code object at this address is not the one the sampler saw.
    #[error("the code object at {0:#x} was replaced")]
    Stale(u64),
    /// An object did not look as expected.
    #[error("unexpected object: {0}")]
    Object(&'static str),
}

/// The profile frame of a Python function (an empty file and line 0 are unknown).
pub fn frame(function: &str, file: &str, line: u32) -> Frame {
    Frame::python(
        function,
        (!file.is_empty()).then_some(file),
        (line != 0).then_some(line),
    )
}
