//! The aggregating mode's layout against the exact stream: per-thread time conserved per
//! interval, and attribution replayed both ways on the simulator.

use super::*;

/// The probes' slot.
const SLOT_NS: u64 = energy_bpf_abi::AGG_SLOT_NS;
use crate::{
    attribute::{self, Input, Options, PowerModel},
    testing::{scenarios, sim},
    timeline::Timeline,
};

/// What the probe's rows hold for the slots `[first, end)`: each thread's on-CPU time per
/// CPU and slot, cut exactly at the slot edges, from the exact timeline.
fn slots_of(timeline: &Timeline, first: u64, end: u64, slot_ns: u64) -> Slots {
    let mut rows: std::collections::BTreeMap<(u32, u32, u64), Row> = Default::default();
    for cpu in &timeline.cpus {
        for slot in first..end {
            let (a, b) = (slot * slot_ns, (slot + 1) * slot_ns);
            for run in cpu.runs_in(a, b).filter(|r| r.is_busy()) {
                let ns = run.overlap_ns(a, b);
                let whole = run.end_ns - run.start_ns;
                let row = rows.entry((cpu.cpu, run.tid, slot)).or_insert(Row {
                    cpu: cpu.cpu,
                    tid: run.tid,
                    tgid: run.tgid,
                    slot,
                    busy_ns: 0,
                    activity: Some(0),
                });
                row.busy_ns += ns;
                // The probe splits a run's count at a slot edge in proportion to time.
                row.activity = row
                    .activity
                    .zip(run.activity)
                    .map(|(x, c)| x + (u128::from(c) * u128::from(ns) / u128::from(whole)) as u64);
            }
        }
    }
    Slots {
        first,
        end,
        slot_ns,
        rows: rows.into_values().collect(),
    }
}

/// The exact stream of `out` replayed through the aggregating mode: slots of `slot_ns`,
/// read every 25 slots.
fn aggregated(out: &sim::SimOutput, end_ns: u64, slot_ns: u64) -> Vec<pb::SwitchEvent> {
    let cpus: Vec<u32> = out.cpus.iter().map(|c| c.id).collect();
    let mut events = Vec::new();
    let last = end_ns / slot_ns;
    let mut first = 0;
    while first < last {
        let end = (first + 25).min(last);
        let slots = slots_of(&out.timeline, first, end, slot_ns);
        events.extend(synthesize(&slots, &cpus, first == 0));
        first = end;
    }
    events
}

#[test]
fn each_threads_time_per_cpu_and_slot_is_kept() {
    let row = |cpu, tid, slot, busy_ns, activity| Row {
        cpu,
        tid,
        tgid: tid / 10,
        slot,
        busy_ns,
        activity,
    };
    let slots = Slots {
        first: 1,
        end: 3,
        slot_ns: 1000,
        rows: vec![
            row(0, 70, 1, 300, Some(900)),
            row(0, 80, 1, 501, None),
            row(0, 70, 2, 1000, Some(5)),
            row(1, 90, 2, 250, Some(10)),
        ],
    };
    let events = synthesize(&slots, &[0, 1, 2], true);
    for cpu in [0, 1, 2] {
        let ts: Vec<u64> = events
            .iter()
            .filter(|e| e.cpu == cpu)
            .map(|e| e.ts_ns)
            .collect();
        assert!(ts.windows(2).all(|w| w[0] < w[1]), "cpu {cpu}: {ts:?}");
        assert_eq!(
            (ts.first(), ts.last()),
            (Some(&1000), Some(&3000)),
            "cpu {cpu}"
        );
    }
    let tl = Timeline::build(1000, 3000, &[0, 1, 2], &events);
    let busy = |cpu: usize, tid: u32, a: u64, b: u64| -> (u64, Option<u64>) {
        let runs: Vec<_> = tl.cpus[cpu]
            .runs_in(a, b)
            .filter(|r| r.tid == tid)
            .collect();
        let ns = runs.iter().map(|r| r.overlap_ns(a, b)).sum();
        let activity = runs
            .iter()
            .try_fold(0, |acc, r| r.activity.map(|a| acc + a));
        (ns, activity)
    };
    assert_eq!(busy(0, 70, 1000, 2000).0, 300);
    assert_eq!(busy(0, 70, 2000, 3000).0, 1000);
    assert_eq!(busy(0, 70, 1000, 3000).1, Some(905));
    assert_eq!(busy(0, 80, 1000, 2000), (501, None));
    assert_eq!(busy(1, 90, 2000, 3000), (250, Some(10)));
    assert_eq!(tl.cpus[1].busy_ns(1000, 2000), 0);
    assert_eq!(tl.cpus[2].busy_ns(1000, 3000), 0);
}

