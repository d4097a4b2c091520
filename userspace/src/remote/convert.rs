//! Snapshots to and from the socket's `Frame` messages (`proto/agent.proto`).

use prost::Message as _;

use super::RemoteError;
use crate::{
    attribute::{ActivityUsed, PowerModelUsed, attribution::DOMAINS, domain_name},
    pb::agent as wire,
    pipeline::{DomainJoules, ProcessRow, ThreadRow, Totals},
    tui::{DomainPower, Header, Snapshot},
};

/// The largest frame a client accepts, bytes: a window of a busy machine's rows is well
/// under a megabyte; anything near this is garbage or hostile.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// Encodes a snapshot as one length-delimited frame.
pub fn encode(s: &Snapshot) -> Vec<u8> {
    let frame = wire::Frame {
        start_ns: s.start_ns,
        end_ns: s.ts_ns,
        domains: s
            .header
            .domains
            .iter()
            .map(|d| wire::DomainPower {
                name: d.name.clone(),
                watts: d.watts,
            })
            .collect(),
        idle_w: s.header.idle_w,
        total_w: s.header.total_w,
        source: s.header.source.clone(),
        estimated: s.header.estimated,
        sample_hz: s.header.sample_hz,
        lost_events: s.header.lost_events,
        cpus: s.header.cpus,
        model_row: s.header.model_row.clone().unwrap_or_default(),
        totals: Some(wire::Totals {
            duration_ns: s.totals.duration_ns,
            unknown_ns: s.totals.unknown_ns,
            idle_j: s.totals.idle_j,
            unknown_j: s.totals.unknown_j,
            total_j: s.totals.total_j,
            energy_j: to_wire(&s.totals.energy_j),
            idle_by_domain_j: to_wire(&s.totals.idle_by_domain_j),
            power_model: s.totals.power_model.name().into(),
            activity_event: s.totals.activity.event.clone().unwrap_or_default(),
            activity_weighted: s.totals.activity.weighted,
            activity_coverage: s.totals.activity.coverage,
            power_model_uncertain: s.totals.power_model_uncertain,
            power_model_spread: s.totals.spread_lines(),
        }),
        processes: s.rows.iter().map(process_to_wire).collect(),
    };
    frame.encode_length_delimited_to_vec()
}

/// Decodes one frame's message bytes (without its length prefix).
pub fn decode(bytes: &[u8]) -> Result<Snapshot, RemoteError> {
    if bytes.len() > MAX_FRAME_BYTES {
        return Err(RemoteError::FrameTooLarge { len: bytes.len() });
    }
    let f = wire::Frame::decode(bytes).map_err(|source| RemoteError::Decode { source })?;
    if f.end_ns < f.start_ns {
        return Err(RemoteError::BadFrame {
            why: "window ends before it starts",
        });
    }
    let t = f.totals.unwrap_or_default();
    let interval_s = (f.end_ns - f.start_ns) as f64 / 1e9;
    Ok(Snapshot {
        start_ns: f.start_ns,
        ts_ns: f.end_ns,
        interval_s,
        header: Header {
            domains: f
                .domains
                .into_iter()
                .map(|d| DomainPower {
                    name: d.name,
                    watts: d.watts,
                })
                .collect(),
            idle_w: f.idle_w,
            total_w: f.total_w,
            source: f.source.clone(),
            estimated: f.estimated,
            sample_hz: f.sample_hz,
            lost_events: f.lost_events,
            cpus: f.cpus,
            model_row: Some(f.model_row.clone()).filter(|r| !r.is_empty()),
        },
        totals: Totals {
            duration_ns: t.duration_ns,
            unknown_ns: t.unknown_ns,
            idle_j: t.idle_j,
            unknown_j: t.unknown_j,
            total_j: t.total_j,
            energy_j: from_wire(&t.energy_j),
            idle_by_domain_j: from_wire(&t.idle_by_domain_j),
            source: f.source,
            estimated: f.estimated,
            power_model: if t.power_model == PowerModelUsed::Regression.name() {
                PowerModelUsed::Regression
            } else {
                PowerModelUsed::Time
            },
            power_model_uncertain: t.power_model_uncertain,
            power_model_spread: t.power_model_spread,
            // Static-power origins stay with the agent (its metrics and logs say them).
            static_power: Vec::new(),
            activity: ActivityUsed {
                event: Some(t.activity_event).filter(|e| !e.is_empty()),
                weighted: t.activity_weighted,
                coverage: t.activity_coverage,
            },
        },
        rows: f.processes.into_iter().map(process_from_wire).collect(),
    })
}

fn to_wire(m: &DomainJoules) -> std::collections::HashMap<String, f64> {
    m.iter().map(|(k, v)| ((*k).to_string(), *v)).collect()
}

