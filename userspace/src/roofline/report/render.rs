//! The per-function roofline report written out: a table for people (rows up to a
//! limit), or every row as JSON or CSV. Pure.

use serde::Serialize;

use super::{FunctionRow, Machine, Report, ReportError};
use crate::{
    output::table::Format,
    roofline::{Summary, place::LINE_BYTES},
};

/// The whole JSON document.
#[derive(Serialize)]
struct Doc<'a> {
    calibration: String,
    host: &'a str,
    source: &'a str,
    estimated: bool,
    machine: &'a Summary,
    /// Why there is no per-function result (empty when there is one).
    #[serde(skip_serializing_if = "Option::is_none")]
    per_function_unavailable: Option<&'a str>,
    intensity_proxy: String,
    /// Counted intervals lost to a full ring buffer.
    intervals_lost: u64,
    functions: &'a [FunctionRow],
}

impl Report {
    /// The report in `format`; `limit` rows in a table (all in JSON and CSV).
    pub fn render(&self, format: Format, limit: Option<usize>) -> Result<Vec<u8>, ReportError> {
        let machine = &self.machine;
        let functions = &self.functions;
        let proxy = format!(
            "intensity = instructions / (LLC misses x {LINE_BYTES} B): a proxy for flop/byte \
             (instructions are not flops; misses stand for memory traffic)"
        );
        let mut out = Vec::new();
        match format {
            Format::Json => {
                let doc = Doc {
                    calibration: machine.file.display().to_string(),
                    host: &machine.host,
                    source: &machine.source,
                    estimated: machine.roofline.estimated,
                    machine: &machine.roofline.all,
                    per_function_unavailable: self.unavailable.as_deref(),
                    intervals_lost: machine.dropped,
                    intensity_proxy: proxy,
                    functions,
                };
                out.extend(format!("{:#}\n", serde_json::to_value(doc)?).into_bytes());
            }
            Format::Csv => {
                out.extend(b"function,self_j,samples,instructions,llc_misses,intensity_proxy,time_bound,energy_bound,advice\n");
                for f in functions {
                    let (i, t, e, adv) = match &f.placement {
                        Some(p) => (
                            fmt_i(p.intensity),
                            p.time.name(),
                            p.energy.name(),
                            p.advice.short(),
                        ),
                        None => ("-".into(), "-", "-", "-"),
                    };
                    out.extend(
                        format!(
                            "\"{}\",{:.6},{},{:.0},{:.0},{i},{t},{e},{adv}\n",
                            f.function.replace('"', "\"\""),
                            f.self_j,
                            f.samples,
                            f.instructions,
                            f.llc_misses
                        )
                        .into_bytes(),
                    );
                }
            }
            Format::Table => {
                let text = table(
                    machine,
                    self.unavailable.as_deref(),
                    &proxy,
                    functions,
                    limit,
                );
                out.extend(text.into_bytes());
            }
        }
        Ok(out)
    }
}

/// An intensity: three decimals, exponent form when large, `inf` with no miss.
fn fmt_i(i: f64) -> String {
    if i >= f64::MAX {
        "inf".into()
    } else if i >= 1e4 {
        format!("{i:.2e}")
    } else {
        format!("{i:.3}")
    }
}

