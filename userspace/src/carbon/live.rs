//! The live intensity source, in the Electricity Maps API shape:
//! `GET {base}/v3/carbon-intensity/latest?zone=Z` and `.../history?zone=Z` (the last 24 h),
//! with the token from a file sent as `auth-token` (never on the command line).
//!
//! HTTPS only, verified against the system's roots or `--carbon-ca FILE`. Answers are
//! cached (a bounded [`Series`] of the points seen), a failing source is retried with
//! exponential back-off, and meanwhile the intensity falls back to the last known live
//! value or the zone's yearly average, labelled as such. A failure is said once per outage
//! (`tracing` warning), not once per window.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use serde::Deserialize;

use super::{Intensity, parse_time, series::Series, valid_intensity, zones::Zone};

/// Time for connect, TLS and the whole answer.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read.
pub const MAX_BYTES: usize = 1 << 20;
/// Largest token file read.
const MAX_TOKEN_BYTES: u64 = 64 << 10;
/// First and longest wait before retrying a failing source.
const BACKOFF_MIN: Duration = Duration::from_secs(10);
const BACKOFF_MAX: Duration = Duration::from_secs(30 * 60);
/// A last known value older than this is not used as the fallback.
const LAST_KNOWN_MAX_AGE_NS: u64 = 24 * 3_600_000_000_000;

/// Why an answer was not an intensity.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DecodeError {
    /// Not the JSON expected.
    #[error("not an Electricity Maps answer: {0}")]
    Json(String),
    /// A time stamp that is not one.
    #[error("`{0}` is not a time")]
    Time(String),
    /// An intensity out of range.
    #[error("{0} g/kWh is not a plausible intensity")]
    Value(f64),
    /// No point with a value.
    #[error("no intensity in the answer")]
    Empty,
}

#[derive(Deserialize)]
struct Point {
    #[serde(rename = "carbonIntensity")]
    carbon_intensity: Option<f64>,
    datetime: String,
}

#[derive(Deserialize)]
struct History {
    history: Vec<Point>,
}

fn point(p: &Point) -> Result<Option<(u64, f64)>, DecodeError> {
    let Some(g) = p.carbon_intensity else {
        return Ok(None);
    };
    if !valid_intensity(g) {
        return Err(DecodeError::Value(g));
    }
    let at = parse_time(&p.datetime).ok_or_else(|| DecodeError::Time(p.datetime.clone()))?;
    Ok(Some((at, g)))
}

/// Decodes a `carbon-intensity/latest` answer: (Unix ns, gCO2e/kWh).
pub fn decode_latest(bytes: &[u8]) -> Result<(u64, f64), DecodeError> {
    let p: Point = serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
    point(&p)?.ok_or(DecodeError::Empty)
}

/// Decodes a `carbon-intensity/history` answer: its points, any order.
pub fn decode_history(bytes: &[u8]) -> Result<Vec<(u64, f64)>, DecodeError> {
    let h: History = serde_json::from_slice(bytes).map_err(|e| DecodeError::Json(e.to_string()))?;
    let mut out = Vec::with_capacity(h.history.len().min(super::series::MAX_POINTS));
    for p in h.history.iter().take(super::series::MAX_POINTS) {
        if let Some(x) = point(p)? {
            out.push(x);
        }
    }
    if out.is_empty() {
        return Err(DecodeError::Empty);
    }
    Ok(out)
}

/// Where and how to ask.
#[derive(Clone, Debug)]
pub struct Config {
    /// Base URL (`https://api.electricitymaps.com`).
    pub base: String,
    /// Zone asked for (`FR`).
    pub zone: String,
    /// File holding the API token.
    pub token_file: Option<PathBuf>,
    /// PEM file of CA certificates to trust instead of the system's.
    pub ca: Option<PathBuf>,
    /// How often the latest value is asked for.
    pub refresh: Duration,
}

/// An HTTPS GET client for one base URL.
struct Client {
    host: String,
    port: u16,
    base_path: String,
    server_name: ServerName<'static>,
    tls: tokio_rustls::TlsConnector,
    token_file: Option<PathBuf>,
}

