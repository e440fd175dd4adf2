//! Where an engine's event sockets are: the `kv_events` block of `/server_info`.

use serde::Deserialize;

use crate::error::EndpointError;

/// The `kv_events` descriptor SGLang puts in `/server_info` (null when publishing is off).
/// Unknown fields are ignored; only `endpoint_port_base` is required.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct KvEventsDescriptor {
    /// `"zmq"`; absent is taken as zmq.
    #[serde(default)]
    pub publisher: Option<String>,
    /// Often a wildcard (`*`, `0.0.0.0`, `::`): then the worker URL's host is used.
    #[serde(default)]
    pub endpoint_host: Option<String>,
    /// The PUB port of rank 0; rank r publishes on base + r.
    pub endpoint_port_base: u16,
    /// The topic to subscribe to; empty subscribes to everything.
    #[serde(default)]
    pub topic: String,
    /// The engine's block size: the granularity a router must hash prompts at.
    #[serde(default)]
    pub block_size: Option<u32>,
    /// Data-parallel ranks, each with its own publisher; absent means 1.
    #[serde(default)]
    pub dp_size: Option<u32>,
    /// The replay ROUTER port of rank 0, when replay is configured.
    #[serde(default)]
    pub replay_endpoint_port_base: Option<u16>,
    /// The pushed-load PUB port of rank 0, when load publishing is on.
    #[serde(default)]
    pub load_endpoint_port_base: Option<u16>,
    /// The topic of pushed load; absent means `"load"`.
    #[serde(default)]
    pub load_topic: Option<String>,
}

/// The ZMQ endpoints of one data-parallel rank, as `tcp://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEndpoints {
    pub rank: u32,
    /// Connect a SUB socket here.
    pub events: String,
    /// Connect a DEALER socket here to ask for replay.
    pub replay: Option<String>,
    /// Connect a SUB socket here for pushed load.
    pub load: Option<String>,
}

/// The endpoints of every rank of the worker at `worker_url` (e.g. `http://10.0.0.1:8000`).
///
/// A wildcard `endpoint_host` (absent, empty, `*`, `0.0.0.0`, `::`) is replaced by the
/// worker URL's host, since a publisher bound to every interface is reached where the
/// worker itself is.
pub fn rank_endpoints(
    worker_url: &str,
    d: &KvEventsDescriptor,
) -> Result<Vec<RankEndpoints>, EndpointError> {
    if let Some(p) = d.publisher.as_deref().filter(|p| *p != "zmq") {
        return Err(EndpointError::Publisher(p.to_owned()));
    }
    let host = match d.endpoint_host.as_deref().map(str::trim) {
        Some(h) if !is_wildcard(h) => bracket(h),
        _ => url_host(worker_url).ok_or_else(|| EndpointError::NoHost(worker_url.to_owned()))?,
    };
    let ranks = d.dp_size.unwrap_or(1);
    if ranks == 0 {
        return Err(EndpointError::NoRank);
    }
    let at = |base: u16, rank: u32| -> Result<String, EndpointError> {
        let port = u32::from(base) + rank;
        u16::try_from(port)
            .map(|p| format!("tcp://{host}:{p}"))
            .map_err(|_| EndpointError::Port { base, rank })
    };
    (0..ranks)
        .map(|rank| {
            Ok(RankEndpoints {
                rank,
                events: at(d.endpoint_port_base, rank)?,
                replay: d
                    .replay_endpoint_port_base
                    .map(|b| at(b, rank))
                    .transpose()?,
                load: d.load_endpoint_port_base.map(|b| at(b, rank)).transpose()?,
            })
        })
        .collect()
}

fn is_wildcard(h: &str) -> bool {
    matches!(h, "" | "*" | "0.0.0.0" | "::" | "[::]")
}

/// An IPv6 literal gets the brackets a `tcp://` endpoint needs.
fn bracket(h: &str) -> String {
    if h.contains(':') && !h.starts_with('[') {
        format!("[{h}]")
    } else {
        h.to_owned()
    }
}

/// The host of a worker URL, IPv6 literals kept in brackets.
fn url_host(url: &str) -> Option<String> {
    let host = kvgate_core::split_url(url.trim()).host;
    let unclosed = host.starts_with('[') && !host.ends_with(']');
    (!host.is_empty() && host != "[]" && !unclosed).then(|| host.to_ascii_lowercase())
}
