//! The agent's own web view, on the metrics listener: `/` is a page (HTML, script and style
//! embedded in the binary, nothing fetched from elsewhere) that charts power over time from
//! the agent's own windows ([`ring`]), draws a row's energy flamegraph for a time range from
//! the rotating recordings, or without them from the recent windows' stacks kept in memory
//! ([`recent`]), ([`profile`]) and compares two ranges or two processes as a differential
//! flamegraph (with `diff`'s significance marks, from recordings). Its JSON API
//! (`/api/v1/series`, `/api/v1/profile`, `/api/v1/diff`, decoded by [`api`]) is bounded in
//! range, rows and response size; a request over a bound gets 400 and the reason.
//!
//! Security: served on loopback by default. On another address the agent refuses to start
//! unless a token is configured (`--web-token-file`) or the view is turned off (`--no-web`);
//! with a token, the API answers only `Authorization: Bearer TOKEN` (401 otherwise). The
//! page and its assets hold no data. Only GET and HEAD are served; every answer carries a
//! Content-Security-Policy that allows this origin's script and style only.

pub mod api;
pub(crate) mod profile;
pub(crate) mod recent;
pub(crate) mod ring;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use hyper::StatusCode;

use super::sink::{Sink, SinkError};
use super::stacks::StackTables;
use crate::{pb::v1 as pb, pipeline::Window};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The Content-Security-Policy of every answer: this origin's script, style and fetches;
/// no frames, no forms, no plugins.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An answer: status, content type, body.
pub type Answer = (StatusCode, &'static str, Vec<u8>);

/// `--web-token-file FILE`, `--no-web`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WebSettings {
    /// Serve the web view at `/` (false: `--no-web`).
    pub enabled: bool,
    /// The bearer token its API asks for, when configured.
    pub token: Option<String>,
}

/// Why the agent refuses to serve the web view where it was asked to.
pub fn check_exposure(addr: SocketAddr, token: Option<&str>, enabled: bool) -> Result<(), String> {
    if !enabled || addr.ip().is_loopback() || token.is_some_and(|t| !t.is_empty()) {
        return Ok(());
    }
    Err(format!(
        "--metrics-addr {addr} is not loopback, and the web view there names every process of this machine: give a token with --web-token-file FILE (clients send `Authorization: Bearer TOKEN`), or serve /metrics alone with --no-web"
    ))
}

/// Reads a token file: its first line, trimmed; an error for an empty file.
pub fn read_token(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the web token file {}: {e}", path.display()))?;
    let token = text.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        return Err(format!("the web token file {} is empty", path.display()));
    }
    Ok(token)
}

/// The web view's state: the ring of windows, where recordings are (or the recent
/// windows' stacks, without them), the token.
pub struct WebView {
    ring: Mutex<ring::Ring>,
    record_dir: Option<PathBuf>,
    recent: Mutex<recent::Recent>,
    token: Option<String>,
}