impl Client {
    fn new(cfg: &Config) -> Result<Self, String> {
        let uri: http::Uri = cfg
            .base
            .parse()
            .map_err(|_| format!("`{}` is not a URL", cfg.base))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!(
                "`{}`: only https:// is supported (the intensity is fetched verified)",
                cfg.base
            ));
        }
        let host = uri
            .host()
            .ok_or_else(|| format!("`{}` has no host", cfg.base))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let server_name = ServerName::try_from(host.clone())
            .map_err(|_| format!("`{host}` is not a DNS name or IP"))?;
        let mut roots = rustls::RootCertStore::empty();
        match &cfg.ca {
            Some(ca) => {
                let bad = |e: String| format!("CA file {}: {e}", ca.display());
                for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(e.to_string()))? {
                    roots
                        .add(cert.map_err(|e| bad(e.to_string()))?)
                        .map_err(|e| bad(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(bad("no certificate in it".into()));
                }
            }
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
                if roots.is_empty() {
                    return Err(
                        "no CA certificates found on this system; give one with --carbon-ca".into(),
                    );
                }
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Self {
            host,
            port,
            base_path: uri.path().trim_end_matches('/').to_string(),
            server_name,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            token_file: cfg.token_file.clone(),
        })
    }

    /// GETs `path_and_query` under the base URL, within [`TIMEOUT`].
    fn get(&self, path_and_query: &str) -> Result<Bytes, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("runtime: {e}"))?;
        rt.block_on(async {
            tokio::time::timeout(TIMEOUT, self.get_inner(path_and_query))
                .await
                .map_err(|_| format!("no answer within {TIMEOUT:?}"))?
        })
    }

    async fn get_inner(&self, path_and_query: &str) -> Result<Bytes, String> {
        let token = match &self.token_file {
            Some(path) => Some(read_token(path)?),
            None => None,
        };
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| format!("TLS: {e}"))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| e.to_string())?;
        let driver = tokio::spawn(conn);
        let mut req = http::Request::get(format!("{}{path_and_query}", self.base_path))
            .header(http::header::HOST, self.host.as_str())
            .header(http::header::ACCEPT, "application/json");
        if let Some(t) = token {
            req = req.header("auth-token", t);
        }
        let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
        let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        if !status.is_success() {
            driver.abort();
            return Err(format!("HTTP status {}", status.as_u16()));
        }
        let body = Limited::new(resp.into_body(), MAX_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        driver.abort();
        Ok(body)
    }
}

fn read_token(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES).read_to_string(&mut text))
        .map_err(|e| format!("token file {}: {e}", path.display()))?;
    let token = text.trim();
    if token.is_empty() || token.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "token file {}: empty or not a token",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// What the source has learnt, shared with the refreshing thread.
#[derive(Default)]
struct State {
    /// Points seen (history and latest), bounded.
    seen: Series,
    /// The latest answer: (its time, Unix ns; g/kWh).
    latest: Option<(u64, f64)>,
    /// The current outage, if any: what failed.
    failing: Option<String>,
    /// Whether the current outage was said.
    warned: bool,
    /// When the source may be asked again, and the wait after the next failure.
    next_try: Option<Instant>,
    backoff: Duration,
    /// Whether history was asked for (reports ask once).
    history_asked: bool,
    /// Whether a window the history does not cover was said.
    uncovered_warned: bool,
}

