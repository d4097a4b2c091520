//! Symbolizing a whole profile's addresses up front: every address not yet cached is
//! grouped by file (and the kernel's by kallsyms), each group is resolved with one batched
//! blazesym call, and the groups are spread over a few threads, each with a blazesym
//! symbolizer of its own (a file is parsed once, by the thread that takes it). The results
//! fill the [`Symbolizer`]'s caches, so the lookups that follow are hits and give exactly
//! the frames the one-address-at-a-time path gives: the same build-id check, the same
//! fallbacks, the same counts. [`prefetch_together`] does this for several symbolizers at
//! once (the recordings of a diff), each file parsed and each offset resolved once for all.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized};

use super::{Frame, FrameKind, Symbolizer, frames_of, mapping_of};
use crate::pb::v1::Mapping;

/// Most threads one prefetch uses.
const MAX_THREADS: usize = 8;

/// One blazesym call's worth of work.
enum Job {
    /// File offsets in one file (whose build-id matched).
    Elf { path: String, offsets: Vec<u64> },
    /// Kernel addresses, through this kallsyms file.
    Kernel { kallsyms: PathBuf, addrs: Vec<u64> },
}

/// A job's frames, one entry per input in order; `None` where nothing resolved.
type Resolved = Vec<Option<Vec<Frame>>>;

impl Symbolizer {
    /// Resolves, ahead of the lookups, every user address in `user` (an address with the
    /// mappings of its process, as [`Symbolizer::user`] takes them) and every kernel address
    /// in `kernel`. Later [`Symbolizer::user`] and [`Symbolizer::kernel`] calls for them
    /// are cache hits. Addresses in no mapping are left to those calls.
    pub fn prefetch<'m>(
        &mut self,
        user: impl IntoIterator<Item = (u64, &'m [Mapping])>,
        kernel: impl IntoIterator<Item = u64>,
    ) {
        let jobs = self.plan(user, kernel);
        let results = run(&jobs);
        self.fill(jobs, results);
    }

    /// The blazesym calls that [`Symbolizer::prefetch`] of `user` and `kernel` needs. Offsets
    /// in files whose build-id no longer matches get their unresolved frames here, without
    /// a call.
    fn plan<'m>(
        &mut self,
        user: impl IntoIterator<Item = (u64, &'m [Mapping])>,
        kernel: impl IntoIterator<Item = u64>,
    ) -> Vec<Job> {
        // Per file and recorded build-id, in first-seen order: the offsets not yet cached.
        // Like the lookups, the first mapping seen for a (path, offset) decides its build-id.
        let mut groups: Vec<(&'m Mapping, Vec<u64>)> = Vec::new();
        let mut group_of: HashMap<(&'m str, &'m [u8]), usize> = HashMap::new();
        let mut seen: HashMap<&'m str, foldhash::HashSet<u64>> = HashMap::new();
        for (addr, mappings) in user {
            let Some(m) = mapping_of(addr, mappings).map(|i| &mappings[i]) else {
                continue;
            };
            let offset = addr - m.start + m.file_offset;
            let cached = self
                .user_cache
                .get(&m.path)
                .is_some_and(|c| c.contains_key(&offset))
                || self.stored.has_user(&m.path, offset);
            if cached || !seen.entry(m.path.as_str()).or_default().insert(offset) {
                continue;
            }
            let g = *group_of
                .entry((m.path.as_str(), m.build_id.as_slice()))
                .or_insert_with(|| {
                    groups.push((m, Vec::new()));
                    groups.len() - 1
                });
            groups[g].1.push(offset);
        }
        let mut jobs = Vec::new();
        for (m, offsets) in groups {
            if self.build_id_matches(m) {
                jobs.push(Job::Elf {
                    path: m.path.clone(),
                    offsets,
                });
                continue;
            }
            let cache = self.user_cache.entry(m.path.clone()).or_default();
            for offset in offsets {
                self.stats.unresolved += 1;
                let frame = Frame::unresolved(&m.path, offset, FrameKind::Native);
                cache.insert(offset, vec![frame]);
            }
        }
        let mut addrs: Vec<u64> = kernel
            .into_iter()
            .filter(|a| !self.kernel_cache.contains_key(a) && !self.stored.has_kernel(*a))
            .collect();
        addrs.sort_unstable();
        addrs.dedup();
        // Without kernel symbols the lookups make the same unresolved frames themselves.
        if let Some(kallsyms) = self.kallsyms.clone().filter(|_| !addrs.is_empty()) {
            jobs.push(Job::Kernel { kallsyms, addrs });
        }
        jobs
    }

    /// Puts what `jobs` resolved (`results`, in the jobs' order) into the caches.
    fn fill(&mut self, jobs: Vec<Job>, results: Vec<Resolved>) {
        for (job, resolved) in jobs.into_iter().zip(results) {
            match job {
                Job::Elf { path, offsets } => {
                    let cache = self.user_cache.entry(path.clone()).or_default();
                    for (offset, frames) in offsets.into_iter().zip(resolved) {
                        let frames = match frames {
                            Some(f) => {
                                self.stats.resolved += 1;
                                f
                            }
                            None => {
                                self.stats.unresolved += 1;
                                vec![Frame::unresolved(&path, offset, FrameKind::Native)]
                            }
                        };
                        cache.insert(offset, frames);
                    }
                }
                Job::Kernel { addrs, .. } => {
                    for (addr, frames) in addrs.into_iter().zip(resolved) {
                        let frames = match frames {
                            Some(f) => {
                                self.stats.resolved += 1;
                                f
                            }
                            None => {
                                self.stats.unresolved += 1;
                                vec![Frame::unresolved("[kernel]", addr, FrameKind::Kernel)]
                            }
                        };
                        self.kernel_cache.insert(addr, frames);
                    }
                }
            }
        }
    }
}

/// One symbolizer's share of [`prefetch_together`]: the symbolizer, the user addresses
/// (each with its process's mappings) and the kernel addresses it will look up.
pub type Request<'s, 'm> = (&'s mut Symbolizer, Vec<(u64, &'m [Mapping])>, Vec<u64>);

