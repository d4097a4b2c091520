//! Building a [`Profile`] from a recording: filter samples, symbolize stacks (cached per
//! unique address), intern frames and locations, attach weights.

use std::sync::Arc;

use super::Stacks;
use super::interner::{FastMap, Interner, Stack};
use super::{
    Frame, Labels, NO_STACK_SAMPLE, Profile, ProfileMeta, ProfileSample, SAMPLES, SampleValues,
    ValueType,
};
use crate::pb::v1::Mapping;
use crate::symbolize::perf_map::JitTable;
use crate::symbolize::{JitRuntime, Symbolizer, caller_adjusted};

/// A raw stack as recorded: (tgid, kernel addresses, user addresses, Python frame ids,
/// Python groups, whether callers were cut off: a leaves-only build keys by the leaf).
type StackKey<'r> = (u32, &'r [u64], &'r [u64], &'r [u64], &'r [u32], bool);

/// Which samples to keep. Empty lists keep everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// Keep only these process ids (tgid).
    pub pids: Vec<u32>,
    /// Keep only threads whose name, or whose process's name, is one of these.
    pub comms: Vec<String>,
}

impl Filter {
    fn keeps(&self, tgid: u32, comm: &str, process_comm: &str) -> bool {
        (self.pids.is_empty() || self.pids.contains(&tgid))
            && (self.comms.is_empty() || self.comms.iter().any(|c| c == comm || c == process_comm))
    }
}

/// Builds the profile of `input` (a [`Recording`](crate::record::Recording) or any other
/// [`Stacks`]) weighted by `weights` (one row per `input.samples[i]`).
///
/// Values are `samples/count` followed by `weights.value_types`. Caller addresses (every
/// frame but the leaf) are looked up at `addr - 1`: a return address points after the call,
/// possibly into the next line or function (as perf does).
pub fn build<'a>(
    input: impl Into<Stacks<'a>>,
    weights: &SampleValues,
    symbolizer: &mut Symbolizer,
    filter: &Filter,
) -> Profile {
    build_with(input.into(), weights, symbolizer, filter, false, false)
}

/// [`build`] with only each stack's leaf symbolized (kernel, native, Python or JIT, with its
/// inlined frames): a stack's callers are one `NOT_SYMBOLIZED` frame. Self energy per
/// function (samples whose leaf it is) comes out exactly as from [`build`], for a fraction
/// of the symbolizing; totals, stacks and anything else that reads callers do not.
pub fn build_leaves<'a>(
    input: impl Into<Stacks<'a>>,
    weights: &SampleValues,
    symbolizer: &mut Symbolizer,
    filter: &Filter,
) -> Profile {
    build_with(input.into(), weights, symbolizer, filter, true, false)
}

/// [`build`], or [`build_leaves`] when `leaves_only`, by a `symbolizer` that already holds
/// the names the build needs ([`needed`] of the same input, filter and `leaves_only` went
/// to its prefetch, or to `crate::symbolize::prefetch_together`): the addresses are not
/// gathered a second time. Any name it lacks is resolved when looked up: the profile is the
/// same either way.
pub fn build_prefetched<'a>(
    input: impl Into<Stacks<'a>>,
    weights: &SampleValues,
    symbolizer: &mut Symbolizer,
    filter: &Filter,
    leaves_only: bool,
) -> Profile {
    build_with(input.into(), weights, symbolizer, filter, leaves_only, true)
}

/// Resolves, ahead of [`build`] (or of [`build_leaves`] when `leaves_only`) of the same
/// input and filter, every address it will look up, filling `symbolizer`'s caches: the
/// build that follows with this symbolizer then only hits them. Needs no weights, so it can
/// run while the recording is still being analysed; the profile comes out the same.
pub fn prefetch<'a>(
    input: impl Into<Stacks<'a>>,
    symbolizer: &mut Symbolizer,
    filter: &Filter,
    leaves_only: bool,
) {
    let (user, kernel) = needed(input, filter, leaves_only);
    symbolizer.prefetch(user, kernel);
}

