//! The tables a profile build fills: frames interned once each, locations (one per mapping
//! and address, each with its frames), mappings, and the location of every address looked
//! up. Frames are copied out of the symbolizer's caches only when first seen.

use std::borrow::Cow;
use std::hash::BuildHasher as _;

use super::{Frame, FrameId, KERNEL_MAPPING, Location, LocationId, NOT_SYMBOLIZED, ProfileMapping};
use crate::pb::v1::Mapping;
use crate::symbolize::perf_map::{JitTable, jit_frame};
use crate::symbolize::{JitRuntime, Symbolizer, mapping_of};

/// Hash map with a fast non-cryptographic hasher: keys are our own addresses and ids.
pub(super) type FastMap<K, V> = foldhash::HashMap<K, V>;

/// A stack as frames and as locations, both leaf first.
#[derive(Clone, Default)]
pub(super) struct Stack {
    pub(super) frames: Vec<FrameId>,
    pub(super) locations: Vec<LocationId>,
}

impl Stack {
    pub(super) fn push(&mut self, id: LocationId, locations: &[Location]) {
        self.locations.push(id);
        self.frames
            .extend_from_slice(&locations[id as usize].frames);
    }
}

/// Frames, each stored once, found again by their hash (the table holds no second copy).
#[derive(Default)]
pub(super) struct FrameTable {
    hasher: foldhash::fast::RandomState,
    /// The first frame seen with each hash.
    by_hash: FastMap<u64, FrameId>,
    /// Frames whose hash an earlier, different frame already has.
    collided: FastMap<Frame, FrameId>,
    pub(super) frames: Vec<Frame>,
}

impl FrameTable {
    fn intern(&mut self, frame: Cow<'_, Frame>) -> FrameId {
        let hash = self.hasher.hash_one(&*frame);
        let next = FrameId::try_from(self.frames.len()).unwrap_or(FrameId::MAX);
        match self.by_hash.get(&hash) {
            Some(&id) if self.frames.get(id as usize) == Some(&*frame) => return id,
            Some(_) => {
                if let Some(&id) = self.collided.get(&*frame) {
                    return id;
                }
                self.collided.insert(frame.clone().into_owned(), next);
            }
            None => {
                self.by_hash.insert(hash, next);
            }
        }
        self.frames.push(frame.into_owned());
        next
    }
}

/// Interns frames, locations (one per mapping and address) and mappings, and caches the
/// location of each sampled address.
pub(super) struct Interner<'a> {
    symbolizer: &'a mut Symbolizer,
    pub(super) table: FrameTable,
    pub(super) locations: Vec<Location>,
    pub(super) mappings: Vec<ProfileMapping>,
    /// Profile mapping of each (tgid, index in the recording's mappings of tgid).
    mapping_ids: FastMap<(u32, usize), u32>,
    pub(super) kernel_mapping: Option<u32>,
    user: FastMap<(u32, u64), LocationId>,
    kernel: FastMap<u64, LocationId>,
    /// Addresses in no mapping, which processes share.
    unmapped: FastMap<u64, LocationId>,
    /// Location of each Python frame id.
    python: FastMap<u64, LocationId>,
    /// Per process: its recorded perf-map entries and the runtime that wrote them.
    jit: FastMap<u32, (JitTable, JitRuntime)>,
    /// Only each stack's leaf is symbolized; its callers are [`NOT_SYMBOLIZED`]'s location.
    leaves_only: bool,
    /// The one location of every caller frame when `leaves_only`.
    caller: Option<LocationId>,
}

impl<'a> Interner<'a> {
    pub(super) fn new(
        symbolizer: &'a mut Symbolizer,
        jit: FastMap<u32, (JitTable, JitRuntime)>,
        leaves_only: bool,
    ) -> Self {
        Self {
            symbolizer,
            table: FrameTable::default(),
            locations: Vec::new(),
            mappings: Vec::new(),
            mapping_ids: FastMap::default(),
            kernel_mapping: None,
            user: FastMap::default(),
            kernel: FastMap::default(),
            unmapped: FastMap::default(),
            python: FastMap::default(),
            jit,
            leaves_only,
            caller: None,
        }
    }

    /// A new location of `frames` (interned).
    pub(super) fn location(
        &mut self,
        mapping: Option<u32>,
        address: u64,
        frames: &[Frame],
    ) -> LocationId {
        push_location(
            &mut self.table,
            &mut self.locations,
            mapping,
            address,
            frames.into(),
        )
    }

    /// With `leaves_only`, pushes the placeholder for a frame that is not the stack's leaf
    /// (once for a run of callers) and says so; otherwise pushes nothing and returns false.
    pub(super) fn skip_caller(&mut self, out: &mut Stack) -> bool {
        if !self.leaves_only || out.locations.is_empty() {
            return false;
        }
        let id = match self.caller {
            Some(id) => id,
            None => {
                let id = self.location(None, 0, &[Frame::synthetic(NOT_SYMBOLIZED)]);
                self.caller = Some(id);
                id
            }
        };
        if out.locations.last() != Some(&id) {
            out.push(id, &self.locations);
        }
        true
    }

