//! What energy stacks are built from, kept between windows for the sinks that build them
//! (the OTLP export, the web view's recent flamegraphs): the tables that resolve a
//! window's samples ([`StackTables`]: thread names, executable mappings, perf-map (JIT)
//! entries, Python frame names of live processes, dropped at exit) and a window's samples
//! with their weights and the part of the tables they use ([`Batch`]).

pub(crate) mod python;

use std::collections::{HashMap, HashSet};

use crate::{
    analysis,
    pb::v1 as pb,
    pipeline::Window,
    profile::{SampleValues, Stacks},
    record::{LiveTables, PythonFrames, merge_thread},
};

/// Samples of one or more windows, the tables that resolve them, and their weights: what
/// one profile is built from.
#[derive(Clone, Debug)]
pub struct Batch {
    /// The machine's name.
    pub hostname: String,
    /// Stack samples per second and CPU.
    pub sample_hz: u32,
    /// First window's start, ns (CLOCK_MONOTONIC).
    pub start_ns: u64,
    /// The same instant, ns since the epoch.
    pub start_unix_ns: u64,
    /// Last window's end, ns.
    pub end_ns: u64,
    /// The samples.
    pub samples: Vec<pb::Sample>,
    /// Threads of the processes the samples and residuals belong to.
    pub threads: HashMap<u32, pb::ThreadInfo>,
    /// Their executable mappings, per process.
    pub mappings: HashMap<u32, Vec<pb::Mapping>>,
    /// Their perf-map entries, per process.
    pub jit_symbols: HashMap<u32, Vec<pb::JitSymbol>>,
    /// Names of the Python frames the samples refer to.
    pub python_frames: PythonFrames,
    /// Per-sample weights (and residuals), aligned with `samples`.
    pub weights: SampleValues,
}

impl Batch {
    /// The profile builder's view of the batch.
    pub fn stacks(&self) -> Stacks<'_> {
        Stacks {
            hostname: &self.hostname,
            sample_hz: self.sample_hz,
            start_unix_ns: self.start_unix_ns,
            duration_ns: self.end_ns.saturating_sub(self.start_ns),
            lost_events: 0,
            samples: &self.samples,
            threads: &self.threads,
            mappings: &self.mappings,
            python_frames: &self.python_frames,
            jit_symbols: &self.jit_symbols,
        }
    }

    /// Appends a later batch of the same value types; hands it back when they differ (a
    /// source came or went), for the caller to start a new batch with it (`None`: taken). Tables merge: a
    /// process's later entries win, and one that exited keeps what its samples need.
    pub fn absorb(&mut self, later: Batch) -> Option<Batch> {
        if self.weights.value_types != later.weights.value_types {
            return Some(later);
        }
        self.samples.extend(later.samples);
        for t in later.threads.into_values() {
            merge_thread(&mut self.threads, t);
        }
        self.mappings.extend(later.mappings);
        self.jit_symbols.extend(later.jit_symbols);
        // Ids are never reused: rows of processes that exited since stay valid.
        self.python_frames.extend(later.python_frames);
        self.end_ns = later.end_ns;
        self.sample_hz = later.sample_hz;
        self.weights.values.extend(later.weights.values);
        self.weights.residuals.extend(later.weights.residuals);
        None
    }

    /// The memory it holds, roughly, bytes: what a bounded store counts.
    pub fn bytes(&self) -> usize {
        use prost::Message as _;
        let samples: usize = self
            .samples
            .iter()
            .map(|s| {
                std::mem::size_of::<pb::Sample>()
                    + 8 * (s.kernel_stack.len() + s.user_stack.len() + s.python_stack.len())
                    + 4 * s.python_groups.len()
            })
            .sum();
        let tables: usize = self
            .threads
            .values()
            .map(|t| 64 + t.encoded_len())
            .chain(
                self.mappings
                    .values()
                    .flatten()
                    .map(|m| 64 + m.encoded_len()),
            )
            .chain(
                self.jit_symbols
                    .values()
                    .flatten()
                    .map(|j| 64 + j.encoded_len()),
            )
            .chain(self.python_frames.values().map(|f| 64 + f.encoded_len()))
            .sum();
        let residuals: usize = self
            .weights
            .residuals
            .iter()
            .map(|r| 32 + 8 * r.values.len())
            .sum();
        samples + tables + residuals + 8 * self.weights.values.len()
    }
}

/// Adds `batch` to `pending`, or makes it the pending one; hands it back when its value
/// types differ from the pending one's, for the caller to close that one first.
pub fn gather(pending: &mut Option<Batch>, batch: Batch) -> Option<Batch> {
    match pending {
        None => {
            *pending = Some(batch);
            None
        }
        Some(acc) => acc.absorb(batch),
    }
}

/// The tables that resolve samples, kept from chunks while their processes live.
#[derive(Default)]
pub struct StackTables {
    live: LiveTables,
    python: python::PythonTable,
}

impl StackTables {
    /// Takes what a chunk names.
    pub fn chunk(&mut self, chunk: &pb::Chunk) {
        self.live.remember(chunk);
        self.python.chunk(chunk);
    }

    /// A window's samples, weighted by its attribution, with the part of the tables they
    /// (and the threads' residual values) need. `start_unix_ns` is the window's start on
    /// the epoch clock.
    pub fn batch(&self, window: &Window, header: &pb::Header, start_unix_ns: u64) -> Batch {
        let stacks = Stacks {
            hostname: &header.hostname,
            sample_hz: header.sample_hz,
            start_unix_ns,
            duration_ns: window.end_ns().saturating_sub(window.start_ns()),
            lost_events: 0,
            samples: &window.events.samples,
            threads: &self.live.threads,
            mappings: &self.live.mappings,
            python_frames: self.python.rows(),
            jit_symbols: &self.live.jit_symbols,
        };
        let weights = analysis::sample_values(stacks, &window.analysis);
        let tgids: HashSet<u32> = window
            .events
            .samples
            .iter()
            .map(|s| s.tgid)
            .chain(weights.residuals.iter().map(|r| r.tgid))
            .collect();
        Batch {
            hostname: header.hostname.clone(),
            sample_hz: header.sample_hz,
            start_ns: window.start_ns(),
            start_unix_ns,
            end_ns: window.end_ns(),
            samples: window.events.samples.clone(),
            threads: self
                .live
                .threads
                .iter()
                .filter(|(_, t)| tgids.contains(&t.tgid))
                .map(|(&tid, t)| (tid, t.clone()))
                .collect(),
            mappings: pick(&tgids, &self.live.mappings),
            jit_symbols: pick(&tgids, &self.live.jit_symbols),
            python_frames: self.python.used_by(&window.events.samples),
            weights,
        }
    }

    /// Forgets the processes that exited in `window` (call after taking its batch).
    pub fn forget_exited(&mut self, window: &Window) {
        for tgid in self.live.exited(&window.events.process_events) {
            self.python.exited(tgid);
        }
    }
}

/// The entries of processes `tgids`.
fn pick<T: Clone>(tgids: &HashSet<u32>, m: &HashMap<u32, Vec<T>>) -> HashMap<u32, Vec<T>> {
    tgids
        .iter()
        .filter_map(|t| Some((*t, m.get(t)?.clone())))
        .collect()
}
