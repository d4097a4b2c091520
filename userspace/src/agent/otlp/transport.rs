//! Pushes OTLP profiles to a collector over gRPC (`ProfilesService/Export`), never in the
//! way of capture.
//!
//! The agent hands each window's request to [`Exporter::push`], which only queues it. A
//! bounded queue (drop-oldest, counted, logged once per burst) sits between capture and a
//! tokio task that sends: one request at a time, gzip-compressed, with a per-call timeout,
//! retrying with exponential backoff and jitter. A collector that is down, slow, or answers
//! garbage costs at most the queue's windows of memory and a counter going up.
//!
//! Security: `http://` is refused for anything but loopback unless the user says
//! `--otlp-insecure`; `https://` uses rustls with the system's roots. Headers (bearer
//! tokens) are sent as gRPC metadata and never logged.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::sync::Notify;
use tonic::{
    codec::CompressionEncoding,
    metadata::{MetadataKey, MetadataValue},
    transport::{Channel, ClientTlsConfig, Endpoint},
};

use crate::pb::otlp::collector::profiles::v1development::{
    ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};

/// The gRPC method OTLP profiles are sent to.
const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// Where and how to export.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportConfig {
    /// `http://host:port` (loopback only, unless `insecure`) or `https://host:port`.
    pub endpoint: String,
    /// gRPC metadata sent with every call (e.g. `authorization: Bearer ...`).
    pub headers: Vec<(String, String)>,
    /// Allow plaintext to a non-loopback address.
    pub insecure: bool,
    /// Windows waiting at most; older ones are dropped first.
    pub queue_windows: usize,
    /// Per-call deadline.
    pub timeout: Duration,
}

impl Default for ExportConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            headers: Vec::new(),
            insecure: false,
            queue_windows: 8,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why export cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The endpoint is not a URL we can use.
    #[error("--otlp-endpoint `{endpoint}`: {why}")]
    Endpoint {
        /// The endpoint given.
        endpoint: String,
        /// What is wrong with it.
        why: String,
    },
    /// Plaintext to a remote host without `--otlp-insecure`.
    #[error(
        "--otlp-endpoint `{endpoint}` is plaintext http:// to a host that is not loopback; use https://, or pass --otlp-insecure if the network is trusted"
    )]
    Plaintext {
        /// The endpoint given.
        endpoint: String,
    },
    /// A header that gRPC metadata cannot carry.
    #[error(
        "--otlp-header `{key}`: not a valid gRPC metadata key or value (values are never shown)"
    )]
    Header {
        /// The header's key.
        key: String,
    },
}

/// What the exporter counts (self-metrics read these).
#[derive(Debug, Default)]
pub struct ExportStats {
    /// Requests the collector accepted.
    pub sent: AtomicU64,
    /// Windows dropped because the queue was full.
    pub dropped: AtomicU64,
    /// Calls that failed (each is retried).
    pub failed: AtomicU64,
    /// Windows waiting now.
    pub queue_depth: AtomicU64,
}

struct Queue {
    items: Mutex<VecDeque<ExportProfilesServiceRequest>>,
    ready: Notify,
    /// A drop burst is logged once, until a send succeeds again.
    dropping: AtomicBool,
    /// Most requests held, the one being retried included.
    capacity: usize,
}

impl Queue {
    /// Counts one dropped window; the first of a burst is logged.
    fn dropped(&self, stats: &ExportStats) {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        if !self.dropping.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "OTLP export is behind: dropping the oldest windows (queue of {}); counted in energy_bpf_export_total{{outcome=\"dropped\"}}",
                self.capacity
            );
        }
    }
}

/// A running exporter.
pub struct Exporter {
    queue: Arc<Queue>,
    stats: Arc<ExportStats>,
}

/// Parses `K=V` (from `--otlp-header`).
pub fn parse_header(text: &str) -> Result<(String, String), String> {
    let (k, v) = text
        .split_once('=')
        .ok_or_else(|| "expected KEY=VALUE, e.g. authorization=Bearer TOKEN".to_string())?;
    if k.trim().is_empty() {
        return Err("the header name is empty".into());
    }
    Ok((k.trim().to_ascii_lowercase(), v.to_string()))
}

