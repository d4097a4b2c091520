//! A recording's switch events held packed in memory, as on disk.
//!
//! A context-switch storm records a switch in about 3 bytes of columns ([`super::columns`]),
//! but one decoded `SwitchEvent` takes 56: held decoded, the events of an 8 s storm alone
//! took 18 times the file. [`SwitchLog`] keeps each batch as its encoded columns and hands
//! the events out one batch at a time, so readers need only one batch decoded at once
//! (the memory bound in `README.md`, "Reading is bounded").

use prost::Message as _;

use crate::pb::v1::{SwitchColumns, SwitchEvent};

/// Events per block when a long list is packed at once: small enough that one decoded
/// block is a few MiB, large enough that the columns' per-block overhead is nothing.
const BLOCK: usize = 1 << 16;

/// Switch events in their recorded order, packed in blocks of encoded columns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwitchLog {
    /// `SwitchColumns` messages, each encoded by [`Self::push`].
    blocks: Vec<Vec<u8>>,
    len: usize,
}

impl SwitchLog {
    /// Appends `events` (one chunk's, in order).
    pub fn push(&mut self, events: &[SwitchEvent]) {
        for block in events.chunks(BLOCK) {
            self.blocks
                .push(super::columns::to_columns(block).encode_to_vec());
            self.len += block.len();
        }
    }

    /// Appends a later log.
    pub fn append(&mut self, other: Self) {
        self.blocks.extend(other.blocks);
        self.len += other.len;
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
        assert!(log.blocks().all(|b| b.len() <= BLOCK));
        // Packed, a switch takes a few bytes, not the 56 of a decoded event.
        assert!(
            log.packed_bytes() < all.len() * 16,
            "{}",
            log.packed_bytes()
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
