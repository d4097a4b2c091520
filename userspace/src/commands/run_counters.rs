//! `record --activity-events`: turns the run counters on and says, per event, whether it
//! counts; an event this machine cannot count is a warning, never a failed recording.

use anyhow::Context as _;

use crate::{
    capture::{
        Live,
        run_counts::{RunCounterStatus, RunEvent},
    },
    pb::v1 as pb,
};

/// Turns run counters on for `events`; what the recording's header stores about them.
pub fn start(live: &mut Live, events: &[RunEvent]) -> anyhow::Result<Vec<pb::RunCounter>> {
    let statuses = live
        .count_runs(events)
        .context("cannot set up the run counters of --activity-events")?;
    for line in describe(&statuses) {
        eprintln!("energy-bpf: {line}");
    }
    Ok(statuses.iter().map(RunCounterStatus::to_pb).collect())
}

/// One line per counter: counted, or why not and what follows for the report.
pub fn describe(statuses: &[RunCounterStatus]) -> Vec<String> {
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