#[test]
fn the_opening_switch_comes_only_with_the_first_read() {
    let slots = Slots {
        first: 0,
        end: 2,
        slot_ns: 100,
        rows: Vec::new(),
    };
    // Idle slots merge into one run.
    assert_eq!(synthesize(&slots, &[0], true).len(), 2);
    assert_eq!(synthesize(&slots, &[0], false).len(), 1);
}

/// Per-process energy, µJ, and the relative gap of attributed + idle + unknown to measured.
fn by_process(
    out: &sim::SimOutput,
    sources: &[pb::EnergySource],
    readings: &[pb::EnergyReading],
    timeline: &Timeline,
) -> (std::collections::BTreeMap<u32, f64>, f64) {
    let input = Input {
        timeline,
        samples: &out.samples,
        sources,
        readings,
        cpus: &out.cpus,
        threads: &out.threads,
        activity: None,
    };
    // The agent's split: by busy time.
    let opts = Options {
        power_model: PowerModel::Time,
        ..Options::default()
    };
    let attr = attribute::attribute(&input, &opts);
    let mut per = std::collections::BTreeMap::new();
    for t in &attr.threads {
        *per.entry(t.tgid).or_insert(0.0) += attr.headline_uj(&t.energy);
    }
    let attributed: f64 =
        per.values().sum::<f64>() + attr.headline_uj(&attr.idle) + attr.headline_uj(&attr.unknown);
    (per, (attributed - attr.total_uj()) / attr.total_uj())
}

/// How the energy is known in a replay.
#[derive(Clone, Copy, Debug)]
enum Energy {
    /// A counter read on the slot edges, as the energy reader reads.
    OnEdges,
    /// A counter read every 10 ms ± 5%, drifting off the edges.
    Drifting,
    /// The estimated model (a concave load curve), its steps from a window start on an edge.
    Model,
}

/// The largest relative gap of any process's energy between the exact stream and the
/// aggregating mode, for `cfg` with energy known as `energy`.
fn largest_gap(name: &str, cfg: sim::SimConfig, energy: Energy) -> f64 {
    let out = sim::simulate(&sim::SimConfig {
        reads_on_grid: matches!(energy, Energy::OnEdges),
        read_period_ns: SLOT_NS,
        ..cfg
    });
    let cpus: Vec<u32> = out.cpus.iter().map(|c| c.id).collect();
    let end = out.timeline.end_ns;
    let agg = Timeline::build(0, end, &cpus, &aggregated(&out, end, SLOT_NS));
    // The busy time of every CPU is the same both ways (within the nanoseconds a slot's
    // layout rounds away).
    for (e, a) in out.timeline.cpus.iter().zip(&agg.cpus) {
        let (e, a) = (e.busy_ns(0, end), a.busy_ns(0, end));
        assert!(
            e.abs_diff(a) <= end.div_ceil(SLOT_NS),
            "{name}: cpu busy {e} ns exact, {a} ns aggregated"
        );
    }
    let (sources, exact_readings, agg_readings) = match energy {
        Energy::OnEdges | Energy::Drifting => (
            out.sources.clone(),
            out.readings.clone(),
            out.readings.clone(),
        ),
        Energy::Model => {
            let sources: Vec<pb::EnergySource> = out
                .sources
                .iter()
                .map(|s| pb::EnergySource {
                    kind: crate::energy::SourceKind::Model.as_str().into(),
                    estimated: true,
                    model_idle_w: 4.0,
                    model_max_w: 30.0,
                    model_curve_gamma: 0.6,
                    ..s.clone()
                })
                .collect();
            let model =
                |t: &Timeline| crate::energy::model::readings(t, &out.cpus, &sources, SLOT_NS);
            let (e, a) = (model(&out.timeline), model(&agg));
            (sources, e, a)
        }
    };
    let (exact, exact_gap) = by_process(&out, &sources, &exact_readings, &out.timeline);
    let (folded, folded_gap) = by_process(&out, &sources, &agg_readings, &agg);
    assert!(
        exact_gap.abs() < 1e-9 && folded_gap.abs() < 1e-9,
        "{name}: not conserved: {exact_gap} exact, {folded_gap} aggregated"
    );
    let mut largest = 0.0f64;
    for (tgid, e) in &exact {
        let f = folded.get(tgid).copied().unwrap_or(0.0);
        let rel = (f - e) / e;
        eprintln!(
            "{name}, {energy:?}: process {tgid}: {e:.0} µJ exact, {f:.0} µJ aggregated ({:+.3}%)",
            rel * 100.0
        );
        largest = largest.max(rel.abs());
    }
    largest
}

