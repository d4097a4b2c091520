//! A recording's switch events held packed in memory, as on disk.
//!
//! A context-switch storm records a switch in about 3 bytes of columns ([`super::columns`]),
//! but one decoded `SwitchEvent` takes 56: held decoded, the events of an 8 s storm alone
//! took 18 times the file. [`SwitchLog`] keeps each batch as its encoded columns and hands
//! the events out one batch at a time, so readers need only one batch decoded at once
//! (the memory bound in `docs/how-it-works.md`, "Reading is bounded").

use std::collections::BTreeMap;

use prost::Message as _;

use crate::pb::v1::{SwitchColumns, SwitchEvent};

/// Events per block when a long list is packed at once: small enough that one decoded
/// block is a few MiB, large enough that the columns' per-block overhead is nothing.
const BLOCK: usize = 1 << 16;

/// Blocks [`SwitchLog::for_each_block`] decodes ahead of its caller.
const AHEAD: usize = 2;

/// One CPU's switch events as they come: how many, and whether in time order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOrder {
    /// Events on the CPU.
    pub events: usize,
    /// Whether their timestamps never go back.
    pub ordered: bool,
    first_ns: u64,
    last_ns: u64,
}

/// `CpuOrder` per CPU, taken as events are added: a timeline sizes each CPU's runs and
/// knows which CPUs need sorting without a pass over the events of its own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuOrders(BTreeMap<u32, CpuOrder>);

impl CpuOrders {
    /// Counts `events`, which come after those already counted.
    pub fn add(&mut self, events: &[SwitchEvent]) {
        for e in events {
            self.0
                .entry(e.cpu)
                .and_modify(|o| {
                    o.events += 1;
                    o.ordered &= o.last_ns <= e.ts_ns;
                    o.last_ns = e.ts_ns;
                })
                .or_insert(CpuOrder {
                    events: 1,
                    ordered: true,
                    first_ns: e.ts_ns,
                    last_ns: e.ts_ns,
                });
        }
    }

    /// Counts the events of `later`, which come after those already counted.
    fn append(&mut self, later: Self) {
        for (cpu, l) in later.0 {
            self.0
                .entry(cpu)
                .and_modify(|o| {
                    o.events += l.events;
                    o.ordered &= l.ordered && o.last_ns <= l.first_ns;
                    o.last_ns = l.last_ns;
                })
                .or_insert(l);
        }
    }

    /// Every CPU with events, in CPU order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, CpuOrder)> + '_ {
        self.0.iter().map(|(&cpu, &o)| (cpu, o))
    }
}

/// Switch events in their recorded order, packed in blocks of encoded columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchLog {
    /// `SwitchColumns` messages, each encoded by [`Self::push`].
    blocks: Vec<Vec<u8>>,
    len: usize,
    orders: CpuOrders,
}

impl SwitchLog {
    /// Appends `events` (one chunk's, in order).
    pub fn push(&mut self, events: &[SwitchEvent]) {
        for block in events.chunks(BLOCK) {
            self.blocks
                .push(super::columns::to_columns(block).encode_to_vec());
            self.len += block.len();
        }
        self.orders.add(events);
    }

    /// Appends a later log.
    pub fn append(&mut self, other: Self) {
        self.blocks.extend(other.blocks);
        self.len += other.len;
        self.orders.append(other.orders);
    }

    /// Per CPU, how many events and whether they are in time order.
    pub fn cpu_orders(&self) -> &CpuOrders {
        &self.orders
    }

    /// Keeps only the events `keep` says to, in order.
    pub fn retain(&mut self, mut keep: impl FnMut(&SwitchEvent) -> bool) {
        let old = std::mem::take(self);
        for mut block in old.blocks() {
            block.retain(&mut keep);
            self.push(&block);
        }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no events.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held (the packed columns).
    pub fn packed_bytes(&self) -> usize {
        self.blocks.iter().map(Vec::len).sum()
    }

    /// The events in order, one decoded block at a time.
    pub fn blocks(&self) -> impl Iterator<Item = Vec<SwitchEvent>> + '_ {
        self.blocks.iter().map(|bytes| unpack(bytes))
    }