/// [`Symbolizer::prefetch`] for several symbolizers at once (say, one per recording of
/// the same machine): each distinct file offset and kernel address is resolved once, for
/// all of them, and each symbolizer's caches and counts come out as its own prefetch
/// leaves them. A file is matched against each recording's build-id by that recording's
/// symbolizer, so a file rebuilt between two recordings stays unresolved only for the one
/// whose build-id it no longer has. Returns how many addresses went to blazesym.
pub fn prefetch_together(requests: Vec<Request<'_, '_>>) -> usize {
    let mut plans = Vec::with_capacity(requests.len());
    let mut symbolizers = Vec::with_capacity(requests.len());
    for (symbolizer, user, kernel) in requests {
        plans.push(symbolizer.plan(user, kernel));
        symbolizers.push(symbolizer);
    }
    let merged = merge(&plans);
    let results = run(&merged);
    let found = Found::new(&merged, &results);
    for (symbolizer, jobs) in symbolizers.into_iter().zip(plans) {
        let resolved = jobs.iter().map(|job| found.of(job)).collect();
        symbolizer.fill(jobs, resolved);
    }
    merged.iter().map(job_len).sum()
}

/// One job per file and per kallsyms file for all of `plans`, each offset or address once.
fn merge(plans: &[Vec<Job>]) -> Vec<Job> {
    let mut elf: Vec<(&str, Vec<u64>)> = Vec::new();
    let mut kernel: Vec<(&std::path::Path, Vec<u64>)> = Vec::new();
    let mut elf_of: HashMap<&str, usize> = HashMap::new();
    let mut kernel_of: HashMap<&std::path::Path, usize> = HashMap::new();
    for job in plans.iter().flatten() {
        match job {
            Job::Elf { path, offsets } => {
                let i = *elf_of.entry(path.as_str()).or_insert_with(|| {
                    elf.push((path.as_str(), Vec::new()));
                    elf.len() - 1
                });
                elf[i].1.extend_from_slice(offsets);
            }
            Job::Kernel { kallsyms, addrs } => {
                let i = *kernel_of.entry(kallsyms.as_path()).or_insert_with(|| {
                    kernel.push((kallsyms.as_path(), Vec::new()));
                    kernel.len() - 1
                });
                kernel[i].1.extend_from_slice(addrs);
            }
        }
    }
    let unique = |mut v: Vec<u64>| {
        v.sort_unstable();
        v.dedup();
        v
    };
    let elf = elf.into_iter().map(|(path, offsets)| Job::Elf {
        path: path.to_string(),
        offsets: unique(offsets),
    });
    let kernel = kernel.into_iter().map(|(kallsyms, addrs)| Job::Kernel {
        kallsyms: kallsyms.to_path_buf(),
        addrs: unique(addrs),
    });
    elf.chain(kernel).collect()
}

