//! One HTTPS GET of the pod list: TLS verified against a CA file (the service account's
//! `ca.crt` for the API server, or the kubelet's CA), the service-account token as a bearer
//! token (re-read every time: projected tokens rotate), a time limit, and a body bounded by
//! [`super::podlist::MAX_BYTES`].

use std::{path::PathBuf, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};

use super::{KubeError, podlist::MAX_BYTES};

/// Time for connect, TLS and the whole answer.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest token file read.
const MAX_TOKEN_BYTES: u64 = 64 << 10;

/// Where and how to ask.
pub struct Client {
    uri: http::Uri,
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    tls: tokio_rustls::TlsConnector,
    token: Option<PathBuf>,
}

impl Client {
    /// A client for `url` (https only), trusting the certificates in `ca` (PEM) or, without
    /// one, nothing: a pod list is never fetched unverified.
    pub fn new(url: &str, ca: &std::path::Path, token: Option<PathBuf>) -> Result<Self, KubeError> {
        let uri: http::Uri = url
            .parse()
            .map_err(|_| KubeError::Url(url.to_owned(), "not a URL"))?;
        if uri.scheme_str() != Some("https") {
            return Err(KubeError::Url(url.to_owned(), "only https:// is supported"));
        }
        let host = uri
            .host()
            .ok_or(KubeError::Url(url.to_owned(), "no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(443);
        let server_name = ServerName::try_from(host.clone())
            .map_err(|_| KubeError::Url(url.to_owned(), "host is not a DNS name or IP"))?;
        let mut roots = rustls::RootCertStore::empty();
        let certs = CertificateDer::pem_file_iter(ca)
            .map_err(|e| KubeError::Ca(ca.to_owned(), e.to_string()))?;
        for cert in certs {
            let cert = cert.map_err(|e| KubeError::Ca(ca.to_owned(), e.to_string()))?;
            roots
                .add(cert)
                .map_err(|e| KubeError::Ca(ca.to_owned(), e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(KubeError::Ca(ca.to_owned(), "no certificate in it".into()));
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| KubeError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Self {
            uri,
            host,
            port,
            server_name,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            token,
        })
    }

    /// The URL asked.
    pub fn url(&self) -> String {
        self.uri.to_string()
    }

    /// GETs the pod list's bytes.
    pub async fn get(&self) -> Result<Bytes, KubeError> {
        tokio::time::timeout(TIMEOUT, self.get_inner())
            .await
            .map_err(|_| KubeError::Http(format!("no answer within {TIMEOUT:?}")))?
    }

    async fn get_inner(&self) -> Result<Bytes, KubeError> {
        let token = match &self.token {
            Some(path) => Some(read_token(path)?),
            None => None,
        };
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| KubeError::Http(format!("connect: {e}")))?;
        let tls = self
            .tls
            .connect(self.server_name.clone(), tcp)
            .await
            .map_err(|e| KubeError::Http(format!("TLS: {e}")))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| KubeError::Http(e.to_string()))?;
        let driver = tokio::spawn(conn);
        let path = self
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let mut req = http::Request::get(path)
            .header(http::header::HOST, self.host.as_str())
            .header(http::header::ACCEPT, "application/json");
        if let Some(t) = token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| KubeError::Http(e.to_string()))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| KubeError::Http(e.to_string()))?;
        let status = resp.status();
        if !status.is_success() {
            driver.abort();
            return Err(KubeError::Status(status.as_u16()));
        }
        let body = Limited::new(resp.into_body(), MAX_BYTES)
            .collect()
            .await
            .map_err(|e| KubeError::Http(format!("reading the answer: {e}")))?
            .to_bytes();
        driver.abort();
        Ok(body)
    }
}

fn read_token(path: &std::path::Path) -> Result<String, KubeError> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES).read_to_string(&mut text))
        .map_err(|e| KubeError::Token(path.to_owned(), e.to_string()))?;
    let token = text.trim();
    if token.is_empty() || token.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(KubeError::Token(
            path.to_owned(),
            "empty or not a token".into(),
        ));
    }
    Ok(token.to_owned())
}
