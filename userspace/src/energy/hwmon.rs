//! hwmon energy inputs: `<sysfs>/class/hwmon/hwmonN/{name,energyK_input,energyK_label}`, µJ.
//!
//! amd_energy and zenergy label their inputs `EsocketP` (package P) and `EcoreCCC` (core CCC,
//! numbered as the `core_id` of sysfs topology); other drivers' inputs are kept with their
//! label and domain "other". The inputs are 64-bit accumulators in the driver, so they are
//! not unwrapped; a backwards step is flagged.

use std::path::{Path, PathBuf};

use super::{EnergyError, EnergySource, RawSample, SourceKind, read_text, read_u64, source_desc};
use crate::pb::v1 as pb;

const HINT: &str = "run as root or grant read access to the hwmon energy inputs";

/// One `energyK_input`.
#[derive(Clone, Debug, PartialEq)]
pub struct InputInfo {
    /// The input file.
    pub path: PathBuf,
    /// Driver name (`name` of the hwmon device).
    pub chip: String,
    /// `energyK_label`, or `energyK` when there is none.
    pub label: String,
    /// Domain derived from the label.
    pub domain: pb::EnergyDomain,
    /// Package derived from the label and topology.
    pub package: u32,
}

/// An open hwmon energy input.
#[derive(Debug)]
pub struct Input {
    path: PathBuf,
    desc: pb::EnergySource,
}

/// Finds every `energyK_input` under `<sysfs>/class/hwmon`, sorted by path.
pub fn inputs(sysfs: &Path, cpus: &[pb::Cpu]) -> Result<Vec<InputInfo>, EnergyError> {
    let root = sysfs.join("class/hwmon");
    let devices = match std::fs::read_dir(&root) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(EnergyError::from_io(&root, e, "")),
    };
    let mut dirs: Vec<PathBuf> = devices.filter_map(|e| Some(e.ok()?.path())).collect();
    dirs.sort();
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(files) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<String> = files
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        let inputs: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with("energy") && n.ends_with("_input"))
            .collect();
        if inputs.is_empty() {
            continue;
        }
        let chip = read_text(&dir.join("name"), "").unwrap_or_else(|_| "hwmon".to_owned());
        for input in inputs {
            let stem = &input[..input.len() - "_input".len()];
            let label = read_text(&dir.join(format!("{stem}_label")), "")
                .unwrap_or_else(|_| stem.to_owned());
            let (domain, package) = classify(&label, cpus);
            out.push(InputInfo {
                path: dir.join(input),
                chip: chip.clone(),
                label,
                domain,
                package,
            });
        }
    }
    Ok(out)
}

/// Domain and package of an input from its label (amd_energy/zenergy naming).
fn classify(label: &str, cpus: &[pb::Cpu]) -> (pb::EnergyDomain, u32) {
    if let Some(p) = label.strip_prefix("Esocket").and_then(|p| p.parse().ok()) {
        return (pb::EnergyDomain::Package, p);
    }
    if let Some(core) = label
        .strip_prefix("Ecore")
        .and_then(|c| c.parse::<u32>().ok())
    {
        let package = cpus
            .iter()
            .find(|c| c.core == core)
            .map_or(0, |c| c.package);
        return (pb::EnergyDomain::Cores, package);
    }
    (pb::EnergyDomain::DomainUnspecified, 0)
}

impl Input {
    /// Opens an input (checks it is readable).
    pub fn open(info: &InputInfo) -> Result<Self, EnergyError> {
        read_u64(&info.path, HINT)?;
        let desc = source_desc(
            SourceKind::Hwmon,
            info.domain,
            info.package,
            format!("{} {}", info.chip, info.label),
        );
        Ok(Self {
            path: info.path.clone(),
            desc,
        })
    }
}

impl EnergySource for Input {
    fn describe(&self) -> pb::EnergySource {
        self.desc.clone()
    }

    fn unit_uj(&self) -> f64 {
        1.0
    }

    fn wrap_counts(&self) -> Option<u64> {
        None
    }

    fn read(&mut self) -> Result<RawSample, EnergyError> {
        Ok(RawSample {
            count: read_u64(&self.path, HINT)?,
            gpu_processes: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::fake;

    #[test]
    fn amd_energy_inputs_are_classified() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let files = fake::hwmon_amd_energy(tmp.path(), 1, 2).expect("fake hwmon");
        assert_eq!(files.len(), 3);
        let cpus = crate::energy::fake::cpus(1, 2);
        let found = inputs(tmp.path(), &cpus).expect("inputs");
        let summary: Vec<(&str, pb::EnergyDomain, u32)> = found
            .iter()
            .map(|i| (i.label.as_str(), i.domain, i.package))
            .collect();
        use pb::EnergyDomain::*;
        assert_eq!(
            summary,
            vec![
                ("Ecore000", Cores, 0),
                ("Ecore001", Cores, 0),
                ("Esocket0", Package, 0)
            ]
        );
        let mut input = Input::open(&found[2]).expect("open");
        assert_eq!(input.describe().name, "amd_energy Esocket0");
        std::fs::write(&found[2].path, "123456\n").expect("write");
        assert_eq!(input.read().expect("read").count, 123_456);
    }

    #[test]
    fn vanished_input_is_reported_as_such() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fake::hwmon_amd_energy(tmp.path(), 1, 1).expect("fake hwmon");
        let found = inputs(tmp.path(), &[]).expect("inputs");
        let mut input = Input::open(&found[0]).expect("open");
        std::fs::remove_file(&found[0].path).expect("remove");
        let err = input.read().expect_err("read of a removed file");
        assert!(matches!(err, EnergyError::Vanished { .. }), "{err}");
    }
}