/// What merged jobs resolved, by file (or kallsyms file) and offset (or address).
struct Found<'j> {
    elf: HashMap<(&'j str, u64), &'j Option<Vec<Frame>>>,
    kernel: HashMap<(&'j std::path::Path, u64), &'j Option<Vec<Frame>>>,
}

impl<'j> Found<'j> {
    fn new(jobs: &'j [Job], results: &'j [Resolved]) -> Self {
        let mut found = Self {
            elf: HashMap::new(),
            kernel: HashMap::new(),
        };
        for (job, resolved) in jobs.iter().zip(results) {
            match job {
                Job::Elf { path, offsets } => found.elf.extend(
                    offsets
                        .iter()
                        .zip(resolved)
                        .map(|(&o, r)| ((path.as_str(), o), r)),
                ),
                Job::Kernel { kallsyms, addrs } => found.kernel.extend(
                    addrs
                        .iter()
                        .zip(resolved)
                        .map(|(&a, r)| ((kallsyms.as_path(), a), r)),
                ),
            }
        }
        found
    }

    /// The frames of each input of `job` (one of the jobs that were merged).
    fn of(&self, job: &Job) -> Resolved {
        match job {
            Job::Elf { path, offsets } => offsets
                .iter()
                .map(|&o| self.elf.get(&(path.as_str(), o)).and_then(|r| (*r).clone()))
                .collect(),
            Job::Kernel { kallsyms, addrs } => addrs
                .iter()
                .map(|&a| {
                    self.kernel
                        .get(&(kallsyms.as_path(), a))
                        .and_then(|r| (*r).clone())
                })
                .collect(),
        }
    }
}

/// Runs `jobs` over a few threads, biggest first; results in the jobs' order.
fn run(jobs: &[Job]) -> Vec<Resolved> {
    let threads = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_THREADS)
        .min(jobs.len());
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(job_len(&jobs[i])));
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Resolved>>> = Mutex::new((0..jobs.len()).map(|_| None).collect());
    let work = || {
        let symbolizer = super::blazesym_symbolizer();
        while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
            let resolved = resolve(&symbolizer, &jobs[i]);
            if let Ok(mut r) = results.lock() {
                r[i] = Some(resolved);
            }
        }
    };
    if threads <= 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    results
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .into_iter()
        .zip(jobs)
        // A job a panicking thread left undone: nothing resolved, as a failed call gives.
        .map(|(r, job)| r.unwrap_or_else(|| vec![None; job_len(job)]))
        .collect()
}

fn job_len(job: &Job) -> usize {
    match job {
        Job::Elf { offsets, .. } => offsets.len(),
        Job::Kernel { addrs, .. } => addrs.len(),
    }
}

/// One job through one blazesym call.
fn resolve(symbolizer: &blazesym::symbolize::Symbolizer, job: &Job) -> Resolved {
    let (src, input, module, kind) = match job {
        Job::Elf { path, offsets } => (
            Source::Elf(Elf::new(path)),
            Input::FileOffset(offsets.as_slice()),
            path.as_str(),
            FrameKind::Native,
        ),
        Job::Kernel { kallsyms, addrs } => (
            super::kernel_source(kallsyms),
            Input::AbsAddr(addrs.as_slice()),
            "[kernel]",
            FrameKind::Kernel,
        ),
    };
    let n = job_len(job);
    match symbolizer.symbolize(&src, input) {
        Ok(v) if v.len() == n => v
            .iter()
            .map(|s| match s {
                Symbolized::Sym(sym) => Some(frames_of(sym, module, kind)),
                _ => None,
            })
            .collect(),
        _ => vec![None; n],
    }
}
