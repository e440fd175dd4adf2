//! A stand-in for Envoy's ext_proc filter in `FULL_DUPLEX_STREAMED` mode, built from the
//! same `envoy-types` messages kvgate's picker serves: the request headers, the body in
//! chunks without waiting for an answer, then, once the picker has answered, the
//! request forwarded to the picked engine and its response reported back the same way.
//! It speaks the protocol as Envoy does, so the protocol's cases run without an Envoy
//! binary; `tests/tests/picker_envoy.rs` runs through a real one.

use std::net::SocketAddr;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

/// The header and `envoy.lb` key of the pick.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";

/// A client of the picker's ext_proc service.
#[derive(Debug, Clone)]
pub struct Envoy {
    client: ExternalProcessorClient<Channel>,
}

/// One HTTP request's stream.
#[derive(Debug)]
pub struct Exchange {
    tx: Option<mpsc::Sender<ProcessingRequest>>,
    rx: Streaming<ProcessingResponse>,
}

/// What the picker answered to the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The answer to the request headers: the header's value, the metadata's value, and
    /// whether the route cache is cleared; then the body sent back.
    Pick {
        header: String,
        metadata: String,
        clear_route_cache: bool,
        body: Vec<u8>,
    },
    /// An immediate response: Envoy answers the client with it.
    Refused {
        status: u16,
        body: serde_json::Value,
    },
}

impl Answer {
    /// The endpoints of a pick, first the picked one; panics on a refusal.
    pub fn endpoints(&self) -> Vec<String> {
        match self {
            Answer::Pick { header, .. } => header.split(',').map(str::to_owned).collect(),
            Answer::Refused { status, body } => panic!("refused {status}: {body}"),
        }
    }
}

fn headers(pairs: &[(&str, &str)]) -> Option<HeaderMap> {
    Some(HeaderMap {
        headers: pairs
            .iter()
            .map(|(k, v)| HeaderValue {
                key: (*k).to_owned(),
                raw_value: v.as_bytes().to_vec(),
                ..HeaderValue::default()
            })
            .collect(),
    })
}

fn text(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// Metadata with one key in one namespace.
pub fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
    Metadata {
        filter_metadata: [(
            namespace.to_owned(),
            Struct {
                fields: [(key.to_owned(), value)].into(),
            },
        )]
        .into(),
        ..Metadata::default()
    }
}

/// The gateway's subset hint.
pub fn subset(endpoints: &[&str]) -> Metadata {
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: endpoints.iter().map(|e| text(e)).collect(),
        })),
    };
    metadata(
        "envoy.lb.subset_hint",
        "x-gateway-destination-endpoint-subset",
        list,
    )
}

/// A streamed body answer's bytes and end flag.
fn streamed(b: &BodyResponse) -> (Vec<u8>, bool) {
    match b
        .response
        .as_ref()
        .and_then(|r| r.body_mutation.as_ref())
        .and_then(|m| m.mutation.as_ref())
    {
        Some(Mutation::StreamedResponse(s)) => (s.body.clone(), s.end_of_stream),
        other => panic!("not a streamed body answer: {other:?}"),
    }
}

/// `body` in `n` pieces of about equal size (at least one, possibly empty).
pub fn pieces(body: &[u8], n: usize) -> Vec<Vec<u8>> {
    let size = body.len().div_ceil(n.max(1)).max(1);
    let mut out: Vec<Vec<u8>> = body.chunks(size).map(<[u8]>::to_vec).collect();
    if out.is_empty() {
        out.push(Vec::new());
    }
    out
}

impl Envoy {
    pub async fn connect(addr: SocketAddr) -> Envoy {
        let client = ExternalProcessorClient::connect(format!("http://{addr}"))
            .await
            .expect("the picker accepts a connection");
        Envoy { client }
    }

    /// A client over `channel` (TLS, for one).
    pub fn over(channel: Channel) -> Envoy {
        Envoy {
            client: ExternalProcessorClient::new(channel),
        }
    }

    /// A new stream, as Envoy opens one per request.
    pub async fn open(&self) -> Exchange {
        let (tx, rx) = mpsc::channel(64);
        let outbound = tokio_stream::wrappers::ReceiverStream::new(rx);
        let rx = self
            .client
            .clone()
            .process(outbound)
            .await
            .expect("the picker opens the stream")
            .into_inner();
        Exchange { tx: Some(tx), rx }
    }

    /// A whole request up to the pick: `path`'s headers (with `extra`), the metadata,
    /// `body` in `chunks` pieces, and the picker's answer.
    pub async fn route(
        &self,
        path: &str,
        body: &[u8],
        chunks: usize,
        md: Option<Metadata>,
    ) -> (Exchange, Answer) {
        let mut ex = self.open().await;
        ex.request_headers(path, &[], md, body.is_empty()).await;
        if !body.is_empty() {
            let parts = pieces(body, chunks);
            let last = parts.len() - 1;
            for (i, p) in parts.into_iter().enumerate() {
                ex.send(Message::RequestBody(HttpBody {
                    body: p,
                    end_of_stream: i == last,
                    ..HttpBody::default()
                }))
                .await;
            }
        }
        let answer = ex.answer(!body.is_empty()).await;
        (ex, answer)
    }
}

