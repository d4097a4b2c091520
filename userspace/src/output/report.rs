//! The `report` document: one window covering a recording, or consecutive windows of it,
//! rendered as a table, JSON or CSV. Rows come from the pipeline's rollup
//! (docs/ARCHITECTURE.md, "Data flow"); this module builds the report rows (title, notes,
//! the idle/unknown/total footer, `--by` groupings) and the documents around them.

use serde::Serialize;

use crate::{
    analysis::{self, Analysis},
    attribute::domain_name,
    output::{
        OutputError, functions,
        table::{self, By, EnergyCell, Format, RenderOptions, Report, ReportRow, RowKey},
    },
    pipeline::{self, Config, ProcessRow, Totals},
    profile::Filter,
    record::Recording,
};

/// Rows a table shows when no limit is given (JSON and CSV show all).
pub const DEFAULT_TABLE_ROWS: usize = 25;

/// What the report shows and how.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    /// One row per process, thread, cgroup, command, container or function.
    pub by: By,
    /// Output format.
    pub format: Format,
    /// A time series: windows of this many seconds.
    pub window: Option<f64>,
    /// Sort column (a unique prefix); `None`: the first energy column, else CPU time.
    pub sort: Option<String>,
    /// At most this many rows; `None`: 25 in a table, all in JSON and CSV.
    pub limit: Option<usize>,
    /// Only these processes (tgid); empty: all.
    pub pids: Vec<u32>,
}

impl ReportOptions {
    /// `rows` without the processes `pids` leaves out.
    fn kept<'a>(&self, rows: &'a [ProcessRow]) -> std::borrow::Cow<'a, [ProcessRow]> {
        if self.pids.is_empty() {
            return rows.into();
        }
        rows.iter()
            .filter(|r| self.pids.contains(&r.pid))
            .cloned()
            .collect::<Vec<_>>()
            .into()
    }
}

