//! How a recording's user stacks were walked: samples per method and why walks ended. Every
//! output that shows stacks says it (report header and JSON, flamegraph subtitle, pprof
//! comment), so a flat flamegraph can be told from a flat program.

use serde::Serialize;

use crate::pb::v1::{PythonStop, Sample, UnwindMethod, UnwindStop};

/// Samples per unwind method and per stop reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UnwindCounts {
    /// User stacks walked with unwind tables.
    pub dwarf: u64,
    /// User stacks walked by frame pointers.
    pub frame_pointer: u64,
    /// Samples per stop reason (`end_of_stack`, `no_process_table`, ...), largest first.
    pub stops: Vec<(String, u64)>,
    /// Samples of walked CPython processes per Python stop reason (`end`, `depth`,
    /// `read_fault`, `no_thread`, `tail_call`), largest first.
    pub python_stops: Vec<(String, u64)>,
}

impl UnwindCounts {
    /// Counts `samples`.
    pub fn of<'a>(samples: impl IntoIterator<Item = &'a Sample>) -> Self {
        let mut counts = Self::default();
        let mut stops = [0u64; 10];
        let mut python = [0u64; 6];
        for s in samples {
            if let Some(n) = python.get_mut(s.python_stop() as usize) {
                *n += 1;
            }
            match s.unwind_method() {
                UnwindMethod::Dwarf => counts.dwarf += 1,
                UnwindMethod::FramePointer => counts.frame_pointer += 1,
            }
            if let Some(n) = stops.get_mut(s.unwind_stop() as usize) {
                *n += 1;
            }
        }
        for (i, &n) in stops.iter().enumerate() {
            let stop = UnwindStop::try_from(i as i32).unwrap_or(UnwindStop::Off);
            if n > 0 && stop != UnwindStop::Off {
                counts.stops.push((stop_name(stop).to_owned(), n));
            }
        }
        for (i, &n) in python.iter().enumerate() {
            let stop = PythonStop::try_from(i as i32).unwrap_or(PythonStop::PythonOff);
            if n > 0 && stop != PythonStop::PythonOff {
                counts
                    .python_stops
                    .push((python_stop_name(stop).to_owned(), n));
            }
        }
        for list in [&mut counts.stops, &mut counts.python_stops] {
            list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        }
        counts
    }

    /// `; python: end 2,890, no thread 3`, or nothing when no CPython was walked.
    fn python_label(&self) -> String {
        if self.python_stops.is_empty() {
            return String::new();
        }
        let stops: Vec<String> = self
            .python_stops
            .iter()
            .map(|(name, n)| format!("{} {n}", name.replace('_', " ")))
            .collect();
        format!("; python: {}", stops.join(", "))
    }

    /// One line: `user stacks: 2,900 by unwind tables (99.5%), 14 by frame pointers; ended:
    /// stack end 2,890, no process table 14`. Frame pointers alone read `by frame pointers`.
    pub fn label(&self) -> String {
        let total = self.dwarf + self.frame_pointer;
        if self.dwarf == 0 {
            return format!(
                "user stacks: {total} by frame pointers{}",
                self.python_label()
            );
        }
        let pct = 100.0 * self.dwarf as f64 / total.max(1) as f64;
        let mut line = format!(
            "user stacks: {} by unwind tables ({pct:.1}%), {} by frame pointers",
            self.dwarf, self.frame_pointer
        );
        if !self.stops.is_empty() {
            let stops: Vec<String> = self
                .stops
                .iter()
                .map(|(name, n)| format!("{} {n}", name.replace('_', " ")))
                .collect();
            line.push_str("; ended: ");
            line.push_str(&stops.join(", "));
        }
        line.push_str(&self.python_label());
        line
    }
}

/// The Python stop reason as JSON and the labels name it.
pub fn python_stop_name(stop: PythonStop) -> &'static str {
    match stop {
        PythonStop::PythonOff => "off",
        PythonStop::PythonEnd => "end",
        PythonStop::PythonDepth => "depth",
        PythonStop::PythonReadFault => "read_fault",
        PythonStop::PythonNoThread => "no_thread",
        PythonStop::PythonTailCall => "tail_call",
    }
}

/// The stop reason as JSON and the labels name it.
pub fn stop_name(stop: UnwindStop) -> &'static str {
    match stop {
        UnwindStop::Off => "off",
        UnwindStop::EndOfStack => "end_of_stack",
        UnwindStop::NoTable => "no_table",
        UnwindStop::BadCfa => "bad_cfa",
        UnwindStop::Unsupported => "unsupported",
        UnwindStop::ReadFault => "read_fault",
        UnwindStop::DepthLimit => "depth_limit",
        UnwindStop::NoProcessTable => "no_process_table",
        UnwindStop::InKernel => "in_kernel",
        UnwindStop::TailCall => "tail_call",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(method: UnwindMethod, stop: UnwindStop) -> Sample {
        Sample {
            unwind_method: method as i32,
            unwind_stop: stop as i32,
            ..Sample::default()
        }
    }

    #[test]
    fn counts_methods_and_stops() {
        let samples = [
            sample(UnwindMethod::Dwarf, UnwindStop::EndOfStack),
            sample(UnwindMethod::Dwarf, UnwindStop::EndOfStack),
            sample(UnwindMethod::Dwarf, UnwindStop::ReadFault),
            sample(UnwindMethod::FramePointer, UnwindStop::NoProcessTable),
        ];
        let c = UnwindCounts::of(&samples);
        assert_eq!((c.dwarf, c.frame_pointer), (3, 1));
        assert_eq!(
            c.stops,
            vec![
                ("end_of_stack".to_owned(), 2),
                ("no_process_table".to_owned(), 1),
                ("read_fault".to_owned(), 1)
            ]
        );
        assert_eq!(
            c.label(),
            "user stacks: 3 by unwind tables (75.0%), 1 by frame pointers; ended: end of \
             stack 2, no process table 1, read fault 1"
        );
    }

    #[test]
    fn python_stops_are_counted_and_labelled() {
        let mut samples = vec![sample(UnwindMethod::FramePointer, UnwindStop::Off); 4];
        samples[0].python_stop = PythonStop::PythonEnd as i32;
        samples[1].python_stop = PythonStop::PythonEnd as i32;
        samples[2].python_stop = PythonStop::PythonReadFault as i32;
        let c = UnwindCounts::of(&samples);
        assert_eq!(
            c.python_stops,
            vec![("end".to_owned(), 2), ("read_fault".to_owned(), 1)]
        );
        assert_eq!(
            c.label(),
            "user stacks: 4 by frame pointers; python: end 2, read fault 1"
        );
    }

    #[test]
    fn old_recordings_read_as_frame_pointers() {
        let c = UnwindCounts::of(&[Sample::default(), Sample::default()]);
        assert_eq!((c.dwarf, c.frame_pointer), (0, 2));
        assert!(c.stops.is_empty());
        assert_eq!(c.label(), "user stacks: 2 by frame pointers");
    }
}
