//! The web view's query decoders and limits: `/api/v1/series`, `/api/v1/profile` and
//! `/api/v1/diff` query strings into typed requests, every number checked against its cap.
//! Pure functions of the query text (fuzzed: `fuzz/fuzz_targets/web_query.rs`); an error
//! is the 400 reason the client sees.

/// Longest series range: a day.
pub const MAX_SERIES_RANGE_S: u64 = 24 * 3600;
/// Most rows a series response names (the rest are summed into `[rest]`).
pub const MAX_TOP: usize = 50;
/// Most points per series; longer ranges are averaged into this many buckets.
pub const MAX_POINTS: usize = 1200;
/// Longest profile or diff range (the recordings read are bounded by
/// [`MAX_READ_BYTES`]).
pub const MAX_PROFILE_RANGE_S: u64 = 3600;
/// Most stacks a profile answers with (the smallest are merged into one `[other stacks]`).
pub const MAX_STACKS: usize = 4000;
/// Recordings one profile or diff request reads at most, bytes: a range whose files are
/// larger is read from files spread evenly over it, and the answer says how many.
pub const MAX_READ_BYTES: u64 = 16 << 20;
/// Largest response body, bytes.
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;
/// Longest query string accepted.
pub const MAX_QUERY_BYTES: usize = 1024;

/// What a chart row is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    /// A process (pid and comm).
    Process,
    /// A container (its id; `[host]` for processes in none).
    Container,
    /// A pod (its UID; `[host]` for processes in none).
    Pod,
    /// A virtual machine (its name; `[host]` for processes that are none).
    Vm,
}

impl By {
    /// The name used in queries and responses.
    pub fn name(self) -> &'static str {
        match self {
            By::Process => "process",
            By::Container => "container",
            By::Pod => "pod",
            By::Vm => "vm",
        }
    }

    fn parse(text: &str, key: &str) -> Result<Self, String> {
        Ok(match text {
            "process" => By::Process,
            "container" => By::Container,
            "pod" => By::Pod,
            "vm" => By::Vm,
            other => {
                return Err(format!("{key}={other}: give process, container, pod or vm"));
            }
        })
    }
}

/// `/api/v1/series?range=SECS&by=process|container|pod&top=N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeriesQuery {
    /// Seconds back from now.
    pub range_s: u64,
    /// Row kind.
    pub by: By,
    /// Rows named.
    pub top: usize,
}

/// `/api/v1/profile?from=MS&to=MS[&row=PID | &by=container|pod|vm&name=NAME]`: unix
/// milliseconds, and a process id or a chart row's group (its name as the chart shows it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileQuery {
    /// Start, unix ms.
    pub from_ms: u64,
    /// End, unix ms.
    pub to_ms: u64,
    /// The process; `None` for every process (or the group's).
    pub pid: Option<u32>,
    /// A group of the chart: its kind and name.
    pub group: Option<(By, String)>,
    /// The group's processes over the range, as the chart's windows had them (filled in
    /// by the view before the profile is built).
    pub pids: Vec<u32>,
}

impl ProfileQuery {
    /// The processes it is of; empty for every process.
    pub fn processes(&self) -> Vec<u32> {
        match self.pid {
            Some(pid) => vec![pid],
            None => self.pids.clone(),
        }
    }
}

/// `/api/v1/diff?a_from=MS&a_to=MS&b_from=MS&b_to=MS[&a_row=PID&b_row=PID]`: two time
/// ranges, or two processes (over one or two ranges).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiffQuery {
    /// The base side.
    pub a: ProfileQuery,
    /// The new side.
    pub b: ProfileQuery,
}

/// The `key=value` pairs of a query string, percent-decoded; an error for a string over
/// [`MAX_QUERY_BYTES`], a repeated key or a bad escape.
pub fn pairs(query: &str) -> Result<Vec<(String, String)>, String> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(format!(
            "query string of {} bytes; at most {MAX_QUERY_BYTES}",
            query.len()
        ));
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for part in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        let (k, v) = (decode(k)?, decode(v)?);
        if out.iter().any(|(seen, _)| *seen == k) {
            return Err(format!("`{k}` given twice"));
        }
        out.push((k, v));
    }
    Ok(out)
}

fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| "a `%` not followed by two hex digits".to_string())?;
                out.push(hex);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| "query is not UTF-8".to_string())
}

fn get<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn number<T: std::str::FromStr>(
    pairs: &[(String, String)],
    key: &str,
) -> Result<Option<T>, String> {
    get(pairs, key)
        .map(|v| {
            v.parse()
                .map_err(|_| format!("`{key}={v}` is not a whole number"))
        })
        .transpose()
}

fn only(pairs: &[(String, String)], allowed: &[&str]) -> Result<(), String> {
    match pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        Some((k, _)) => Err(format!(
            "unknown parameter `{k}` (this endpoint takes {})",
            allowed.join(", ")
        )),
        None => Ok(()),
    }
}

/// Decodes a series query; defaults: the last 5 minutes, by process, top 10.
pub fn series(query: &str) -> Result<SeriesQuery, String> {
    let p = pairs(query)?;
    only(&p, &["range", "by", "top"])?;
    let range_s = number::<u64>(&p, "range")?.unwrap_or(300);
    if range_s == 0 || range_s > MAX_SERIES_RANGE_S {
        return Err(format!(
            "range={range_s} s: give 1 to {MAX_SERIES_RANGE_S} (a day)"
        ));
    }
    let by = By::parse(get(&p, "by").unwrap_or("process"), "by")?;
    let top = number::<usize>(&p, "top")?.unwrap_or(10);
    if top == 0 || top > MAX_TOP {
        return Err(format!("top={top}: give 1 to {MAX_TOP}"));
    }
    Ok(SeriesQuery { range_s, by, top })
}

