//! Plain-text frames, like `top -b`: for pipes, logs and scripts.
//!
//! Each frame is the three header lines, a blank line, a column-title line and every
//! visible table line (not only what would fit a screen), then a blank line. ASCII only,
//! fixed-width columns, so `awk '$1 == 1234'` works on it.

use std::io::{self, Write};

use super::format::{column_titles, command_cell, estimated, numeric_cells};
use super::format::{power_line, summary_line, view_line, warning_lines};
use super::state::State;

/// Longest command cell printed, in characters; longer command lines end in `...`.
const MAX_COMMAND_CHARS: usize = 200;

/// How `top --batch` prints a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FrameFormat {
    /// Plain text, like `top -b`.
    #[default]
    Text,
    /// One JSON document per frame, one per line: `start_ns`, `end_ns`, the window's
    /// machine-wide figures and `processes[]` with the same keys as `report --format json`
    /// (only the `-p` processes when given).
    Json,
}

/// Writes one frame of `state` to `out` as one line of JSON (see [`FrameFormat::Json`]).
pub fn write_json_frame(out: &mut impl Write, state: &State) -> io::Result<()> {
    let Some(snapshot) = state.snapshot() else {
        return Ok(());
    };
    let pids = state.pids();
    let processes: Vec<&crate::pipeline::ProcessRow> = snapshot
        .rows
        .iter()
        .filter(|p| pids.is_empty() || pids.contains(&p.pid))
        .collect();
    let mut doc = serde_json::to_value(&snapshot.totals).map_err(io::Error::other)?;
    if let Some(obj) = doc.as_object_mut() {
        obj.insert("start_ns".into(), snapshot.start_ns.into());
        obj.insert("end_ns".into(), snapshot.ts_ns.into());
        obj.insert("lost_events".into(), snapshot.header.lost_events.into());
        let mut procs = serde_json::to_value(&processes).map_err(io::Error::other)?;
        if let Some(i) = state.intensity() {
            // The grams of the gCO2e column: the energy since start at the process's rate.
            for (p, row) in procs.as_array_mut().into_iter().flatten().zip(&processes) {
                let grams = state.co2e_g(row.pid, row.since_start_j);
                p["co2e_g"] = grams.unwrap_or(0.0).into();
            }
            obj.insert(
                "carbon".into(),
                serde_json::json!({
                    "g_per_kwh": i.g_per_kwh,
                    "source": i.source,
                    "pue": i.pue,
                    "fallback": i.fallback,
                    "window_co2e_g": i.grams(snapshot.totals.total_j),
                }),
            );
        }
        obj.insert("processes".into(), procs);
    }
    // Encoded first, so a closed pipe shows as the write's own BrokenPipe error.
    let mut line = serde_json::to_vec(&doc).map_err(io::Error::other)?;
    line.push(b'\n');
    out.write_all(&line)?;
    out.flush()
}

