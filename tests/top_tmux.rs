//! `energy-bpf top` in a real terminal: tmux gives it a 200x50 pseudo-terminal, we read the
//! screen with `capture-pane`, press keys with `send-keys`, and check that the terminal is
//! handed back clean.
//!
//! Needs root (the live feed loads eBPF), `tmux` and `taskset`. Each run uses its own tmux
//! server socket, so it never touches a user's tmux sessions.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// Refresh interval passed to `top -i`, seconds.
const INTERVAL_S: u64 = 1;
/// Line the shell prints after `top` exits, followed by the exit status.
const EXIT_MARK: &str = "top-exit-status=";
/// Clears the pane before a run so the previous run's exit line is gone.
const CLEAR: &str = r"printf '\033[H\033[2J'";
/// The fixed grid intensity the carbon runs pass, gCO2e/kWh.
const INTENSITY: &str = "400";

/// Starts `bin top -i 1 --carbon-intensity 400` in tmux and checks: a pinned busy process
/// is the first table row within three refreshes; its gCO2e column is its energy column at
/// the header's intensity; pressing `N` re-sorts the table by PID; `q` and Ctrl-C exit with
/// status 0 and SIGTERM with 143, each leaving the primary screen, cursor and cooked mode
/// as they were; closing the terminal ends top (a run without an intensity, whose table has
/// no gCO2e column).
pub fn top_in_tmux(bin: &Path) {
    for tool in ["tmux", "taskset"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "`{tool}` is not installed: apt-get install -y tmux util-linux"
        );
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the top tmux test must run as root (the live feed loads eBPF)"
    );
    assert!(
        bin.exists(),
        "binary under test not found: {}",
        bin.display()
    );

    let busy = Busy::start();
    let tmux = Tmux::start(200, 50);
    let line = format!(
        "'{}' top -i {INTERVAL_S} --carbon-intensity {INTENSITY}; echo \"{EXIT_MARK}$?\"",
        bin.display()
    );
    tmux.send_text(&line);
    tmux.send_key("Enter");

    // Loading the probes can take a while; the three refreshes count from the first frame.
    let first = tmux.wait_for(Duration::from_secs(30), "the table's column titles", |s| {
        table_rows(s).is_some()
    });
    assert!(
        !first.lines().any(|l| l.trim().starts_with(EXIT_MARK)),
        "top exited before drawing:\n{first}"
    );
    let deadline = Duration::from_secs(3 * INTERVAL_S) + Duration::from_millis(1500);
    let by_power = tmux.wait_for(
        deadline,
        &format!("busy PID {} as the first row (sorted by power)", busy.pid()),
        |s| table_rows(s).and_then(|rows| rows.first().copied()) == Some(busy.pid()),
    );
    let power_order = table_rows(&by_power).unwrap_or_default();
    // The busy row's grams: wait until its energy column shows a joule, so the check
    // is not lost in the column's 0.1 J rounding.
    let with_energy = tmux.wait_for(
        Duration::from_secs(30),
        &format!("a joule on busy PID {}'s row", busy.pid()),
        |s| {
            carbon_table(s).is_some_and(|t| {
                t.rows
                    .iter()
                    .any(|r| r.pid == busy.pid() && r.energy_j >= 1.0)
            })
        },
    );
    let table = carbon_table(&with_energy).expect("checked above");
    check_grams(&table, &with_energy);
    assert!(
        table
            .rows
            .iter()
            .any(|r| r.pid == busy.pid() && r.grams > 0.0),
        "the busy process has grams:\n{with_energy}"
    );

    tmux.send_text("N");
    let by_pid = tmux.wait_for(
        Duration::from_secs(3),
        "rows sorted by ascending PID after pressing N",
        |s| {
            table_rows(s).is_some_and(|rows| {
                rows.len() >= 2 && rows.windows(2).all(|w| w[0] < w[1]) && rows != power_order
            })
        },
    );
    assert!(
        by_pid.contains("PID▲"),
        "the PID column should carry the ascending sort mark:\n{by_pid}"
    );

    tmux.send_text("q");
    expect_clean_exit(&tmux, "0", "q");

    // Ctrl-C arrives as a key in raw mode: same clean exit.
    tmux.send_text(&format!("{CLEAR}; {line}"));
    tmux.send_key("Enter");
    tmux.wait_for(Duration::from_secs(30), "top's table (second run)", |s| {
        table_rows(s).is_some()
    });
    tmux.send_key("C-c");
    expect_clean_exit(&tmux, "0", "Ctrl-C");

    // SIGTERM: the terminal is restored and the status says which signal (128 + 15).
    tmux.send_text(&format!("{CLEAR}; {line}"));
    tmux.send_key("Enter");
    tmux.wait_for(Duration::from_secs(30), "top's table (third run)", |s| {
        table_rows(s).is_some()
    });
    let shell = tmux.format("#{pane_pid}");
    let top_pid = child_of(&shell);
    let killed = Command::new("kill").args(["-TERM", &top_pid]).status();
    assert!(
        killed.is_ok_and(|s| s.success()),
        "cannot send SIGTERM to top ({top_pid})"
    );
    expect_clean_exit(&tmux, "143", "SIGTERM");
    drop(tmux);

    // Closing the terminal under top (pane killed, ssh dropped) must end it, not leave it
    // spinning on a dead tty.
    let tmux = Tmux::start(200, 50);
    tmux.send_text(&format!("exec '{}' top -i {INTERVAL_S}", bin.display()));
    tmux.send_key("Enter");
    tmux.wait_for(Duration::from_secs(30), "top's table (hang-up run)", |s| {
        table_rows(s).is_some()
    });
    let screen = tmux.capture();
    assert!(
        !screen.contains("gCO2e") && !screen.contains("carbon:"),
        "without an intensity the table has no gCO2e column:\n{screen}"
    );
    let top_pid = tmux.format("#{pane_pid}");
    drop(tmux);
    let start = Instant::now();
    while is_running(&top_pid) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "top (PID {top_pid}) still runs 5 s after its terminal was closed"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Checks that top exited with `status` after `how`, leaving the primary screen, a visible
