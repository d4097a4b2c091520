//! Sums over a timeline's runs by thread-table entry, flat: an array indexed by each run's
//! thread index (see `store`) instead of a hash map looked up per run. A window of a
//! million runs among ten thousand threads then hashes ten thousand times, not a million.

use super::{IDLE_TID, Run, Timeline, UNKNOWN_TID};

/// A thread's busy time: `((tgid, tid), ns, cgroup)`, the cgroup of its last run that
/// named one (0 when none did).
pub(crate) type ThreadBusy = ((u32, u32), u64, u64);

/// An entry's process slot in [`Timeline::busy_by_thread`]: not busy (idle, unknown).
const NOT_BUSY: u32 = u32::MAX;
/// An entry's process slot in [`Timeline::busy_by_thread`]: a process walked run by run.
const APART: u32 = u32::MAX - 1;

impl Timeline {
    /// Busy ns per thread, with the cgroup of its last run that named one, the values
    /// adding run by run gives (CPU order, then time order), in no order. The runs of
    /// processes for which `apart(tgid)` holds are not summed but listed with their CPU's
    /// position; with `by_process`, each CPU's busy ns per process (the others) is given
    /// to it as `(CPU position, process slot, tgid, ns)`: a process's slot is the same on
    /// every CPU, and slots are numbered from 0 without holes.
    pub(crate) fn busy_by_thread(
        &self,
        apart: &dyn Fn(u32) -> bool,
        apart_runs: &mut Vec<(usize, Run)>,
        mut by_process: Option<&mut dyn FnMut(usize, usize, u32, u64)>,
    ) -> Vec<ThreadBusy> {
        let who = self.who();
        // Per entry of the thread table: its process's slot in `tgids`, or a marker.
        let mut slot_of: foldhash::HashMap<u32, u32> = Default::default();
        let mut tgids: Vec<u32> = Vec::new();
        let slots: Vec<u32> = who
            .iter()
            .map(|w| match w.tid {
                IDLE_TID | UNKNOWN_TID => NOT_BUSY,
                _ if apart(w.tgid) => APART,
                _ => *slot_of.entry(w.tgid).or_insert_with(|| {
                    tgids.push(w.tgid);
                    (tgids.len() - 1) as u32
                }),
            })
            .collect();
        let mut threads = FlatSums::default();
        threads.reset(who.len());
        let mut procs = FlatSums::default();
        procs.reset(tgids.len());
        for (ci, cpu) in self.cpus.iter().enumerate() {
            let store = cpu.store();
            for i in 0..store.len() {
                let id = store.id(i);
                match slots[id as usize] {
                    NOT_BUSY => {}
                    APART => apart_runs.push((ci, store.run(who, i))),
                    slot => {
                        let ns = store.end(i) - store.start(i);
                        threads.add(id, ns, position(ci, i));
                        if by_process.is_some() {
                            procs.add(slot, ns, 0);
                        }
                    }
                }
            }
            if let Some(f) = by_process.as_mut() {
                for (slot, ns, _) in procs.drain() {
                    f(ci, slot as usize, tgids[slot as usize], ns);
                }
            }
        }
        // Each entry to its thread, the cgroup of the latest run that named one winning.
        let mut out: foldhash::HashMap<(u32, u32), (u64, u64, u64)> = Default::default();
        for (id, ns, last) in threads.drain() {
            let w = who[id as usize];
            let (sum, cgroup_id, at) = out.entry((w.tgid, w.tid)).or_default();
            *sum += ns;
            if w.cgroup_id != 0 && last >= *at {
                *cgroup_id = w.cgroup_id;
                *at = last;
            }
        }
        out.into_iter()
            .map(|(key, (ns, cgroup_id, _))| (key, ns, cgroup_id))
            .collect()
    }
}

/// Per-entry sums of one thread table: ns, and where the entry's last added run is.
#[derive(Clone, Debug, Default)]
pub(crate) struct FlatSums {
    /// Per entry: (ns, position of its last run + 1; 0 while untouched).
    acc: Vec<(u64, u64)>,
    touched: Vec<u32>,
}

impl FlatSums {
    /// Empty sums for a table of `len` entries.
    pub(crate) fn reset(&mut self, len: usize) {
        self.touched.clear();
        self.acc.clear();
        self.acc.resize(len, (0, 0));
    }

    /// Adds `ns` to entry `id`, whose run is at `pos` (positions grow in the order runs are
    /// added; see [`position`]).
    #[inline]
    pub(crate) fn add(&mut self, id: u32, ns: u64, pos: u64) {
        let a = &mut self.acc[id as usize];
        if a.1 == 0 {
            self.touched.push(id);
        }
        a.0 += ns;
        a.1 = pos + 1;
    }

    /// `(entry, ns, position of its last run)` of every entry added to since the last
    /// drain, which are reset.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = (u32, u64, u64)> + '_ {
        let acc = &mut self.acc;
        self.touched.drain(..).map(move |id| {
            let (ns, pos) = std::mem::take(&mut acc[id as usize]);
            (id, ns, pos - 1)
        })
    }
}

/// The position of run `run` of the timeline's CPU at position `cpu`: in CPU order, then
/// time order (the order run-by-run sums add them in).
#[inline]
pub(crate) fn position(cpu: usize, run: usize) -> u64 {
    ((cpu as u64) << 40) | run as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_per_entry_and_keeps_the_last_position() {
        let mut s = FlatSums::default();
        s.reset(4);
        s.add(2, 10, position(0, 5));
        s.add(0, 1, position(0, 6));
        s.add(2, 5, position(1, 0));
        let mut got: Vec<_> = s.drain().collect();
        got.sort_unstable();
        assert_eq!(got, vec![(0, 1, position(0, 6)), (2, 15, position(1, 0))]);
        assert_eq!(s.drain().count(), 0, "a drain resets");
        s.add(2, 3, 0);
        assert_eq!(s.drain().collect::<Vec<_>>(), vec![(2, 3, 0)]);
    }
}