impl Exporter {
    /// Checks the configuration and starts the sending task on `runtime`.
    pub fn spawn(cfg: ExportConfig, runtime: &tokio::runtime::Handle) -> Result<Self, ExportError> {
        let endpoint = endpoint(&cfg)?;
        let mut metadata = tonic::metadata::MetadataMap::new();
        for (k, v) in &cfg.headers {
            let key = MetadataKey::from_bytes(k.as_bytes())
                .map_err(|_| ExportError::Header { key: k.clone() })?;
            let value = MetadataValue::try_from(v.as_str())
                .map_err(|_| ExportError::Header { key: k.clone() })?;
            metadata.insert(key, value);
        }
        let queue = Arc::new(Queue {
            items: Mutex::new(VecDeque::new()),
            ready: Notify::new(),
            dropping: AtomicBool::new(false),
            capacity: cfg.queue_windows.max(1),
        });
        let stats = Arc::new(ExportStats::default());
        // connect_lazy needs the runtime's context to spawn its connection task.
        let _enter = runtime.enter();
        let channel = endpoint.connect_lazy();
        runtime.spawn(send_loop(
            channel,
            metadata,
            Arc::clone(&queue),
            Arc::clone(&stats),
            cfg.timeout,
        ));
        Ok(Self { queue, stats })
    }

    /// Queues one window's request; when the queue is full the oldest is dropped.
    pub fn push(&self, req: ExportProfilesServiceRequest) {
        let mut items = self
            .queue
            .items
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while items.len() >= self.queue.capacity {
            items.pop_front();
            self.queue.dropped(&self.stats);
        }
        items.push_back(req);
        self.stats
            .queue_depth
            .store(items.len() as u64, Ordering::Relaxed);
        drop(items);
        self.queue.ready.notify_one();
    }

    /// The counters.
    pub fn stats(&self) -> &Arc<ExportStats> {
        &self.stats
    }
}

fn endpoint(cfg: &ExportConfig) -> Result<Endpoint, ExportError> {
    let bad = |why: &str| ExportError::Endpoint {
        endpoint: cfg.endpoint.clone(),
        why: why.to_string(),
    };
    let uri: http::Uri = cfg
        .endpoint
        .parse()
        .map_err(|e| bad(&format!("not a URL ({e})")))?;
    let host = uri.host().ok_or_else(|| bad("no host"))?;
    let tls = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad("use http:// or https://")),
    };
    if !tls && !cfg.insecure && !is_loopback(host) {
        return Err(ExportError::Plaintext {
            endpoint: cfg.endpoint.clone(),
        });
    }
    let mut ep = Endpoint::from(uri)
        .connect_timeout(Duration::from_secs(5))
        .timeout(cfg.timeout)
        .tcp_keepalive(Some(Duration::from_secs(60)));
    if tls {
        ep = ep
            .tls_config(ClientTlsConfig::new().with_native_roots())
            .map_err(|e| bad(&format!("TLS: {e}")))?;
    }
    Ok(ep)
}

fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Backoff after the n-th failure in a row: 0.5 s doubling to 30 s, ±25% jitter.
fn backoff(failures: u32, jitter: f64) -> Duration {
    let base = 0.5 * 2f64.powi(failures.saturating_sub(1).min(6) as i32);
    Duration::from_secs_f64(base.min(30.0) * (0.75 + 0.5 * jitter.clamp(0.0, 1.0)))
}