/// Why a report could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// `--window` with `--by function`: a profile has no time series.
    #[error(
        "`--window` gives a time series of processes; `--by function` has none (use `flamegraph`)"
    )]
    WindowByFunction,
    /// The table renderer failed.
    #[error("cannot report")]
    Render(#[source] OutputError),
    /// The JSON document could not be built.
    #[error("cannot encode the report as JSON")]
    Json(#[from] serde_json::Error),
}

/// The report of `rec` analysed with `cfg`, as `opts.format` prints it; with `carbon`,
/// grams of CO2e beside the joules at the intensities it gives for each window's time
/// (docs/carbon.md).
pub fn render_carbon(
    rec: &Recording,
    cfg: &Config,
    opts: &ReportOptions,
    mut carbon: Option<&mut crate::carbon::Carbon>,
) -> Result<Vec<u8>, ReportError> {
    let mut intensity = |start_ns: u64, end_ns: u64| {
        let unix = |t: u64| rec.header.start_unix_ns + t.saturating_sub(rec.start_ns());
        carbon
            .as_mut()
            .map(|c| c.over(unix(start_ns), unix(end_ns)))
    };
    match opts.window {
        Some(secs) => windowed(opts, rec, cfg, secs, &mut intensity),
        None => whole(opts, rec, cfg, &mut intensity),
    }
}

/// An intensity for a window's bounds (CLOCK_MONOTONIC ns), when carbon is shown.
type IntensityAt<'a> = dyn FnMut(u64, u64) -> Option<crate::carbon::Intensity> + 'a;

/// Adds grams to a window's JSON: `carbon` (the intensity, its source and the window's
/// grams) and `co2e_g` on every process and thread (its share of the measured energy).
fn add_carbon(value: &mut serde_json::Value, i: &crate::carbon::Intensity, totals: &Totals) {
    let grams = |share: f64| i.grams(share * totals.total_j);
    if let Some(procs) = value.get_mut("processes").and_then(|p| p.as_array_mut()) {
        for p in procs {
            let share = p["share"].as_f64().unwrap_or(0.0);
            p["co2e_g"] = grams(share).into();
            if let Some(threads) = p.get_mut("threads").and_then(|t| t.as_array_mut()) {
                for t in threads {
                    let share = t["share"].as_f64().unwrap_or(0.0);
                    t["co2e_g"] = grams(share).into();
                }
            }
        }
    }
    value["carbon"] = serde_json::json!({
        "g_per_kwh": i.g_per_kwh,
        "source": i.source,
        "pue": i.pue,
        "fallback": i.fallback,
        "co2e_g": i.grams(totals.total_j),
        "idle_co2e_g": i.grams(totals.idle_j.max(0.0)),
    });
}

/// The table's `co2e_g` column and the note saying which intensity made it.
fn carbon_column(report: &mut Report, i: Option<&crate::carbon::Intensity>, totals: &Totals) {
    if let Some(i) = i {
        report.co2e_g_per_j = Some(i.g_per_joule());
        report.notes.push(format!(
            "carbon: {:.6} gCO2e at {}",
            i.grams(totals.total_j),
            i.describe()
        ));
    }
}

/// What a JSON report says about the recording besides its windows.
#[derive(Serialize)]
struct RecordingFacts {
    lost_events: u64,
    truncated: bool,
    damage: serde_json::Value,
    losses: Losses,
    /// How user stacks were walked: samples per method and per stop reason.
    unwind: crate::record::UnwindCounts,
    /// CPython processes found (or ruled out): `{pid, version, status}`.
    python: Vec<serde_json::Value>,
}

#[derive(Serialize)]
struct Losses {
    switch_dropped: u64,
    sample_dropped: u64,
    process_dropped: u64,
    stack_errors: u64,
    vanished_processes: u64,
}

impl RecordingFacts {
    fn of(rec: &Recording) -> Self {
        let l = &rec.losses;
        Self {
            lost_events: crate::record::lost_events(l),
            truncated: rec.truncated,
            damage: rec.damage.to_json(),
            losses: Losses {
                switch_dropped: l.switch_dropped,
                sample_dropped: l.sample_dropped,
                process_dropped: l.process_dropped,
                stack_errors: l.stack_errors,
                vanished_processes: l.vanished_processes,
            },
            unwind: crate::record::UnwindCounts::of(&rec.samples),
            python: rec
                .python_processes
                .iter()
                .map(|p| serde_json::json!({"pid": p.tgid, "version": p.version, "status": p.status}))
                .collect(),
        }
    }
}

/// One line per CPython process found: `python: pid 123 (3.11) walked`.
fn python_notes(rec: &Recording) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    rec.python_processes
        .iter()
        .filter(|p| seen.insert((p.tgid, p.status.as_str())))
        .take(20)
        .map(|p| {
            if p.version.is_empty() {
                format!("python: pid {} {}", p.tgid, p.status)
            } else {
                format!("python: pid {} ({}) {}", p.tgid, p.version, p.status)
            }
        })
        .collect()
}

/// One window as JSON prints it: its bounds, its machine-wide figures and its process rows
/// (the same document `top --batch --format json` prints per frame).
#[derive(Serialize)]
struct WindowDoc<'a> {
    /// Window start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// Window end (exclusive), ns.
    pub end_ns: u64,
    /// Machine-wide figures.
    #[serde(flatten)]
    pub totals: &'a Totals,
    /// Process rows with their threads.
    pub processes: &'a [ProcessRow],
}

fn whole(
    args: &ReportOptions,
    rec: &Recording,
    cfg: &Config,
    intensity: &mut IntensityAt<'_>,
) -> Result<Vec<u8>, ReportError> {
    let analysis = analysis::analyze(rec, cfg);
    let input = rec.window();
    let names = pipeline::recorded_cgroup_names(rec);
    let all = pipeline::rows(&input, &analysis, &rec.threads, &names);
    let rows = args.kept(&all);
    let totals = analysis.totals();
    let carbon = intensity(input.start_ns, input.end_ns);
    let mut out = Vec::new();
    if args.format == Format::Json && args.by != By::Function {
        let mut value = serde_json::to_value(WindowDoc {
            start_ns: input.start_ns,
            end_ns: input.end_ns,
            totals: &totals,
            processes: &rows,
        })?;
        merge(&mut value, serde_json::to_value(RecordingFacts::of(rec))?);
        merge(&mut value, model_facts(&analysis.sources));
        if args.by == By::Vm {
            let vms = crate::vm::rows::energies(&rows);
            merge(&mut value, serde_json::json!({ "vms": vms }));
        }
        if let Some(i) = &carbon {
            add_carbon(&mut value, i, &totals);
        }
        out.extend(format!("{value:#}\n").into_bytes());
        return Ok(out);
    }
    let mut report = report(args, &rows, &totals, rec, &analysis, None);
    carbon_column(&mut report, carbon.as_ref(), &totals);
    table::render(&report, &render_options(args), args.format, &mut out)
        .map_err(ReportError::Render)?;
    Ok(out)
}

