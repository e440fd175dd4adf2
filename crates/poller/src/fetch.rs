//! One worker's poll over HTTP: `/v1/loads` when the worker has it, else `/metrics`.
//! Redirects are never followed: a worker could otherwise send the poll, and its key,
//! anywhere.

use std::time::{Duration, Instant};

use awc::Client;
use awc::http::StatusCode;
use bytes::Bytes;
use kvgate_policies::RankLoad;
use thiserror::Error;

use crate::error::ParseError;
use crate::loads::parse_v1_loads;
use crate::prometheus::{Sample, parse_prometheus_where};
use kvgate_core::WorkerUrl;

/// Large enough for a vLLM `/metrics` with many histograms; bounds a misbehaving peer.
const BODY_LIMIT: usize = 8 * 1024 * 1024;

/// The client of every poll: `timeout` per request, no redirect followed (a 3xx answer is
/// a failed poll).
pub(crate) fn client(timeout: Duration) -> Client {
    Client::builder()
        .timeout(timeout)
        .disable_redirects()
        .finish()
}

/// What one poll needs; owned so the future can outlive the actor's borrow.
pub(crate) struct Fetch {
    pub client: Client,
    pub url: WorkerUrl,
    pub api_key: Option<String>,
    pub timeout: Duration,
    pub epoch: Instant,
    /// False once the worker showed it has no `/v1/loads`.
    pub try_loads: bool,
}

/// A body read from the worker, still to be turned into ranks.
#[derive(Debug)]
pub(crate) enum Source {
    Loads(Vec<RankLoad>),
    Metrics(Vec<Sample>),
}

/// Why a poll gave nothing; all worker-side, and the next tick may succeed.
#[derive(Debug, Error)]
pub(crate) enum PollError {
    #[error("{route}: {reason}")]
    Transport { route: &'static str, reason: String },
    #[error("{route}: status {status}")]
    Status {
        route: &'static str,
        status: StatusCode,
    },
    #[error("{route}: redirect refused (status {status}): load polls do not follow redirects")]
    Redirect {
        route: &'static str,
        status: StatusCode,
    },
    #[error(transparent)]
    Parse(#[from] ParseError),
    #[error("/metrics: body is not UTF-8")]
    NotUtf8,
}

#[derive(Debug)]
pub(crate) struct Fetched {
    /// The worker answered in a way that means it has no `/v1/loads`: remember it.
    pub no_loads: bool,
    /// The body, and when the request that fetched it was sent (on the epoch's clock).
    pub result: Result<(Source, Duration), PollError>,
}

pub(crate) async fn fetch(f: Fetch) -> Fetched {
    let mut no_loads = false;
    if f.try_loads {
        match get(&f, f.url.join("/v1/loads?include=core"), "/v1/loads").await {
            Ok((StatusCode::OK, body, sent)) => match parse_v1_loads(&body) {
                Ok(ranks) => return done(false, Ok((Source::Loads(ranks), sent))),
                // An engine with /v1/loads that has no ranks yet: try again next tick.
                Err(ParseError::NoRanks) => {
                    return done(false, Err(ParseError::NoRanks.into()));
                }
                Err(_) => no_loads = true,
            },
            Ok((
                StatusCode::NOT_FOUND
                | StatusCode::METHOD_NOT_ALLOWED
                | StatusCode::NOT_IMPLEMENTED,
                _,
                _,
            )) => no_loads = true,
            Ok((status, _, _)) => {
                let route = "/v1/loads";
                return done(false, Err(PollError::Status { route, status }));
            }
            Err(e) => return done(false, Err(e)),
        }
    }
    let result = match get(&f, f.url.join("/metrics"), "/metrics").await {
        Ok((StatusCode::OK, body, sent)) => std::str::from_utf8(&body)
            .map_err(|_| PollError::NotUtf8)
            .and_then(|text| Ok(parse_prometheus_where(text, crate::ranks::is_load_metric)?))
            .map(|samples| (Source::Metrics(samples), sent)),
        Ok((status, _, _)) => Err(PollError::Status {
            route: "/metrics",
            status,
        }),
        Err(e) => Err(e),
    };
    done(no_loads, result)
}

fn done(no_loads: bool, result: Result<(Source, Duration), PollError>) -> Fetched {
    Fetched { no_loads, result }
}

/// One GET: status, body (bounded) and the send time.
async fn get(
    f: &Fetch,
    url: String,
    route: &'static str,
) -> Result<(StatusCode, Bytes, Duration), PollError> {
    let transport = |reason: String| PollError::Transport { route, reason };
    let mut req = f.client.get(url).timeout(f.timeout);
    if let Some(key) = &f.api_key {
        req = req.bearer_auth(key);
    }
    // Taken just before sending: work dispatched after this instant is not in the sample.
    let sent = Instant::now().saturating_duration_since(f.epoch);
    let mut resp = req.send().await.map_err(|e| transport(e.to_string()))?;
    let status = resp.status();
    if status.is_redirection() {
        return Err(PollError::Redirect { route, status });
    }
    let body = resp
        .body()
        .limit(BODY_LIMIT)
        .await
        .map_err(|e| transport(e.to_string()))?;
    Ok((status, body, sent))
}

#[cfg(test)]
mod tests;