async fn send_loop(
    channel: Channel,
    metadata: tonic::metadata::MetadataMap,
    queue: Arc<Queue>,
    stats: Arc<ExportStats>,
    timeout: Duration,
) {
    use rand::{RngExt as _, SeedableRng as _};
    // Jitter only needs to differ between agents that restart together.
    let mut rng = rand::rngs::ChaCha8Rng::seed_from_u64(
        crate::clock::realtime_ns() ^ u64::from(std::process::id()),
    );
    let mut grpc = tonic::client::Grpc::new(channel)
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let path = http::uri::PathAndQuery::from_static(EXPORT_PATH);
    let mut failures = 0u32;
    loop {
        let next = {
            let mut items = queue.items.lock().unwrap_or_else(PoisonError::into_inner);
            let next = items.pop_front();
            stats
                .queue_depth
                .store(items.len() as u64, Ordering::Relaxed);
            next
        };
        let Some(req) = next else {
            queue.ready.notified().await;
            continue;
        };
        let mut call = tonic::Request::new(req.clone());
        *call.metadata_mut() = metadata.clone();
        let sent = tokio::time::timeout(timeout, async {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            grpc.unary::<_, ExportProfilesServiceResponse, _>(
                call,
                path.clone(),
                tonic_prost::ProstCodec::default(),
            )
            .await
        })
        .await;
        match sent {
            Ok(Ok(_)) => {
                stats.sent.fetch_add(1, Ordering::Relaxed);
                queue.dropping.store(false, Ordering::Relaxed);
                if failures > 0 {
                    tracing::info!("OTLP export resumed after {failures} failed attempts");
                }
                failures = 0;
            }
            Ok(Err(_)) | Err(_) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                failures += 1;
                if failures == 1 {
                    let why = match sent {
                        Ok(Err(status)) => format!("{} ({:?})", status.message(), status.code()),
                        _ => format!("no answer within {timeout:?}"),
                    };
                    tracing::warn!("OTLP export failed, retrying with backoff: {why}");
                }
                // Put it back in front, unless newer windows filled the queue meanwhile:
                // then it is the oldest, and dropped.
                {
                    let mut items = queue.items.lock().unwrap_or_else(PoisonError::into_inner);
                    if items.len() < queue.capacity {
                        items.push_front(req);
                    } else {
                        queue.dropped(&stats);
                    }
                    stats
                        .queue_depth
                        .store(items.len() as u64, Ordering::Relaxed);
                }
                tokio::time::sleep(backoff(failures, rng.random::<f64>())).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(endpoint: &str, insecure: bool) -> ExportConfig {
        ExportConfig {
            endpoint: endpoint.into(),
            insecure,
            ..ExportConfig::default()
        }
    }

    #[test]
    fn plaintext_goes_to_loopback_only_unless_insecure() {
        assert!(endpoint(&cfg("http://127.0.0.1:4317", false)).is_ok());
        assert!(endpoint(&cfg("http://localhost:4317", false)).is_ok());
        assert!(endpoint(&cfg("http://[::1]:4317", false)).is_ok());
        assert!(matches!(
            endpoint(&cfg("http://collector.example:4317", false)),
            Err(ExportError::Plaintext { .. })
        ));
        assert!(endpoint(&cfg("http://collector.example:4317", true)).is_ok());
        assert!(matches!(
            endpoint(&cfg("ftp://x", false)),
            Err(ExportError::Endpoint { .. })
        ));
    }

    #[test]
    fn headers_parse_and_backoff_grows_to_a_cap() {
        assert_eq!(
            parse_header("Authorization=Bearer a=b"),
            Ok(("authorization".into(), "Bearer a=b".into()))
        );
        assert!(parse_header("novalue").is_err());
        assert!(parse_header("=x").is_err());
        assert!(backoff(1, 0.5) < backoff(3, 0.5));
        assert!(backoff(50, 1.0) <= Duration::from_secs_f64(37.5));
        assert!(backoff(1, 0.0) >= Duration::from_millis(375));
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            // Nothing listens on port 9 of loopback: every send fails and is retried.
            let ex = Exporter::spawn(
                ExportConfig {
                    endpoint: "http://127.0.0.1:9".into(),
                    queue_windows: 2,
                    ..ExportConfig::default()
                },
                &tokio::runtime::Handle::current(),
            )
            .expect("spawn");
            for _ in 0..5 {
                ex.push(ExportProfilesServiceRequest::default());
            }
            let s = ex.stats();
            assert!(s.dropped.load(Ordering::Relaxed) >= 3);
            assert!(s.queue_depth.load(Ordering::Relaxed) <= 2);
        });
    }

    #[test]
    fn a_retried_window_does_not_overfill_the_queue() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            // A collector that accepts and never answers: each call runs into the timeout.
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let port = listener.local_addr().expect("addr").port();
            tokio::spawn(async move {
                let mut held = Vec::new();
                while let Ok((conn, _)) = listener.accept().await {
                    held.push(conn);
                }
            });
            let ex = Exporter::spawn(
                ExportConfig {
                    endpoint: format!("http://127.0.0.1:{port}"),
                    queue_windows: 2,
                    timeout: Duration::from_millis(300),
                    ..ExportConfig::default()
                },
                &tokio::runtime::Handle::current(),
            )
            .expect("spawn");
            ex.push(ExportProfilesServiceRequest::default());
            ex.push(ExportProfilesServiceRequest::default());
            // The first is in flight; a third fills the queue behind it.
            tokio::time::sleep(Duration::from_millis(100)).await;
            ex.push(ExportProfilesServiceRequest::default());
            // The call times out and its window comes back to a full queue.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let s = ex.stats();
            assert_eq!(s.failed.load(Ordering::Relaxed), 1);
            assert_eq!(s.dropped.load(Ordering::Relaxed), 1);
            assert_eq!(s.queue_depth.load(Ordering::Relaxed), 2);
        });
    }
}
