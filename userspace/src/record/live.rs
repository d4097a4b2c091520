//! The thread, mapping and perf-map tables of live processes, kept from a stream of chunks:
//! what resolving later samples needs from earlier chunks (a rotating recording's next
//! file, the agent's profiles). A process's entries go when it exits.

use std::collections::HashMap;

use super::merge_thread;
use crate::pb::v1::{Chunk, JitSymbol, Mapping, ProcessEvent, ThreadInfo, process_event::Kind};

/// The tables.
#[derive(Clone, Debug, Default)]
pub struct LiveTables {
    /// Threads by tid.
    pub threads: HashMap<u32, ThreadInfo>,
    /// Executable mappings by process.
    pub mappings: HashMap<u32, Vec<Mapping>>,
    /// Perf-map entries by process.
    pub jit_symbols: HashMap<u32, Vec<JitSymbol>>,
}

impl LiveTables {
    /// Takes what `chunk` names.
    pub fn remember(&mut self, chunk: &Chunk) {
        for t in &chunk.threads {
            merge_thread(&mut self.threads, t.clone());
        }
        for m in &chunk.mappings {
            self.mappings.entry(m.tgid).or_default().push(m.clone());
        }
        for j in &chunk.jit_symbols {
            self.jit_symbols.entry(j.tgid).or_default().push(j.clone());
        }
    }

    /// Forgets the threads, and the processes, that `events` say exited; returns the
    /// processes.
    pub fn exited(&mut self, events: &[ProcessEvent]) -> Vec<u32> {
        let mut gone = Vec::new();
        for e in events.iter().filter(|e| e.kind() == Kind::Exit) {
            self.threads.remove(&e.tid);
            if e.tid == e.tgid {
                self.mappings.remove(&e.tgid);
                self.jit_symbols.remove(&e.tgid);
                gone.push(e.tgid);
            }
        }
        gone
    }
}
