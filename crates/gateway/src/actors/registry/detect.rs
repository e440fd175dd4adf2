//! What a worker is, asked of the worker itself: its models and engine kind from
//! `/v1/models`, its limits, data-parallel size, start time and KV-event descriptor from
//! `/server_info` (or the older `/get_server_info`); and its `/health`. Redirects are
//! never followed: a worker could otherwise send its probes, and its key, anywhere.

use std::time::Duration;

use kvgate_core::WorkerUrl;
use serde::Deserialize;
use thiserror::Error;
use tracing::warn;

use super::Runtime;
use kvgate_core::Secret;

/// The client of every probe: `timeout` per request, no redirect followed (a 3xx answer
/// is a failed probe).
pub(super) fn client(timeout: Duration) -> awc::Client {
    awc::Client::builder()
        .timeout(timeout)
        .disable_redirects()
        .finish()
}

/// How a worker is asked: the client, the timeout of one probe, the key the worker
/// expects.
#[derive(Clone, Copy)]
pub(super) struct Probe<'a> {
    pub client: &'a awc::Client,
    pub timeout: Duration,
    pub key: Option<&'a Secret>,
}

impl Probe<'_> {
    fn get(&self, url: &str) -> awc::ClientRequest {
        let req = self.client.get(url).timeout(self.timeout);
        match self.key {
            Some(k) => req.bearer_auth(k.expose()),
            None => req,
        }
    }
}

/// Largest probe answer read; a model list or server_info is far smaller.
const PROBE_BODY_LIMIT: usize = 4 * 1024 * 1024;

/// Why a probe of a worker's route failed. Rendered once, into the worker record's
/// `last_error`.
#[derive(Debug, Error)]
pub(crate) enum ProbeError {
    #[error("GET {url}: {source}")]
    Send {
        url: String,
        #[source]
        source: awc::error::SendRequestError,
    },
    #[error("GET {url}: status {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: redirect refused (status {status}): worker probes do not follow redirects")]
    Redirect { url: String, status: u16 },
    #[error("GET {url}: {source}")]
    Body {
        url: String,
        #[source]
        source: awc::error::PayloadError,
    },
    #[error("{url} lists no model yet")]
    NoModel { url: String },
    #[error("GET {url}: {source}")]
    Json {
        url: String,
        #[source]
        source: serde_json::Error,
    },
}

impl ProbeError {
    /// The connection was refused: nothing listens at the worker's address.
    pub(crate) fn refused(&self) -> bool {
        use awc::error::{ConnectError, SendRequestError};
        matches!(self, ProbeError::Send { source: SendRequestError::Connect(ConnectError::Io(e)), .. }
            if e.kind() == std::io::ErrorKind::ConnectionRefused)
    }

    /// A status other than 2xx: a redirect is named as such.
    fn status(url: String, status: awc::http::StatusCode) -> ProbeError {
        let code = status.as_u16();
        if status.is_redirection() {
            ProbeError::Redirect { url, status: code }
        } else {
            ProbeError::Status { url, status: code }
        }
    }
}

/// What registration learned from the worker's own routes.
#[derive(Debug, Clone, Default)]
pub(super) struct Detected {
    pub models: Vec<String>,
    /// Adapter → base model, for the cards with a `parent` other than themselves.
    pub adapters: std::collections::BTreeMap<String, String>,
    pub runtime: Option<Runtime>,
    pub max_running_requests: Option<u64>,
    pub dp_size: Option<u64>,
    pub page_size: Option<u64>,
    pub startup_time: Option<f64>,
    pub kv_events: Option<serde_json::Value>,
    pub tokenizer_path: Option<String>,
    /// `version` of `/server_info`.
    pub version: Option<String>,
    /// Whether `/server_info` (or `/get_server_info`) answered; when it did not, the
    /// fields above from it are unknown, not absent.
    pub server_info: bool,
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelCard>,
}

#[derive(Deserialize)]
struct ModelCard {
    id: String,
    #[serde(default)]
    owned_by: Option<String>,
    /// vLLM (and SGLang) list a LoRA adapter as a model whose `parent` is its base.
    #[serde(default)]
    parent: Option<String>,
}

/// Takes the fields kept from a `/server_info` answer into `d`. Read one by one, so a
/// field of an unexpected type (a newer engine, say) costs only that field.
pub(super) fn read_server_info(d: &mut Detected, url: &WorkerUrl, v: &serde_json::Value) {
    let field = |key: &str, read: fn(&serde_json::Value) -> bool| {
        let x = v.get(key).filter(|x| !x.is_null())?;
        if read(x) {
            Some(x.clone())
        } else {
            warn!(worker = %url, field = key, value = %x, "server_info field of an unexpected type, ignored");
            None
        }
    };
    let count = |key| field(key, |x| x.is_u64()).and_then(|x| x.as_u64());
    d.server_info = true;
    d.max_running_requests = count("max_running_requests");
    d.dp_size = count("dp_size");
    d.page_size = count("page_size");
    d.startup_time = field("startup_time", |x| x.is_number()).and_then(|x| x.as_f64());
    d.kv_events = field("kv_events", |_| true);
    d.tokenizer_path = tokenizer_path(v);
    d.version = field("version", |x| x.is_string()).and_then(|x| x.as_str().map(str::to_owned));
}

