//! `calibrate --roofline --plot FILE.svg`: the thesis's two normalised views per source
//! (the energy roofline thesis, Figs 4–5), on log–log axes of intensity I (flop/byte):
//! - time: W·τ_flop/T against the roofline min(1, I/B_τ), kinked at B_τ;
//! - energy: W·ε̂_flop/E against the arch line 1/(1 + B̂_ε(I)/I),
//!
//! with the measured kernels as points, the balance points as vertical lines and the
//! balance gap (compute-bound in time, memory-bound in energy) shaded. Pure: returns text.

use std::fmt::Write as _;

use super::{KernelPoint, Roofline, Summary};

const PANEL_W: f64 = 520.0;
const PANEL_H: f64 = 300.0;
const MARGIN: f64 = 60.0;
/// Axes: I from 2^-5 to 2^7, normalised values from 2^-10 to 2^1.
const X_LOG2: (f64, f64) = (-5.0, 7.0);
const Y_LOG2: (f64, f64) = (-10.0, 1.0);

struct Panel {
    x0: f64,
    y0: f64,
}

impl Panel {
    fn x(&self, i: f64) -> f64 {
        let t = (i.log2().clamp(X_LOG2.0, X_LOG2.1) - X_LOG2.0) / (X_LOG2.1 - X_LOG2.0);
        self.x0 + t * PANEL_W
    }
    fn y(&self, v: f64) -> f64 {
        let l = if v > 0.0 { v.log2() } else { Y_LOG2.0 };
        let t = (l.clamp(Y_LOG2.0, Y_LOG2.1) - Y_LOG2.0) / (Y_LOG2.1 - Y_LOG2.0);
        self.y0 + PANEL_H - t * PANEL_H
    }
}

/// The SVG for `sources` (name, roofline), one row of two panels each.
pub fn svg(sources: &[(String, &Roofline)]) -> String {
    let width = 2.0 * (PANEL_W + 2.0 * MARGIN);
    let row_h = PANEL_H + 2.0 * MARGIN + 40.0;
    let height = row_h * sources.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><title>energy roofline</title>"#
    );
    for (row, (name, r)) in sources.iter().enumerate() {
        let top = row as f64 * row_h;
        let label = if r.estimated {
            format!("{name} (estimated: the model, not the machine)")
        } else {
            name.clone()
        };
        let advice = match r.all.balance_gap {
            None => "race to halt: yes (B_τ > B̂_ε)".to_owned(),
            Some([lo, hi]) => format!(
                "race to halt: no; balance gap {lo:.3} < I < {hi:.3}: compute-bound in time, memory-bound in energy"
            ),
        };
        let _ = writeln!(
            s,
            r#"<text x="{MARGIN}" y="{}" font-size="15" font-weight="bold">{}</text><text x="{MARGIN}" y="{}" font-size="13">{} threads: B_τ = {:.3}, B_ε = {:.3}, B̂_ε = {:.3} flop/byte; {}</text>"#,
            top + 18.0,
            escape(&label),
            top + 36.0,
            r.all.threads,
            r.all.time_balance,
            r.all.energy_balance,
            r.all.effective_energy_balance,
            escape(&advice)
        );
        for (col, energy) in [(0.0, false), (1.0, true)] {
            let p = Panel {
                x0: MARGIN + col * (PANEL_W + 2.0 * MARGIN),
                y0: top + MARGIN,
            };
            panel(&mut s, &p, r, energy);
        }
    }
    s.push_str("</svg>\n");
    s
}

