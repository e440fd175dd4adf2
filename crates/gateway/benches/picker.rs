//! The endpoint picker's cost per request: from the last request-body chunk sent to the
//! pick received (the answer to the request headers), over gRPC on loopback, at 1 KiB and
//! 256 KiB prompts. Four simulated engines are registered; no request reaches them (the
//! stream is closed after the pick, which releases the booking), so the figure is the
//! picker's own: the body's facts, the index lookup, the decision, the booking, the
//! answers. Prompts come in 32 groups sharing a system prompt, so lookups hit.
//!
//! `cargo bench -p kvgate-gateway --bench picker` (release); `-- --requests N` sets the
//! requests per size (default 2000). `cargo test -p kvgate-gateway --bench picker`
//! runs a short debug pass (its figures say nothing of a release build).

use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{HttpBody, HttpHeaders, ProcessingRequest};
use kvgate_engine_sim::{SimConfig, SimFleet};
use kvgate_gateway::{Gateway, GatewayConfig};
use serde_json::json;

const GROUPS: usize = 32;
/// Envoy's usual body chunk.
const CHUNK: usize = 16 * 1024;

fn message(m: Message) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(m),
        ..ProcessingRequest::default()
    }
}

fn headers() -> ProcessingRequest {
    let pairs = [(":method", "POST"), (":path", "/v1/chat/completions")];
    message(Message::RequestHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: (*k).into(),
                    raw_value: v.as_bytes().to_vec(),
                    ..HeaderValue::default()
                })
                .collect(),
        }),
        ..HttpHeaders::default()
    }))
}

fn body(group: usize, n: usize, bytes: usize) -> Vec<u8> {
    let system = format!("System prompt of group {group}. ")
        .repeat(bytes / 32 + 1)
        .chars()
        .take(bytes)
        .collect::<String>();
    let b = json!({
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question {n}")},
        ],
        "max_tokens": 8,
    });
    b.to_string().into_bytes()
}

/// One request: microseconds from the last body chunk sent to the pick.
async fn one(
    client: &mut ExternalProcessorClient<tonic::transport::Channel>,
    body: &[u8],
) -> anyhow::Result<f64> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let mut answers = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    tx.send(headers()).await?;
    let chunks: Vec<&[u8]> = body.chunks(CHUNK).collect();
    let last = chunks.len() - 1;
    let mut started = Instant::now();
    for (i, c) in chunks.into_iter().enumerate() {
        if i == last {
            started = Instant::now();
        }
        tx.send(message(Message::RequestBody(HttpBody {
            body: c.to_vec(),
            end_of_stream: i == last,
            ..HttpBody::default()
        })))
        .await?;
    }
    let first = answers.message().await?.context("no answer")?;
    let took = started.elapsed();
    match first.response {
        Some(Response::RequestHeaders(_)) => Ok(took.as_secs_f64() * 1e6),
        other => Err(anyhow!("not a pick: {other:?}")),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

async fn run(addr: std::net::SocketAddr, requests: usize) -> anyhow::Result<()> {
    let mut client = ExternalProcessorClient::connect(format!("http://{addr}")).await?;
    println!("| prompt | requests | p50 µs | p99 µs |");
    println!("|---|---|---|---|");
    for (name, bytes) in [("1 KiB", 1024), ("256 KiB", 256 * 1024)] {
        // Bodies made first: only the protocol and the pick are timed.
        let bodies: Vec<Vec<u8>> = (0..requests).map(|n| body(n % GROUPS, n, bytes)).collect();
        let mut took = Vec::with_capacity(requests);
        for b in &bodies {
            took.push(one(&mut client, b).await?);
        }
        took.sort_by(f64::total_cmp);
        println!(
            "| {name} | {requests} | {:.0} | {:.0} |",
            percentile(&took, 0.5),
            percentile(&took, 0.99)
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // A debug build (`cargo test --bench picker`) only checks that it runs.
    let requests = args
        .iter()
        .position(|a| a == "--requests")
        .and_then(|i| args.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) { 50 } else { 2000 });
    let fleet = SimFleet::start_each("127.0.0.1", 0, vec![SimConfig::default(); 4])?;
    let dir = tempfile::tempdir()?;
    let cfg = GatewayConfig {
        port: 0,
        worker_urls: fleet.urls(),
        data_dir: dir.path().join("data"),
        picker: kvgate_gateway::PickerConfig {
            ext_proc_port: Some(0),
            ..Default::default()
        },
        seed: Some(1),
        ..GatewayConfig::default()
    };
    let gw = Gateway::start(cfg)?;
    let addr = gw.ext_proc_addr().context("the picker listens")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let out = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(600), run(addr, requests)).await
    });
    gw.stop();
    out.map_err(|_| anyhow!("the benchmark took over 10 minutes"))?
}
