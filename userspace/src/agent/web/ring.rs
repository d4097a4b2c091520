//! The agent's own windows, kept for the web view's chart: per window its end time, length,
//! whether its energy is modelled, and each process row's power with the 95% interval.
//! Bounded twice: at most [`MAX_ROWS_PER_WINDOW`] rows a window (the rest summed into one
//! `[rest]` row) and [`MAX_ENTRIES`] rows in all, oldest windows dropped first; row names
//! are interned and dropped with their last window.

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use super::api::{By, MAX_POINTS, SeriesQuery};

/// Rows kept per window.
pub const MAX_ROWS_PER_WINDOW: usize = 256;
/// Rows kept in all: 4 Mi × 16 bytes = 64 MiB at most (a day of 1 s windows with 48
/// processes each, or an hour with 200 and more).
pub const MAX_ENTRIES: usize = 4 << 20;
/// Windows kept, whatever their rows: a day at 1 s.
pub const MAX_WINDOWS: usize = 86_400;

/// What a row is: a process, in its container and pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RowKey {
    /// Process id (0 for the `[rest]` row).
    pub pid: u32,
    /// Short name.
    pub comm: String,
    /// Container id, empty when none.
    pub container: String,
    /// Pod UID, empty when none.
    pub pod: String,
    /// The VM's name when the process is a VM, empty otherwise.
    pub vm: String,
}

/// One process row of a window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    key: u32,
    watts: f32,
    lo: f32,
    hi: f32,
}

/// One window.
#[derive(Clone, Debug, PartialEq)]
struct Win {
    end_ms: u64,
    estimated: bool,
    rows: Vec<Entry>,
}

/// A row of a window as handed to [`Ring::push`]: key, power and its 95% interval, W.
pub struct Row {
    /// What it is.
    pub key: RowKey,
    /// Average power over the window, W.
    pub watts: f64,
    /// 95% interval of the power, W.
    pub ci_w: [f64; 2],
}

/// The ring of windows.
#[derive(Default)]
pub struct Ring {
    keys: Vec<Option<(RowKey, u32)>>,
    index: HashMap<RowKey, u32>,
    free: Vec<u32>,
    windows: VecDeque<Win>,
    entries: usize,
}

/// One charted row.
#[derive(Debug, Serialize, PartialEq)]
pub struct Series {
    /// Label shown (`comm (pid)`, a container id, a pod UID, `[host]` or `[rest]`).
    pub name: String,
    /// The process id, for a process row (what `/api/v1/profile?row=` takes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Mean power over the range, W.
    pub mean_w: f64,
    /// Power per point, W.
    pub watts: Vec<f64>,
    /// Lower and upper 95% bound per point, W.
    pub ci_lo: Vec<f64>,
    /// Upper bound.
    pub ci_hi: Vec<f64>,
}

/// A series response.
#[derive(Debug, Serialize, PartialEq)]
pub struct SeriesResponse {
    /// Row kind.
    pub by: &'static str,
    /// End of each point, unix ms.
    pub times_ms: Vec<u64>,
    /// Windows behind each point.
    pub windows: usize,
    /// True when any window of the range is modelled energy.
    pub estimated: bool,
    /// The top rows, largest mean first, then `[rest]` when rows were left out.
    pub series: Vec<Series>,
}

impl Ring {
    fn intern(&mut self, key: RowKey) -> u32 {
        if let Some(&i) = self.index.get(&key) {
            if let Some((_, n)) = &mut self.keys[i as usize] {
                *n += 1;
            }
            return i;
        }
        let slot = match self.free.pop() {
            Some(i) => i,
            None => {
                self.keys.push(None);
                (self.keys.len() - 1) as u32
            }
        };
        self.keys[slot as usize] = Some((key.clone(), 1));
        self.index.insert(key, slot);
        slot
    }