    /// Whether a location runs CPython's evaluation loop (its Python frames go before it).
    pub(super) fn is_eval(&self, id: LocationId) -> bool {
        self.locations[id as usize]
            .frames
            .iter()
            .any(|&f| self.table.frames[f as usize].function == crate::python::EVAL_FRAME)
    }

    /// Pushes the Python frames `ids` (innermost first), named from the recording's table.
    pub(super) fn python(
        &mut self,
        ids: &[u64],
        table: &crate::record::PythonFrames,
        out: &mut Stack,
    ) {
        for &pid in ids {
            let id = match self.python.get(&pid) {
                Some(&id) => id,
                None => {
                    let frame = match table.get(&pid) {
                        Some(f) => crate::python::frame(&f.function, &f.file, f.line),
                        None => crate::python::frame(crate::python::names::UNKNOWN, "", 0),
                    };
                    let id = self.location(None, 0, &[frame]);
                    self.python.insert(pid, id);
                    id
                }
            };
            out.push(id, &self.locations);
        }
    }

    pub(super) fn user_location(
        &mut self,
        tgid: u32,
        addr: u64,
        mappings: &[Mapping],
    ) -> LocationId {
        if let Some(&id) = self.user.get(&(tgid, addr)) {
            return id;
        }
        let id = match mapping_of(addr, mappings) {
            Some(i) => {
                let next = self.mappings.len() as u32;
                let mapping = *self.mapping_ids.entry((tgid, i)).or_insert_with(|| {
                    let m = &mappings[i];
                    self.mappings.push(ProfileMapping {
                        start: m.start,
                        end: m.end,
                        file_offset: m.file_offset,
                        path: m.path.clone(),
                        build_id: m.build_id.clone(),
                    });
                    next
                });
                let frames = self.symbolizer.user_frames_once(addr, mappings);
                push_location(
                    &mut self.table,
                    &mut self.locations,
                    Some(mapping),
                    addr,
                    frames,
                )
            }
            None if let Some(frame) = self.jit_frame(tgid, addr) => {
                self.location(None, addr, &[frame])
            }
            None => match self.unmapped.get(&addr) {
                Some(&id) => id,
                None => {
                    let frames = self.symbolizer.user_frames(addr, mappings).into();
                    let id =
                        push_location(&mut self.table, &mut self.locations, None, addr, frames);
                    self.unmapped.insert(addr, id);
                    id
                }
            },
        };
        self.user.insert((tgid, addr), id);
        id
    }

    /// The frame of `addr` from the process's recorded perf map, if an entry holds it.
    fn jit_frame(&self, tgid: u32, addr: u64) -> Option<Frame> {
        let (table, runtime) = self.jit.get(&tgid)?;
        let (_, _, name) = table.lookup(addr)?;
        Some(jit_frame(name, *runtime))
    }

    pub(super) fn kernel(&mut self, addr: u64, out: &mut Stack) {
        if let Some(&id) = self.kernel.get(&addr) {
            out.push(id, &self.locations);
            return;
        }
        // One kernel mapping spanning every kernel address sampled.
        let mapping = match self.kernel_mapping {
            Some(k) => {
                let m = &mut self.mappings[k as usize];
                m.start = m.start.min(addr);
                m.end = m.end.max(addr.saturating_add(1));
                k
            }
            None => {
                let k = self.mappings.len() as u32;
                self.mappings.push(ProfileMapping {
                    start: addr,
                    end: addr.saturating_add(1),
                    file_offset: 0,
                    path: KERNEL_MAPPING.to_string(),
                    build_id: Vec::new(),
                });
                self.kernel_mapping = Some(k);
                k
            }
        };
        let frames = self.symbolizer.kernel_frames_once(addr);
        let id = push_location(
            &mut self.table,
            &mut self.locations,
            Some(mapping),
            addr,
            frames,
        );
        out.push(id, &self.locations);
        self.kernel.insert(addr, id);
    }
}

/// Appends a location of `frames` (interned into `table`, moved there when owned) to
/// `locations`.
fn push_location(
    table: &mut FrameTable,
    locations: &mut Vec<Location>,
    mapping: Option<u32>,
    address: u64,
    frames: Cow<'_, [Frame]>,
) -> LocationId {
    let frames = match frames {
        Cow::Borrowed(frames) => frames
            .iter()
            .map(|f| table.intern(Cow::Borrowed(f)))
            .collect(),
        Cow::Owned(frames) => frames
            .into_iter()
            .map(|f| table.intern(Cow::Owned(f)))
            .collect(),
    };
    let id = LocationId::try_from(locations.len()).unwrap_or(LocationId::MAX);
    locations.push(Location {
        mapping,
        address,
        frames,
    });
    id
}