impl State {
    fn failed(&mut self, what: String, zone: &str, fallback: &str) {
        if !self.warned {
            tracing::warn!(
                "carbon intensity source for {zone} failing ({what}); using {fallback} until it answers again"
            );
            self.warned = true;
        }
        self.failing = Some(what);
        self.backoff = (self.backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
        self.next_try = Some(Instant::now() + self.backoff);
    }

    fn answered(&mut self, zone: &str) {
        if self.failing.take().is_some() && self.warned {
            tracing::warn!("carbon intensity source for {zone} answers again");
        }
        self.warned = false;
        self.backoff = Duration::ZERO;
        self.next_try = None;
    }

    fn remember(&mut self, mut points: Vec<(u64, f64)>) {
        points.extend_from_slice(self.seen.points());
        self.seen = Series::from_points(points);
    }

    fn may_try(&self) -> bool {
        self.next_try.is_none_or(|t| Instant::now() >= t)
    }
}

/// The live source.
pub struct Live {
    cfg: Config,
    client: Option<Client>,
    /// The zone's yearly average, the fallback of last resort.
    yearly: Option<Zone>,
    /// A fixed value given as the fallback (`--carbon-intensity` beside `--carbon-api`).
    fixed: Option<f64>,
    state: Arc<Mutex<State>>,
    refresher: Option<std::thread::JoinHandle<()>>,
}

impl Live {
    /// A live source; fails when it has nothing to fall back to, or on a bad URL or CA.
    pub fn new(cfg: Config, fixed: Option<f64>) -> anyhow::Result<Self> {
        let yearly = super::zones::lookup(&cfg.zone).ok();
        anyhow::ensure!(
            yearly.is_some() || fixed.is_some(),
            "zone `{}` has no yearly average to fall back to when the live source fails; give one with --carbon-intensity",
            cfg.zone
        );
        let client = Client::new(&cfg).map_err(|e| anyhow::anyhow!("--carbon-api: {e}"))?;
        Ok(Self {
            cfg,
            client: Some(client),
            yearly,
            fixed,
            state: Arc::default(),
            refresher: None,
        })
    }

    fn fallback_label(&self) -> String {
        match (&self.fixed, &self.yearly) {
            (Some(g), _) => format!("fixed {g} g/kWh"),
            (None, Some(z)) => z.label(),
            (None, None) => "nothing".into(),
        }
    }

    /// The fallback when the source fails: the last known value (younger than a day), else
    /// the fixed value or the yearly average.
    fn fallback(&self, state: &State, now_ns: u64) -> Intensity {
        let why = state
            .failing
            .clone()
            .unwrap_or_else(|| "no answer yet".into());
        if let Some((at, g)) = state
            .latest
            .filter(|(at, _)| now_ns.saturating_sub(*at) < LAST_KNOWN_MAX_AGE_NS)
        {
            return Intensity {
                g_per_kwh: g,
                source: format!(
                    "fallback: last live value {}, {} (live source: {why})",
                    self.cfg.zone,
                    age(now_ns, at)
                ),
                pue: 1.0,
                fallback: true,
            };
        }
        let g = self
            .fixed
            .or(self.yearly.as_ref().map(|z| z.g_per_kwh))
            .unwrap_or(0.0);
        Intensity {
            g_per_kwh: g,
            source: format!("fallback: {} (live source: {why})", self.fallback_label()),
            pue: 1.0,
            fallback: true,
        }
    }

    fn fetch_latest(client: &Client, cfg: &Config, state: &Mutex<State>, fallback: &str) {
        let got = client
            .get(&format!("/v3/carbon-intensity/latest?zone={}", cfg.zone))
            .and_then(|b| decode_latest(&b).map_err(|e| e.to_string()));
        let mut s = state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match got {
            Ok(p) => {
                s.answered(&cfg.zone);
                s.latest = Some(p);
                s.remember(vec![p]);
            }
            Err(e) => s.failed(e, &cfg.zone, fallback),
        }
    }

    /// The latest intensity, for live windows. The first call starts a thread that asks
    /// every refresh period (or after the back-off); the window never waits on the network.
    pub fn latest(&mut self, now_ns: u64) -> Intensity {
        if self.refresher.is_none()
            && let Some(client) = self.client.take()
        {
            let (cfg, state, fallback) =
                (self.cfg.clone(), self.state.clone(), self.fallback_label());
            // The first answer (or failure) before the first window, within the timeout.
            Self::fetch_latest(&client, &cfg, &state, &fallback);
            self.refresher = std::thread::Builder::new()
                .name("carbon-live".into())
                .spawn(move || {
                    loop {
                        let wait = {
                            let s = state
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner);
                            match s.next_try {
                                Some(t) => t.saturating_duration_since(Instant::now()),
                                None => cfg.refresh,
                            }
                        };
                        std::thread::sleep(wait.max(Duration::from_millis(100)));
                        Self::fetch_latest(&client, &cfg, &state, &fallback);
                    }
                })
                .ok();
        }
        let s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (s.failing.is_none(), s.latest) {
            (true, Some((at, g))) => Intensity {
                g_per_kwh: g,
                source: format!("live {}, {}", self.cfg.zone, age(now_ns, at)),
                pue: 1.0,
                fallback: false,
            },
            _ => self.fallback(&s, now_ns),
        }
    }