    fn release(&mut self, i: u32) {
        let gone = match &mut self.keys[i as usize] {
            Some((_, n)) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if gone {
            if let Some((key, _)) = self.keys[i as usize].take() {
                self.index.remove(&key);
            }
            self.free.push(i);
        }
    }

    /// Adds a window ending at `end_ms`; rows beyond the largest
    /// [`MAX_ROWS_PER_WINDOW`] are summed into `[rest]`.
    pub fn push(&mut self, end_ms: u64, estimated: bool, mut rows: Vec<Row>) {
        rows.sort_by(|a, b| b.watts.total_cmp(&a.watts));
        if rows.len() > MAX_ROWS_PER_WINDOW {
            let rest = rows.split_off(MAX_ROWS_PER_WINDOW - 1);
            let sum = |f: &dyn Fn(&Row) -> f64| rest.iter().map(f).sum::<f64>();
            rows.push(Row {
                key: RowKey {
                    pid: 0,
                    comm: "[rest]".into(),
                    container: String::new(),
                    pod: String::new(),
                    vm: String::new(),
                },
                watts: sum(&|r| r.watts),
                ci_w: [sum(&|r| r.ci_w[0]), sum(&|r| r.ci_w[1])],
            });
        }
        let entries: Vec<Entry> = rows
            .into_iter()
            .map(|r| Entry {
                key: self.intern(r.key),
                watts: r.watts as f32,
                lo: r.ci_w[0] as f32,
                hi: r.ci_w[1] as f32,
            })
            .collect();
        self.entries += entries.len();
        self.windows.push_back(Win {
            end_ms,
            estimated,
            rows: entries,
        });
        while self.entries > MAX_ENTRIES || self.windows.len() > MAX_WINDOWS {
            let Some(old) = self.windows.pop_front() else {
                break;
            };
            self.entries -= old.rows.len();
            for e in old.rows {
                self.release(e.key);
            }
        }
    }

    /// Windows held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Rows held in all windows.
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.entries
    }

    fn group(&self, key: u32, by: By) -> (String, Option<u32>) {
        let Some((k, _)) = &self.keys[key as usize] else {
            return ("[gone]".into(), None);
        };
        let or_host = |s: &str| {
            if s.is_empty() {
                "[host]".to_string()
            } else {
                s.to_string()
            }
        };
        match by {
            By::Process if k.pid == 0 => (k.comm.clone(), None),
            By::Process => (format!("{} ({})", k.comm, k.pid), Some(k.pid)),
            By::Container => (
                or_host(&k.container.chars().take(12).collect::<String>()),
                None,
            ),
            By::Pod => (or_host(&k.pod), None),
            By::Vm => (or_host(&k.vm), None),
        }
    }