impl Exchange {
    async fn send(&mut self, m: Message) {
        self.send_with(m, None).await;
    }

    async fn send_with(&mut self, m: Message, md: Option<Metadata>) {
        let msg = ProcessingRequest {
            request: Some(m),
            metadata_context: md,
            ..ProcessingRequest::default()
        };
        let tx = self.tx.as_ref().expect("the stream is open");
        tx.send(msg).await.expect("the stream takes the message");
    }

    /// The request headers, as Envoy sends them (pseudo-headers included).
    pub async fn request_headers(
        &mut self,
        path: &str,
        extra: &[(&str, &str)],
        md: Option<Metadata>,
        end_of_stream: bool,
    ) {
        let mut pairs = vec![
            (":method", "POST"),
            (":path", path),
            (":authority", "gateway.example"),
            ("content-type", "application/json"),
        ];
        pairs.extend_from_slice(extra);
        let h = HttpHeaders {
            headers: headers(&pairs),
            end_of_stream,
            ..HttpHeaders::default()
        };
        self.send_with(Message::RequestHeaders(h), md).await;
    }

    /// The next answer; `None` when the picker ended the stream.
    pub async fn next(&mut self) -> Option<ProcessingResponse> {
        let next = tokio::time::timeout(std::time::Duration::from_secs(30), self.rx.message());
        next.await
            .expect("the picker answers within 30 s")
            .expect("the stream stays whole")
    }

    /// The picker's answer to the request: the pick and the body sent back (when `body`),
    /// or a refusal.
    pub async fn answer(&mut self, body: bool) -> Answer {
        let first = self.next().await.expect("an answer to the request");
        let (header, metadata, clear_route_cache) = match first.response {
            Some(Response::RequestHeaders(h)) => {
                let common = h.response.expect("a common response");
                let set = common
                    .header_mutation
                    .expect("a header mutation")
                    .set_headers;
                let header = set
                    .iter()
                    .filter_map(|o| o.header.as_ref())
                    .find(|h| h.key == DESTINATION)
                    .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
                    .expect("the destination header");
                let md = first.dynamic_metadata.expect("dynamic metadata");
                let Some(Kind::StructValue(lb)) =
                    md.fields.get("envoy.lb").and_then(|v| v.kind.clone())
                else {
                    panic!("no envoy.lb namespace in {md:?}");
                };
                let Some(Kind::StringValue(metadata)) =
                    lb.fields.get(DESTINATION).and_then(|v| v.kind.clone())
                else {
                    panic!("no destination in envoy.lb: {lb:?}");
                };
                (header, metadata, common.clear_route_cache)
            }
            Some(Response::ImmediateResponse(r)) => {
                return Answer::Refused {
                    status: r.status.map_or(0, |s| s.code as u16),
                    body: serde_json::from_slice(&r.body).expect("a JSON body"),
                };
            }
            other => panic!("unexpected first answer: {other:?}"),
        };
        let mut sent_back = Vec::new();
        let mut end = !body;
        while !end {
            let m = self.next().await.expect("the body sent back");
            let Some(Response::RequestBody(b)) = m.response else {
                panic!("expected the request body back, got {m:?}");
            };
            let (bytes, last) = streamed(&b);
            assert!(bytes.len() <= 62_000, "a chunk of {} bytes", bytes.len());
            sent_back.extend_from_slice(&bytes);
            end = last;
        }
        Answer::Pick {
            header,
            metadata,
            clear_route_cache,
            body: sent_back,
        }
    }

    /// The engine's response as Envoy reports it: its headers (with the served endpoint
    /// in the `envoy.lb` metadata), then its body in `chunks` pieces; returns the body the
    /// picker sent back.
    pub async fn respond(
        &mut self,
        status: u16,
        served: Option<&str>,
        body: &[u8],
        chunks: usize,
    ) -> Vec<u8> {
        self.response_headers(status, served).await;
        let parts = pieces(body, chunks);
        let last = parts.len() - 1;
        for (i, p) in parts.into_iter().enumerate() {
            self.send(Message::ResponseBody(HttpBody {
                body: p,
                end_of_stream: i == last,
                ..HttpBody::default()
            }))
            .await;
        }
        let mut back = Vec::new();
        loop {
            let m = self.next().await.expect("the response body sent back");
            let Some(Response::ResponseBody(b)) = m.response else {
                panic!("expected the response body back, got {m:?}");
            };
            let (bytes, end) = streamed(&b);
            back.extend_from_slice(&bytes);
            if end {
                return back;
            }
        }
    }

    /// The response headers alone, and the picker's answer to them.
    pub async fn response_headers(&mut self, status: u16, served: Option<&str>) {
        let md =
            served.map(|s| metadata("envoy.lb", "x-gateway-destination-endpoint-served", text(s)));
        let status = status.to_string();
        let h = HttpHeaders {
            headers: headers(&[(":status", &status), ("content-type", "application/json")]),
            ..HttpHeaders::default()
        };
        self.send_with(Message::ResponseHeaders(h), md).await;
        let m = self
            .next()
            .await
            .expect("an answer to the response headers");
        assert!(
            matches!(m.response, Some(Response::ResponseHeaders(_))),
            "{m:?}"
        );
    }

    /// Envoy closes its side of the stream.
    pub fn close(&mut self) {
        self.tx = None;
    }
}
