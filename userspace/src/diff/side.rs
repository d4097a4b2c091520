//! One side of a diff: its recordings cut into runs (a recording's `RunMarker`s from
//! `record --repeat`, else the whole recording is one run), each run analysed by the same
//! pipeline as `report` ([`crate::analysis::analyze`]) and rolled up by its rollup
//! (`pipeline::rows`/`group` for processes, `output::functions::self_by_function` for
//! functions). This module only reads those rows into per-run values.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use crate::{
    analysis,
    attribute::domain_name,
    output::{collapsed, functions, table::RowKey},
    pipeline::{self, Config, GroupBy},
    profile::{self, Filter},
    record::Recording,
    symbolize::Symbolizer,
};

use super::stats::Z95;

/// What a row of the diff is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum By {
    /// A function (self energy: samples whose leaf it is).
    #[default]
    Function,
    /// A process, matched across recordings by command line (pids differ between runs).
    Process,
    /// A command name (`comm`): its processes summed.
    Command,
    /// A thread, as `process/thread` names.
    Thread,
    /// A container or pod (`[host]` for the rest).
    Container,
}

/// One recording given to a side, with the pipeline configuration it is analysed with.
pub struct Input {
    /// How the user named it (the path).
    pub label: String,
    /// The recording.
    pub rec: Recording,
    /// Its configuration (`analysis::config`).
    pub cfg: Config,
}

/// One run's figures, in J (not yet normalised).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Run {
    /// Length, s.
    pub duration_s: f64,
    /// Measured energy of the run (headline domains), J.
    pub total_j: f64,
    /// Idle/static energy, J.
    pub idle_j: f64,
    /// Energy per row name, J, with its within-run sampling variance, J².
    pub rows: HashMap<String, (f64, f64)>,
    /// Folded stacks (`comm;root;...;leaf`) with their energy, J (functions only, when
    /// asked for).
    pub stacks: BTreeMap<String, f64>,
}

/// What a side is made of, for the header.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Facts {
    /// The recordings given.
    pub files: Vec<String>,
    /// Host names recorded on (sorted, unique).
    pub hostnames: Vec<String>,
    /// True when any energy is modelled: every figure of the side is then estimated.
    pub estimated: bool,
    /// Kinds of sources, e.g. `powercap`, `model`.
    pub source: String,
    /// Sampling rates, Hz (sorted, unique).
    pub sample_hz: Vec<u32>,
    /// Runs marked by `record --repeat` (0 when the recordings are the runs).
    pub marked_runs: usize,
    /// Events the kernel dropped, all recordings.
    pub lost_events: u64,
    /// Notes about damaged or cut-short recordings.
    pub warnings: Vec<String>,
}

/// A side: its facts and its runs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Side {
    /// Where it came from.
    pub facts: Facts,
    /// One entry per run.
    pub runs: Vec<Run>,
}

/// Which sides get folded stacks (by function): the differential flamegraph draws the
/// new side's, the two-column collapsed stacks both sides'. A side without them symbolizes
/// only each stack's leaf.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StacksOf {
    /// Rows only.
    #[default]
    Neither,
    /// The new side's stacks.
    New,
    /// Both sides' stacks.
    Both,
}

impl StacksOf {
    fn of_base(self) -> bool {
        self == StacksOf::Both
    }

    fn of_new(self) -> bool {
        self != StacksOf::Neither
    }
}

/// Reads `inputs` into a side with rows of `by` (and folded stacks when `stacks`).
pub fn side(inputs: Vec<Input>, by: By, stacks: bool) -> Side {
    let stacks = if stacks {
        StacksOf::Both
    } else {
        StacksOf::Neither
    };
    let (side, _) = sides(inputs, Vec::new(), by, stacks);
    side
}