/// cursor and a cooked tty behind.
fn expect_clean_exit(tmux: &Tmux, status: &str, how: &str) {
    let after = tmux.wait_for(
        Duration::from_secs(5),
        &format!("the shell printing top's exit status after {how}"),
        |s| s.lines().any(|l| l.trim().starts_with(EXIT_MARK)),
    );
    let got = after
        .lines()
        .find_map(|l| l.trim().strip_prefix(EXIT_MARK))
        .unwrap_or("?");
    assert_eq!(got, status, "top's exit status after {how}:\n{after}");
    assert!(
        table_rows(&after).is_none() && !after.contains("energy-bpf top - "),
        "the table is still on screen after {how} (alternate screen not left):\n{after}"
    );
    assert_eq!(
        tmux.format("#{alternate_on}"),
        "0",
        "the pane is still on the alternate screen after {how}"
    );
    assert_eq!(
        tmux.format("#{cursor_flag}"),
        "1",
        "the cursor is still hidden after {how}"
    );
    tmux.send_text(
        "case \"$(stty -a)\" in *-icanon*) echo RAW-MODE-LEFT-ON;; *) echo TTY-COOKED;; esac",
    );
    tmux.send_key("Enter");
    let tty = tmux.wait_for(Duration::from_secs(5), "the stty check", |s| {
        s.lines()
            .any(|l| l == "TTY-COOKED" || l == "RAW-MODE-LEFT-ON")
    });
    assert!(
        tty.lines().any(|l| l == "TTY-COOKED"),
        "top left the terminal in raw mode after {how}:\n{tty}"
    );
}

/// The single child process of `pid` (top, started by the pane's shell).
fn child_of(pid: &str) -> String {
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_else(|e| panic!("cannot list the children of the pane shell {pid}: {e}"));
    let first = children.split_whitespace().next();
    first
        .unwrap_or_else(|| panic!("the pane shell {pid} has no child: top is not running"))
        .to_string()
}

/// Whether `pid` exists and is not a zombie.
fn is_running(pid: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next());
        state != Some("Z")
    })
}

/// PIDs of the table's lines, top to bottom; `None` when no table is on screen.
fn table_rows(screen: &str) -> Option<Vec<u32>> {
    let mut lines = screen.lines();
    lines.find(|l| {
        l.split_whitespace()
            .next()
            .is_some_and(|w| w.starts_with("PID"))
            && l.contains("Command")
    })?;
    Some(
        lines
            .map_while(|l| l.split_whitespace().next()?.parse().ok())
            .collect(),
    )
}

/// One row of a table with a gCO2e column.
#[derive(Debug)]
struct GramsRow {
    pid: u32,
    energy_j: f64,
    grams: f64,
    /// Half the last printed digit of the grams: their rounding.
    grams_half_ulp: f64,
}

/// A table with a gCO2e column and its header line's figures.
#[derive(Debug)]
struct CarbonTable {
    /// The intensity the header line names, gCO2e/kWh (PUE 1 unless it says otherwise).
    g_per_kwh: f64,
    pue: f64,
    /// Grams since start, in total and of the idle/static row.
    total_g: f64,
    idle_g: f64,
    /// Whether every process's line is in `rows` (the view line's `N lines, N processes`
    /// and all N on screen).
    all_shown: bool,
    rows: Vec<GramsRow>,
}

