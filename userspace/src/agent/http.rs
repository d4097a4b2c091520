//! The agent's HTTP endpoints, a small HTTP/1.1 server on its tokio runtime: `/metrics`
//! (Prometheus), `/healthz` and `/readyz` (see [`super::health`]; they read atomics and
//! never touch the metrics lock), and the web view at `/` with its API (see [`super::web`]).
//! Anything else gets 404; only GET and HEAD are served, and every answer carries the web
//! view's Content-Security-Policy.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::{
    health::Health,
    metrics::{CONTENT_TYPE, Metrics},
    web::{CSP, WebView},
};

/// Binds `addr` (port 0 picks a free port) and returns the listener with the address it
/// got.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves scrapes until the task is dropped. A failed connection is logged and forgotten.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    web: Option<Arc<WebView>>,
) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                // EMFILE and friends: wait a little instead of spinning.
                tracing::warn!("accepting a metrics connection: {err}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = Arc::clone(&metrics);
        let health = Arc::clone(&health);
        let web = web.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                respond(req, Arc::clone(&metrics), Arc::clone(&health), web.clone())
            });
            if let Err(err) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!("metrics connection from {peer}: {err}");
            }
        });
    }
}

async fn respond(
    req: Request<Incoming>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    web: Option<Arc<WebView>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, content_type: &str, body: Vec<u8>| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        let h = resp.headers_mut();
        if let Ok(v) = header::HeaderValue::from_str(content_type) {
            h.insert(header::CONTENT_TYPE, v);
        }
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            header::HeaderValue::from_static(CSP),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            header::HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::X_FRAME_OPTIONS,
            header::HeaderValue::from_static("DENY"),
        );
        h.insert(
            header::REFERRER_POLICY,
            header::HeaderValue::from_static("no-referrer"),
        );
        h.insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        resp
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            b"GET only\n".to_vec(),
        ));
    }
    let builtin = matches!(req.uri().path(), "/metrics" | "/healthz" | "/readyz");
    if let Some(web) = web.filter(|_| !builtin) {
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let auth = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // A profile reads recordings: keep it off the I/O thread.
        let answer =
            tokio::task::spawn_blocking(move || web.answer(&path, &query, auth.as_deref())).await;
        return Ok(match answer {
            Ok(Some((status, kind, body))) => reply(status, kind, body),
            Ok(None) => reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                b"energy-bpf agent: the web view is at /, metrics at /metrics; probes at /healthz, /readyz\n".to_vec(),
            ),
            Err(_) => reply(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                b"the web view failed\n".to_vec(),
            ),
        });
    }
    let verdict = match req.uri().path() {
        "/metrics" => None,
        "/healthz" => Some(health.live()),
        "/readyz" => Some(health.ready()),
        _ => {
            return Ok(reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                b"energy-bpf agent: metrics are at /metrics; probes at /healthz, /readyz\n"
                    .to_vec(),
            ));
        }
    };
    if let Some(v) = verdict {
        let status = if v.ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        return Ok(reply(
            status,
            "text/plain",
            format!("{}\n", v.reason).into_bytes(),
        ));
    }
    // Encoding takes the metrics lock for a moment; keep it off the I/O thread.
    let body = tokio::task::spawn_blocking(move || metrics.encode()).await;
    Ok(match body {
        Ok(Ok(text)) => reply(StatusCode::OK, CONTENT_TYPE, text.into_bytes()),
        Ok(Err(_)) | Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            b"encoding metrics failed\n".to_vec(),
        ),
    })
}
