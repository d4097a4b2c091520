//! `record --activity-events`: says, per event, whether its run counter (started with the
//! capture) counts; an event this machine cannot count is a warning, never a failed
//! recording.

use crate::{
    capture::{Live, run_counts::RunCounterStatus},
    pb::v1 as pb,
};

/// Says whether each run counter of `live` counts; what the recording's header stores
/// about them (nothing without run counters).
pub(crate) fn announce(live: &Live) -> Vec<pb::RunCounter> {
    let statuses = live.run_counters();
    for line in describe(statuses) {
        eprintln!("energy-bpf: {line}");
    }
    statuses.iter().map(RunCounterStatus::to_pb).collect()
}

/// One line per counter: counted, or why not and what follows for the report.
pub(crate) fn describe(statuses: &[RunCounterStatus]) -> Vec<String> {
    statuses
        .iter()
        .map(|s| match &s.unavailable {
            None => format!("counting {} per run", s.event.name()),
            Some(why) => format!(
                "warning: {} is not counted: {why}. Recording goes on without it; \
                 `report --roofline` shows the machine-level roofline only",
                s.event.name()
            ),
        })
        .collect()
}
