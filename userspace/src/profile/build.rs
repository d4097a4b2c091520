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
        let stack = match stacks.get(&key) {
            Some(stack) => stack.clone(),
            None => {
                let depth = kernel.len() + user.len() + usize::from(cut);
                let mut stack = Stack {
                    frames: Vec::with_capacity(depth),
                    locations: Vec::with_capacity(depth),
                };
                for (depth, &addr) in s.kernel_stack.iter().enumerate() {
                    if !interner.skip_caller(&mut stack) {
                        interner.kernel(caller_adjusted(addr, depth), &mut stack);
                    }
                }
                let mappings = rec.mappings.get(&s.tgid).unwrap_or(&no_mappings);
                // With a kernel stack, the first user address is where the thread entered
                // the kernel: still a leaf-like address of its own frame.
                // Each evaluation-loop frame gets its call's Python frames just before it
                // (leaf side); groups no such frame takes go on the root side.
                let mut groups = PythonGroups::new(&s.python_stack, &s.python_groups);
                for (depth, &addr) in s.user_stack.iter().enumerate() {
                    if interner.skip_caller(&mut stack) {
                        continue;
                    }
                    let id = interner.user_location(s.tgid, caller_adjusted(addr, depth), mappings);
                    if !groups.is_done() && interner.is_eval(id) {
                        interner.python(groups.next_group(), rec.python_frames, &mut stack);
                    }
                    stack.push(id, &interner.locations);
                }
                while !groups.is_done() {
                    interner.python(groups.next_group(), rec.python_frames, &mut stack);
                }
                stacks.insert(key, stack.clone());
                stack
            }
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
        if !keep(s.tid, s.tgid)
            || !stacks.insert((s.tgid, s.kernel_stack.as_slice(), s.user_stack.as_slice()))
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
mod tests {
    use super::*;
    use crate::pb::v1::{Header, Sample, ThreadInfo};
    use crate::profile::{KERNEL_MAPPING, Residual};
    use crate::record::Recording;

    fn rec() -> Recording {
        let mut rec = Recording {
            header: Header {
                sample_hz: 100,
                hostname: "box".into(),
                ..Header::default()
            },
            end_ns: 2_000_000_000,
            ..Recording::default()
        };
        for (tid, tgid, comm) in [(10, 10, "app"), (11, 10, "worker"), (20, 20, "other")] {
            rec.threads.insert(
                tid,
                ThreadInfo {
                    tid,
                    tgid,
                    comm: comm.into(),
                    ..Default::default()
                },
            );
        }
        rec.mappings.insert(
            10,
            vec![Mapping {
                tgid: 10,
                start: 0x1000,
                end: 0x2000,
                path: "/nonexistent/app".into(),
                ..Default::default()
            }],
        );
        let sample = |tid, tgid, user: Vec<u64>, kernel: Vec<u64>| Sample {
            tid,
            tgid,
            cpu: 1,
            cgroup_id: 5,
            user_stack: user,
            kernel_stack: kernel,
            ..Default::default()
        };
        rec.samples = vec![
            sample(10, 10, vec![0x1010, 0x1101], vec![]),
            sample(11, 10, vec![0x1010, 0x1101], vec![0xffff_0000]),
            sample(20, 20, vec![0x5000], vec![]),
        ];
        rec
    }

    #[test]
    fn addresses_in_recorded_perf_map_entries_are_jit_frames_of_their_process() {
        use crate::pb::v1::JitSymbol;
        use crate::symbolize::FrameKind;
        let mut rec = rec();
        rec.threads.get_mut(&20).expect("pid 20").comm = "node".into();
        rec.jit_symbols.insert(
            20,
            vec![JitSymbol {
                tgid: 20,
                start: 0x4f00,
                size: 0x200,
                name: "JS:*hot /srv/app.js:7:3".into(),
                ts_ns: 0,
            }],
        );
        // Process 10 has no entries: the same address stays unresolved there.
        rec.samples.push(Sample {
            tid: 10,
            tgid: 10,
            user_stack: vec![0x5000],
            ..Default::default()
        });
        let mut sym = Symbolizer::with_kallsyms(None);
        let p = build(
            &rec,
            &SampleValues::cpu_time(&rec),
            &mut sym,
            &Filter::default(),
        );
        let leaf = |i: usize| &p.frames[p.samples[i].frames[0] as usize];
        let jit = leaf(2);
        assert_eq!(jit.function, "hot");
        assert_eq!(
            (jit.file.as_deref(), jit.line),
            (Some("/srv/app.js"), Some(7))
        );
        assert_eq!(jit.kind, FrameKind::Jit(JitRuntime::V8));
        assert_eq!(jit.kind.otel_name(), "v8js");
        assert_eq!(leaf(3).function, "[unknown]+0x5000");
        assert_eq!(leaf(3).kind, FrameKind::Native);
    }

    #[test]
    fn builds_interned_leaf_first_stacks_with_cpu_time() {
        let rec = rec();
        let mut sym = Symbolizer::with_kallsyms(None);
        let p = build(
            &rec,
            &SampleValues::cpu_time(&rec),
            &mut sym,
            &Filter::default(),
        );
        assert_eq!(p.value_types[0], ValueType::new("samples", "count"));
        assert_eq!(p.value_types[1], ValueType::new("cpu", "nanoseconds"));
        assert_eq!(p.samples.len(), 3);
        assert_eq!(p.meta.totals, vec![3.0, 3e7]);
        let names = |s: &ProfileSample| -> Vec<&str> {
            s.frames
                .iter()
                .map(|&f| p.frames[f as usize].function.as_str())
                .collect()
        };
        // Unresolvable file: module+offset, caller looked up at addr - 1.
        assert_eq!(names(&p.samples[0]), vec!["app+0x10", "app+0x100"]);
        assert_eq!(
            names(&p.samples[1]),
            vec!["[kernel]+0xffff0000", "app+0x10", "app+0x100"]
        );
        assert_eq!(names(&p.samples[2]), vec!["[unknown]+0x5000"]);
        assert_eq!(p.samples[0].frames, p.samples[1].frames[1..]);
        assert_eq!(p.frames.len(), 4, "frames are interned");
        // Locations: one per (mapping, address), caller addresses minus one; the kernel
        // mapping spans the kernel pages sampled, an address in no mapping has none.
        let at = |s: &ProfileSample| -> Vec<(Option<&str>, u64)> {
            s.locations
                .iter()
                .map(|&l| {
                    let l = &p.locations[l as usize];
                    let path = l.mapping.map(|m| p.mappings[m as usize].path.as_str());
                    (path, l.address)
                })
                .collect()
        };
        let app = Some("/nonexistent/app");
        assert_eq!(at(&p.samples[0]), vec![(app, 0x1010), (app, 0x1100)]);
        assert_eq!(
            at(&p.samples[1]),
            vec![
                (Some(KERNEL_MAPPING), 0xffff_0000),
                (app, 0x1010),
                (app, 0x1100)
            ]
        );
        assert_eq!(at(&p.samples[2]), vec![(None, 0x5000)]);
        assert_eq!(p.samples[0].locations, p.samples[1].locations[1..]);
        assert_eq!(p.locations.len(), 4);
        assert!(p.locations.iter().all(|l| l.frames.len() == 1));
        let spans: Vec<_> = p
            .mappings
            .iter()
            .map(|m| (m.path.as_str(), m.start, m.end, m.file_offset))
            .collect();
        assert_eq!(
            spans,
            vec![
                ("/nonexistent/app", 0x1000, 0x2000, 0),
                (KERNEL_MAPPING, 0xffff_0000, 0xffff_1000, 0xffff_0000),
            ]
        );
        assert_eq!(&*p.samples[1].labels.comm, "worker");
        assert_eq!(p.samples[1].labels.cpu, Some(1));
        assert_eq!(p.samples[1].labels.cgroup, 5);
    }

    #[test]
    fn filters_by_pid_and_comm_and_adds_residuals() {
        let rec = rec();
        let mut sym = Symbolizer::with_kallsyms(None);
        let mut w = SampleValues::cpu_time(&rec);
        w.residuals.push(Residual {
            tgid: 10,
            tid: 11,
            values: vec![5e6],
        });
        w.residuals.push(Residual {
            tgid: 20,
            tid: 20,
            values: vec![7e6],
        });
        let by_pid = Filter {
            pids: vec![10],
            comms: vec![],
        };
        let p = build(&rec, &w, &mut sym, &by_pid);
        assert_eq!(p.samples.len(), 3);
        let last = &p.samples[2];
        assert_eq!(p.frames[last.frames[0] as usize].function, NO_STACK_SAMPLE);
        let residual = &p.locations[last.locations[0] as usize];
        assert_eq!((residual.mapping, residual.address), (None, 0));
        assert_eq!(residual.frames, last.frames);
        assert_eq!(last.values, vec![0.0, 5e6]);
        assert_eq!(p.meta.totals, vec![2.0, 2.5e7]);
        // A process name selects all its threads.
        let by_comm = Filter {
            pids: vec![],
            comms: vec!["app".into()],
        };
        assert_eq!(build(&rec, &w, &mut sym, &by_comm).samples.len(), 3);
        let none = Filter {
            pids: vec![99],
            comms: vec![],
        };
        let p = build(&rec, &w, &mut sym, &none);
        assert!(p.samples.is_empty());
        assert!(p.frames.is_empty());
        assert!(p.locations.is_empty());
    }
}
