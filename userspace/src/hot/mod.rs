//! The hot function of each thread and process over a window, as `top` and the agent's
//! snapshot stream show it: `py:train_step (model.py:88)` for a Python frame, the perf-map
//! name of JIT-compiled code, otherwise the native leaf symbol.
//!
//! Each sample names one function: its innermost named Python frame, else its innermost
//! user address inside JIT code a perf map named, else its leaf (user, or kernel when the
//! sample has no user stack). A thread's (or process's) hot function is the one most of its
//! window's samples name; energy within a thread is split over its samples, so this is also
//! the function with most of its energy.
//!
//! Everything is bounded, for an agent that runs for months: names learned from chunks
//! (Python frame names by id, perf-map entries, mappings) are capped and forgotten when
//! a process exits; native symbols are cached per process by address, and at most
//! [`NEW_NATIVE_PER_WINDOW`] new addresses, for at most [`NATIVE_TIME_PER_WINDOW`], are
//! symbolized per window (the rest wait for the next ones), so a window costs a hash lookup per sample once the cache is warm.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::pb::v1::{self as pb, process_event::Kind};
use crate::pipeline::ProcessRow;
use crate::record::Recording;
use crate::symbolize::{Frame, FrameKind};

/// New native addresses symbolized per window at most...
pub const NEW_NATIVE_PER_WINDOW: usize = 256;
/// ...and the time they may take per window (a cold cache warms over a few windows).
pub const NATIVE_TIME_PER_WINDOW: Duration = Duration::from_millis(10);
/// Native symbols cached over all processes; past this the cache starts over.
const MAX_NATIVE: usize = 1 << 16;
/// Python frame names kept (the newest ids: the capture's namer hands out ids in order).
const MAX_PYTHON: usize = 1 << 16;
/// Perf-map entries kept per process.
const MAX_JIT: usize = 1 << 16;
/// Mappings kept per process.
const MAX_MAPPINGS: usize = 4096;
/// Processes followed at once.
const MAX_PROCESSES: usize = 8192;
/// Name of a Python frame whose code object could not be read.
const PY_UNKNOWN: &str = "<unknown>";

/// The function one sample names, counted per thread and process.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Leaf {
    /// Function name (`py:` prefixed for Python).
    pub name: Arc<str>,
    /// Source file name (Python frames only), without its directory.
    pub file: Option<Arc<str>>,
    /// Source line (0: unknown or not shown).
    pub line: u32,
}

/// Samples per [`Leaf`].
pub type Tally = HashMap<Leaf, u64>;

/// The most sampled function of a tally, with the most sampled line of that function:
/// lines of one function count together. Ties go to the smaller name (stable output).
pub fn pick(tally: &Tally) -> Option<String> {
    /// Samples of one function, and its most sampled line with that line's samples.
    #[derive(Default)]
    struct Function {
        n: u64,
        line: u32,
        line_n: u64,
    }
    let mut by_fn: BTreeMap<(&str, Option<&str>), Function> = BTreeMap::new();
    for (leaf, &n) in tally {
        let f = by_fn.entry((&leaf.name, leaf.file.as_deref())).or_default();
        f.n += n;
        if n > f.line_n || (n == f.line_n && leaf.line < f.line) {
            f.line = leaf.line;
            f.line_n = n;
        }
    }
    let mut best: Option<(&(&str, Option<&str>), &Function)> = None;
    for (key, f) in &by_fn {
        // The map iterates names in order, so `>` keeps the smaller name on a tie.
        if best.is_none_or(|(_, b)| f.n > b.n) {
            best = Some((key, f));
        }
    }
    let ((name, file), &Function { line, .. }) = best?;
    Some(match (file, line) {
        (Some(file), 0) => format!("{name} ({file})"),
        (Some(file), line) => format!("{name} ({file}:{line})"),
        (None, _) => name.to_string(),
    })
}

#[derive(Default)]
struct Process {
    mappings: Vec<pb::Mapping>,
    /// Perf-map entries, sorted by start: (start, end, name).
    jit: Vec<(u64, u64, Arc<str>)>,
    native: HashMap<u64, Arc<str>>,
}

/// What symbolizing new native addresses may still take in this window.
struct Budget {
    left: usize,
    until: Instant,
}

/// Names the hot functions of each window's rows; one per live capture or replay.
pub struct HotFunctions {
    native: Native,
    /// Python frame names by id.
    python: BTreeMap<u64, Leaf>,
    procs: HashMap<u32, Process>,
    native_cached: usize,
    /// Processes that exited: forgotten after the next window (its samples may be theirs).
    exited: Vec<u32>,
}