/// Writes one frame of `state` to `out`.
pub fn write_frame(out: &mut impl Write, state: &State) -> io::Result<()> {
    let est = estimated(state);
    writeln!(out, "{}", summary_line(state))?;
    writeln!(out, "{}", power_line(state))?;
    for warning in warning_lines(state) {
        writeln!(out, "{warning}")?;
    }
    writeln!(out, "{}", view_line(state))?;
    writeln!(out)?;
    let titles = column_titles(est, state.intensity().is_some());
    // Grams take up to nine decimals (`~0.000001234`).
    let widths: Vec<usize> = titles
        .iter()
        .map(|(c, t)| t.len().max(if c.is_some() { 7 } else { 12 }))
        .collect();
    let (command, numeric) = titles.split_last().expect("the command column");
    for ((_, title), w) in numeric.iter().zip(&widths) {
        write!(out, "{title:>w$} ")?;
    }
    writeln!(out, "{}", command.1)?;
    for row in state.rows() {
        let cells = numeric_cells(row, est);
        for (cell, w) in cells.iter().zip(&widths) {
            write!(out, "{cell:>w$} ")?;
        }
        let command = command_cell(row, true);
        match command.char_indices().nth(MAX_COMMAND_CHARS) {
            Some((cut, _)) => writeln!(out, "{}...", &command[..cut])?,
            None => writeln!(out, "{command}")?,
        }
    }
    writeln!(out)?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::snapshot::{DomainPower, Header, ProcessRow, Snapshot};

    fn snapshot(estimated: bool) -> Snapshot {
        Snapshot {
            start_ns: 0,
            totals: Default::default(),
            ts_ns: 5_000_000_000,
            interval_s: 1.0,
            header: Header {
                domains: vec![
                    DomainPower {
                        name: "package-0".into(),
                        watts: 30.0,
                    },
                    DomainPower {
                        name: "gpu-0".into(),
                        watts: 12.5,
                    },
                ],
                idle_w: 10.0,
                total_w: 42.5,
                source: if estimated { "model" } else { "powercap" }.into(),
                estimated,
                sample_hz: 49,
                lost_events: 3,
                cpus: 2,
                model_row: None,
            },
            rows: vec![
                ProcessRow {
                    pid: 7,
                    comm: "small".into(),
                    cmdline: "/bin/small".into(),
                    power_w: 1.25,
                    since_start_j: 2.5,
                    cpu_pct: 3.0,
                    share: 0.03,
                    ..ProcessRow::default()
                },
                ProcessRow {
                    pid: 1234,
                    comm: "busy".into(),
                    cmdline: String::new(),
                    power_w: 20.0,
                    since_start_j: 100.25,
                    cpu_pct: 99.5,
                    share: 0.47,
                    ..ProcessRow::default()
                },
            ],
        }
    }

    fn frame(estimated: bool) -> String {
        let mut state = State::new(Vec::new());
        state.push_snapshot(snapshot(estimated));
        let mut out = Vec::new();
        write_frame(&mut out, &state).expect("writing to a Vec cannot fail");
        String::from_utf8(out).expect("frames are UTF-8")
    }

    #[test]
    fn json_frame_is_one_line_with_the_window_and_the_selected_processes() {
        let mut snap = snapshot(true);
        snap.start_ns = 4_000_000_000;
        snap.totals.total_j = 42.5;
        snap.totals.estimated = true;
        let pid = snap.rows[0].pid;
        let mut state = State::new(vec![pid]);
        state.push_snapshot(snap);
        let mut out = Vec::new();
        write_json_frame(&mut out, &state).expect("writing to a Vec cannot fail");
        let text = String::from_utf8(out).expect("UTF-8");
        assert_eq!(text.lines().count(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["start_ns"], 4_000_000_000u64);
        assert_eq!(v["end_ns"], 5_000_000_000u64);
        assert_eq!(v["total_j"], 42.5);
        assert_eq!(v["estimated"], true);
        let procs = v["processes"].as_array().expect("processes[]");
        assert_eq!(procs.len(), 1, "only -p {pid}: {text}");
        assert_eq!(procs[0]["pid"], pid);
        assert!(procs[0].get("energy_j").is_some() && procs[0].get("ci_j").is_some());
    }

    /// A frame of `snapshot(estimated)` at a fixed 400 gCO2e/kWh, as text and as JSON.
    fn carbon_frames(estimated: bool) -> (String, serde_json::Value) {
        let mut snap = snapshot(estimated);
        snap.totals.total_j = 42.5;
        snap.totals.idle_j = 10.0;
        let mut state = State::new(Vec::new());
        state.set_carbon(crate::carbon::Carbon {
            source: crate::carbon::Source::Fixed(400.0),
            pue: 1.0,
        });
        state.push_snapshot(snap);
        let (mut text, mut json) = (Vec::new(), Vec::new());
        write_frame(&mut text, &state).expect("writing to a Vec cannot fail");
        write_json_frame(&mut json, &state).expect("writing to a Vec cannot fail");
        let text = String::from_utf8(text).expect("frames are UTF-8");
        (text, serde_json::from_slice(&json).expect("JSON"))
    }

    #[test]
    fn with_an_intensity_each_row_shows_the_grams_of_its_energy_column() {
        let (text, json) = carbon_frames(false);
        let lines: Vec<&str> = text.lines().collect();
        let titles = lines
            .iter()
            .position(|l| l.trim_start().starts_with("PID"))
            .expect("title line");
        assert_eq!(
            lines[titles], "    PID Power W Energy J        gCO2e   CPU % Share % Command",
            "{text}"
        );
        assert!(
            lines[titles - 3].starts_with("carbon: 0.004722 gCO2e since start (idle/static 0.001111) at 400.0 gCO2e/kWh (fixed"),
            "{text}"
        );
        let g_per_j = 400.0 / 3.6e6;
        for line in &lines[titles + 1..titles + 3] {
            let cells: Vec<&str> = line.split_whitespace().collect();
            let energy: f64 = cells[2].parse().expect("energy");
            let grams: f64 = cells[3].parse().expect("grams");
            assert!(
                (grams - energy * g_per_j).abs() <= 0.05 * g_per_j + 5e-6,
                "{line}"
            );
            let pid: u64 = cells[0].parse().expect("pid");
            let p = json["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .find(|p| p["pid"] == pid)
                .expect("the row's process in the JSON");
            let json_g = p["co2e_g"].as_f64().expect("co2e_g");
            assert_eq!(
                super::super::format::grams_cell(json_g),
                cells[3],
                "JSON and table agree: {line}"
            );
        }
    }

    #[test]
    fn modelled_grams_are_labelled_estimated() {
        let (text, _) = carbon_frames(true);
        let titles = text
            .lines()
            .find(|l| l.trim_start().starts_with("PID"))
            .expect("title line");
        assert!(titles.contains("gCO2e (estimated)"), "{titles}");
        let busy = text
            .lines()
            .find(|l| l.trim_start().starts_with("1234"))
            .expect("busy row");
        let cells: Vec<&str> = busy.split_whitespace().collect();
        assert_eq!(cells[3], "~0.01114", "{busy}");
    }

    #[test]
    fn long_command_lines_are_cut() {
        let mut snap = snapshot(false);
        snap.rows[0].cmdline = format!("/bin/small {}", "x".repeat(5000));
        let mut state = State::new(Vec::new());
        state.push_snapshot(snap);
        let mut out = Vec::new();
        write_frame(&mut out, &state).expect("writing to a Vec cannot fail");
        let text = String::from_utf8(out).expect("frames are UTF-8");
        let line = text
            .lines()
            .find(|l| l.contains("/bin/small"))
            .expect("row printed");
        assert!(line.ends_with("xxx..."), "{line}");
        assert!(line.len() < MAX_COMMAND_CHARS + 100, "{} chars", line.len());
    }

    #[test]
    fn frame_has_header_titles_and_rows_in_power_order() {
        let text = frame(false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "energy-bpf top - source: powercap - sampling 49 Hz - lost events 3 - 2 CPUs - interval 1.00 s"
        );
        assert_eq!(
            lines[1],
            "Power: total 42.50 W | package-0 30.00 W | GPU gpu-0 12.50 W | idle/static 10.00 W (23.5%) | activity none: split by time"
        );
        assert_eq!(
            lines[2],
            "Sort: power (descending) | group by: process | 2 lines, 2 processes"
        );
        assert_eq!(lines[3], "");
        assert_eq!(lines[4], "    PID Power W Energy J   CPU % Share % Command");
        assert_eq!(lines[5], "   1234   20.00    100.2    99.5    47.0 [busy]");
        assert_eq!(
            lines[6],
            "      7    1.25      2.5     3.0     3.0 /bin/small"
        );
        assert_eq!(lines[7], "");
        assert_eq!(lines.len(), 8);
    }

    #[test]
    fn unidentified_static_power_is_a_header_line_in_batch_frames() {
        let mut state = State::new(Vec::new());
        state.push_snapshot(crate::tui::fixtures::unidentified(snapshot(false)));
        let mut out = Vec::new();
        write_frame(&mut out, &state).expect("write to a Vec");
        let text = String::from_utf8(out).expect("utf-8");
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[2].starts_with("WARNING static power of package-0 unidentified"),
            "{text}"
        );
        assert!(lines[2].contains("energy-bpf calibrate"), "{}", lines[2]);
        assert!(lines[3].starts_with("Sort:"), "{text}");
    }

    #[test]
    fn estimated_frames_are_labelled_everywhere() {
        let text = frame(true);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("source: model (estimated)"),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with("Power (estimated): total"),
            "{}",
            lines[1]
        );
        assert!(lines[4].contains("Power W (estimated)"), "{}", lines[4]);
        assert!(lines[4].contains("Energy J (estimated)"), "{}", lines[4]);
        let busy: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(busy[..3], ["1234", "~20.00", "~100.2"]);
    }

    #[test]
    fn a_table_modelled_frame_names_its_row() {
        let mut snap = snapshot(true);
        let row = "Intel Xeon Platinum 8375C → Ice Lake-SP (no servers before the table's cut-off) → Intel server, 299 servers, ±12%";
        snap.header.model_row = Some(row.into());
        let mut state = State::new(Vec::new());
        state.push_snapshot(snap);
        let mut out = Vec::new();
        write_frame(&mut out, &state).expect("writing to a Vec cannot fail");
        let text = String::from_utf8(out).expect("frames are UTF-8");
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.contains(&format!("source: model (estimated: {row})"))),
            "{text}"
        );
    }
}