/// The user addresses (each with its process's mappings) and kernel addresses that
/// [`build`] (or [`build_leaves`] when `leaves_only`) of `input` and `filter` looks up, as
/// [`Symbolizer::prefetch`] and `crate::symbolize::prefetch_together` take them.
pub fn needed<'a>(
    input: impl Into<Stacks<'a>>,
    filter: &Filter,
    leaves_only: bool,
) -> (Vec<(u64, &'a [Mapping])>, Vec<u64>) {
    let rec = input.into();
    let mut kept: FastMap<u32, bool> = FastMap::default();
    addresses(&rec, &[], leaves_only, |tid, tgid| {
        *kept
            .entry(tid)
            .or_insert_with(|| filter.keeps(tgid, &comm_of(&rec, tid), &comm_of(&rec, tgid)))
    })
}

/// A thread's name as profiles label it.
fn comm_of(rec: &Stacks<'_>, tid: u32) -> Arc<str> {
    match rec.threads.get(&tid) {
        Some(t) if !t.comm.is_empty() => Arc::from(t.comm.as_str()),
        _ if tid == 0 => Arc::from("[idle]"),
        _ => Arc::from("[unknown]"),
    }
}

fn build_with(
    rec: Stacks<'_>,
    weights: &SampleValues,
    symbolizer: &mut Symbolizer,
    filter: &Filter,
    leaves_only: bool,
    prefetched: bool,
) -> Profile {
    let mut value_types = vec![ValueType::new(SAMPLES, "count")];
    value_types.extend(weights.value_types.iter().cloned());
    let n_weights = weights.value_types.len();

    let comm_of = |tid: u32| comm_of(&rec, tid);
    // Per thread: its name and whether the filter keeps it (decided once).
    let mut threads: FastMap<u32, (Arc<str>, bool)> = FastMap::default();
    let mut thread = |tid: u32, tgid: u32| -> (Arc<str>, bool) {
        threads
            .entry(tid)
            .or_insert_with(|| {
                let comm = comm_of(tid);
                let keep = filter.keeps(tgid, &comm, &comm_of(tgid));
                (comm, keep)
            })
            .clone()
    };

    let jit = rec
        .jit_symbols
        .iter()
        .map(|(&tgid, symbols)| (tgid, (JitTable::new(symbols), runtime_of(&rec, tgid))))
        .collect();
    let no_mappings: Vec<Mapping> = Vec::new();
    if !prefetched {
        // Every address the kept samples need, resolved a file at a time up front (far
        // faster than one lookup per address); the lookups below are then cache hits.
        let (user, kernel) = addresses(&rec, &no_mappings, leaves_only, |tid, tgid| {
            thread(tid, tgid).1
        });
        symbolizer.prefetch(user, kernel);
    }
    let mut interner = Interner::new(symbolizer, jit, leaves_only);
    // Whole stacks repeat far more than they differ: one lookup per sample in the common case.
    let mut stacks: FastMap<StackKey<'_>, Stack> = FastMap::default();
    let mut samples = Vec::with_capacity(rec.samples.len());
    for (i, s) in rec.samples.iter().enumerate() {
        let (comm, keep) = thread(s.tid, s.tgid);
        if !keep {
            continue;
        }
        let (kernel, user) = if leaves_only {
            // The leaf alone decides the stack: its callers are one placeholder.
            let kernel = &s.kernel_stack[..s.kernel_stack.len().min(1)];
            let user = match kernel.is_empty() {
                true => &s.user_stack[..s.user_stack.len().min(1)],
                false => &[][..],
            };
            (kernel, user)
        } else {
            (s.kernel_stack.as_slice(), s.user_stack.as_slice())
        };
        let cut = kernel.len() + user.len() < s.kernel_stack.len() + s.user_stack.len();
        let key = (
            s.tgid,
            kernel,
            user,
            s.python_stack.as_slice(),
            s.python_groups.as_slice(),
            cut,
        );
        let mappings = rec.mappings.get(&s.tgid).unwrap_or(&no_mappings);
        let stack = if leaves_only {
            // The interner's per-address locations make a leaf's stack as cheaply as a
            // lookup of it would.
            stack_of(
                &mut interner,
                s,
                (kernel, user, cut),
                mappings,
                rec.python_frames,
            )
        } else if let Some(stack) = stacks.get(&key) {
            stack.clone()
        } else {
            let stack = stack_of(
                &mut interner,
                s,
                (kernel, user, cut),
                mappings,
                rec.python_frames,
            );
            stacks.insert(key, stack.clone());
            stack
        };
        let mut values = Vec::with_capacity(1 + n_weights);
        values.push(1.0);
        let row = weights.row(i);
        values.extend((0..n_weights).map(|k| row.get(k).copied().unwrap_or(0.0)));
        samples.push(ProfileSample {
            frames: stack.frames,
            locations: stack.locations,
            values,
            labels: Labels {
                pid: s.tgid,
                tid: s.tid,
                comm,
                cpu: Some(s.cpu),
                cgroup: s.cgroup_id,
            },
        });
    }

    let residual_location = interner.location(None, 0, &[Frame::synthetic(NO_STACK_SAMPLE)]);
    let residual_frame = interner.locations[residual_location as usize].frames[0];
    let mut any_residual = false;
    for r in &weights.residuals {
        let (comm, keep) = thread(r.tid, r.tgid);
        if !keep {
            continue;
        }
        any_residual = true;
        let mut values = Vec::with_capacity(1 + n_weights);
        values.push(0.0);
        values.extend((0..n_weights).map(|k| r.values.get(k).copied().unwrap_or(0.0)));
        let cgroup = rec.threads.get(&r.tid).map_or(0, |t| t.cgroup_id);
        samples.push(ProfileSample {
            frames: vec![residual_frame],
            locations: vec![residual_location],
            values,
            labels: Labels {
                pid: r.tgid,
                tid: r.tid,
                comm,
                cpu: None,
                cgroup,
            },
        });
    }
    let mut frames = interner.table.frames;
    let mut locations = interner.locations;
    if !any_residual {
        // Made last and unused: keep the tables to what samples use.
        locations.pop();
        if residual_frame as usize + 1 == frames.len() {
            frames.pop();
        }
    }
    let mut mappings = interner.mappings;
    if let Some(k) = interner.kernel_mapping {
        // Whole pages; a kernel address is its own offset (as perf maps the kernel).
        let m = &mut mappings[k as usize];
        m.start &= !(PAGE - 1);
        m.end = m.end.saturating_add(PAGE - 1) & !(PAGE - 1);
        m.file_offset = m.start;
    }

    let mut profile = Profile {
        meta: ProfileMeta {
            title: if rec.hostname.is_empty() {
                "energy-bpf".to_string()
            } else {
                format!("energy-bpf on {}", rec.hostname)
            },
            totals: Vec::new(),
            duration_ns: rec.duration_ns,
            estimated: weights.estimated,
            source: weights.source.clone(),
            model_row: weights.model_row.clone(),
            model_error_pct: weights.model_error_pct,
            sample_hz: rec.sample_hz,
            start_unix_ns: rec.start_unix_ns,
            lost_events: rec.lost_events,
            unwind: if rec.samples.is_empty() {
                String::new()
            } else {
                crate::record::UnwindCounts::of(rec.samples).label()
            },
        },
        value_types,
        frames,
        locations,
        mappings,
        samples,
    };
    profile.recompute_totals();
    profile
}

/// The stack of sample `s` from its kernel and user addresses `kernel` and `user` (all of
/// them, or the leaf alone with `cut` when its callers were cut off: they become one
/// placeholder) and its Python frames.
fn stack_of(
    interner: &mut Interner<'_>,
    s: &crate::pb::v1::Sample,
    (kernel, user, cut): (&[u64], &[u64], bool),
    mappings: &[Mapping],
    python_frames: &crate::record::PythonFrames,
) -> Stack {
    let depth = kernel.len() + user.len() + usize::from(cut);
    let mut stack = Stack {
        frames: Vec::with_capacity(depth),
        locations: Vec::with_capacity(depth),
    };
    for (depth, &addr) in kernel.iter().enumerate() {
        if !interner.skip_caller(&mut stack) {
            interner.kernel(caller_adjusted(addr, depth), &mut stack);
        }
    }
    // With a kernel stack, the first user address is where the thread entered the kernel:
    // still a leaf-like address of its own frame.
    // Each evaluation-loop frame gets its call's Python frames just before it (leaf side);
    // groups no such frame takes go on the root side.
    let mut groups = PythonGroups::new(&s.python_stack, &s.python_groups);
    for (depth, &addr) in user.iter().enumerate() {
        if interner.skip_caller(&mut stack) {
            continue;
        }
        let id = interner.user_location(s.tgid, caller_adjusted(addr, depth), mappings);
        if !groups.is_done() && interner.is_eval(id) {
            interner.python(groups.next_group(), python_frames, &mut stack);
        }
        stack.push(id, &interner.locations);
    }
    if cut {
        interner.skip_caller(&mut stack);
    }
    while !groups.is_done() {
        interner.python(groups.next_group(), python_frames, &mut stack);
    }
    stack
}

/// The distinct user addresses (with their process's mappings) and kernel addresses, caller
/// adjusted as the stacks look them up, of the samples `keep(tid, tgid)` keeps; with
/// `leaves_only`, of each stack's leaf alone.
fn addresses<'r>(
    rec: &Stacks<'r>,
    no_mappings: &'r [Mapping],
    leaves_only: bool,
    mut keep: impl FnMut(u32, u32) -> bool,
) -> (Vec<(u64, &'r [Mapping])>, Vec<u64>) {
    let mut stacks: foldhash::HashSet<(u32, &[u64], &[u64])> = Default::default();
    let mut seen_user: foldhash::HashSet<(u32, u64)> = Default::default();
    let mut seen_kernel: foldhash::HashSet<u64> = Default::default();
    let (mut user, mut kernel) = (Vec::new(), Vec::new());
    for s in rec.samples {
        // A repeated stack adds nothing; with `leaves_only` the sets below see to it.
        if !keep(s.tid, s.tgid)
            || (!leaves_only
                && !stacks.insert((s.tgid, s.kernel_stack.as_slice(), s.user_stack.as_slice())))
        {
            continue;
        }
        let depth_limit = if leaves_only { 1 } else { usize::MAX };
        for (depth, &addr) in s.kernel_stack.iter().enumerate().take(depth_limit) {
            let addr = caller_adjusted(addr, depth);
            if seen_kernel.insert(addr) {
                kernel.push(addr);
            }
        }
        let user_limit = if s.kernel_stack.is_empty() {
            depth_limit
        } else if leaves_only {
            0
        } else {
            usize::MAX
        };
        let mappings = rec.mappings.get(&s.tgid).map_or(no_mappings, Vec::as_slice);
        for (depth, &addr) in s.user_stack.iter().enumerate().take(user_limit) {
            let addr = caller_adjusted(addr, depth);
            if seen_user.insert((s.tgid, addr)) {
                user.push((addr, mappings));
            }
        }
    }
    (user, kernel)
}

/// A sample's Python frames, one evaluation-loop call's worth at a time.
struct PythonGroups<'s> {
    ids: &'s [u64],
    groups: std::slice::Iter<'s, u32>,
}

impl<'s> PythonGroups<'s> {
    fn new(ids: &'s [u64], groups: &'s [u32]) -> Self {
        Self {
            ids,
            groups: groups.iter(),
        }
    }

    fn is_done(&self) -> bool {
        self.ids.is_empty()
    }

    /// The next call's frames; everything left when the groups run out or overrun.
    fn next_group(&mut self) -> &'s [u64] {
        let n = self.groups.next().map_or(self.ids.len(), |&n| n as usize);
        let (group, rest) = self.ids.split_at(n.min(self.ids.len()));
        self.ids = rest;
        group
    }
}

/// The runtime of a process, from its name or the program its command line starts.
fn runtime_of(rec: &Stacks<'_>, tgid: u32) -> JitRuntime {
    let Some(t) = rec.threads.get(&tgid) else {
        return JitRuntime::Other;
    };
    match JitRuntime::of_process(&t.comm) {
        JitRuntime::Other => t
            .cmdline
            .split([' ', '\0'])
            .next()
            .map_or(JitRuntime::Other, JitRuntime::of_process),
        known => known,
    }
}

/// Page size the kernel mapping is rounded to.
const PAGE: u64 = 0x1000;

#[cfg(test)]
#[path = "build_tests.rs"]
mod tests;