fn windowed(
    args: &ReportOptions,
    rec: &Recording,
    cfg: &Config,
    secs: f64,
    intensity: &mut IntensityAt<'_>,
) -> Result<Vec<u8>, ReportError> {
    if args.by == By::Function {
        return Err(ReportError::WindowByFunction);
    }
    let windows: Vec<pipeline::Window> =
        pipeline::windows(rec, cfg.clone(), std::time::Duration::from_secs_f64(secs)).collect();
    let carbon: Vec<Option<crate::carbon::Intensity>> = windows
        .iter()
        .map(|w| intensity(w.start_ns(), w.end_ns()))
        .collect();
    let mut out = Vec::new();
    match args.format {
        Format::Json => {
            let docs: Vec<serde_json::Value> = windows
                .iter()
                .zip(&carbon)
                .map(|(w, c)| {
                    let mut v = serde_json::to_value(WindowDoc {
                        start_ns: w.start_ns(),
                        end_ns: w.end_ns(),
                        totals: &w.totals,
                        processes: &args.kept(&w.processes),
                    })?;
                    if let Some(i) = c {
                        add_carbon(&mut v, i, &w.totals);
                    }
                    Ok(v)
                })
                .collect::<Result<_, serde_json::Error>>()?;
            let mut value = serde_json::json!({
                "window_s": secs,
                "start_ns": rec.start_ns(),
                "end_ns": rec.end_ns,
                "windows": docs,
            });
            merge(&mut value, serde_json::to_value(RecordingFacts::of(rec))?);
            merge(&mut value, model_facts(&cfg.sources));
            out.extend(format!("{value:#}\n").into_bytes());
        }
        Format::Csv => {
            for (i, w) in windows.iter().enumerate() {
                let rows = args.kept(&w.processes);
                let mut report = report(args, &rows, &w.totals, rec, &w.analysis, None);
                carbon_column(&mut report, carbon[i].as_ref(), &w.totals);
                let g = carbon[i]
                    .as_ref()
                    .map(|c| (",g_per_kwh", format!(",{}", c.g_per_kwh)));
                let (g_head, g_cell) = g.unwrap_or_default();
                let mut text = Vec::new();
                table::render(&report, &render_options(args), Format::Csv, &mut text)
                    .map_err(ReportError::Render)?;
                let text = String::from_utf8_lossy(&text);
                let (t0, t1) = window_secs(rec, w);
                for (n, line) in text.lines().enumerate() {
                    if n == 0 {
                        if i == 0 {
                            out.extend(
                                format!("window_start_s,window_end_s{g_head},{line}\n")
                                    .into_bytes(),
                            );
                        }
                    } else {
                        out.extend(format!("{t0:.3},{t1:.3}{g_cell},{line}\n").into_bytes());
                    }
                }
            }
        }
        Format::Table => {
            for (i, w) in windows.iter().enumerate() {
                if i > 0 {
                    out.push(b'\n');
                }
                let rows = args.kept(&w.processes);
                let mut report = report(
                    args,
                    &rows,
                    &w.totals,
                    rec,
                    &w.analysis,
                    Some(window_secs(rec, w)),
                );
                carbon_column(&mut report, carbon[i].as_ref(), &w.totals);
                table::render(&report, &render_options(args), Format::Table, &mut out)
                    .map_err(ReportError::Render)?;
            }
        }
    }
    Ok(out)
}