fn panel(s: &mut String, p: &Panel, r: &Roofline, energy: bool) {
    let c = &r.all.constants;
    let (x1, y1) = (p.x0 + PANEL_W, p.y0 + PANEL_H);
    let kind = if energy { "energy" } else { "time" };
    let _ = writeln!(s, r#"<g class="panel" id="{kind}-panel">"#);
    // The balance gap first, under everything.
    if let Some([lo, hi]) = r.all.balance_gap {
        let _ = writeln!(
            s,
            r##"<rect class="balance-gap" x="{:.1}" y="{:.1}" width="{:.1}" height="{PANEL_H}" fill="#fde68a" opacity="0.6"><title>balance gap: compute-bound in time, memory-bound in energy</title></rect>"##,
            p.x(lo),
            p.y0,
            (p.x(hi) - p.x(lo)).max(0.0)
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{}" y="{}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="black"/>"#,
        p.x0, p.y0
    );
    for e in (X_LOG2.0 as i32)..=(X_LOG2.1 as i32) {
        let x = p.x(2f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{y1}" stroke="#e5e7eb"/><text x="{x:.1}" y="{}" text-anchor="middle" font-size="10">{}</text>"##,
            p.y0,
            y1 + 14.0,
            pow2_label(e)
        );
    }
    for e in (Y_LOG2.0 as i32)..=(Y_LOG2.1 as i32) {
        let y = p.y(2f64.powi(e));
        let _ = writeln!(
            s,
            r##"<line x1="{}" y1="{y:.1}" x2="{x1}" y2="{y:.1}" stroke="#e5e7eb"/><text x="{}" y="{:.1}" text-anchor="end" font-size="10">{}</text>"##,
            p.x0,
            p.x0 - 4.0,
            y + 3.0,
            pow2_label(e)
        );
    }
    let (title, ylabel) = if energy {
        ("energy arch line", "flop/J relative to peak (W·ε̂_flop/E)")
    } else {
        ("time roofline", "flop/s relative to peak (W·τ_flop/T)")
    };
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{title}</text><text x="{}" y="{}" text-anchor="middle">intensity I (flop/byte)</text><text transform="translate({},{}) rotate(-90)" text-anchor="middle">{ylabel}</text>"#,
        p.x0 + PANEL_W / 2.0,
        p.y0 - 8.0,
        p.x0 + PANEL_W / 2.0,
        y1 + 32.0,
        p.x0 - 40.0,
        p.y0 + PANEL_H / 2.0,
    );
    // The model line, sampled finely on the log axis.
    let mut d = String::new();
    let steps = 240;
    for k in 0..=steps {
        let i = 2f64.powf(X_LOG2.0 + (X_LOG2.1 - X_LOG2.0) * k as f64 / steps as f64);
        let v = if energy { c.arch(i) } else { c.roofline(i) };
        let _ = write!(
            d,
            "{}{:.1},{:.1}",
            if k == 0 { "M" } else { " L" },
            p.x(i),
            p.y(v)
        );
    }
    let (id, colour) = if energy {
        ("arch", "#b91c1c")
    } else {
        ("roofline", "#1d4ed8")
    };
    let _ = writeln!(
        s,
        r#"<path class="model" id="{id}" d="{d}" fill="none" stroke="{colour}" stroke-width="2.5"><title>{title}</title></path>"#
    );
    // Balance points.
    let mut lines = vec![("time-balance", "B_τ", r.all.time_balance, "#1d4ed8")];
    if energy {
        lines.push(("energy-balance", "B_ε", r.all.energy_balance, "#b91c1c"));
        lines.push((
            "effective-energy-balance",
            "B̂_ε",
            r.all.effective_energy_balance,
            "#7c2d12",
        ));
    }
    for (n, (id, name, at, colour)) in lines.into_iter().enumerate() {
        if !at.is_finite() || at <= 0.0 {
            continue;
        }
        let x = p.x(at);
        let _ = writeln!(
            s,
            r#"<g class="balance" id="{kind}-{id}"><line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{y1}" stroke="{colour}" stroke-dasharray="5,3"/><text x="{:.1}" y="{}" fill="{colour}">{name} = {at:.3}</text></g>"#,
            p.y0,
            p.x0 + 6.0,
            p.y0 + 14.0 + 14.0 * n as f64
        );
    }
    // Measured kernels, each normalised by its own thread count's constants.
    let _ = writeln!(s, r#"<g class="points" id="{kind}-points">"#);
    for k in &r.kernels {
        let Some(sum) = summary_for(r, k.threads) else {
            continue;
        };
        let v = normalised(sum, k, energy);
        let colour = if k.threads == r.all.threads {
            "#111827"
        } else {
            "#059669"
        };
        let _ = writeln!(
            s,
            r#"<circle class="point" cx="{:.1}" cy="{:.1}" r="4" fill="{colour}"><title>I = {} flop/byte, {} thread(s): {:.3}</title></circle>"#,
            p.x(k.flop_per_byte),
            p.y(v),
            k.flop_per_byte,
            k.threads,
            v
        );
    }
    s.push_str("</g>\n");
    let _ = writeln!(
        s,
        r##"<text x="{}" y="{}" font-size="10"><tspan fill="#111827">● {} threads</tspan> <tspan fill="#059669">● 1 thread</tspan></text>"##,
        p.x0 + 6.0,
        y1 - 6.0,
        r.all.threads
    );
    s.push_str("</g>\n");
}

fn summary_for(r: &Roofline, threads: u32) -> Option<&Summary> {
    if threads == r.all.threads {
        Some(&r.all)
    } else {
        r.one_thread.as_ref().filter(|s| s.threads == threads)
    }
}

/// A kernel's W·τ_flop/T or W·ε̂_flop/E.
fn normalised(s: &Summary, k: &KernelPoint, energy: bool) -> f64 {
    let c = &s.constants;
    if energy {
        k.flops * (c.j_per_flop + c.const_w * c.s_per_flop) / k.joules
    } else {
        k.flops * c.s_per_flop / super::fit::run_time(k)
    }
}

fn pow2_label(e: i32) -> String {
    if e >= 0 {
        format!("{}", 1u64 << e)
    } else {
        format!("1/{}", 1u64 << -e)
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::roofline::{Constants, fit};

    #[test]
    fn plot_has_points_lines_and_balance_points() {
        let c = Constants {
            const_w: 10.0,
            j_per_flop: 100e-12,
            j_per_byte: 4e-9,
            s_per_flop: 1e-11,
            s_per_byte: 1e-10,
        };
        let points: Vec<KernelPoint> = crate::roofline::kernels::INTENSITIES
            .iter()
            .map(|&i| KernelPoint {
                flop_per_byte: i,
                flops: i * 1e9,
                bytes: 1e9,
                seconds: c.time(i * 1e9, 1e9),
                busy_seconds: c.time(i * 1e9, 1e9),
                joules: c.energy(i * 1e9, 1e9),
                threads: 2,
            })
            .collect();
        let (fitted, report) = fit::fit(&points, 10.0, [10.0; 2]).expect("fit");
        let r = Roofline {
            estimated: true,
            isa: "scalar".into(),
            buffer_bytes: 0,
            all: Summary::new(2, fitted, report),
            one_thread: None,
            kernels: points,
            dvfs: None,
        };
        let text = svg(&[("powercap <pkg>".into(), &r)]);
        assert_eq!(text.matches("class=\"point\"").count(), 22);
        for id in [
            "id=\"roofline\"",
            "id=\"arch\"",
            "id=\"time-time-balance\"",
            "id=\"energy-effective-energy-balance\"",
            "class=\"balance-gap\"",
            "estimated",
            "&lt;pkg&gt;",
        ] {
            assert!(text.contains(id), "{id} missing");
        }
        // Points on the model lines: a kernel at I = 64 sits at 1 on the roofline.
        assert!(!text.contains("NaN") && !text.contains("inf"));
    }
}