/// Reads both sides of a diff, as [`side`] reads each. The runs of each side are analysed
/// on a thread of their own; meanwhile, by function, the names of every run of both sides
/// are resolved together, each distinct file offset and kernel address once (the two sides
/// of a diff run the same binaries on the same kernel).
pub fn sides(base: Vec<Input>, new: Vec<Input>, by: By, stacks: StacksOf) -> (Side, Side) {
    let (base_facts, base_runs) = cut(&base);
    let (new_facts, new_runs) = cut(&new);
    let analyse = |runs: &[(Cow<'_, Recording>, &Config)]| -> Vec<analysis::Analysis> {
        runs.iter()
            .map(|(rec, cfg)| analysis::analyze(rec, cfg))
            .collect()
    };
    let mut symbolizers: Vec<Symbolizer> = Vec::new();
    let (base_a, new_a) = std::thread::scope(|s| {
        let base_a = s.spawn(|| analyse(&base_runs));
        let new_a = s.spawn(|| analyse(&new_runs));
        if by == By::Function {
            // Each run with whether its side wants stacks.
            let all = || {
                let base = base_runs.iter().map(|r| (r, stacks.of_base()));
                base.chain(new_runs.iter().map(|r| (r, stacks.of_new())))
            };
            symbolizers = all()
                .map(|((rec, _), _)| analysis::symbolizer_for(rec))
                .collect();
            let requests = symbolizers
                .iter_mut()
                .zip(all())
                .map(|(symbolizer, ((rec, _), stacks))| {
                    let (user, kernel) = profile::needed(&**rec, &Filter::default(), !stacks);
                    (symbolizer, user, kernel)
                })
                .collect();
            crate::symbolize::prefetch_together(requests);
        }
        let join = |h: std::thread::ScopedJoinHandle<'_, _>| match h.join() {
            Ok(a) => a,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (join(base_a), join(new_a))
    });
    let mut symbolizers = symbolizers.into_iter();
    let mut rows = |runs: &[(Cow<'_, Recording>, &Config)],
                    analyses: Vec<analysis::Analysis>,
                    stacks: bool| {
        runs.iter()
            .zip(analyses)
            .map(|((rec, _), a)| run(rec, &a, by, stacks, symbolizers.next()))
            .collect()
    };
    let base = Side {
        facts: base_facts,
        runs: rows(&base_runs, base_a, stacks.of_base()),
    };
    let new = Side {
        facts: new_facts,
        runs: rows(&new_runs, new_a, stacks.of_new()),
    };
    (base, new)
}

/// The facts of a side and its runs: each marked run cut out of its recording, or the
/// whole recording, with its configuration.
fn cut(inputs: &[Input]) -> (Facts, Vec<(Cow<'_, Recording>, &Config)>) {
    let mut facts = Facts::default();
    let mut runs = Vec::new();
    let mut sources = Vec::new();
    for input in inputs {
        let rec = &input.rec;
        facts.files.push(input.label.clone());
        facts.hostnames.push(rec.header.hostname.clone());
        facts.sample_hz.push(rec.header.sample_hz);
        facts.lost_events += crate::record::lost_events(&rec.losses);
        facts.estimated |= rec.sources.iter().any(|s| s.estimated);
        sources.extend(input.cfg.sources.iter().cloned());
        if rec.truncated && !rec.damage.end_damaged {
            facts
                .warnings
                .push(format!("{} was cut short (no trailer)", input.label));
        }
        if let Some(note) = rec.damage.note() {
            facts
                .warnings
                .push(format!("{} is damaged: {note}", input.label));
        }
        if rec.runs.is_empty() {
            runs.push((Cow::Borrowed(rec), &input.cfg));
        } else {
            facts.marked_runs += rec.runs.len();
            for marker in &rec.runs {
                let mut slice = rec.clone();
                crate::record::series::cut_mono(&mut slice, marker.start_ns, marker.end_ns);
                runs.push((Cow::Owned(slice), &input.cfg));
            }
        }
    }
    facts.hostnames.sort();
    facts.hostnames.dedup();
    facts.sample_hz.sort_unstable();
    facts.sample_hz.dedup();
    facts.source = pipeline::source_label(&sources);
    (facts, runs)
}

/// Variance from a 95% interval (half its width is z·σ).
fn variance(lo: f64, hi: f64) -> f64 {
    let sd = (hi - lo).max(0.0) / (2.0 * Z95);
    sd * sd
}

/// One analysed run read into rows; by function, `symbolizer` has the names it needs.
fn run(
    rec: &Recording,
    a: &analysis::Analysis,
    by: By,
    want_stacks: bool,
    symbolizer: Option<Symbolizer>,
) -> Run {
    let totals = a.totals();
    let mut out = Run {
        duration_s: totals.duration_ns as f64 / 1e9,
        total_j: totals.total_j,
        idle_j: totals.idle_j.max(0.0),
        ..Run::default()
    };
    let mut add = |key: String, j: f64, var: f64| {
        let e = out.rows.entry(key).or_insert((0.0, 0.0));
        e.0 += j;
        e.1 += var;
    };
    if by == By::Function {
        // Rows are self energy: only each stack's leaf needs a name, unless stacks are drawn.
        let weights = analysis::sample_values(rec, a);
        let mut symbolizer = symbolizer.unwrap_or_else(|| analysis::symbolizer_for(rec));
        // `sides` filled the symbolizer with what this build needs.
        let profile = profile::build_prefetched(
            rec,
            &weights,
            &mut symbolizer,
            &Filter::default(),
            !want_stacks,
        );
        let Some((idx, domain)) = profile
            .value_types
            .iter()
            .enumerate()
            .find_map(|(i, v)| v.name.strip_prefix("energy_").map(|d| (i, d.to_string())))
        else {
            return out;
        };
        let report = functions::self_by_function(&profile, &[domain]);
        for row in &report.rows {
            let (RowKey::Function { name, .. }, Some(cell)) = (&row.key, row.energy.first()) else {
                continue;
            };
            add(
                name.clone(),
                cell.joules,
                variance(cell.ci_low, cell.ci_high),
            );
        }
        if want_stacks {
            out.stacks = collapsed::fold(&profile, idx)
                .into_iter()
                .map(|(k, uj)| (k, uj * 1e-6))
                .collect();
        }
        return out;
    }
    let names = pipeline::recorded_cgroup_names(rec);
    let rows = pipeline::rows(&rec.window(), a, &rec.threads, &names);
    let headline = |e: &pipeline::DomainJoules| -> f64 {
        a.attribution
            .headline
            .iter()
            .map(|&d| e.get(domain_name(d)).copied().unwrap_or(0.0))
            .sum()
    };
    match by {
        By::Process => {
            for p in &rows {
                let key = if p.cmdline.is_empty() {
                    p.comm.clone()
                } else {
                    p.cmdline.clone()
                };
                add(key, headline(&p.energy_j), variance(p.ci_j[0], p.ci_j[1]));
            }
        }
        By::Command | By::Container => {
            let group = if by == By::Command {
                GroupBy::Command
            } else {
                GroupBy::Container
            };
            for g in pipeline::group(&rows, group) {
                add(
                    g.comm.clone(),
                    headline(&g.energy_j),
                    variance(g.ci_j[0], g.ci_j[1]),
                );
            }
        }
        By::Thread => {
            for p in &rows {
                for t in &p.threads {
                    add(format!("{}/{}", p.comm, t.comm), headline(&t.energy_j), 0.0);
                }
            }
        }
        By::Function => {}
    }
    out
}