#[test]
fn attribution_replayed_both_ways_agrees_within_half_a_percent() {
    let scenarios = || {
        [
            ("mixed duty", scenarios::mixed_duty(1)),
            ("all busy", scenarios::all_cpus_always_busy(2)),
            ("three runnable", scenarios::three_always_runnable(3)),
        ]
    };
    for (name, cfg) in scenarios() {
        for energy in [Energy::OnEdges, Energy::Model] {
            let gap = largest_gap(name, cfg.clone(), energy);
            assert!(gap < 0.005, "{name}, {energy:?}: {gap}");
        }
    }
}

#[test]
fn readings_off_the_slot_edges_cost_a_few_percent_at_most() {
    // Where a counter is read off the edges (another reader's timer), energy inside a slot
    // is split by the slot's layout rather than by who ran when: a bounded error, largest
    // where processes of different power alternate within tens of milliseconds (here up
    // to 3% for the smallest process, a 5 W one beside 15 W and 8 W ones).
    let gap = largest_gap("mixed duty", scenarios::mixed_duty(1), Energy::Drifting);
    assert!(gap < 0.05, "{gap}");
}

/// A slot table as the probe sends it: `len`, `cpu`, then `len` rows.
fn table_record(cpu: u32, rows: &[energy_bpf_abi::AggRow]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend((rows.len() as u32).to_ne_bytes());
    out.extend(cpu.to_ne_bytes());
    for r in rows {
        // SAFETY: AggRow is plain old data of its size.
        out.extend(unsafe {
            std::slice::from_raw_parts(
                std::ptr::from_ref(r).cast::<u8>(),
                std::mem::size_of::<energy_bpf_abi::AggRow>(),
            )
        });
    }
    out
}

#[test]
fn slot_tables_decode_and_wait_until_every_cpu_left_their_slot() {
    let row = |slot, tid, busy_ns, flags| energy_bpf_abi::AggRow {
        slot,
        busy_ns,
        activity: 7,
        tid,
        tgid: tid + 1,
        flags,
        _pad: 0,
    };
    let mut pending = Vec::new();
    // A table of slot 4 on CPU 1, one of slot 5 that filled up early, one from before the
    // first read, and records that are no table: the wrong length, a length over the batch.
    decode_table(
        &table_record(1, &[row(4, 10, 6_000_000, 0), row(4, 11, 1_000_000, 1)]),
        &mut pending,
    );
    decode_table(&table_record(0, &[row(5, 12, 9_000_000, 0)]), &mut pending);
    decode_table(&table_record(0, &[row(2, 13, 5, 0)]), &mut pending);
    let mut short = table_record(0, &[row(4, 14, 5, 0)]);
    short.pop();
    decode_table(&short, &mut pending);
    let mut long = table_record(0, &[]);
    long[..4].copy_from_slice(&(energy_bpf_abi::SWITCH_BATCH as u32 + 1).to_ne_bytes());
    decode_table(&long, &mut pending);
    assert_eq!(pending.len(), 4);
    assert_eq!(
        pending[1],
        Row {
            cpu: 1,
            tid: 11,
            tgid: 12,
            slot: 4,
            busy_ns: 1_000_000,
            activity: None,
        }
    );
    assert_eq!(pending[0].activity, Some(7));

    // Slots [3, 5) are complete: slot 4's rows are taken, slot 2's dropped (before the
    // first read), slot 5's kept for a later read.
    let taken = take_slots(&mut pending, 3, 5);
    assert_eq!(taken.iter().map(|r| r.tid).collect::<Vec<_>>(), [10, 11]);
    assert_eq!(pending.iter().map(|r| r.tid).collect::<Vec<_>>(), [12]);
    assert_eq!(take_slots(&mut pending, 5, 6)[0].busy_ns, 9_000_000);
    assert!(pending.is_empty());
}

#[test]
fn a_thread_split_over_two_tables_of_one_slot_is_laid_out_as_one_run() {
    // A table that filled up mid-slot is sent early: the thread's time in the slot then
    // comes in two rows, which the layout adds up.
    let row = |tid, busy_ns| Row {
        cpu: 0,
        tid,
        tgid: tid,
        slot: 7,
        busy_ns,
        activity: None,
    };
    let slots = Slots {
        first: 7,
        end: 8,
        slot_ns: SLOT_NS,
        rows: vec![row(5, 2_000_000), row(6, 1_000_000), row(5, 3_000_000)],
    };
    let events = synthesize(&slots, &[0], false);
    let runs: Vec<(u64, u32)> = events.iter().map(|e| (e.ts_ns, e.tid)).collect();
    let start = 7 * SLOT_NS;
    assert_eq!(
        runs,
        [
            (start + 5_000_000, 5),
            (start + 6_000_000, 6),
            (start + SLOT_NS, 0)
        ]
    );
}
