//! The names of the Python frames that live processes' samples refer to, kept between
//! windows for the sinks that build stacks.
//!
//! A chunk carries a frame's row ([`pb::PythonFrame`]) once, when the recorder first
//! names it, and a row may serve several processes (rows are shared by name), so each row
//! is kept while some live process's samples have used it: every process holds the ids
//! its samples referred to, and a row goes when the last of its processes exits. Both are
//! bounded: past [`MAX_ROWS`] rows, or [`MAX_IDS_PER_PROCESS`] ids in one process, the
//! table starts over (frames named before then export as `<unknown>`).

use std::collections::{HashMap, HashSet};

use crate::pb::v1 as pb;
use crate::record::PythonFrames;

/// Rows kept at most (the recorder remembers 2^20 names per capture).
pub const MAX_ROWS: usize = 1 << 20;

/// Frame ids one process may hold at most.
pub const MAX_IDS_PER_PROCESS: usize = 1 << 16;

/// Python frame rows of live processes.
#[derive(Debug, Default)]
pub struct PythonTable {
    rows: PythonFrames,
    /// How many live processes used each row.
    users: HashMap<u64, u32>,
    /// The row ids each process's samples used.
    by_process: HashMap<u32, HashSet<u64>>,
}

impl PythonTable {
    /// Takes a chunk's new rows and notes which processes its samples used them in. Rows
    /// no sample of the chunk used are not kept (the recorder names a frame while naming
    /// the sample that holds it, in the same chunk).
    pub fn chunk(&mut self, chunk: &pb::Chunk) {
        if chunk.python_frames.is_empty() && chunk.samples.iter().all(|s| s.python_stack.is_empty())
        {
            return;
        }
        if self.rows.len() + chunk.python_frames.len() > MAX_ROWS {
            self.clear();
        }
        for s in chunk.samples.iter().filter(|s| !s.python_stack.is_empty()) {
            let ids = self.by_process.entry(s.tgid).or_default();
            if ids.len() + s.python_stack.len() > MAX_IDS_PER_PROCESS {
                // One process with more names than any program plausibly has: forget its
                // share rather than let the table grow.
                let old = std::mem::take(ids);
                for id in old {
                    release(&mut self.users, &mut self.rows, id);
                }
            }
            let ids = self.by_process.entry(s.tgid).or_default();
            for &id in &s.python_stack {
                if ids.insert(id) {
                    *self.users.entry(id).or_default() += 1;
                }
            }
        }
        for f in &chunk.python_frames {
            if self.users.contains_key(&f.id) {
                self.rows.insert(f.id, f.clone());
            }
        }
    }

    /// Process `tgid` exited: the rows only it used go.
    pub fn exited(&mut self, tgid: u32) {
        for id in self.by_process.remove(&tgid).unwrap_or_default() {
            release(&mut self.users, &mut self.rows, id);
        }
    }

    /// The rows kept, by id.
    pub fn rows(&self) -> &PythonFrames {
        &self.rows
    }

    /// The rows `samples` refer to: what a profile of them needs.
    pub fn used_by(&self, samples: &[pb::Sample]) -> PythonFrames {
        let mut out = PythonFrames::new();
        for id in samples.iter().flat_map(|s| &s.python_stack) {
            if !out.contains_key(id)
                && let Some(f) = self.rows.get(id)
            {
                out.insert(*id, f.clone());
            }
        }
        out
    }

    fn clear(&mut self) {
        self.rows.clear();
        self.users.clear();
        self.by_process.clear();
    }
}

/// One process no longer uses row `id`.
fn release(users: &mut HashMap<u64, u32>, rows: &mut PythonFrames, id: u64) {
    if let Some(n) = users.get_mut(&id) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            users.remove(&id);
            rows.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64, function: &str) -> pb::PythonFrame {
        pb::PythonFrame {
            id,
            function: function.into(),
            file: "w.py".into(),
            line: 3,
        }
    }

    fn sample(tgid: u32, stack: &[u64]) -> pb::Sample {
        pb::Sample {
            tgid,
            tid: tgid,
            python_stack: stack.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn a_shared_row_stays_until_its_last_process_exits() {
        let mut t = PythonTable::default();
        t.chunk(&pb::Chunk {
            samples: vec![sample(10, &[1, 2])],
            python_frames: vec![row(1, "leaf"), row(2, "main")],
            ..Default::default()
        });
        // Process 11 uses row 2, named before for process 10: no new row comes.
        t.chunk(&pb::Chunk {
            samples: vec![sample(11, &[2])],
            ..Default::default()
        });
        let used = t.used_by(&[sample(11, &[2, 9])]);
        assert_eq!(used.keys().collect::<Vec<_>>(), vec![&2]);
        t.exited(10);
        assert!(!t.rows().contains_key(&1));
        assert_eq!(t.rows()[&2].function, "main");
        t.exited(11);
        assert!(t.rows().is_empty());
        assert!(t.users.is_empty() && t.by_process.is_empty());
    }

    #[test]
    fn rows_no_sample_used_are_not_kept() {
        let mut t = PythonTable::default();
        t.chunk(&pb::Chunk {
            python_frames: vec![row(7, "orphan")],
            ..Default::default()
        });
        assert!(t.rows().is_empty());
    }

    #[test]
    fn one_process_cannot_grow_the_table_past_its_bound() {
        let mut t = PythonTable::default();
        let n = MAX_IDS_PER_PROCESS as u64;
        for id in 1..=n + 10 {
            t.chunk(&pb::Chunk {
                samples: vec![sample(5, &[id])],
                python_frames: vec![row(id, "f")],
                ..Default::default()
            });
        }
        assert!(t.rows().len() <= MAX_IDS_PER_PROCESS);
        assert!(t.rows().contains_key(&(n + 10)), "the newest names stay");
        assert_eq!(t.users.len(), t.rows().len());
    }
}
