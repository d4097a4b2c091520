//! Which CPython versions the machine's running processes use, and whether the frame walker
//! supports each: what `energy-bpf sources` lists (`report` says the same per recorded
//! process).
//!
//! Bounded: at most [`MAX_PROCESSES`] processes are looked at (each a read of
//! `/proc/PID/maps`), and at most [`MAX_INTERPRETERS`] CPython files opened.

use std::collections::BTreeMap;

use serde::Serialize;

use super::discover::{self, Found};

/// Processes looked at, at most.
pub const MAX_PROCESSES: usize = 8192;
/// Processes running a CPython looked into (ELF symbols, `_Py_DebugOffsets`), at most.
pub const MAX_INTERPRETERS: usize = 64;
/// Process ids listed per line.
const MAX_PIDS: usize = 8;

/// The processes running one CPython version with one outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Running {
    /// `3.11`; empty when the version could not be told.
    pub version: String,
    /// `walked`, `python 3.8: not supported, native frames only`, or why it could not be
    /// looked at.
    pub status: String,
    /// How many processes.
    pub processes: usize,
    /// The first few of their ids, ascending.
    pub pids: Vec<u32>,
}

/// The CPython versions running now, by version and outcome; processes this user may not
/// look at are left out.
pub fn running() -> Vec<Running> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .take(MAX_PROCESSES)
                .collect()
        })
        .unwrap_or_default();
    pids.sort_unstable();
    let own = std::process::id();
    let mut groups: BTreeMap<(String, String), Running> = BTreeMap::new();
    let mut looked = 0;
    for pid in pids.into_iter().filter(|&p| p != own) {
        if looked >= MAX_INTERPRETERS {
            break;
        }
        let (version, status) = match discover::find(pid) {
            Ok(Found::NotPython) => continue,
            Ok(Found::Walked(interp)) => (interp.table.version.to_string(), "walked".into()),
            Ok(other) => match other.not_walked() {
                Some(said) => said,
                None => continue,
            },
            // Gone, or not ours to read.
            Err(super::PythonError::Io { .. }) => continue,
            Err(err) => (String::new(), format!("python not walked: {err}")),
        };
        looked += 1;
        let g = groups
            .entry((version.clone(), status.clone()))
            .or_insert(Running {
                version,
                status,
                processes: 0,
                pids: Vec::new(),
            });
        g.processes += 1;
        if g.pids.len() < MAX_PIDS {
            g.pids.push(pid);
        }
    }
    groups.into_values().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_python_child_is_listed_with_its_outcome() {
        let Ok(mut child) = std::process::Command::new("/usr/bin/python3")
            .args(["-c", "import time; time.sleep(30)"])
            .spawn()
        else {
            eprintln!("SKIPPED: no /usr/bin/python3");
            return;
        };
        std::thread::sleep(std::time::Duration::from_millis(300));
        let found = super::running();
        let _ = child.kill();
        let _ = child.wait();
        let ours = found
            .iter()
            .find(|r| r.pids.contains(&child.id()) || r.processes > r.pids.len())
            .unwrap_or_else(|| panic!("python3 {} not listed: {found:?}", child.id()));
        assert!(!ours.version.is_empty(), "{ours:?}");
        assert!(
            ours.status == "walked" || ours.status.contains("not supported"),
            "{ours:?}"
        );
    }
}
