//! What the agent runs with, as plain values: `commands/agent.rs` turns flags and the TOML
//! file into a [`Settings`]. `--retain` is the rotating recorder's [`Retain`].

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::capture::LiveConfig;
pub use crate::record::rotate::Retain;

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
    /// OTLP profile export, when asked for.
    pub otlp: Option<OtlpSettings>,
    /// Where state that outlives a restart is kept (the learned static power).
    pub state_dir: PathBuf,
    /// Where pod names come from, when asked for.
    pub kube: Option<crate::kube::KubeSettings>,
    /// The web view at `/`: whether it is served, and the token its API asks for.
    pub web: crate::agent::web::WebSettings,
    /// Virtual machines: the share of per-VM directories and the static share policy.
    pub vm: crate::agent::vms::VmSettings,
}

/// `--otlp-endpoint URL --otlp-header K=V --otlp-insecure --profile-interval SECS`.
#[derive(Clone, Debug, PartialEq)]
pub struct OtlpSettings {
    /// Where and how.
    pub export: crate::agent::otlp::transport::ExportConfig,
    /// Windows per exported profile, as time.
    pub profile_interval: Duration,
}

/// `--record-dir DIR --retain DURATION|SIZE`.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordSettings {
    /// Directory of the rotating files.
    pub dir: PathBuf,
    /// How much is kept.
    pub retain: Retain,
}

/// A `--retain` or `--metrics-addr` value that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SettingsError {
    /// Not an address.
    #[error("`{0}` is not HOST:PORT or :PORT (e.g. 127.0.0.1:9102, [::1]:9102, :0)")]
    Addr(String),
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