/// Domain names back to the static names rows use; names this build does not know are
/// dropped rather than invented.
fn from_wire(m: &std::collections::HashMap<String, f64>) -> DomainJoules {
    m.iter()
        .filter_map(|(k, v)| {
            DOMAINS
                .iter()
                .map(|&d| domain_name(d))
                .find(|n| n == k)
                .map(|n| (n, *v))
        })
        .collect()
}

fn process_to_wire(p: &ProcessRow) -> wire::Process {
    wire::Process {
        pid: p.pid,
        instance: p.instance,
        comm: p.comm.clone(),
        cmdline: p.cmdline.clone(),
        cgroup: p.cgroup.clone(),
        container_id: p.container_id.clone(),
        pod_uid: p.pod_uid.clone(),
        cpu_ns: p.cpu_ns,
        cpu_pct: p.cpu_pct,
        samples: p.samples,
        energy_j: to_wire(&p.energy_j),
        power_w: p.power_w,
        share: p.share,
        ci_low_j: p.ci_j[0],
        ci_high_j: p.ci_j[1],
        since_start_j: p.since_start_j,
        threads: p
            .threads
            .iter()
            .map(|t| wire::Thread {
                tid: t.tid,
                comm: t.comm.clone(),
                cpu_ns: t.cpu_ns,
                cpu_pct: t.cpu_pct,
                samples: t.samples,
                energy_j: to_wire(&t.energy_j),
                power_w: t.power_w,
                share: t.share,
                since_start_j: t.since_start_j,
                top_function: t.top_function.clone(),
            })
            .collect(),
        top_function: p.top_function.clone(),
    }
}

fn process_from_wire(p: wire::Process) -> ProcessRow {
    ProcessRow {
        pid: p.pid,
        instance: p.instance,
        energy_j: from_wire(&p.energy_j),
        comm: p.comm,
        cmdline: p.cmdline,
        cgroup: p.cgroup,
        container_id: p.container_id,
        pod_uid: p.pod_uid,
        cpu_ns: p.cpu_ns,
        cpu_pct: p.cpu_pct,
        samples: p.samples,
        power_w: p.power_w,
        share: p.share,
        ci_j: [p.ci_low_j, p.ci_high_j],
        since_start_j: p.since_start_j,
        threads: p
            .threads
            .into_iter()
            .map(|t| ThreadRow {
                tid: t.tid,
                energy_j: from_wire(&t.energy_j),
                comm: t.comm,
                cpu_ns: t.cpu_ns,
                cpu_pct: t.cpu_pct,
                samples: t.samples,
                power_w: t.power_w,
                share: t.share,
                since_start_j: t.since_start_j,
                top_function: t.top_function,
            })
            .collect(),
        top_function: p.top_function,
        cpu_share: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_survives_the_wire() {
        let mut snap = crate::tui::fixtures::unidentified(crate::tui::fixtures::snapshot(true));
        snap.start_ns = snap.ts_ns - 1_000_000_000;
        snap.totals.total_j = 12.5;
        snap.totals.energy_j.insert("package", 12.5);
        snap.totals.power_model = PowerModelUsed::Regression;
        snap.totals.power_model_uncertain = true;
        snap.totals.static_power[0].power_model_spread = Some("power model uncertain".into());
        snap.rows[0].energy_j.insert("dram", 0.25);
        snap.rows[0].ci_j = [1.0, 2.0];
        snap.rows[0].top_function = "py:train_step (model.py:88)".into();
        if let Some(t) = snap.rows.iter_mut().flat_map(|p| &mut p.threads).next() {
            t.top_function = "LazyCompile:*hot burn.js:4".into();
        }
        let bytes = encode(&snap);
        let len = prost::decode_length_delimiter(bytes.as_slice()).expect("length prefix");
        let body = &bytes[bytes.len() - len..];
        let back = decode(body).expect("decodes");
        assert_eq!(back.rows, snap.rows);
        assert_eq!(back.header, snap.header);
        assert_eq!(back.totals.power_model, PowerModelUsed::Regression);
        // The flag and its line reach `top --connect`'s header and JSON.
        assert!(back.totals.power_model_uncertain);
        assert_eq!(back.totals.spread_lines(), ["power model uncertain"]);
        assert_eq!(back.totals.energy_j, snap.totals.energy_j);
        assert_eq!((back.start_ns, back.ts_ns), (snap.start_ns, snap.ts_ns));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode(&[0xff; 64]).is_err());
        let mut f = wire::Frame {
            start_ns: 10,
            end_ns: 5,
            ..Default::default()
        }
        .encode_to_vec();
        assert!(matches!(decode(&f), Err(RemoteError::BadFrame { .. })));
        f.clear();
        assert!(
            decode(&f).is_ok(),
            "an empty frame is a valid, empty window"
        );
    }
}
