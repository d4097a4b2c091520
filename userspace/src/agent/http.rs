//! The agent's HTTP endpoints, a small HTTP/1.1 server on its tokio runtime: `/metrics`
//! (Prometheus), `/healthz` and `/readyz` (see [`super::health`]; they read atomics and
//! never touch the metrics lock). Anything else gets 404; only GET and HEAD are served.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::{
    health::Health,
    metrics::{CONTENT_TYPE, Metrics},
};

/// Binds `addr` (port 0 picks a free port) and returns the listener with the address it
/// got.
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves scrapes until the task is dropped. A failed connection is logged and forgotten.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, health: Arc<Health>) {
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
        tokio::spawn(async move {
            let service =
                service_fn(move |req| respond(req, Arc::clone(&metrics), Arc::clone(&health)));
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
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, content_type: &str, body: String| {
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        *resp.status_mut() = status;
        if let Ok(v) = header::HeaderValue::from_str(content_type) {
            resp.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        resp
    };
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        ));
    }
    let verdict = match req.uri().path() {
        "/metrics" => None,
        "/healthz" => Some(health.live()),
        "/readyz" => Some(health.ready()),
        _ => {
            return Ok(reply(
                StatusCode::NOT_FOUND,
                "text/plain",
                "energy-bpf agent: metrics are at /metrics; probes at /healthz, /readyz\n".into(),
            ));
        }
    };
    if let Some(v) = verdict {
        let status = if v.ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        };
        return Ok(reply(status, "text/plain", format!("{}\n", v.reason)));
    }
    // Encoding takes the metrics lock for a moment; keep it off the I/O thread.
    let body = tokio::task::spawn_blocking(move || metrics.encode()).await;
    Ok(match body {
        Ok(Ok(text)) => reply(StatusCode::OK, CONTENT_TYPE, text),
        Ok(Err(_)) | Err(_) => reply(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            "encoding metrics failed\n".into(),
        ),
    })
}
