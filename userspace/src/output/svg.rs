//! Energy flamegraph SVG via inferno: widths in µJ (or ns for CPU time), title with the
//! total and the average power, and `estimated` when the energy is modelled. Frames are
//! coloured by kind: native and kernel code in inferno's warm palette (kernel frames
//! marked `_[k]`), JIT-compiled code green (as inferno's java/js palettes colour `_[j]`
//! frames) and Python functions blue.

use std::io::Write;

use inferno::flamegraph::color::{Color, PaletteMap};

use super::{OutputError, ProfileSink, collapsed, flame_name, joules_and_watts, value_index};
use crate::profile::{FrameKind, Profile};

/// Writes an interactive flamegraph SVG weighted by one value.
pub struct Svg {
    /// Name of the value to weight by (e.g. `energy_package`, `cpu`).
    pub value: String,
    /// Image width in pixels (inferno's default when `None`).
    pub width: Option<usize>,
}

/// The flamegraph title: what is measured, its total, average power, and `estimated`.
pub fn title(profile: &Profile, value: usize) -> (String, String) {
    let vt = &profile.value_types[value];
    let total = profile.meta.totals.get(value).copied().unwrap_or(0.0);
    let (what, count_name) = match vt.unit.as_str() {
        "microjoules" => {
            let domain = vt.name.strip_prefix("energy_").unwrap_or(&vt.name);
            (
                format!(
                    "Energy ({domain}): {}",
                    joules_and_watts(total, profile.meta.duration_ns)
                ),
                "µJ",
            )
        }
        "nanoseconds" => (format!("CPU time: {:.3} s", total / 1e9), "ns"),
        "nanograms" => {
            let domain = vt.name.strip_prefix("co2e_").unwrap_or(&vt.name);
            (
                format!("Carbon ({domain}): {:.6} gCO2e", total / 1e9),
                "ng CO2e",
            )
        }
        unit => (format!("{}: {total:.0} {unit}", vt.name), "samples"),
    };
    let estimated =
        if profile.meta.estimated && matches!(vt.unit.as_str(), "microjoules" | "nanograms") {
            " (estimated)"
        } else {
            ""
        };
    (
        format!("{} — {what}{estimated}", profile.meta.title),
        count_name.to_string(),
    )
}

/// The line under the title: the energy source and, when the kernel dropped events, how
/// many (the picture is then incomplete).
pub(crate) fn subtitle(profile: &Profile) -> Option<String> {
    let mut parts = Vec::new();
    if !profile.meta.source.is_empty() {
        parts.push(format!("source: {}", profile.meta.source));
    }
    if profile.meta.lost_events > 0 {
        parts.push(format!(
            "{} events lost during capture",
            profile.meta.lost_events
        ));
    }
    if !profile.meta.unwind.is_empty() {
        parts.push(profile.meta.unwind.clone());
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

impl ProfileSink for Svg {
    fn write_profile(&mut self, profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
        let value = value_index(profile, &self.value)?;
        let lines = collapsed::lines(profile, value);
        if lines.is_empty() {
            return Err(OutputError::Empty);
        }
        let (title, count_name) = title(profile, value);
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = title;
        opts.count_name = count_name;
        opts.image_width = self.width;
        // Same input, same colours: golden files and diffs of two runs stay stable.
        opts.deterministic = true;
        opts.hash = true;
        opts.subtitle = subtitle(profile);
        let mut kinds = kind_colours(profile);
        opts.palette_map = Some(&mut kinds);
        inferno::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), out)?;
        Ok(())
    }
}

/// Colours of the frames named by a runtime: JIT code green, Python blue, each name a
/// stable shade. Other frames are left to inferno's palette (so their colours do not change).
fn kind_colours(profile: &Profile) -> PaletteMap {
    let mut map = PaletteMap::default();
    for frame in &profile.frames {
        if let Some(colour) = kind_colour(frame.kind, &frame.function) {
            map.insert(flame_name(frame), colour);
        }
    }
    map
}

