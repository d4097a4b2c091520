//! `energy-bpf assets` (hidden): writes the man pages and shell completions of the command
//! line it is given, for packages (`cargo xtask deb`). Generated from the same clap
//! definition that parses arguments, so they cannot drift from `--help`.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;

/// Arguments of `energy-bpf assets`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Write `energy-bpf.1` and one `energy-bpf-SUBCOMMAND.1` per visible subcommand here.
    #[arg(long, value_name = "DIR")]
    pub(crate) man: Option<PathBuf>,
    /// Write bash, zsh and fish completions here (`energy-bpf.bash`, `_energy-bpf`,
    /// `energy-bpf.fish`).
    #[arg(long, value_name = "DIR")]
    pub(crate) completions: Option<PathBuf>,
}

/// Writes what `args` asks for, from `cmd` (the whole command line's definition).
pub fn run(args: &Args, cmd: clap::Command) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.man.is_some() || args.completions.is_some(),
        "nothing to write: give --man DIR and/or --completions DIR"
    );
    if let Some(dir) = &args.man {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        write_man(&cmd, dir)?;
    }
    if let Some(dir) = &args.completions {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        for shell in [
            clap_complete::Shell::Bash,
            clap_complete::Shell::Zsh,
            clap_complete::Shell::Fish,
        ] {
            let mut cmd = cmd.clone();
            clap_complete::generate_to(shell, &mut cmd, "energy-bpf", dir).with_context(|| {
                format!("cannot write {shell} completions to {}", dir.display())
            })?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The top page and one page per visible subcommand (`energy-bpf-record.1`, ...), as
/// git and cargo lay theirs out.
fn write_man(cmd: &clap::Command, dir: &std::path::Path) -> anyhow::Result<()> {
    let mut cmd = cmd.clone();
    cmd.build();
    let write = |name: String, page: clap::Command| -> anyhow::Result<()> {
        let path = dir.join(format!("{name}.1"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page)
            .render(&mut out)
            .with_context(|| format!("cannot render {name}.1"))?;
        std::fs::write(&path, out).with_context(|| format!("cannot write {}", path.display()))
    };
    write("energy-bpf".into(), cmd.clone())?;
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        let name = format!("energy-bpf-{}", sub.get_name());
        write(name.clone(), sub.clone().name(name))?;
    }
    Ok(())
}
