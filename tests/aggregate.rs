//! The aggregating mode (the agent's default) against the exact stream, on this kernel:
//! two captures at once, one streaming every switch and one summing runs in the kernel,
//! over the same workload. Between two slot edges the aggregating capture has read up to,
//! every process's on-CPU time and every CPU's busy time must agree within 0.5% of the
//! span (they agree within 0.03% on this machine).

use energy_bpf::{
    capture::{Live, LiveOptions},
    energy::EnergyArgs,
    pb::v1 as pb,
    timeline::Timeline,
};

/// On-CPU ns of each process, and busy ns of each CPU, over `[a, b)`.
fn busy(timeline: &Timeline, a: u64, b: u64, pids: &[u32]) -> (Vec<u64>, Vec<u64>) {
    let per_pid = pids
        .iter()
        .map(|&pid| {
            timeline
                .cpus
                .iter()
                .flat_map(|c| {
                    c.runs_in(a, b)
                        .filter(move |r| r.tgid == pid && r.is_busy())
                })
                .map(|r| r.overlap_ns(a, b))
                .sum()
        })
        .collect();
    let per_cpu = timeline.cpus.iter().map(|c| c.busy_ns(a, b)).collect();
    (per_pid, per_cpu)
}

/// The most threads of process `pid` that ran in one slot on one CPU, over `[a, b)`.
fn most_threads_in_a_slot(timeline: &Timeline, a: u64, b: u64, pid: u32) -> usize {
    let slot_ns = energy_bpf_abi::AGG_SLOT_NS;
    let mut most = 0;
    for cpu in &timeline.cpus {
        for slot in a / slot_ns..b / slot_ns {
            let (from, to) = (slot * slot_ns, (slot + 1) * slot_ns);
            let tids: std::collections::HashSet<u32> = cpu
                .runs_in(from, to)
                .filter(|r| r.tgid == pid && r.is_busy())
                .map(|r| r.tid)
                .collect();
            most = most.max(tids.len());
        }
    }
    most
}

#[test]
fn aggregated_runs_agree_with_the_exact_stream() {
    if !crate::util::require_root("aggregated_runs_agree_with_the_exact_stream") {
        return;
    }
    let _guard = crate::util::exclusive();
    // A spinner, a worker that runs and sleeps in short bursts (hundreds of switches a
    // second), and a shell starting short processes.
    let spinner = crate::util::Workload::spawn("while :; do :; done", Some(0));
    let bursty = crate::util::Workload::spawn(
        "while :; do i=0; while [ $i -lt 300 ]; do i=$((i+1)); done; sleep 0.002; done",
        Some(1),
    );
    let churn = crate::util::Workload::spawn("while :; do /bin/true; sleep 0.01; done", None);
    // More threads than a slot table holds (63) waking on one CPU within a slot: their
    // tables fill up and go out early.
    let crowd = crate::util::Workload::spawn(
        "exec /usr/bin/python3 -c 'import threading, time\n\
         def nap():\n    while True: time.sleep(0.005)\n\
         for _ in range(80): threading.Thread(target=nap).start()'",
        Some(1),
    );
    let pids = [spinner.pid(), bursty.pid(), churn.pid(), crowd.pid()];
    let options = || LiveOptions::timeline(EnergyArgs::default()).stacks(49, Default::default());
    let mut stream = Live::start(options()).expect("streaming capture (root)");
    let mut agg = Live::start(options().aggregated(true)).expect("aggregating capture (root)");
    let cpus: Vec<u32> = agg.cpu_ids().to_vec();
    let (mut streamed, mut folded): (Vec<pb::SwitchEvent>, Vec<pb::SwitchEvent>) =
        Default::default();
    let mut boundaries: Vec<u64> = Vec::new();
    // Until two seconds of whole slots were read and the crowd filled a table in them (on a
    // busy machine its threads may take longer to all wake within one slot), with a cap.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let enough = |boundaries: &[u64], streamed: &[pb::SwitchEvent]| {
        let [_, a, .., b] = boundaries else {
            return false;
        };
        *b - *a >= 2_000_000_000
            && most_threads_in_a_slot(
                &Timeline::build(*a, *b, &cpus, streamed),
                *a,
                *b,
                crowd.pid(),
            ) > energy_bpf_abi::SWITCH_BATCH
    };
    while !enough(&boundaries, &streamed) {
        assert!(
            std::time::Instant::now() < give_up,
            "in 60 s, no two seconds of slots read in which the crowd ran over {} threads in a \
             slot of one CPU",
            energy_bpf_abi::SWITCH_BATCH
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
        folded.extend(agg.poll().switches);
        boundaries.push(agg.covered_ns().expect("aggregating"));
        streamed.extend(stream.poll().switches);
    }
    // The stream's batches wait in the kernel for up to one sampling period.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let (last, _) = stream.finish();
    eprintln!("streaming capture's losses: {:?}", last.losses);
    streamed.extend(last.switches);
    let (last, _) = agg.finish();
    eprintln!("aggregating capture's losses: {:?}", last.losses);
    folded.extend(last.switches);
    let (a, b) = (boundaries[1], boundaries[boundaries.len() - 1]);
    let exact = Timeline::build(a, b, &cpus, &streamed);
    let aggregated = Timeline::build(a, b, &cpus, &folded);
    let (exact_pid, exact_cpu) = busy(&exact, a, b, &pids);
    let (agg_pid, agg_cpu) = busy(&aggregated, a, b, &pids);
    let window = (b - a) as f64;
    eprintln!(
        "over {:.3} s: processes {exact_pid:?} ns exact, {agg_pid:?} aggregated; CPUs \
         {exact_cpu:?} exact, {agg_cpu:?} aggregated; {} switch events streamed, {} laid out",
        window / 1e9,
        streamed.len(),
        folded.len()
    );
    assert!(exact_pid[0] as f64 > 0.1 * window, "the spinner ran");
    assert!(exact_pid[1] > 0, "the bursty worker ran");
    let crowded = most_threads_in_a_slot(&exact, a, b, crowd.pid());
    eprintln!("the crowd ran {crowded} threads in one slot of one CPU at most");
    assert!(
        crowded > energy_bpf_abi::SWITCH_BATCH,
        "the crowd's tables never filled up ({crowded} threads in a slot at most)"
    );
    for (k, (e, f)) in exact_pid.iter().zip(&agg_pid).enumerate() {
        assert!(
            (*e as f64 - *f as f64).abs() <= 0.005 * window,
            "process {}: {e} ns exact, {f} ns aggregated",
            pids[k]
        );
    }
    for (cpu, (e, f)) in exact_cpu.iter().zip(&agg_cpu).enumerate() {
        assert!(
            (*e as f64 - *f as f64).abs() <= 0.005 * window,
            "cpu {cpu}: {e} ns exact, {f} ns aggregated"
        );
    }
    // The point of it: far fewer events than switches.
    assert!(
        folded.len() < streamed.len(),
        "{} laid out, {} streamed",
        folded.len(),
        streamed.len()
    );
}
