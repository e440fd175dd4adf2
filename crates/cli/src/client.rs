//! The gateway's admin API over HTTP: one JSON request, its status and its JSON answer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// Every byte but RFC 3986's unreserved characters is escaped, so a worker URL stays one
/// path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// The gateway `--url` names, with the admin key sent on every request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gateway<'a> {
    /// The base URL, without a trailing slash.
    pub(crate) base: &'a str,
    pub(crate) key: Option<&'a str>,
    /// For an `https://` gateway: the roots it is verified against.
    pub(crate) tls: Option<&'a Arc<rustls::ClientConfig>>,
}

/// The TLS settings for an `https://` gateway: the roots of `ca` (PEM), else the system's.
pub(crate) fn tls_config(
    ca: Option<&std::path::Path>,
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{}: not PEM certificates", path.display()))?;
            anyhow::ensure!(!certs.is_empty(), "{}: no PEM certificate", path.display());
            for c in certs {
                roots
                    .add(c)
                    .with_context(|| format!("{}", path.display()))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    #[expect(
        deprecated,
        reason = "ring is the provider the tree links already; aws-lc-rs would add a C build"
    )]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A gateway's answer: its status, its body, and how a person reads it.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Value,
    pub(crate) render: fn(&Value) -> String,
}

impl Gateway<'_> {
    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        self.call("GET", path, None).await
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        self.call("POST", path, Some(body)).await
    }

    pub(crate) async fn delete(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        self.call("DELETE", path, None).await
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let url = format!("{}{path}", self.base);
        let mut connector = awc::Connector::new();
        if let Some(tls) = self.tls {
            connector = connector.rustls_0_23(tls.clone());
        }
        let client = awc::Client::builder()
            .connector(connector)
            .timeout(Duration::from_secs(30))
            .finish();
        call(&client, method, &url, self.key, body).await
    }
}

async fn call(
    client: &awc::Client,
    method: &str,
    url: &str,
    key: Option<&str>,
    body: Option<Value>,
) -> anyhow::Result<(u16, Value)> {
    let req = match method {
        "POST" => client.post(url),
        "DELETE" => client.delete(url),
        _ => client.get(url),
    };
    let req = match key {
        Some(k) => req.bearer_auth(k),
        None => req,
    };
    let mut resp = match body {
        Some(b) => req.send_json(&b).await,
        None => req.send().await,
    }
    .map_err(|e| anyhow::anyhow!("{method} {url}: {e}"))?;
    let status = resp.status().as_u16();
    let bytes = resp
        .body()
        .await
        .with_context(|| format!("{method} {url}: reading the body"))?;
    let v = match serde_json::from_slice::<Value>(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        // A 2xx that is not a JSON object is not a kvgate answer: `--url` points elsewhere.
        _ if (200..300).contains(&status) => {
            let head = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
            anyhow::bail!("{method} {url}: not a kvgate answer (status {status}): {head:?}");
        }
        Ok(v) => v,
        Err(_) => Value::String(String::from_utf8_lossy(&bytes).into_owned()),
    };
    Ok((status, v))
}

/// `s` as one URL path segment.
pub(crate) fn percent_encode(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// Fails with the gateway's own message unless `status` is a success.
pub(crate) fn ensure_ok(status: u16, body: &Value) -> anyhow::Result<()> {
    if !(200..300).contains(&status) {
        anyhow::bail!("the gateway answered {status}: {}", error_message(body));
    }
    Ok(())
}

/// The message of an OpenAI-style error body, else the whole body.
fn error_message(v: &Value) -> String {
    v["error"]["message"]
        .as_str()
        .map_or_else(|| v.to_string(), str::to_owned)
}