impl Default for HotFunctions {
    fn default() -> Self {
        Self::new()
    }
}

impl HotFunctions {
    /// Knows nothing yet: [`Self::observe`] each chunk.
    pub fn new() -> Self {
        Self {
            native: Native::new(),
            python: BTreeMap::new(),
            procs: HashMap::new(),
            native_cached: 0,
            exited: Vec::new(),
        }
    }

    /// Knows what a whole recording holds (for `top --replay`).
    pub fn of_recording(rec: &Recording) -> Self {
        let mut hot = Self::new();
        for f in rec.python_frames.values() {
            hot.python_frame(f);
        }
        for (&tgid, maps) in &rec.mappings {
            if let Some(p) = hot.process(tgid) {
                p.mappings = maps.iter().take(MAX_MAPPINGS).cloned().collect();
            }
        }
        for syms in rec.jit_symbols.values() {
            for s in syms {
                hot.jit_symbol(s);
            }
        }
        hot
    }

    /// Learns the names, perf-map entries, mappings and exits a capture chunk carries.
    pub fn observe(&mut self, chunk: &pb::Chunk) {
        for e in &chunk.process_events {
            match e.kind() {
                Kind::Exit if e.tid == e.tgid => self.exited.push(e.tgid),
                // A new program image: cached names and perf-map entries are the old one's.
                Kind::Exec => {
                    if let Some(p) = self.procs.get_mut(&e.tgid) {
                        self.native_cached = self.native_cached.saturating_sub(p.native.len());
                        p.native.clear();
                        p.jit.clear();
                    }
                }
                _ => {}
            }
        }
        for f in &chunk.python_frames {
            self.python_frame(f);
        }
        for m in &chunk.mappings {
            if let Some(p) = self.process(m.tgid) {
                if p.mappings.len() >= MAX_MAPPINGS {
                    p.mappings.remove(0);
                }
                p.mappings.push(m.clone());
            }
        }
        for s in &chunk.jit_symbols {
            self.jit_symbol(s);
        }
    }

    /// Sets `top_function` of every row and thread row from the window's samples.
    pub fn annotate(&mut self, samples: &[pb::Sample], rows: &mut [ProcessRow]) {
        let mut threads: HashMap<u32, Tally> = HashMap::new();
        let mut procs: HashMap<u32, Tally> = HashMap::new();
        let mut budget = Budget {
            left: NEW_NATIVE_PER_WINDOW,
            until: Instant::now() + NATIVE_TIME_PER_WINDOW,
        };
        for s in samples {
            let Some(leaf) = self.leaf(s, &mut budget) else {
                continue;
            };
            *procs
                .entry(s.tgid)
                .or_default()
                .entry(leaf.clone())
                .or_default() += 1;
            *threads.entry(s.tid).or_default().entry(leaf).or_default() += 1;
        }
        for p in rows.iter_mut() {
            p.top_function = procs.get(&p.pid).and_then(pick).unwrap_or_default();
            for t in &mut p.threads {
                t.top_function = threads.get(&t.tid).and_then(pick).unwrap_or_default();
            }
        }
        for tgid in std::mem::take(&mut self.exited) {
            if let Some(p) = self.procs.remove(&tgid) {
                self.native_cached = self.native_cached.saturating_sub(p.native.len());
            }
        }
    }

    /// The function sample `s` names; `None` when it has no stack, or its leaf is new and
    /// this window's symbolization budget is spent.
    fn leaf(&mut self, s: &pb::Sample, budget: &mut Budget) -> Option<Leaf> {
        let py = s
            .python_stack
            .iter()
            .filter_map(|id| self.python.get(id))
            .find(|leaf| &*leaf.name != PY_UNKNOWN);
        if let Some(leaf) = py {
            return Some(leaf.clone());
        }
        let p = self.procs.get(&s.tgid);
        if let Some(p) = p.filter(|p| !p.jit.is_empty()) {
            let jit = s.user_stack.iter().find_map(|&addr| {
                let i = p.jit.partition_point(|e| e.0 <= addr).checked_sub(1)?;
                let (_, end, name) = &p.jit[i];
                (addr < *end).then(|| name.clone())
            });
            if let Some(name) = jit {
                return Some(Leaf {
                    name,
                    file: None,
                    line: 0,
                });
            }
        }
        let (addr, kernel) = match (s.user_stack.first(), s.kernel_stack.first()) {
            (Some(&a), _) => (a, false),
            (None, Some(&a)) => (a, true),
            (None, None) => return None,
        };
        if let Some(name) = p.and_then(|p| p.native.get(&addr)) {
            return Some(Leaf {
                name: name.clone(),
                file: None,
                line: 0,
            });
        }
        if budget.left == 0 || Instant::now() >= budget.until {
            return None;
        }
        budget.left -= 1;
        if self.native_cached >= MAX_NATIVE {
            // Start over: the symbolizer's own caches go with it.
            self.native = Native::new();
            for p in self.procs.values_mut() {
                p.native.clear();
            }
            self.native_cached = 0;
        }
        let name = if kernel {
            self.native.kernel(addr)
        } else {
            let maps = self
                .procs
                .get(&s.tgid)
                .map(|p| p.mappings.as_slice())
                .unwrap_or_default();
            self.native.user(addr, maps)
        };
        if let Some(p) = self.process(s.tgid) {
            p.native.insert(addr, name.clone());
            self.native_cached += 1;
        }
        Some(Leaf {
            name,
            file: None,
            line: 0,
        })
    }