/// The first number in `text` (after a `~` estimated mark) and half its last digit.
fn number(text: &str) -> Option<(f64, f64)> {
    let t = text.trim_start_matches('~');
    let value: f64 = t.parse().ok()?;
    let decimals = t.split_once('.').map_or(0, |(_, d)| d.len());
    Some((value, 0.5 * 10f64.powi(-(decimals as i32))))
}

/// Reads the gCO2e table of one screen or batch frame; `None` when there is none. Panics
/// when the column titles say estimated and a grams or energy cell lacks the `~` mark.
fn carbon_table(screen: &str) -> Option<CarbonTable> {
    let header = screen
        .lines()
        .find_map(|l| l.trim().strip_prefix("carbon: "))?;
    // `0.000267 gCO2e since start (idle/static 0.000250) at 400.0 gCO2e/kWh (...)[, PUE x]`
    let total_g: f64 = header.split_whitespace().next()?.parse().ok()?;
    let idle_g: f64 = header
        .split_once("(idle/static ")?
        .1
        .split(')')
        .next()?
        .parse()
        .ok()?;
    let g_per_kwh: f64 = header
        .split_once(") at ")?
        .1
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let pue = header
        .rsplit_once(", PUE ")
        .and_then(|(_, p)| p.trim().parse().ok())
        .unwrap_or(1.0);
    let mut lines = screen.lines();
    let titles = lines.find(|l| l.trim_start().starts_with("PID") && l.contains("Command"))?;
    if !titles.contains("gCO2e") {
        return None;
    }
    let estimated = titles.contains("Energy J (estimated)");
    assert_eq!(
        estimated,
        titles.contains("gCO2e (estimated)"),
        "modelled grams carry the estimated label like the energy: {titles}"
    );
    let mut rows = Vec::new();
    for line in lines {
        let cells: Vec<&str> = line.split_whitespace().collect();
        let Some(pid) = cells.first().and_then(|c| c.parse::<u32>().ok()) else {
            break;
        };
        assert!(cells.len() >= 6, "a table line with fewer cells: {line}");
        if estimated {
            assert!(
                cells[2].starts_with('~') && cells[3].starts_with('~'),
                "modelled energy and grams are marked ~: {line}"
            );
        }
        let (energy_j, _) = number(cells[2]).unwrap_or_else(|| panic!("energy cell: {line}"));
        let (grams, grams_half_ulp) =
            number(cells[3]).unwrap_or_else(|| panic!("gCO2e cell: {line}"));
        rows.push(GramsRow {
            pid,
            energy_j,
            grams,
            grams_half_ulp,
        });
    }
    // `Sort: power (descending) | group by: process | 12 lines, 12 processes`
    let counts = screen
        .lines()
        .find(|l| l.starts_with("Sort: "))
        .and_then(|l| l.rsplit(" | ").find(|p| p.ends_with(" processes")))
        .and_then(|p| {
            let (lines, procs) = p.split_once(" lines, ")?;
            Some((
                lines.parse::<usize>().ok()?,
                procs.trim_end_matches(" processes").parse::<usize>().ok()?,
            ))
        });
    let all_shown = counts.is_some_and(|(l, p)| l == p && l == rows.len())
        && screen.contains("group by: process")
        && !screen.contains("filter:")
        && !screen.contains("pids:");
    Some(CarbonTable {
        g_per_kwh,
        pue,
        total_g,
        idle_g,
        all_shown,
        rows,
    })
}

/// Each row's grams are its energy column × the header's intensity (within the rounding of
/// both columns), and where every process is shown the rows and the idle/static grams add
/// up to no more than the header's grams since start (processes that exited hold the rest).
fn check_grams(t: &CarbonTable, screen: &str) {
    assert!(
        (t.g_per_kwh - INTENSITY.parse::<f64>().expect("number")).abs() < 1e-9,
        "the header names the intensity given: {screen}"
    );
    let g_per_j = t.g_per_kwh * t.pue / 3.6e6;
    assert!(!t.rows.is_empty(), "no rows:\n{screen}");
    for r in &t.rows {
        // The energy column rounds to 0.1 J.
        let slack = 0.05 * g_per_j + r.grams_half_ulp + 1e-12;
        assert!(
            (r.grams - r.energy_j * g_per_j).abs() <= slack,
            "PID {}: {} g shown for {} J at {} g/kWh ({} g), off by more than {slack}:\n{screen}",
            r.pid,
            r.grams,
            r.energy_j,
            t.g_per_kwh,
            r.energy_j * g_per_j
        );
    }
    if t.all_shown {
        let rows_g: f64 = t.rows.iter().map(|r| r.grams).sum();
        let rounding: f64 = t.rows.iter().map(|r| r.grams_half_ulp).sum::<f64>() + 1e-6;
        assert!(
            rows_g + t.idle_g <= t.total_g + rounding,
            "rows {rows_g} g + idle/static {} g exceed the header's {} g:\n{screen}",
            t.idle_g,
            t.total_g
        );
    }
}