/// The machine's balance points, then the placed functions (up to `limit`).
fn table(
    m: &Machine,
    unavailable: Option<&str>,
    proxy: &str,
    functions: &[FunctionRow],
    limit: Option<usize>,
) -> String {
    let s = &m.roofline.all;
    let mut t = format!(
        "energy roofline of {} ({}, {}{}; {} thread(s))\n",
        m.host,
        m.source,
        m.file.display(),
        if m.roofline.estimated {
            ", estimated: the model, not the machine"
        } else {
            ""
        },
        s.threads
    );
    t += &format!(
        "  time balance B_τ = {:.3} flop/byte, energy balance B_ε = {:.3}, effective B̂_ε(B_τ) = {:.3}, constant power {:.2} W\n",
        s.time_balance, s.energy_balance, s.effective_energy_balance, s.constants.const_w
    );
    t += &match (s.race_to_halt, s.balance_gap) {
        (true, _) => "  race to halt: saves energy on this machine (B_τ > B̂_ε)\n".to_string(),
        (false, Some([lo, hi])) => format!(
            "  race to halt: does not save energy here; balance gap {lo:.3}..{hi:.3} flop/byte (compute-bound in time, memory-bound in energy)\n"
        ),
        (false, None) => "  race to halt: does not save energy here\n".to_string(),
    };
    if let Some(why) = unavailable {
        t += &format!("per function: not available: {why}\n");
        return t;
    }
    t += &format!("per function (self): {proxy}\n");
    t += &format!(
        "{:<40} {:>10} {:>8} {:>14} {:>12} {:>10} {:>8} {:>8}  advice\n",
        "function",
        "self_j",
        "samples",
        "instructions",
        "llc_misses",
        "intensity",
        "time",
        "energy"
    );
    let shown = functions
        .iter()
        .filter(|f| f.placement.is_some())
        .take(limit.unwrap_or(usize::MAX));
    for f in shown {
        let Some(p) = &f.placement else { continue };
        let name: String = f.function.chars().take(40).collect();
        t += &format!(
            "{name:<40} {:>10.3} {:>8} {:>14.0} {:>12.0} {:>10} {:>8} {:>8}  {} ({})\n",
            f.self_j,
            f.samples,
            f.instructions,
            f.llc_misses,
            fmt_i(p.intensity),
            p.time.name(),
            p.energy.name(),
            p.advice.short(),
            p.advice.why()
        );
    }
    if m.dropped > 0 {
        t += &format!(
            "({} counted intervals were lost: the run-count ring buffer was full)\n",
            m.dropped
        );
    }
    let unplaced = functions.iter().filter(|f| f.placement.is_none()).count();
    if unplaced > 0 {
        t += &format!("({unplaced} function(s) with no instruction counted are not placed)\n");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roofline::{Constants, Roofline, fit::FitReport, place};

    #[test]
    fn the_table_places_each_function_with_its_advice() {
        let constants = Constants {
            const_w: 0.0,
            j_per_flop: 25e-12,
            j_per_byte: 360e-12,
            s_per_flop: 1.0 / 515e9,
            s_per_byte: 1.0 / 144e9,
        };
        let fit = FitReport::exact(0);
        let m = Machine {
            roofline: Roofline {
                estimated: false,
                isa: "avx2+fma".into(),
                buffer_bytes: 0,
                all: Summary::new(4, constants, fit),
                one_thread: None,
                kernels: Vec::new(),
                dvfs: None,
            },
            dropped: 0,
            file: "cal.json".into(),
            host: "box".into(),
            source: "powercap:package-0".into(),
        };
        let row = |name: &str, instructions: f64, misses: f64| FunctionRow {
            function: name.into(),
            self_j: 1.0,
            samples: 10,
            instructions,
            llc_misses: misses,
            cycles: None,
            placement: place::intensity_proxy(instructions, misses)
                .map(|i| place::place(i, &constants)),
        };
        let rows = [
            row("stream", 64.0e6, 1.0e6),
            row("gap", 512.0e6, 1.0e6),
            row("fma", 1e10, 10.0),
            row("idle_wait", 0.0, 5.0),
        ];
        let t = table(&m, None, "proxy", &rows, None);
        let line = |name: &str| {
            t.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("no {name}: {t}"))
                .split_whitespace()
                .collect::<Vec<_>>()
        };
        assert!(t.contains("balance gap 3.576..14.400"), "{t}");
        assert_eq!(line("stream")[5..9], ["1.000", "memory", "memory", "slow"]);
        assert_eq!(line("gap")[5..9], ["8.000", "compute", "memory", "slow"]);
        assert_eq!(line("fma")[6..9], ["compute", "compute", "race"]);
        assert!(
            t.contains("(1 function(s) with no instruction counted"),
            "{t}"
        );
        let t = table(
            &m,
            Some("instructions could not be counted"),
            "proxy",
            &rows,
            None,
        );
        assert!(t.ends_with("per function: not available: instructions could not be counted\n"));
    }
}
