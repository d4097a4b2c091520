//! The runs of a recorded command (`record -- CMD`, `--repeat N`): one after the other,
//! each process joining the capture's targets as it starts, each run marked
//! ([`RunMarker`]: start, end, exit code) within a millisecond of its end.

use std::{
    process::{Child, Command, ExitStatus},
    thread,
    time::{Duration, Instant},
};

use super::Live;
use crate::pb::v1::RunMarker;

/// A run could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot run {program}: {source}")]
pub struct RunError {
    /// The command's program.
    pub program: String,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// The runs of the recorded command: which one is running, and the markers of those done.
pub struct Runs {
    program: String,
    rest: Vec<String>,
    repeat: u32,
    left: u32,
    index: u32,
    current: Option<(Child, u64)>,
    done: Vec<RunMarker>,
}

impl Runs {
    /// `repeat` runs of `command` (program, then its arguments), none started yet; `None`
    /// for an empty command.
    pub fn new(command: &[String], repeat: u32) -> Option<Self> {
        let (program, rest) = command.split_first()?;
        Some(Self {
            program: program.clone(),
            rest: rest.to_vec(),
            repeat,
            left: repeat,
            index: 0,
            current: None,
            done: Vec::new(),
        })
    }

    /// Starts the next run; its process joins the targets.
    pub fn start(&mut self, live: &mut Live) -> Result<(), RunError> {
        let start_ns = crate::clock::monotonic_ns();
        let child = Command::new(&self.program)
            .args(&self.rest)
            .spawn()
            .map_err(|source| RunError {
                program: self.program.clone(),
                source,
            })?;
        live.targets_mut().add(child.id());
        let tables = live.unwind_stats().is_some();
        let python = live.python_on();
        if (tables || python) && wait_for_exec(child.id()) {
            // Tables from the first milliseconds, not after the first drain; libraries
            // the dynamic loader maps later are picked up at the first walk that meets
            // them.
            if tables {
                live.load_unwind_tables(child.id());
            }
            // Likewise the interpreter of a CPython command (a shared build's libpython,
            // if not mapped yet, is found at a later sample).
            live.load_python(child.id());
        }
        self.left = self.left.saturating_sub(1);
        self.current = Some((child, start_ns));
        Ok(())
    }

    /// Marks the current run done if it exited; returns its status.
    pub fn reap(&mut self) -> Option<ExitStatus> {
        let (child, start_ns) = self.current.as_mut()?;
        let status = child.try_wait().ok()??;
        let end_ns = crate::clock::monotonic_ns();
        self.done.push(RunMarker {
            index: self.index,
            start_ns: *start_ns,
            end_ns,
            pid: child.id(),
            exit_code: status
                .code()
                .or_else(|| std::os::unix::process::ExitStatusExt::signal(&status).map(|s| -s))
                .unwrap_or(0),
        });
        self.index += 1;
        self.current = None;
        Some(status)
    }

    /// Sleeps for one drain `tick`, watching the command in 1 ms steps so a run's end is
    /// marked within a millisecond and the next run starts at once. Returns the status of
    /// the last run when the command is done (its runs all ran, or one failed).
    pub fn tick(
        &mut self,
        live: &mut Live,
        tick: Duration,
    ) -> Result<Option<ExitStatus>, RunError> {
        let until = Instant::now() + tick;
        loop {
            if let Some(status) = self.reap() {
                if self.left == 0 || !status.success() {
                    return Ok(Some(status));
                }
                self.start(live)?;
            }
            let now = Instant::now();
            if now >= until {
                return Ok(None);
            }
            thread::sleep((until - now).min(Duration::from_millis(1)));
        }
    }

    /// The markers of the runs ended since the last call.
    pub fn take_done(&mut self) -> Vec<RunMarker> {
        std::mem::take(&mut self.done)
    }

    /// How many runs have ended.
    pub fn ended(&self) -> u32 {
        self.index
    }

    /// Why the recording stops when a run exited with `status` and no run is left: the
    /// trailer's stop reason.
    pub fn stop_reason(&self, status: ExitStatus) -> String {
        if self.repeat > 1 {
            format!(
                "command exited ({status}) after {} of {} runs",
                self.ended(),
                self.repeat
            )
        } else {
            format!("command exited ({status})")
        }
    }

    /// Kills the running run, if any, and reaps it (it is not marked).
    pub fn kill(&mut self) {
        if let Some((c, _)) = self.current.as_mut()
            && matches!(c.try_wait(), Ok(None))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits (up to 200 ms) until the child we forked has exec'd its program, then 2 ms more
/// for the dynamic loader; false when it did not exec in time.
fn wait_for_exec(pid: u32) -> bool {
    let ours = std::fs::read_link("/proc/self/exe").ok();
    let deadline = Instant::now() + Duration::from_millis(200);
    while Instant::now() < deadline {
        match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(exe) if Some(&exe) != ours.as_ref() => {
                std::thread::sleep(Duration::from_millis(2));
                return true;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(1)),
            Err(_) => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_command_has_no_runs() {
        assert!(Runs::new(&[], 3).is_none());
        let r = Runs::new(&["true".into(), "x".into()], 2).expect("runs");
        assert_eq!((r.program.as_str(), r.rest.len(), r.left), ("true", 1, 2));
    }

    #[test]
    fn the_stop_reason_counts_runs_only_when_repeated() {
        use std::os::unix::process::ExitStatusExt as _;
        let status = ExitStatus::from_raw(3 << 8);
        let once = Runs::new(&["true".into()], 1).expect("runs");
        assert_eq!(once.stop_reason(status), "command exited (exit status: 3)");
        let mut twice = Runs::new(&["true".into()], 2).expect("runs");
        twice.index = 1;
        assert_eq!(
            twice.stop_reason(status),
            "command exited (exit status: 3) after 1 of 2 runs"
        );
    }

    #[test]
    fn a_run_that_exited_is_marked_with_its_exit_code() {
        let mut r = Runs::new(&["sh".into(), "-c".into(), "exit 3".into()], 1).expect("runs");
        let child = Command::new("sh")
            .args(["-c", "exit 3"])
            .spawn()
            .expect("sh");
        let pid = child.id();
        r.current = Some((child, 5));
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = r.reap() {
                break s;
            }
            assert!(Instant::now() < deadline, "sh did not exit");
            thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(status.code(), Some(3));
        let done = r.take_done();
        assert_eq!(done.len(), 1);
        assert_eq!((done[0].index, done[0].pid, done[0].exit_code), (0, pid, 3));
        assert_eq!(done[0].start_ns, 5);
        assert_eq!(r.ended(), 1);
        assert!(r.take_done().is_empty());
    }
}
