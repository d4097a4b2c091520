//! Online CPUs and their package/core from `<sysfs>/devices/system/cpu`, for commands that
//! read energy without a capture session (`sources`). Packages decide which CPU opens each
//! per-package counter.

use std::path::Path;

use crate::pb::v1 as pb;

/// Parses a kernel CPU list such as `0-3,8,10-11`.
fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// Online CPUs with package and core (0 where sysfs does not say). Falls back to CPU 0
/// alone when the list is unreadable.
pub fn cpus(sysfs: &Path) -> Vec<pb::Cpu> {
    let base = sysfs.join("devices/system/cpu");
    let ids = std::fs::read_to_string(base.join("online"))
        .ok()
        .and_then(|t| parse_cpu_list(&t))
        .filter(|ids| !ids.is_empty())
        .unwrap_or_else(|| vec![0]);
    let read = |cpu: u32, file: &str| -> u32 {
        std::fs::read_to_string(base.join(format!("cpu{cpu}/topology/{file}")))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    ids.into_iter()
        .map(|id| pb::Cpu {
            id,
            package: read(id, "physical_package_id"),
            core: read(id, "core_id"),
        })
        .collect()
}

/// Package and core of each of `ids` (the CPUs capture watches), from the topology under
/// `sysfs` (a fake tree in tests, so per-package attribution can be exercised on a
/// one-package machine); a CPU the tree does not describe is its own core of package 0.
pub fn of(sysfs: &Path, ids: &[u32]) -> Vec<pb::Cpu> {
    let known = cpus(sysfs);
    ids.iter()
        .map(|&id| {
            known
                .iter()
                .find(|c| c.id == id)
                .copied()
                .unwrap_or(pb::Cpu {
                    id,
                    package: 0,
                    core: id,
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn reads_fake_topology() {
        let tmp = tempfile::tempdir().expect("tempdir");
        crate::energy::fake::topology(tmp.path(), 2, 2).expect("fake topology");
        let got = cpus(tmp.path());
        assert_eq!(
            got,
            vec![
                pb::Cpu {
                    id: 0,
                    package: 0,
                    core: 0
                },
                pb::Cpu {
                    id: 1,
                    package: 0,
                    core: 1
                },
                pb::Cpu {
                    id: 2,
                    package: 1,
                    core: 0
                },
                pb::Cpu {
                    id: 3,
                    package: 1,
                    core: 1
                },
            ]
        );
    }
}