impl WebView {
    /// A view with no windows yet.
    pub fn new(record_dir: Option<PathBuf>, token: Option<String>) -> Arc<Self> {
        Arc::new(Self {
            ring: Mutex::new(ring::Ring::default()),
            record_dir,
            recent: Mutex::new(recent::Recent::new(recent::CAP_BYTES)),
            token,
        })
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, recent::Recent> {
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Fills in the processes of `q`'s group from the chart's windows over its range.
    fn resolve(&self, q: &mut api::ProfileQuery) -> Result<(), String> {
        let Some((by, name)) = &q.group else {
            return Ok(());
        };
        q.pids = self.ring().pids_of(*by, name, q.from_ms, q.to_ms);
        if q.pids.is_empty() {
            return Err(format!(
                "no process of {} `{name}` in the chart's windows of that range",
                by.name()
            ));
        }
        Ok(())
    }

    /// Whether flamegraphs come from the stacks kept in memory (no recordings).
    fn keeps_stacks(&self) -> bool {
        self.record_dir.is_none()
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, ring::Ring> {
        self.ring
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Adds a window's rows.
    pub fn push(&self, end_ms: u64, estimated: bool, rows: Vec<ring::Row>) {
        self.ring().push(end_ms, estimated, rows);
    }

    fn authorized(&self, authorization: Option<&str>) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let Some(given) = authorization.and_then(|a| a.strip_prefix("Bearer ")) else {
            return false;
        };
        // Compared in time that does not depend on where they differ.
        given.len() == token.len()
            && given
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }

    /// The answer to `path?query`, or `None` when the path is not the web view's.
    pub fn answer(
        self: &Arc<Self>,
        path: &str,
        query: &str,
        authorization: Option<&str>,
    ) -> Option<Answer> {
        let text = |status, body: String| (status, "text/plain; charset=utf-8", body.into_bytes());
        match path {
            "/" | "/index.html" => {
                return Some((
                    StatusCode::OK,
                    "text/html; charset=utf-8",
                    INDEX_HTML.as_bytes().to_vec(),
                ));
            }
            "/app.js" => {
                return Some((
                    StatusCode::OK,
                    "text/javascript; charset=utf-8",
                    APP_JS.as_bytes().to_vec(),
                ));
            }
            "/app.css" => {
                return Some((
                    StatusCode::OK,
                    "text/css; charset=utf-8",
                    APP_CSS.as_bytes().to_vec(),
                ));
            }
            "/api/v1/series" | "/api/v1/profile" | "/api/v1/diff" => {}
            _ => return None,
        }
        if !self.authorized(authorization) {
            return Some(text(
                StatusCode::UNAUTHORIZED,
                "a token is required: send `Authorization: Bearer TOKEN` (the one in --web-token-file)\n".into(),
            ));
        }
        let json = |value: Result<Vec<u8>, String>| match value {
            Ok(body) if body.len() > api::MAX_RESPONSE_BYTES => text(
                StatusCode::BAD_REQUEST,
                format!(
                    "the answer would be {} bytes, over the {} byte cap: ask for a shorter range or fewer rows\n",
                    body.len(),
                    api::MAX_RESPONSE_BYTES
                ),
            ),
            Ok(body) => (StatusCode::OK, "application/json", body),
            Err(reason) => text(StatusCode::BAD_REQUEST, format!("{reason}\n")),
        };
        let encode = |v: Result<Vec<u8>, serde_json::Error>| v.map_err(|e| e.to_string());
        Some(match path {
            "/api/v1/series" => json(api::series(query).and_then(|q| {
                let resp = self
                    .ring()
                    .series(&q, crate::clock::realtime_ns() / 1_000_000);
                encode(serde_json::to_vec(&resp))
            })),
            "/api/v1/profile" => json(api::profile(query).and_then(|mut q| {
                self.resolve(&mut q)?;
                let r = match &self.record_dir {
                    Some(dir) => profile::profile(dir, &q)?,
                    None => {
                        let (from, to) = profile::range_ns(&q);
                        let found = self.recent().overlapping(from, to);
                        profile::recent(found, &q)?
                    }
                };
                encode(serde_json::to_vec(&r))
            })),
            _ => json(api::diff(query).and_then(|mut q| {
                self.resolve(&mut q.a)?;
                self.resolve(&mut q.b)?;
                let r = match &self.record_dir {
                    Some(dir) => profile::compare(dir, &q.a, &q.b)?,
                    None => {
                        let side = |p: &api::ProfileQuery| {
                            let (from, to) = profile::range_ns(p);
                            self.recent().overlapping(from, to)
                        };
                        profile::compare_recent(side(&q.a), &q.a, side(&q.b), &q.b)?
                    }
                };
                encode(serde_json::to_vec(&r))
            })),
        })
    }
}

/// Feeds the web view's ring from the capture loop, and its store of recent stacks when
/// the agent keeps no recordings.
pub struct WebSink {
    view: Arc<WebView>,
    tables: Option<StackTables>,
    names: Option<Arc<crate::kube::Resolver>>,
}

impl WebSink {
    /// Feeds `view`.
    pub fn new(view: Arc<WebView>) -> Self {
        let tables = view.keeps_stacks().then(StackTables::default);
        Self {
            view,
            tables,
            names: None,
        }
    }

    /// Names pods `namespace/name` where `names` knows them (their UID otherwise).
    pub fn with_names(mut self, names: Option<Arc<crate::kube::Resolver>>) -> Self {
        self.names = names;
        self
    }
}

impl Sink for WebSink {
    fn name(&self) -> &'static str {
        "web"
    }

    fn chunk(&mut self, chunk: &pb::Chunk) -> Result<(), SinkError> {
        if let Some(t) = &mut self.tables {
            t.chunk(chunk);
        }
        Ok(())
    }

    fn window(&mut self, w: &Window, header: &pb::Header) -> Result<(), SinkError> {
        let secs = w.totals.duration_ns as f64 / 1e9;
        let per_s = if secs > 0.0 { 1.0 / secs } else { 0.0 };
        let estimated = w
            .analysis
            .sources
            .iter()
            .any(crate::energy::model::is_model);
        let rows = w
            .processes
            .iter()
            .map(|p| ring::Row {
                key: ring::RowKey {
                    pid: p.pid,
                    comm: p.comm.clone(),
                    container: p.container_id.clone(),
                    pod: self
                        .names
                        .as_ref()
                        .and_then(|r| r.names(&p.container()))
                        .map_or_else(
                            || p.pod_uid.clone(),
                            |n| format!("{}/{}", n.namespace, n.pod),
                        ),
                    vm: crate::vm::rows::vm_name(p).unwrap_or_default(),
                },
                watts: p.power_w,
                ci_w: [p.ci_j[0] * per_s, p.ci_j[1] * per_s],
            })
            .collect();
        self.view
            .push(crate::clock::realtime_ns() / 1_000_000, estimated, rows);
        if let Some(tables) = &mut self.tables {
            let start_unix_ns = header
                .start_unix_ns
                .saturating_add(w.start_ns().saturating_sub(header.start_ns));
            let batch = tables.batch(w, header, start_unix_ns);
            tables.forget_exited(w);
            self.view.recent().push(batch);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposure_needs_loopback_a_token_or_no_web() {
        let any: SocketAddr = "0.0.0.0:9102".parse().expect("addr");
        let lo: SocketAddr = "127.0.0.1:9102".parse().expect("addr");
        assert!(check_exposure(lo, None, true).is_ok());
        assert!(check_exposure("[::1]:1".parse().expect("addr"), None, true).is_ok());
        let Err(err) = check_exposure(any, None, true) else {
            panic!("exposed without a token");
        };
        assert!(
            err.contains("--web-token-file") && err.contains("--no-web"),
            "{err}"
        );
        assert!(check_exposure(any, Some(""), true).is_err());
        assert!(check_exposure(any, Some("s3cret"), true).is_ok());
        assert!(check_exposure(any, None, false).is_ok());
    }

    #[test]
    fn the_api_wants_the_token_and_says_why_it_refuses() {
        let view = WebView::new(None, Some("s3cret".into()));
        let status =
            |auth: Option<&str>, path: &str, q: &str| view.answer(path, q, auth).map(|(s, _, _)| s);
        assert_eq!(status(None, "/", ""), Some(StatusCode::OK));
        assert_eq!(status(None, "/metrics", ""), None);
        assert_eq!(
            status(None, "/api/v1/series", ""),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(Some("Bearer wrong!"), "/api/v1/series", ""),
            Some(StatusCode::UNAUTHORIZED)
        );
        assert_eq!(
            status(Some("Bearer s3cret"), "/api/v1/series", ""),
            Some(StatusCode::OK)
        );
        let (s, _, body) = view
            .answer("/api/v1/series", "range=999999", Some("Bearer s3cret"))
            .expect("answer");
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(String::from_utf8_lossy(&body).contains("a day"));
        let (s, _, body) = view
            .answer("/api/v1/profile", "from=1&to=2", Some("Bearer s3cret"))
            .expect("answer");
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(
            String::from_utf8_lossy(&body).contains("--record-dir"),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }

    #[test]
    fn assets_are_embedded_and_fetch_nothing_from_elsewhere() {
        for asset in [INDEX_HTML, APP_JS, APP_CSS] {
            // The SVG namespace is a name, not a fetch.
            let asset = asset.replace("http://www.w3.org/2000/svg", "");
            assert!(!asset.contains("http://") && !asset.contains("https://"));
        }
        assert!(INDEX_HTML.contains("app.js") && APP_JS.contains("estimated"));
    }
}