/// The colour of a frame of `kind` named `name`, for Python and JIT frames.
fn kind_colour(kind: FrameKind, name: &str) -> Option<Color> {
    // A stable shade per name (FNV-1a), as inferno's hash option does.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let v = (hash % 1000) as f32 / 1000.0;
    let shade = |base: u8, span: f32| base.saturating_add((span * v) as u8);
    match kind {
        FrameKind::Jit(_) => Some(Color {
            r: shade(50, 60.0),
            g: shade(200, 55.0),
            b: shade(50, 60.0),
        }),
        FrameKind::Python => Some(Color {
            r: shade(80, 60.0),
            g: shade(120, 60.0),
            b: shade(205, 50.0),
        }),
        FrameKind::Native | FrameKind::Kernel => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testdata;

    #[test]
    fn matches_golden_file_and_names_functions() {
        let mut out = Vec::new();
        Svg {
            value: "energy_package".into(),
            width: Some(1200),
        }
        .write_profile(&testdata::profile(), &mut out)
        .expect("write");
        let text = String::from_utf8(out.clone()).expect("utf-8");
        assert!(text.contains("hot_heavy"));
        assert!(text.contains("hot_light"));
        // 0.95 J over 2 s.
        assert!(
            text.contains("Energy (package): 0.950 J, 0.48 W average (estimated)"),
            "title"
        );
        testdata::assert_golden("flamegraph.svg", &out);
    }

    #[test]
    fn jit_and_python_frames_are_coloured_by_kind() {
        use crate::symbolize::{Frame, JitRuntime};
        let mut p = testdata::profile();
        // hot_heavy becomes JIT code, hot_light a Python function.
        p.frames[1] = Frame::jit("hot_heavy", JitRuntime::V8);
        p.frames[2] = Frame::python("hot_light", Some("/src/burn.py"), Some(3));
        let mut out = Vec::new();
        Svg {
            value: "cpu".into(),
            width: Some(1200),
        }
        .write_profile(&p, &mut out)
        .expect("write");
        let text = String::from_utf8(out).expect("utf-8");
        let fill_of = |name: &str| {
            let at = text.find(&format!("<title>{name}")).expect("frame drawn");
            let rest = &text[at..];
            let fill = rest.find("fill=\"rgb(").expect("a fill") + 10;
            let end = rest[fill..].find(')').expect("rgb(...)") + fill;
            let rgb: Vec<u32> = rest[fill..end]
                .split(',')
                .map(|c| c.trim().parse().expect("number"))
                .collect();
            (rgb[0], rgb[1], rgb[2])
        };
        let (r, g, b) = fill_of("hot_heavy");
        assert!(g > r + 80 && g > b + 80, "JIT green: {r},{g},{b}");
        let (r, g, b) = fill_of("hot_light");
        assert!(b > r + 80 && b > g + 40, "Python blue: {r},{g},{b}");
        let (r, g, b) = fill_of("main");
        assert!(r > g && r > b, "native warm: {r},{g},{b}");
    }

    #[test]
    fn subtitle_names_source_and_lost_events() {
        let mut p = testdata::profile();
        let unwind = "user stacks: 3 by unwind tables (75.0%), 1 by frame pointers";
        assert_eq!(
            subtitle(&p).as_deref(),
            Some(format!("source: model; {unwind}").as_str())
        );
        p.meta.lost_events = 12;
        assert_eq!(
            subtitle(&p).as_deref(),
            Some(format!("source: model; 12 events lost during capture; {unwind}").as_str())
        );
        let mut out = Vec::new();
        Svg {
            value: "cpu".into(),
            width: None,
        }
        .write_profile(&p, &mut out)
        .expect("write");
        assert!(String::from_utf8_lossy(&out).contains("12 events lost during capture"));
        p.meta.source.clear();
        p.meta.lost_events = 0;
        p.meta.unwind.clear();
        assert_eq!(subtitle(&p), None);
    }

    #[test]
    fn empty_profile_is_a_clear_error() {
        let mut p = testdata::profile();
        p.samples.clear();
        p.recompute_totals();
        let err = Svg {
            value: "cpu".into(),
            width: None,
        }
        .write_profile(&p, &mut Vec::new())
        .expect_err("nothing to draw");
        assert!(matches!(err, OutputError::Empty));
    }
}
