//! Facts about the running kernel and CPU that explain a missing energy interface exactly:
//! whether the kernel was built with the driver at all (`/proc/config.gz` or
//! `/boot/config-<release>`) and whether we run under a hypervisor (cpuinfo flag), which
//! does not pass RAPL through. Only consulted for the real roots (`/sys`, `/dev/cpu`).

use std::{collections::HashMap, io::Read as _, path::Path};

/// What the host says about itself.
#[derive(Clone, Debug, Default)]
pub struct HostFacts {
    /// Kernel build options (`CONFIG_X` -> `y`/`m`/...), when the config is readable.
    pub kernel_config: Option<HashMap<String, String>>,
    /// Whether `/proc/cpuinfo` carries the `hypervisor` flag.
    pub hypervisor: bool,
}

/// Parses kernel config text: `CONFIG_X=v` lines; `# CONFIG_X is not set` means absent.
pub fn parse_config(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| k.starts_with("CONFIG_"))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect()
}

impl HostFacts {
    /// Reads the running host's facts (best effort: unreadable files leave `None`/false).
    pub fn read() -> Self {
        let kernel_config = read_proc_config().or_else(|| {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
            let text = std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()?;
            Some(parse_config(&text))
        });
        let hypervisor = std::fs::read_to_string("/proc/cpuinfo")
            .map(|t| {
                t.lines()
                    .find(|l| l.starts_with("flags"))
                    .is_some_and(|l| l.split_whitespace().any(|f| f == "hypervisor"))
            })
            .unwrap_or(false);
        Self {
            kernel_config,
            hypervisor,
        }
    }

    /// `Some(true)` when the kernel has `option` built in or as a module, `Some(false)` when
    /// it is not set, `None` when the config is unknown.
    pub fn has(&self, option: &str) -> Option<bool> {
        self.kernel_config.as_ref().map(|c| c.contains_key(option))
    }

    /// Extra explanation for a kind found absent under the real roots, if the host tells.
    pub fn explain(&self, kind: super::SourceKind) -> Option<String> {
        use super::SourceKind as K;
        let (option, what) = match kind {
            K::Perf => ("CONFIG_PERF_EVENTS_INTEL_RAPL", "the RAPL perf PMU"),
            K::Powercap => ("CONFIG_INTEL_RAPL", "the powercap RAPL driver"),
            K::Msr => ("CONFIG_X86_MSR", "the MSR driver"),
            _ => return None,
        };
        if self.has(option) == Some(false) {
            let fix = if kind == K::Msr {
                ", so `modprobe msr` cannot help"
            } else {
                ""
            };
            return Some(format!(
                "this kernel is built without {what} ({option} is not set){fix}"
            ));
        }
        self.hypervisor.then(|| {
            "running under a hypervisor (cpuinfo flag `hypervisor`), which does not expose RAPL \
             energy counters to guests"
                .to_owned()
        })
    }
}

fn read_proc_config() -> Option<HashMap<String, String>> {
    let file = std::fs::File::open("/proc/config.gz").ok()?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .ok()?;
    Some(parse_config(&text))
}

/// Whether `root` is the real root `real` (hints about the host apply only then).
pub fn is_real_root(root: &Path, real: &str) -> bool {
    root == Path::new(real)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::SourceKind;

    #[test]
    fn explains_from_config_then_hypervisor() {
        let config = parse_config(
            "# CONFIG_X86_MSR is not set\nCONFIG_PERF_EVENTS_INTEL_RAPL=y\nCONFIG_INTEL_RAPL=m\n",
        );
        let facts = HostFacts {
            kernel_config: Some(config),
            hypervisor: true,
        };
        let msr = facts.explain(SourceKind::Msr).expect("msr");
        assert!(
            msr.contains("CONFIG_X86_MSR is not set") && msr.contains("cannot help"),
            "{msr}"
        );
        let perf = facts.explain(SourceKind::Perf).expect("perf");
        assert!(perf.starts_with("running under a hypervisor"), "{perf}");
        assert_eq!(facts.explain(SourceKind::Hwmon), None);
        let bare = HostFacts {
            kernel_config: None,
            hypervisor: false,
        };
        assert_eq!(bare.explain(SourceKind::Powercap), None);
    }
}