fn tokenizer_path(v: &serde_json::Value) -> Option<String> {
    let p = v.get("tokenizer_path")?.as_str()?;
    (!p.is_empty()).then(|| p.to_owned())
}

async fn get_json<T: serde::de::DeserializeOwned>(
    probe: Probe<'_>,
    url: String,
) -> Result<T, ProbeError> {
    let mut resp = match probe.get(&url).send().await {
        Ok(r) => r,
        Err(source) => return Err(ProbeError::Send { url, source }),
    };
    if !resp.status().is_success() {
        return Err(ProbeError::status(url, resp.status()));
    }
    let body = match resp.body().limit(PROBE_BODY_LIMIT).await {
        Ok(b) => b,
        Err(source) => return Err(ProbeError::Body { url, source }),
    };
    serde_json::from_slice(&body).map_err(|source| ProbeError::Json { url, source })
}

/// Probes `/v1/models`, then `/server_info` (falling back to `/get_server_info`).
pub(super) async fn detect(probe: Probe<'_>, url: &WorkerUrl) -> Result<Detected, ProbeError> {
    let models: ModelList = get_json(probe, url.join("/v1/models")).await?;
    let runtime = models
        .data
        .iter()
        .find_map(|m| match m.owned_by.as_deref() {
            Some("sglang") | Some("nvidia") => Some(Runtime::Sglang),
            Some("vllm") => Some(Runtime::Vllm),
            _ => None,
        });
    let adapters = models
        .data
        .iter()
        .filter_map(|m| {
            let parent = m.parent.as_ref().filter(|p| **p != m.id)?;
            Some((m.id.clone(), parent.clone()))
        })
        .collect();
    let mut d = Detected {
        adapters,
        models: models.data.into_iter().map(|m| m.id).collect(),
        runtime,
        ..Detected::default()
    };
    // vLLM has no server_info: that is not a failure.
    let info = match get_json::<serde_json::Value>(probe, url.join("/server_info")).await {
        Ok(i) => Some(i),
        Err(_) => get_json::<serde_json::Value>(probe, url.join("/get_server_info"))
            .await
            .ok(),
    };
    if let Some(v) = info {
        read_server_info(&mut d, url, &v);
    }
    // vLLM behind one API server with data-parallel engines: its metrics label each
    // engine; the gateway then routes rank by rank (`X-data-parallel-rank`).
    if d.runtime == Some(Runtime::Vllm) && !d.server_info {
        d.dp_size = vllm_engines(probe, url).await;
    }
    // Older engines name the tokenizer only in /model_info.
    if d.server_info && d.tokenizer_path.is_none() {
        let info = match get_json::<serde_json::Value>(probe, url.join("/model_info")).await {
            Ok(i) => Some(i),
            Err(_) => get_json::<serde_json::Value>(probe, url.join("/get_model_info"))
                .await
                .ok(),
        };
        d.tokenizer_path = info.as_ref().and_then(tokenizer_path);
    }
    Ok(d)
}

/// How many data-parallel engines a vLLM server's `/metrics` labels (`engine="N"` on
/// `vllm:num_requests_running`); `None` when it does not answer or labels one.
async fn vllm_engines(probe: Probe<'_>, url: &WorkerUrl) -> Option<u64> {
    let mut resp = probe.get(&url.join("/metrics")).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let body = resp.body().limit(PROBE_BODY_LIMIT).await.ok()?;
    let n = engines_labelled(std::str::from_utf8(&body).ok()?);
    (n > 1).then_some(n)
}

/// The distinct `engine` labels of `vllm:num_requests_running` in a Prometheus text.
pub(super) fn engines_labelled(text: &str) -> u64 {
    let mut seen = std::collections::BTreeSet::new();
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("vllm:num_requests_running{") else {
            continue;
        };
        let engine = labels
            .split(',')
            .find_map(|l| l.trim().strip_prefix("engine=\""))
            .and_then(|v| v.split('"').next());
        if let Some(e) = engine {
            seen.insert(e.to_owned());
        }
    }
    seen.len() as u64
}

/// `GET <endpoint>` (`/health` by default): any 2xx passes.
pub(super) async fn health(
    probe: Probe<'_>,
    url: &WorkerUrl,
    endpoint: &str,
) -> Result<(), ProbeError> {
    let url = url.join(endpoint);
    match probe.get(&url).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(ProbeError::status(url, r.status())),
        Err(source) => Err(ProbeError::Send { url, source }),
    }
}

#[cfg(test)]
mod engine_label_tests {
    use super::engines_labelled;

    #[test]
    fn a_vllm_servers_engines_are_counted_by_their_label() {
        let two = "# HELP vllm:num_requests_running Number of requests running.\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 1.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 0.0\n\
            vllm:num_requests_waiting{engine=\"2\",model_name=\"m\"} 0.0\n";
        assert_eq!(engines_labelled(two), 2);
        assert_eq!(
            engines_labelled("vllm:num_requests_running{model_name=\"m\"} 1.0\n"),
            0
        );
        assert_eq!(engines_labelled(""), 0);
    }
}