    /// The intensity over a past span (reports): from the zone's history, asked once.
    pub fn over(&mut self, start_ns: u64, end_ns: u64) -> Intensity {
        let mut s = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !s.history_asked && s.may_try() {
            s.history_asked = true;
            if let Some(client) = &self.client {
                let got = client
                    .get(&format!(
                        "/v3/carbon-intensity/history?zone={}",
                        self.cfg.zone
                    ))
                    .and_then(|b| decode_history(&b).map_err(|e| e.to_string()));
                match got {
                    Ok(points) => {
                        s.answered(&self.cfg.zone);
                        s.latest = points.iter().copied().max_by_key(|p| p.0);
                        s.remember(points);
                    }
                    Err(e) => s.failed(e, &self.cfg.zone, &self.fallback_label()),
                }
            }
        }
        if s.failing.is_some() {
            return self.fallback(&s, end_ns);
        }
        if let Some(g) = s.seen.over(start_ns, end_ns) {
            return Intensity {
                g_per_kwh: g,
                source: format!("live history {}", self.cfg.zone),
                pue: 1.0,
                fallback: false,
            };
        }
        if !s.uncovered_warned {
            tracing::warn!(
                "carbon intensity history for {} does not cover all of the recording; using {} where it does not",
                self.cfg.zone,
                self.fallback_label()
            );
            s.uncovered_warned = true;
        }
        Intensity {
            g_per_kwh: self
                .fixed
                .or(self.yearly.as_ref().map(|z| z.g_per_kwh))
                .unwrap_or(0.0),
            source: format!(
                "fallback: {} (live history does not cover this window)",
                self.fallback_label()
            ),
            pue: 1.0,
            fallback: true,
        }
    }
}

/// `5 min old`.
fn age(now_ns: u64, at_ns: u64) -> String {
    let secs = now_ns.saturating_sub(at_ns) / 1_000_000_000;
    if secs < 60 {
        format!("{secs} s old")
    } else if secs < 3 * 3600 {
        format!("{} min old", secs / 60)
    } else {
        format!("{} h old", secs / 3600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_and_history_answers_decode() {
        let latest = br#"{"zone":"FR","carbonIntensity":45,"datetime":"2024-05-14T09:00:00.000Z","updatedAt":"2024-05-14T09:12:00.000Z","isEstimated":true}"#;
        assert_eq!(decode_latest(latest), Ok((1_715_677_200_000_000_000, 45.0)));
        let history = br#"{"zone":"FR","history":[
            {"carbonIntensity":40,"datetime":"2024-05-14T08:00:00.000Z"},
            {"carbonIntensity":null,"datetime":"2024-05-14T09:00:00.000Z"},
            {"carbonIntensity":45,"datetime":"2024-05-14T10:00:00.000Z"}]}"#;
        assert_eq!(decode_history(history).expect("history").len(), 2);
    }

    #[test]
    fn garbage_and_implausible_answers_are_errors() {
        assert!(matches!(
            decode_latest(b"<html>"),
            Err(DecodeError::Json(_))
        ));
        assert!(matches!(
            decode_latest(br#"{"carbonIntensity":-3,"datetime":"2024-05-14T09:00:00Z"}"#),
            Err(DecodeError::Value(_))
        ));
        assert!(matches!(
            decode_latest(br#"{"carbonIntensity":3,"datetime":"soon"}"#),
            Err(DecodeError::Time(_))
        ));
        assert_eq!(
            decode_history(br#"{"history":[]}"#),
            Err(DecodeError::Empty)
        );
    }

    #[test]
    fn plain_http_and_unknown_zones_without_a_fallback_are_refused() {
        let cfg = |base: &str, zone: &str| Config {
            base: base.into(),
            zone: zone.into(),
            token_file: None,
            ca: None,
            refresh: Duration::from_secs(300),
        };
        let e = Live::new(cfg("http://127.0.0.1:1", "FR"), None)
            .err()
            .expect("http");
        assert!(e.to_string().contains("https"), "{e}");
        let e = Live::new(cfg("https://127.0.0.1:1", "XX-NONE"), None)
            .err()
            .expect("zone");
        assert!(e.to_string().contains("fall back"), "{e}");
    }
}
