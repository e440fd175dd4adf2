//! W3C trace context end to end: with `--otlp-endpoint`, a client's `traceparent` is
//! continued (the gateway's span is its child, exported to an OTLP collector on loopback)
//! and the engine gets the gateway's span as its parent; without it, the engine gets the
//! client's headers unchanged and nothing is exported.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper's panic is a failed test"
)]

use std::sync::{Arc, Mutex};

use kvgate_tests::raw::{RawUpstream, Script};
use kvgate_tests::{client, finish_reply, test_config};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;

const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

/// An OTLP/gRPC collector that keeps every span it is sent.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("spans");
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                spans.extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// The collector, serving on an OS-picked loopback port of this test's runtime.
fn collector() -> (Collector, String) {
    let c = Collector::default();
    let incoming = tonic::transport::server::TcpIncoming::bind(([127, 0, 0, 1], 0).into())
        .expect("bind the collector");
    let addr = incoming.local_addr().expect("its address");
    let server = tonic::transport::Server::builder()
        .add_service(TraceServiceServer::new(c.clone()))
        .serve_with_incoming(incoming);
    #[expect(
        clippy::disallowed_methods,
        reason = "the collector runs as long as the test's runtime"
    )]
    actix_rt::spawn(async move {
        let _ = server.await;
    });
    (c, format!("http://{addr}"))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The value of header `name` in a request head.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// Sends one chat with the client's trace headers and answers the head the engine saw.
async fn chat_through(gw_url: &str, up: &RawUpstream) -> String {
    let resp = client()
        .post(format!("{gw_url}/v1/chat/completions"))
        .insert_header(("content-type", "application/json"))
        .insert_header(("traceparent", format!("00-{TRACE}-{CLIENT_SPAN}-01")))
        .insert_header(("tracestate", "vendor=1"))
        .send_body(r#"{"messages":[{"role":"user","content":"hi"}]}"#)
        .await
        .expect("sent");
    let r = finish_reply(resp).await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    let seen = up.seen.lock().expect("seen");
    seen.last().expect("the engine got it").0.clone()
}

fn engine() -> RawUpstream {
    RawUpstream::start(Script {
        status: 200,
        content_type: "application/json",
        chunks: vec![br#"{"id":"c1","choices":[]}"#.to_vec()],
        crash: false,
    })
}

#[actix_rt::test]
async fn a_clients_trace_is_continued_and_exported() {
    let (collector, endpoint) = collector();
    let up = engine();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![up.url.clone()];
    cfg.otlp_endpoint = Some(endpoint);
    let gw = kvgate_gateway::Gateway::start(cfg).expect("gateway starts");
    let head = chat_through(&gw.url(), &up).await;

    // The engine's parent is the gateway's span, in the client's trace.
    let tp = header(&head, "traceparent").expect("a traceparent to the engine");
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "{tp}");
    assert_eq!((parts[0], parts[1], parts[3]), ("00", TRACE, "01"), "{tp}");
    let gateway_span = parts[2].to_owned();
    assert_ne!(gateway_span, CLIENT_SPAN);
    assert_eq!(header(&head, "tracestate"), Some("vendor=1"), "{head}");
    assert_eq!(head.matches("traceparent").count(), 1, "{head}");

    // Stopping the gateway exports what it holds (off this runtime, which serves the
    // collector).
    actix_rt::task::spawn_blocking(move || gw.stop())
        .await
        .expect("stopped");
    let spans = collector.spans.lock().expect("spans").clone();
    assert_eq!(spans.len(), 1, "{spans:?}");
    let s = &spans[0];
    assert_eq!(hex(&s.trace_id), TRACE);
    assert_eq!(hex(&s.parent_span_id), CLIENT_SPAN);
    assert_eq!(hex(&s.span_id), gateway_span);
    assert_eq!(s.name, "POST /v1/chat/completions");
    let status = s
        .attributes
        .iter()
        .find(|a| a.key == "http.response.status_code")
        .and_then(|a| a.value.as_ref())
        .map(|v| format!("{v:?}"));
    assert!(status.is_some_and(|v| v.contains("200")), "{s:?}");
    assert!(
        s.attributes
            .iter()
            .any(|a| a.key == "server.address" && format!("{:?}", a.value).contains(&up.url)),
        "{s:?}"
    );
}

#[actix_rt::test]
async fn without_an_endpoint_the_clients_headers_pass_unchanged() {
    let up = engine();
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cfg = test_config(&dir);
    cfg.worker_urls = vec![up.url.clone()];
    let gw = kvgate_gateway::Gateway::start(cfg).expect("gateway starts");
    let head = chat_through(&gw.url(), &up).await;
    let want = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    assert_eq!(header(&head, "traceparent"), Some(want.as_str()), "{head}");
    assert_eq!(header(&head, "tracestate"), Some("vendor=1"), "{head}");
}
