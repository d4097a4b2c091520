//! Collapsed stacks (flamegraph.pl / inferno / speedscope input): one line per unique stack,
//! `comm;root;...;leaf COUNT`, the count an integer (µJ for energy, ns for CPU time).

use std::collections::BTreeMap;
use std::io::Write;

use super::{OutputError, ProfileSink, flame_name, unique_stacks, value_index};
use crate::profile::Profile;

/// Writes collapsed stacks weighted by one value.
pub struct Collapsed {
    /// Name of the value to weight by (e.g. `energy_package`).
    pub value: String,
}

/// Stacks folded to `comm;root;...;leaf` with their summed value, sorted by stack.
///
/// Sums are taken in floating point and rounded once per line, so the integer total stays
/// within half a unit per line of the profile's total.
pub fn fold(profile: &Profile, value: usize) -> BTreeMap<String, f64> {
    let names: Vec<String> = profile.frames.iter().map(flame_name).collect();
    let mut folded: BTreeMap<String, f64> = BTreeMap::new();
    for (comm, frames, v) in unique_stacks(profile, value) {
        let mut line = comm.replace([';', '\n', ' '], "_");
        for &id in frames.iter().rev() {
            line.push(';');
            line.push_str(names.get(id as usize).map_or("[bad frame]", String::as_str));
        }
        // Distinct frames can share a name (same function, other line): merge them.
        *folded.entry(line).or_insert(0.0) += v;
    }
    folded
}

/// The folded lines with integer counts (lines that round to zero are dropped).
pub fn lines(profile: &Profile, value: usize) -> Vec<String> {
    fold(profile, value)
        .into_iter()
        .filter_map(|(stack, v)| {
            let n = v.round();
            (n >= 1.0).then(|| format!("{stack} {n:.0}"))
        })
        .collect()
}

impl ProfileSink for Collapsed {
    fn write_profile(&mut self, profile: &Profile, out: &mut dyn Write) -> Result<(), OutputError> {
        let value = value_index(profile, &self.value)?;
        for line in lines(profile, value) {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::testdata;

    #[test]
    fn matches_golden_file() {
        let mut out = Vec::new();
        Collapsed {
            value: "energy_package".into(),
        }
        .write_profile(&testdata::profile(), &mut out)
        .expect("write");
        testdata::assert_golden("collapsed.txt", &out);
    }

    #[test]
    fn counts_sum_to_total() {
        let p = testdata::profile();
        let idx = p.value_index("energy_package").expect("value");
        let sum: f64 = fold(&p, idx).values().sum();
        assert!((sum - p.meta.totals[idx]).abs() < 1e-6);
        let err = Collapsed {
            value: "energy_gpu".into(),
        }
        .write_profile(&p, &mut Vec::new())
        .expect_err("no gpu values");
        assert!(err.to_string().contains("energy_package"), "{err}");
    }
}
