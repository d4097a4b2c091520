//! What building a [`Profile`](super::Profile) reads: the stack samples and the tables that
//! name their threads, addresses and frames, plus the few facts a profile's header shows.
//! A whole recording gives one ([`Stacks::from`]); the agent's OTLP sink gives one from the
//! windows it gathered, without a recording around them.

use std::collections::HashMap;

use crate::pb::v1::{JitSymbol, Mapping, Sample, ThreadInfo};
use crate::record::{PythonFrames, Recording};

/// Borrowed input of [`build`](super::build): samples and the tables that resolve them.
#[derive(Clone, Copy, Debug)]
pub struct Stacks<'a> {
    /// Machine name for the profile's title (empty: none).
    pub hostname: &'a str,
    /// Sampling rate, Hz (one sample's CPU time is `1 / sample_hz`).
    pub sample_hz: u32,
    /// Wall-clock start of the samples' span, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Length of the samples' span, ns.
    pub duration_ns: u64,
    /// Events the capture lost over the span.
    pub lost_events: u64,
    /// The stack samples, in order; weights are aligned with them.
    pub samples: &'a [Sample],
    /// Thread names, commands and cgroups by tid.
    pub threads: &'a HashMap<u32, ThreadInfo>,
    /// Executable mappings by process id.
    pub mappings: &'a HashMap<u32, Vec<Mapping>>,
    /// Python frames the samples name by id.
    pub python_frames: &'a PythonFrames,
    /// JIT symbols (perf maps) by process id.
    pub jit_symbols: &'a HashMap<u32, Vec<JitSymbol>>,
}

impl<'a> From<&'a Recording> for Stacks<'a> {
    fn from(rec: &'a Recording) -> Self {
        Self {
            hostname: &rec.header.hostname,
            sample_hz: rec.header.sample_hz,
            start_unix_ns: rec.header.start_unix_ns,
            duration_ns: rec.duration_ns(),
            lost_events: crate::record::lost_events(&rec.losses),
            samples: &rec.samples,
            threads: &rec.threads,
            mappings: &rec.mappings,
            python_frames: &rec.python_frames,
            jit_symbols: &rec.jit_symbols,
        }
    }
}