    /// The processes whose rows made the chart's group `name` of kind `by` in the windows
    /// that end within `[from_ms, to_ms]` (and the first after: it covers the range's end).
    pub fn pids_of(&self, by: By, name: &str, from_ms: u64, to_ms: u64) -> Vec<u32> {
        let start = self.windows.partition_point(|w| w.end_ms < from_ms);
        let mut seen: Vec<bool> = vec![false; self.keys.len()];
        let mut pids = Vec::new();
        for w in self.windows.range(start..) {
            for e in &w.rows {
                if std::mem::replace(&mut seen[e.key as usize], true) {
                    continue;
                }
                if let Some((k, _)) = &self.keys[e.key as usize]
                    && k.pid != 0
                    && self.group(e.key, by).0 == name
                {
                    pids.push(k.pid);
                }
            }
            if w.end_ms > to_ms {
                break;
            }
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// The chart of `q` as of `now_ms`: the top rows by mean power over the range, the
    /// rest summed into `[rest]`, at most [`MAX_POINTS`] points (windows averaged into
    /// buckets when the range holds more).
    pub fn series(&self, q: &SeriesQuery, now_ms: u64) -> SeriesResponse {
        let from = now_ms.saturating_sub(q.range_s * 1000);
        let start = self.windows.partition_point(|w| w.end_ms <= from);
        let wins: Vec<&Win> = self.windows.range(start..).collect();
        let buckets = wins.len().clamp(1, MAX_POINTS);
        let bucket_of = |i: usize| i * buckets / wins.len().max(1);
        // Each interned key's group (by name), and each group's summed power for ranking:
        // integers in the loops over entries, names only once per key.
        let mut group_of: Vec<Option<usize>> = vec![None; self.keys.len()];
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut groups: Vec<(String, Option<u32>, f64)> = Vec::new();
        for w in &wins {
            for e in &w.rows {
                let g = match group_of[e.key as usize] {
                    Some(g) => g,
                    None => {
                        let (name, pid) = self.group(e.key, q.by);
                        let g = *index.entry(name.clone()).or_insert_with(|| {
                            groups.push((name, pid, 0.0));
                            groups.len() - 1
                        });
                        group_of[e.key as usize] = Some(g);
                        g
                    }
                };
                groups[g].2 += f64::from(e.watts);
            }
        }
        let mut order: Vec<usize> = (0..groups.len()).collect();
        order.sort_by(|&a, &b| {
            groups[b]
                .2
                .total_cmp(&groups[a].2)
                .then_with(|| groups[a].0.cmp(&groups[b].0))
        });
        let rest = order.len() > q.top;
        order.truncate(q.top);
        let n = order.len() + usize::from(rest);
        // Group → its slot in the answer (`[rest]` last, when rows were left out).
        let mut slot: Vec<Option<usize>> = vec![rest.then(|| n - 1); groups.len()];
        for (s, &g) in order.iter().enumerate() {
            slot[g] = Some(s);
        }
        let ranked: Vec<(String, Option<u32>, f64)> =
            order.iter().map(|&g| groups[g].clone()).collect();
        let mut sums = vec![vec![[0.0f64; 3]; buckets]; n];
        let mut counts = vec![0usize; buckets];
        let mut times = vec![0u64; buckets];
        let mut estimated = false;
        for (i, w) in wins.iter().enumerate() {
            let b = bucket_of(i);
            counts[b] += 1;
            times[b] = w.end_ms;
            estimated |= w.estimated;
            for e in &w.rows {
                let Some(s) = group_of[e.key as usize].and_then(|g| slot[g]) else {
                    continue;
                };
                let acc = &mut sums[s][b];
                acc[0] += f64::from(e.watts);
                acc[1] += f64::from(e.lo);
                acc[2] += f64::from(e.hi);
            }
        }
        let total_windows = wins.len().max(1) as f64;
        let mut series: Vec<Series> = ranked
            .iter()
            .map(|(name, pid, sum)| (name.clone(), *pid, sum / total_windows))
            .chain(rest.then(|| ("[rest]".to_string(), None, 0.0)))
            .zip(sums)
            .map(|((name, pid, mean_w), s)| {
                let avg = |k: usize| -> Vec<f64> {
                    s.iter()
                        .zip(&counts)
                        .map(|(v, &c)| if c > 0 { v[k] / c as f64 } else { 0.0 })
                        .collect()
                };
                Series {
                    name,
                    pid,
                    mean_w,
                    watts: avg(0),
                    ci_lo: avg(1),
                    ci_hi: avg(2),
                }
            })
            .collect();
        if let Some(r) = series.last_mut().filter(|r| rest && r.name == "[rest]") {
            r.mean_w = r.watts.iter().sum::<f64>() / buckets as f64;
        }
        let keep: Vec<bool> = counts.iter().map(|&c| c > 0).collect();
        for s in &mut series {
            for v in [&mut s.watts, &mut s.ci_lo, &mut s.ci_hi] {
                let mut k = keep.iter();
                v.retain(|_| *k.next().unwrap_or(&false));
            }
        }
        let mut k = keep.iter();
        times.retain(|_| *k.next().unwrap_or(&false));
        SeriesResponse {
            by: q.by.name(),
            times_ms: times,
            windows: wins.len(),
            estimated,
            series,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, comm: &str, pod: &str, watts: f64) -> Row {
        Row {
            key: RowKey {
                pid,
                comm: comm.into(),
                container: String::new(),
                pod: pod.into(),
                vm: if comm == "qemu" {
                    "web".into()
                } else {
                    String::new()
                },
            },
            watts,
            ci_w: [watts * 0.9, watts * 1.1],
        }
    }

    #[test]
    fn series_ranks_rows_sums_the_rest_and_groups_by_pod() {
        let mut ring = Ring::default();
        for t in 1..=10u64 {
            ring.push(
                t * 1000,
                true,
                vec![
                    row(1, "big", "p1", 3.0),
                    row(2, "small", "p1", 1.0),
                    row(3, "tiny", "", 0.5),
                ],
            );
        }
        let q = SeriesQuery {
            range_s: 60,
            by: By::Process,
            top: 2,
        };
        let s = ring.series(&q, 10_000);
        assert!(s.estimated);
        assert_eq!(s.times_ms.len(), 10);
        let names: Vec<&str> = s.series.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["big (1)", "small (2)", "[rest]"]);
        assert!((s.series[0].mean_w - 3.0).abs() < 1e-6);
        assert!((s.series[2].watts[0] - 0.5).abs() < 1e-6);
        assert_eq!(s.series[0].pid, Some(1));
        let pods = ring.series(
            &SeriesQuery {
                by: By::Pod,
                top: 5,
                ..q
            },
            10_000,
        );
        let p1 = pods.series.iter().find(|r| r.name == "p1").expect("pod p1");
        assert!((p1.mean_w - 4.0).abs() < 1e-6);
        assert!(pods.series.iter().any(|r| r.name == "[host]"));
    }

    #[test]
    fn a_groups_flamegraph_is_of_the_processes_its_rows_had_in_the_range() {
        let mut ring = Ring::default();
        for t in 1..=10u64 {
            let mut rows = vec![row(1, "big", "p1", 3.0), row(3, "qemu", "", 2.0)];
            // Process 2 joins pod p1 in the second half only.
            if t > 5 {
                rows.push(row(2, "small", "p1", 1.0));
            }
            ring.push(t * 1000, false, rows);
        }
        assert_eq!(ring.pids_of(By::Pod, "p1", 1000, 4000), [1]);
        assert_eq!(ring.pids_of(By::Pod, "p1", 1000, 10_000), [1, 2]);
        assert_eq!(ring.pids_of(By::Vm, "web", 1000, 10_000), [3]);
        assert_eq!(ring.pids_of(By::Vm, "[host]", 1000, 10_000), [1, 2]);
        assert!(ring.pids_of(By::Pod, "p9", 1000, 10_000).is_empty());
        let vms = ring.series(
            &SeriesQuery {
                range_s: 60,
                by: By::Vm,
                top: 5,
            },
            10_000,
        );
        let web = vms.series.iter().find(|r| r.name == "web").expect("vm row");
        assert!((web.mean_w - 2.0).abs() < 1e-6);
    }

    #[test]
    fn the_ring_stays_bounded_and_forgets_names() {
        let mut ring = Ring::default();
        for t in 0..(MAX_WINDOWS as u64 + 10) {
            ring.push(t, false, vec![row(t as u32, "p", "", 1.0)]);
        }
        assert_eq!(ring.len(), MAX_WINDOWS);
        assert_eq!(ring.index.len(), MAX_WINDOWS);
        let many: Vec<Row> = (0..1000).map(|i| row(i, "x", "", f64::from(i))).collect();
        ring.push(u64::MAX / 2, false, many);
        let last = ring.windows.back().expect("window");
        assert_eq!(last.rows.len(), MAX_ROWS_PER_WINDOW);
        assert!(ring.entries() <= MAX_ENTRIES);
    }

    #[test]
    fn long_ranges_are_averaged_into_bounded_points() {
        let mut ring = Ring::default();
        for t in 1..=5000u64 {
            ring.push(t * 1000, false, vec![row(1, "a", "", 2.0)]);
        }
        let s = ring.series(
            &SeriesQuery {
                range_s: 86_400,
                by: By::Process,
                top: 10,
            },
            5_000_000,
        );
        assert_eq!(s.times_ms.len(), MAX_POINTS);
        assert!(s.series[0].watts.iter().all(|w| (w - 2.0).abs() < 1e-6));
    }

    /// The figure docs/dashboards.md quotes: an hour of 1 s windows for 200 processes,
    /// answered as JSON (`cargo test -p energy-bpf --release --lib series_of_an_hour --
    /// --ignored --nocapture`). A measurement, not a timed assertion.
    #[test]
    #[ignore]
    fn series_of_an_hour_of_200_processes() {
        let mut ring = Ring::default();
        let t0 = 1_000_000u64;
        for t in 0..3600u64 {
            let rows = (0..200u32)
                .map(|p| row(1000 + p, "worker", "", f64::from(p % 17) + 0.5))
                .collect();
            ring.push(t0 + t * 1000, false, rows);
        }
        let now = t0 + 3600 * 1000;
        for (by, top) in [(By::Process, 10), (By::Process, 50), (By::Pod, 10)] {
            let q = SeriesQuery {
                range_s: 3600,
                by,
                top,
            };
            let runs = 5;
            let start = std::time::Instant::now();
            let mut bytes = 0;
            for _ in 0..runs {
                let resp = ring.series(&q, now);
                bytes = serde_json::to_vec(&resp).expect("json").len();
            }
            let ms = start.elapsed().as_secs_f64() * 1000.0 / f64::from(runs);
            eprintln!(
                "series of 3600 windows x 200 processes, by {}, top {top}: {ms:.1} ms, {bytes} bytes",
                by.name()
            );
        }
    }
}