/// The range and row of one side: keys `{side}from`, `{side}to`, `{side}row`, `{side}by`,
/// `{side}name`.
fn range(p: &[(String, String)], side: &str) -> Result<ProfileQuery, String> {
    let [from, to, row, by, name] =
        ["from", "to", "row", "by", "name"].map(|k| format!("{side}{k}"));
    let from_ms =
        number::<u64>(p, &from)?.ok_or_else(|| format!("`{from}` (unix ms) is missing"))?;
    let to_ms = number::<u64>(p, &to)?.ok_or_else(|| format!("`{to}` (unix ms) is missing"))?;
    if to_ms <= from_ms {
        return Err(format!("{to}={to_ms} is not after {from}={from_ms}"));
    }
    if to_ms - from_ms > MAX_PROFILE_RANGE_S * 1000 {
        return Err(format!(
            "{from}..{to} spans {} s; at most {MAX_PROFILE_RANGE_S} s (an hour) a request",
            (to_ms - from_ms) / 1000
        ));
    }
    let group = match (get(p, &by), get(p, &name)) {
        (None, None) => None,
        (Some(kind), Some(n)) => match By::parse(kind, &by)? {
            By::Process => return Err(format!("{by}=process: give {row}=PID instead")),
            kind if !n.is_empty() && n.len() <= 256 => Some((kind, n.to_string())),
            _ => return Err(format!("`{name}` must be 1 to 256 bytes")),
        },
        _ => return Err(format!("`{by}` and `{name}` go together")),
    };
    let pid = number::<u32>(p, &row)?;
    if pid.is_some() && group.is_some() {
        return Err(format!("give `{row}` or `{by}`+`{name}`, not both"));
    }
    Ok(ProfileQuery {
        from_ms,
        to_ms,
        pid,
        group,
        pids: Vec::new(),
    })
}

/// Decodes a profile query.
pub fn profile(query: &str) -> Result<ProfileQuery, String> {
    let p = pairs(query)?;
    only(&p, &["from", "to", "row", "by", "name"])?;
    range(&p, "")
}

/// Decodes a diff query.
pub fn diff(query: &str) -> Result<DiffQuery, String> {
    let p = pairs(query)?;
    let keys: Vec<String> = ["a_", "b_"]
        .iter()
        .flat_map(|s| ["from", "to", "row", "by", "name"].map(|k| format!("{s}{k}")))
        .collect();
    only(&p, &keys.iter().map(String::as_str).collect::<Vec<_>>())?;
    Ok(DiffQuery {
        a: range(&p, "a_")?,
        b: range(&p, "b_")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal's reason; a panic naming what was accepted.
    fn reason<T: std::fmt::Debug>(r: Result<T, String>) -> String {
        match r {
            Err(e) => e,
            Ok(v) => panic!("accepted: {v:?}"),
        }
    }

    #[test]
    fn series_queries_decode_with_defaults_and_caps() {
        assert_eq!(
            series(""),
            Ok(SeriesQuery {
                range_s: 300,
                by: By::Process,
                top: 10
            })
        );
        assert_eq!(
            series("range=3600&by=pod&top=50").map(|q| q.by),
            Ok(By::Pod)
        );
        assert!(reason(series("range=86401")).contains("a day"));
        assert!(reason(series("top=51")).contains("1 to 50"));
        assert_eq!(series("by=vm").map(|q| q.by), Ok(By::Vm));
        assert!(reason(series("by=node")).contains("process"));
        assert!(reason(series("range=-1")).contains("whole number"));
        assert!(reason(series("range=1&range=2")).contains("twice"));
        assert!(reason(series("bogus=1")).contains("unknown parameter"));
        assert!(reason(series(&"a".repeat(2000))).contains("at most"));
    }

    #[test]
    fn profile_and_diff_ranges_are_checked() {
        assert_eq!(
            profile("from=1000&to=2000&row=42"),
            Ok(ProfileQuery {
                from_ms: 1000,
                to_ms: 2000,
                pid: Some(42),
                ..Default::default()
            })
        );
        assert!(reason(profile("from=2000&to=1000")).contains("not after"));
        assert!(reason(profile("from=0&to=3600001")).contains("an hour"));
        assert!(reason(profile("to=5")).contains("missing"));
        assert!(reason(profile("from=%zz&to=1")).contains("hex"));
        let d = diff("a_from=1&a_to=2&b_from=3&b_to=4&b_row=7").expect("diff");
        assert_eq!((d.a.pid, d.b.pid), (None, Some(7)));
        // A chart row's group: its kind and name together, not with a pid.
        let q = profile("from=1&to=2&by=pod&name=a%2Fb").expect("group");
        assert_eq!(q.group, Some((By::Pod, "a/b".to_string())));
        assert!(reason(profile("from=1&to=2&by=pod")).contains("go together"));
        assert!(reason(profile("from=1&to=2&by=pod&name=x&row=3")).contains("not both"));
        assert!(reason(profile("from=1&to=2&by=process&name=x")).contains("row=PID"));
        assert!(reason(profile("from=1&to=2&by=vm&name=")).contains("1 to 256"));
        let d = diff("a_from=1&a_to=2&b_from=3&b_to=4&a_by=vm&a_name=web&b_by=vm&b_name=db")
            .expect("diff of groups");
        assert_eq!(d.b.group, Some((By::Vm, "db".to_string())));
    }
}
