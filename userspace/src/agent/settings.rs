//! What the agent runs with, as plain values: `commands/agent.rs` turns flags and the TOML
//! file into a [`Settings`], here are the types and the few parsers of their own syntax.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::feed::LiveConfig;

/// Everything the agent needs, merged from flags and the config file.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Window length.
    pub interval: Duration,
    /// Where `/metrics` is served (port 0: a free port, logged at start).
    pub metrics_addr: SocketAddr,
    /// At most this many processes get series of their own.
    pub max_process_series: usize,
    /// Capture: sample rate, energy sources, attribution options.
    pub live: LiveConfig,
    /// Unix socket of the snapshot server.
    pub socket: PathBuf,
    /// Rotating recordings, when asked for.
    pub record: Option<RecordSettings>,
}

/// `--record-dir DIR --retain DURATION|SIZE`.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordSettings {
    /// Directory of the rotating files.
    pub dir: PathBuf,
    /// How much is kept.
    pub retain: Retain,
}

/// How much of the rotating recordings is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retain {
    /// Files younger than this.
    Age(Duration),
    /// The newest files up to this many bytes in all.
    Size(u64),
}

impl Default for Retain {
    /// A day: enough to look back at yesterday's incident.
    fn default() -> Self {
        Retain::Age(Duration::from_secs(24 * 3600))
    }
}

/// A `--retain` or `--metrics-addr` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    /// Not a duration or size.
    #[error(
        "`{0}` is neither a duration (30m, 24h, 7d) nor a size (500MiB, 10G); units: s m h d w, B K M G T (KiB.. also)"
    )]
    Retain(String),
    /// Not an address.
    #[error("`{0}` is not HOST:PORT or :PORT (e.g. 127.0.0.1:9102, [::1]:9102, :0)")]
    Addr(String),
}

impl std::str::FromStr for Retain {
    type Err = SettingsError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || SettingsError::Retain(text.to_owned());
        let t = text.trim();
        let split = t
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: f64 = num.parse().map_err(|_| bad())?;
        if !n.is_finite() || n <= 0.0 {
            return Err(bad());
        }
        let secs = |k: f64| Ok(Retain::Age(Duration::from_secs_f64(n * k)));
        let bytes = |k: f64| Ok(Retain::Size((n * k) as u64));
        match unit.trim() {
            "s" => secs(1.0),
            "m" | "min" => secs(60.0),
            "h" => secs(3600.0),
            "d" => secs(86_400.0),
            "w" => secs(7.0 * 86_400.0),
            "" | "B" => bytes(1.0),
            "K" | "KB" => bytes(1e3),
            "M" | "MB" => bytes(1e6),
            "G" | "GB" => bytes(1e9),
            "T" | "TB" => bytes(1e12),
            "KiB" => bytes(1024.0),
            "MiB" => bytes(1024.0 * 1024.0),
            "GiB" => bytes(1024.0 * 1024.0 * 1024.0),
            "TiB" => bytes(1024.0 * 1024.0 * 1024.0 * 1024.0),
            _ => Err(bad()),
        }
    }
}

/// `HOST:PORT`, or `:PORT` for loopback. Unlike Go's `:PORT` (every interface), a bare
/// port stays on loopback: the metrics name every process on the machine, so exposing
/// them is a choice one writes out (`0.0.0.0:9102`).
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, SettingsError> {
    let full = match text.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => text.to_owned(),
    };
    full.parse()
        .map_err(|_| SettingsError::Addr(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retain_values() {
        let h = |s| Retain::Age(Duration::from_secs(s));
        let cases: &[(&str, Result<Retain, ()>)] = &[
            ("30m", Ok(h(1800))),
            ("24h", Ok(h(86_400))),
            ("7d", Ok(h(604_800))),
            ("1w", Ok(h(604_800))),
            ("90s", Ok(h(90))),
            ("1.5h", Ok(h(5400))),
            ("500MiB", Ok(Retain::Size(500 * 1024 * 1024))),
            ("10G", Ok(Retain::Size(10_000_000_000))),
            ("4096", Ok(Retain::Size(4096))),
            ("0h", Err(())),
            ("h", Err(())),
            ("12 parsecs", Err(())),
            ("-1d", Err(())),
        ];
        for (text, want) in cases {
            let got = text.parse::<Retain>().map_err(|_| ());
            assert_eq!(&got, want, "{text}");
        }
    }

    #[test]
    fn metrics_addresses() {
        assert_eq!(
            parse_metrics_addr(":0").map(|a| a.to_string()),
            Ok("127.0.0.1:0".into())
        );
        assert_eq!(
            parse_metrics_addr("0.0.0.0:9102").map(|a| a.to_string()),
            Ok("0.0.0.0:9102".into())
        );
        assert_eq!(
            parse_metrics_addr("[::1]:9102").map(|a| a.to_string()),
            Ok("[::1]:9102".into())
        );
        assert!(parse_metrics_addr("localhost").is_err());
    }
}