    /// Calls `f` with the events in order, a block at a time, as [`Self::blocks`] gives
    /// them; the next blocks are decoded on another thread meanwhile (at most
    /// two waiting), so decoding costs the caller no time of its own.
    pub fn for_each_block(&self, mut f: impl FnMut(&[SwitchEvent])) {
        if self.blocks.len() < 2 {
            self.blocks().for_each(|b| f(&b));
            return;
        }
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel(AHEAD);
            s.spawn(move || {
                for bytes in &self.blocks {
                    // The receiver is gone only when `f` panicked: stop decoding.
                    if tx.send(unpack(bytes)).is_err() {
                        return;
                    }
                }
            });
            for block in rx {
                f(&block);
            }
        });
    }

    /// The events in order.
    pub fn iter(&self) -> impl Iterator<Item = SwitchEvent> + '_ {
        self.blocks().flatten()
    }

    /// All events, decoded.
    pub fn to_vec(&self) -> Vec<SwitchEvent> {
        let mut out = Vec::with_capacity(self.len);
        out.extend(self.iter());
        out
    }
}

/// Decodes a block written by [`SwitchLog::push`]: it always decodes, as it was encoded
/// here from events.
fn unpack(bytes: &[u8]) -> Vec<SwitchEvent> {
    let events = SwitchColumns::decode(bytes)
        .ok()
        .and_then(|c| super::columns::from_columns(&c).ok());
    debug_assert!(events.is_some(), "a block this log encoded does not decode");
    events.unwrap_or_default()
}

impl From<Vec<SwitchEvent>> for SwitchLog {
    fn from(events: Vec<SwitchEvent>) -> Self {
        let mut log = Self::default();
        log.push(&events);
        log
    }
}

impl FromIterator<SwitchEvent> for SwitchLog {
    fn from_iter<I: IntoIterator<Item = SwitchEvent>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u64) -> SwitchEvent {
        SwitchEvent {
            ts_ns: 1_000 + i * 7,
            cpu: (i % 3) as u32,
            tid: (i % 5) as u32,
            tgid: (i % 5) as u32,
            cgroup_id: if i.is_multiple_of(11) { 42 } else { 0 },
            preempted: i.is_multiple_of(2),
            next_known: !i.is_multiple_of(4),
            next_tid: (i % 7) as u32,
            next_tgid: (i % 7) as u32,
            activity: i.is_multiple_of(3).then_some(i * 1_000),
        }
    }

    #[test]
    fn events_come_back_identical_in_order_across_blocks_and_appends() {
        let all: Vec<SwitchEvent> = (0..(BLOCK as u64 * 2 + 17)).map(ev).collect();
        let mut log = SwitchLog::from(all[..100].to_vec());
        let mut later = SwitchLog::default();
        later.push(&all[100..]);
        log.append(later);
        assert_eq!(log.len(), all.len());
        assert_eq!(log.to_vec(), all);
        let mut ahead = Vec::new();
        log.for_each_block(|b| ahead.extend_from_slice(b));
        assert_eq!(ahead, all, "blocks decoded ahead come in order");
        assert!(log.blocks().all(|b| b.len() <= BLOCK));
        // Packed, a switch takes a few bytes, not the 56 of a decoded event.
        assert!(
            log.packed_bytes() < all.len() * 16,
            "{}",
            log.packed_bytes()
        );
        // The per-CPU summary follows the events, appends included.
        let mut whole = CpuOrders::default();
        whole.add(&all);
        assert_eq!(log.cpu_orders(), &whole);
        assert!(whole.iter().all(|(_, o)| o.ordered && o.events > 0));
        let mut back = log.clone();
        back.push(&[SwitchEvent {
            ts_ns: 0,
            cpu: 2,
            ..all[0]
        }]);
        assert!(
            back.cpu_orders()
                .iter()
                .all(|(cpu, o)| o.ordered == (cpu != 2))
        );
        log.retain(|e| e.cpu != 1);
        let kept: Vec<SwitchEvent> = all.into_iter().filter(|e| e.cpu != 1).collect();
        assert_eq!((log.len(), log.to_vec()), (kept.len(), kept));
    }

    #[test]
    fn empty_log() {
        let log = SwitchLog::default();
        assert!(log.is_empty());
        assert_eq!(log.iter().count(), 0);
        assert_eq!(SwitchLog::from(Vec::new()), log);
    }
}
