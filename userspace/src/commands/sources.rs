//! `energy-bpf sources`: every energy source kind on this machine, whether it can be read and
//! why not, its domains with measured update period and read cost, and which will be used;
//! with no counter, the estimated model's parameters and how to set them. The survey is
//! `crate::energy::survey`; this module parses the flags, prints it and fails when
//! nothing can give energy.
use std::process::ExitCode;

use anyhow::Context as _;

use crate::energy::survey;

/// Output format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// Human-readable text.
    Text,
    /// One JSON document.
    Json,
}

/// Arguments of `energy-bpf sources`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    energy: super::args::EnergyFlags,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let report = survey::survey(&args.energy.config())?;
    match args.format {
        Format::Json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&report).context("encoding JSON")?
            )
        }
        Format::Text => print!("{}", survey::text(&report)),
    }
    Ok(if report.in_use().is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::energy::{SourceKind, fake};

    #[test]
    fn a_machine_with_only_the_model_succeeds() {
        let tmp = tempfile::tempdir().expect("tempdir");
        fake::topology(tmp.path(), 1, 2).expect("topology");
        let args = Args {
            energy: super::super::args::EnergyFlags {
                sysfs_root: tmp.path().to_owned(),
                dev_cpu_root: tmp.path().join("dev/cpu"),
                energy_source: SourceKind::Auto,
                ..Default::default()
            },
            format: Format::Json,
        };
        assert_eq!(run(args).expect("run"), ExitCode::SUCCESS);
    }
}