fn window_secs(rec: &Recording, w: &pipeline::Window) -> (f64, f64) {
    let s = |t: u64| t.saturating_sub(rec.start_ns()) as f64 / 1e9;
    (s(w.start_ns()), s(w.end_ns()))
}

/// `model_row` and `model_error` of the estimated model's power-table row, when its
/// parameters came from the table (nothing otherwise: reports of older recordings keep
/// their keys).
fn model_facts(sources: &[crate::pb::v1::EnergySource]) -> serde_json::Value {
    match crate::energy::model::row_label(sources) {
        Some(row) => serde_json::json!({
            "model_row": row,
            "model_error": crate::energy::model::row_error_pct(sources).unwrap_or(0.0),
        }),
        None => serde_json::json!({}),
    }
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(a), serde_json::Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

fn render_options(args: &ReportOptions) -> RenderOptions {
    RenderOptions {
        sort: args.sort.clone(),
        limit: args
            .limit
            .or((args.format == Format::Table).then_some(DEFAULT_TABLE_ROWS)),
    }
}

/// The table rows of `--by` over one window's process rows, with the title, notes and the
/// idle/unknown/total rows. `window` is the window's place in the recording, seconds.
fn report(
    opts: &ReportOptions,
    rows: &[ProcessRow],
    totals: &Totals,
    rec: &Recording,
    a: &Analysis,
    window: Option<(f64, f64)>,
) -> Report {
    let by = opts.by;
    let attr = &a.attribution;
    let domains = analysis::domains(a);
    let names: Vec<String> = domains
        .iter()
        .map(|&d| domain_name(d).to_string())
        .collect();
    let secs = (totals.duration_ns as f64 / 1e9).max(1e-9);
    // Average power is over the time the energy was measured: a once-a-second counter
    // leaves up to a second out at each end of a recording.
    let power_secs = attr.power_span_ns(totals.duration_ns) as f64 / 1e9;
    let total = attr.total_uj();
    let cpus: Vec<u32> = a.timeline.cpus.iter().map(|c| c.cpu).collect();
    let span = match window {
        Some((t0, t1)) => format!("window {t0:.1}-{t1:.1} s"),
        None => format!("{secs:.1} s"),
    };
    let title = format!(
        "energy-bpf report: {span} on {} ({} CPUs), {} Hz sampling{}",
        rec.header.hostname,
        cpus.len(),
        rec.header.sample_hz,
        if rec.truncated { ", TRUNCATED" } else { "" }
    );
    let notes = vec![
        format!(
            "energy: {:.3} J ({:.2} W) from {}, split by {:?}; idle/static {:.3} J",
            totals.total_j,
            totals.total_j / power_secs,
            analysis::source_description(&a.sources),
            totals.power_model,
            totals.idle_j.max(0.0),
        ),
        format!("activity: {}", totals.activity.label()),
        format!("{} events lost", crate::record::lost_events(&rec.losses)),
        crate::record::UnwindCounts::of(&rec.samples).label(),
    ];
    let mut notes = notes;
    if by == By::Vm {
        notes.push(
            "VM rows: each VM process's measured energy by thread class; static power stays in [idle/static] (the agent shares it out by --vm-static)".into(),
        );
    }
    notes.extend(python_notes(rec));
    notes.extend(
        attr.sources
            .iter()
            .flat_map(crate::attribute::SourceAttribution::static_notes),
    );
    // Whole threads and processes carry no sampling error (attribute::ci), so a process's
    // interval is its headline interval (`ci_j`) scaled to each domain.
    let cells = |e: &pipeline::DomainJoules, ci: Option<[f64; 2]>| -> Vec<EnergyCell> {
        let headline: f64 = attr
            .headline
            .iter()
            .map(|&d| e.get(domain_name(d)).copied().unwrap_or(0.0))
            .sum();
        names
            .iter()
            .map(|d| {
                let joules = e.get(d.as_str()).copied().unwrap_or(0.0);
                let (lo, hi) = match ci {
                    Some([lo, hi]) if headline > 0.0 => (lo / headline, hi / headline),
                    _ => (1.0, 1.0),
                };
                EnergyCell {
                    joules,
                    ci_low: joules * lo,
                    ci_high: joules * hi,
                }
            })
            .collect()
    };
    let summary_row = |label: &str, e: &crate::attribute::PerDomain| {
        let uj = attr.headline_uj(e);
        ReportRow {
            key: RowKey::Label(label.into()),
            cpu_ns: 0.0,
            samples: 0,
            energy: cells(&e.joules_by_name(), None),
            total_energy: None,
            power_w: uj * 1e-6 / power_secs,
            share: if total > 0.0 { uj / total } else { 0.0 },
            cpu_share: Vec::new(),
        }
    };
    let mut footer = vec![summary_row("[idle/static]", &attr.idle)];
    if attr.headline_uj(&attr.unknown) != 0.0 {
        footer.push(summary_row("[unknown]", &attr.unknown));
    }
    footer.push(summary_row("[total]", &attr.measured));
    let process_row = |key: RowKey, p: &ProcessRow| ReportRow {
        key,
        cpu_ns: p.cpu_ns as f64,
        samples: p.samples,
        energy: cells(&p.energy_j, Some(p.ci_j)),
        total_energy: None,
        power_w: p.power_w,
        share: p.share,
        cpu_share: p.cpu_share.clone(),
    };
    let (rows, cpus) = match by {
        By::Process => (
            rows.iter()
                .map(|p| {
                    process_row(
                        RowKey::Process {
                            pid: p.pid,
                            comm: p.comm.clone(),
                        },
                        p,
                    )
                })
                .collect(),
            cpus,
        ),
        By::Cgroup | By::Command | By::Container => {
            let group_by = match by {
                By::Cgroup => pipeline::GroupBy::Cgroup,
                By::Command => pipeline::GroupBy::Command,
                _ => pipeline::GroupBy::Container,
            };
            (
                pipeline::group(rows, group_by)
                    .iter()
                    .map(|g| process_row(RowKey::Group(g.comm.clone()), g))
                    .collect(),
                cpus,
            )
        }
        By::Vm => (
            crate::vm::rows::grouped(rows)
                .iter()
                .map(|g| process_row(RowKey::Group(g.comm.clone()), g))
                .collect(),
            cpus,
        ),
        By::Thread => {
            // Threads running JIT-compiled or Python code show their busiest such
            // function: the thread's name alone says `node`, `java` or `python3`. Only
            // recordings with such frames pay for the profile.
            let top = if rec.jit_symbols.is_empty() && rec.python_frames.is_empty() {
                std::collections::HashMap::new()
            } else {
                functions::top_managed_by_thread(&analysis::profile(rec, a, &Filter::default()))
            };
            (
                rows.iter()
                    .flat_map(|p| {
                        let top = &top;
                        p.threads.iter().map(move |t| ReportRow {
                            key: RowKey::Thread {
                                pid: p.pid,
                                tid: t.tid,
                                comm: match top.get(&t.tid) {
                                    Some(f) => format!("{} [{f}]", t.comm),
                                    None => t.comm.clone(),
                                },
                            },
                            cpu_ns: t.cpu_ns as f64,
                            samples: t.samples,
                            energy: cells(&t.energy_j, None),
                            total_energy: None,
                            power_w: t.power_w,
                            share: t.share,
                            cpu_share: Vec::new(),
                        })
                    })
                    .collect(),
                Vec::new(),
            )
        }
        By::Function => {
            let filter = Filter {
                pids: opts.pids.clone(),
                comms: Vec::new(),
            };
            let profile = analysis::profile(rec, a, &filter);
            let mut r = functions::by_function(&profile, &names);
            r.title = title;
            r.notes = notes;
            r.notes.push(
                "self = samples whose leaf is the function; total = anywhere on the stack".into(),
            );
            // Thread energy no sample carried is not a function: it is shown under the
            // ranked functions, never among them.
            let (residual, functions): (Vec<ReportRow>, Vec<ReportRow>) =
                r.rows.into_iter().partition(|row| {
                    matches!(&row.key, RowKey::Function { name, .. }
                        if name == crate::profile::NO_STACK_SAMPLE)
                });
            r.rows = functions;
            r.footer = residual;
            return r;
        }
    };
    Report {
        by,
        domains: names,
        rows,
        estimated: attr.estimated,
        title,
        notes,
        cpus,
        duration_ns: totals.duration_ns,
        footer,
        model_row: crate::energy::model::row_label(&a.sources).map(|r| {
            (
                r,
                crate::energy::model::row_error_pct(&a.sources).unwrap_or(0.0),
            )
        }),
        co2e_g_per_j: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_fixture(by: By, format: Format, sort: Option<&str>) -> String {
        let rec = crate::analysis::fixture::recording();
        let cfg = analysis::config(
            &rec,
            crate::attribute::Options {
                idle: Default::default(),
                power_model: Default::default(),
                static_w: None,
                ..Default::default()
            },
            &analysis::ModelOverride::default(),
        );
        let a = analysis::analyze(&rec, &cfg);
        let rows = pipeline::rows(&rec.window(), &a, &rec.threads, &|id| id.to_string());
        let opts = ReportOptions {
            by,
            format,
            window: None,
            sort: None,
            limit: None,
            pids: Vec::new(),
        };
        let report = report(&opts, &rows, &a.totals(), &rec, &a, None);
        let opts = RenderOptions {
            sort: sort.map(String::from),
            limit: None,
        };
        let mut out = Vec::new();
        table::render(&report, &opts, format, &mut out).expect("render");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn process_table_has_energy_intervals_idle_total_and_estimated() {
        let text = render_fixture(By::Process, Format::Table, None);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].ends_with("[estimated]"), "{text}");
        assert!(
            lines[1].contains("energy: 3.000 J (3.00 W) from model (estimated)"),
            "{text}"
        );
        assert!(text.contains("0 events lost"), "{text}");
        // heavy 1.2 J over 1 s (60% of the CPU), then light, then quiet.
        let row = |name: &str| {
            lines
                .iter()
                .find(|l| l.split_whitespace().nth(1) == Some(name))
                .unwrap_or_else(|| panic!("no {name} row: {text}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert_eq!(&row("heavy")[2..7], ["0.600", "60.0", "60.0", "6", "1.200"]);
        assert_eq!(row("heavy")[7..9], ["[1.200,", "1.200]"]);
        assert_eq!(row("quiet")[6], "0.200");
        assert_eq!(row("[idle/static]")[2], "1.000");
        assert_eq!(row("[total]")[2..4], ["3.000", "[3.000,"]);
        let heavy_at = text.find("heavy").expect("heavy");
        assert!(
            heavy_at < text.find("light").expect("light"),
            "sorted by energy"
        );
        assert!(text.contains("energy is estimated"), "{text}");
    }

    #[test]
    fn thread_csv_sorts_by_samples_and_tags_estimated() {
        let text = render_fixture(By::Thread, Format::Csv, Some("samples"));
        let mut lines = text.lines();
        assert_eq!(
            lines.next(),
            Some(
                "pid,tid,comm,cpu_s,cpu_pct,samples,package_j,package_ci_low,package_ci_high,power_w,share_pct,estimated"
            )
        );
        let first: Vec<&str> = lines.next().expect("row").split(',').collect();
        assert_eq!(first[..3], ["10", "10", "heavy"]);
        assert_eq!(first[5], "6");
        assert_eq!(first.last(), Some(&"true"));
        assert!(
            text.lines().any(|l| l.starts_with("-,-,[total],")),
            "{text}"
        );
    }

    #[test]
    fn function_json_has_self_and_total_energy() {
        let text = render_fixture(By::Function, Format::Json, None);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["estimated"], true);
        let rows = v["rows"].as_array().expect("rows");
        let j = |name: &str| {
            rows.iter()
                .find(|r| r["function"].as_str().is_some_and(|f| f.contains(name)))
                .and_then(|r| r["self_package_j"].as_f64())
                .unwrap_or_else(|| panic!("no {name}: {text}"))
        };
        assert!((j("+0x100a") - 1.2).abs() < 1e-6, "{text}");
        assert!((j("+0x1014") - 0.6).abs() < 1e-6, "{text}");
        assert!((j("[no stack sample]") - 0.2).abs() < 1e-6, "{text}");
    }
}
