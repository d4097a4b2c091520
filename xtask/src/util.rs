//! Small helpers for running commands.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
};

/// Result of a task: a message on failure.
pub type Result<T = ()> = std::result::Result<T, String>;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(PathBuf::from)
        .unwrap_or_default()
}

/// Runs a command to completion, inheriting stdio; an error names the command.
pub fn status(cmd: &mut Command) -> Result {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: $ {shown}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

/// Runs cargo with `args` in the workspace root.
pub fn cargo(args: &[&str]) -> Result {
    status(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(args)
            .current_dir(root()),
    )
}

/// Runs a command and returns its stdout, or None when it cannot run or fails.
pub fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program)
        .args(args)
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