    fn process(&mut self, tgid: u32) -> Option<&mut Process> {
        if !self.procs.contains_key(&tgid) && self.procs.len() >= MAX_PROCESSES {
            return None;
        }
        Some(self.procs.entry(tgid).or_default())
    }

    fn python_frame(&mut self, f: &pb::PythonFrame) {
        if self.python.len() >= MAX_PYTHON {
            self.python.pop_first();
        }
        let file =
            (!f.file.is_empty()).then(|| Arc::from(f.file.rsplit('/').next().unwrap_or(&f.file)));
        let name = if f.function == PY_UNKNOWN {
            Arc::from(PY_UNKNOWN)
        } else {
            Arc::from(format!("py:{}", f.function))
        };
        self.python.insert(
            f.id,
            Leaf {
                name,
                file,
                line: f.line,
            },
        );
    }

    fn jit_symbol(&mut self, s: &pb::JitSymbol) {
        let Some(p) = self.process(s.tgid) else {
            return;
        };
        if p.jit.len() >= MAX_JIT {
            return;
        }
        let entry = (
            s.start,
            s.start.saturating_add(s.size),
            Arc::from(s.name.as_str()),
        );
        let at = p.jit.partition_point(|e| e.0 < s.start);
        match p.jit.get_mut(at) {
            // A later entry for the same start (code reused) wins.
            Some(e) if e.0 == s.start => *e = entry,
            _ => p.jit.insert(at, entry),
        }
    }
}

/// Native leaf names from ELF symbol tables (no DWARF: a name is all a row shows, and
/// line tables of large binaries cost seconds and megabytes) and kallsyms.
struct Native {
    inner: blazesym::symbolize::Symbolizer,
}

impl Native {
    fn new() -> Self {
        Self {
            inner: blazesym::symbolize::Symbolizer::builder()
                .enable_auto_reload(false)
                .enable_code_info(false)
                .enable_inlined_fns(false)
                .build(),
        }
    }

    /// The function of user address `addr`, given its process's mappings; `module+0xOFFSET`
    /// when no symbol covers it.
    fn user(&self, addr: u64, maps: &[pb::Mapping]) -> Arc<str> {
        use blazesym::symbolize::{Input, Symbolized, source::Elf, source::Source};
        let Some(m) = crate::symbolize::mapping_of(addr, maps).and_then(|i| maps.get(i)) else {
            return Frame::unresolved("[unknown]", addr, FrameKind::Native)
                .function
                .into();
        };
        let offset = addr - m.start + m.file_offset;
        let mut elf = Elf::new(&m.path);
        elf.debug_syms = false;
        match self
            .inner
            .symbolize_single(&Source::Elf(elf), Input::FileOffset(offset))
        {
            Ok(Symbolized::Sym(sym)) => sym.name.as_ref().into(),
            _ => Frame::unresolved(&m.path, offset, FrameKind::Native)
                .function
                .into(),
        }
    }

    /// The function of kernel address `addr` (kallsyms).
    fn kernel(&self, addr: u64) -> Arc<str> {
        use blazesym::MaybeDefault;
        use blazesym::symbolize::{Input, Symbolized, source::Kernel, source::Source};
        let src = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        match self.inner.symbolize_single(&src, Input::AbsAddr(addr)) {
            Ok(Symbolized::Sym(sym)) => sym.name.as_ref().into(),
            _ => Frame::unresolved("[kernel]", addr, FrameKind::Kernel)
                .function
                .into(),
        }
    }
}

#[cfg(test)]
mod tests;