/// A shell loop pinned to CPU 0, killed on drop.
struct Busy(Child);

impl Busy {
    fn start() -> Busy {
        let child = Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the pinned busy loop with taskset: {e}"));
        Busy(child)
    }

    /// taskset execs the shell, so the child's PID is the busy loop's.
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A private tmux server with one detached session running `sh`; killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(width: u16, height: u16) -> Tmux {
        static SERVERS: AtomicU32 = AtomicU32::new(0);
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let tmux = Tmux {
            socket: format!("energy-bpf-top-test-{}-{n}", std::process::id()),
        };
        let (w, h) = (width.to_string(), height.to_string());
        tmux.run(&["new-session", "-d", "-s", "top", "-x", &w, "-y", &h, "sh"]);
        // Keys typed before the shell's first prompt are echoed by the tty first and the
        // prompt lands after them, so top's exit line would follow a stray `# `.
        tmux.wait_for(Duration::from_secs(10), "the shell's first prompt", |s| {
            !s.trim().is_empty()
        });
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        let output = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run tmux {args:?}: {e}"));
        assert!(
            output.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }

    /// Types `text` literally.
    fn send_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "top", "-l", text]);
    }

    /// Presses a named key (`Enter`, `Escape`).
    fn send_key(&self, key: &str) {
        self.run(&["send-keys", "-t", "top", key]);
    }

    fn capture(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", "top"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn format(&self, format: &str) -> String {
        let out = self.run(&["display-message", "-p", "-t", "top", format]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Polls the screen until `ready` holds; panics with the last screen after `timeout`.
    fn wait_for(&self, timeout: Duration, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.capture();
            if ready(&screen) {
                return screen;
            }
            if start.elapsed() > timeout {
                panic!("waited {timeout:?} for {what}; the screen shows:\n{screen}");
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

#[test]
fn top_shows_a_busy_process_sorts_and_quits_cleanly_in_tmux() {
    if !crate::util::require_root("top_shows_a_busy_process_sorts_and_quits_cleanly_in_tmux") {
        return;
    }
    if !crate::util::unless_cpu_taken(
        "top_shows_a_busy_process_sorts_and_quits_cleanly_in_tmux",
        "the spinner is a busy loop as heavy as the one that must be the first row",
    ) {
        return;
    }
    let _guard = crate::util::exclusive();
    top_in_tmux(&crate::util::bin());
}

#[test]
fn top_batch_prints_exactly_n_frames_then_exits() {
    if !crate::util::require_root("top_batch_prints_exactly_n_frames_then_exits") {
        return;
    }
    let _guard = crate::util::exclusive();
    let out = crate::util::run(&["top", "--batch", "-n", "2", "-i", "0.3"]);
    assert!(out.status.success(), "{}", crate::util::text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("energy-bpf top - source:").count(),
        2,
        "two frames, each with its summary line:\n{stdout}"
    );
    assert!(
        stdout.contains("PID"),
        "each frame has the table:\n{stdout}"
    );
    assert!(
        !stdout.contains("gCO2e"),
        "without an intensity no frame has a gCO2e column:\n{stdout}"
    );
}

#[test]
fn top_batch_grams_column_is_each_rows_energy_at_the_headers_intensity() {
    if !crate::util::require_root(
        "top_batch_grams_column_is_each_rows_energy_at_the_headers_intensity",
    ) {
        return;
    }
    let _guard = crate::util::exclusive();
    let busy = crate::util::Workload::spawn("while :; do :; done", Some(0));
    let out = crate::util::run(&[
        "top",
        "--batch",
        "-n",
        "3",
        "-i",
        "1",
        "--carbon-intensity",
        INTENSITY,
    ]);
    assert!(out.status.success(), "{}", crate::util::text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let frames: Vec<&str> = stdout.split("energy-bpf top - source:").skip(1).collect();
    assert_eq!(frames.len(), 3, "three frames:\n{stdout}");
    for frame in frames {
        let table = carbon_table(frame)
            .unwrap_or_else(|| panic!("a carbon header and a gCO2e column:\n{frame}"));
        assert!(
            table.all_shown,
            "a batch frame prints every process:\n{frame}"
        );
        check_grams(&table, frame);
        // The busy loop burns all along: its grams grow from frame to frame.
        assert!(
            table
                .rows
                .iter()
                .any(|r| r.pid == busy.pid() && r.grams > 0.0),
            "the busy loop's row has grams:\n{frame}"
        );
    }
}
