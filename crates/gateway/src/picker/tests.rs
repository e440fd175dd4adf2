use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use kvgate_policies::WorkerId;

use super::choose::{destinations, outside};
use super::envoy::{self, CHUNK, endpoint_of};
use crate::pipeline::Target;

fn text(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
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

fn target(n: u16, eligible: bool) -> Target {
    let url = format!("http://10.0.0.{n}:8000");
    let id = WorkerId::from_url(&url);
    Target {
        worker: id,
        id,
        url: Arc::from(url),
        eligible,
    }
}

#[test]
fn endpoints_are_ip_and_port() {
    for (url, want) in [
        ("http://10.1.2.3:8000", "10.1.2.3:8000"),
        ("http://10.1.2.3", "10.1.2.3:80"),
        ("https://10.1.2.3", "10.1.2.3:443"),
        ("http://[fd00::1]:8000/v1", "[fd00::1]:8000"),
    ] {
        assert_eq!(endpoint_of(url), want, "{url}");
    }
}

#[test]
fn the_subset_hint_is_a_list_or_a_comma_separated_string() {
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: vec![text("10.0.0.1:8000"), text(" 10.0.0.2:8000")],
        })),
    };
    let md = metadata(envoy::SUBSET_NAMESPACE, envoy::SUBSET_KEY, list);
    assert_eq!(
        envoy::subset_hint(Some(&md)),
        Some(vec!["10.0.0.1:8000".into(), "10.0.0.2:8000".into()])
    );
    let md = metadata(envoy::SUBSET_NAMESPACE, envoy::SUBSET_KEY, text("a:1, b:2"));
    assert_eq!(
        envoy::subset_hint(Some(&md)),
        Some(vec!["a:1".into(), "b:2".into()])
    );
    // Another namespace's key is no hint.
    let md = metadata(envoy::LB_NAMESPACE, envoy::SUBSET_KEY, text("a:1"));
    assert_eq!(envoy::subset_hint(Some(&md)), None);
    assert_eq!(envoy::subset_hint(None), None);
}

#[test]
fn the_served_endpoint_comes_from_the_metadata_else_the_header() {
    let md = metadata(envoy::LB_NAMESPACE, envoy::SERVED, text("10.0.0.2:8000"));
    assert_eq!(
        envoy::served(Some(&md), None).as_deref(),
        Some("10.0.0.2:8000")
    );
    let headers = HeaderMap {
        headers: vec![HeaderValue {
            key: envoy::SERVED.into(),
            raw_value: b"10.0.0.3:8000".to_vec(),
            ..HeaderValue::default()
        }],
    };
    assert_eq!(
        envoy::served(None, Some(&headers)).as_deref(),
        Some("10.0.0.3:8000")
    );
    assert_eq!(envoy::served(None, None), None);
}

#[test]
fn the_pick_is_the_same_value_in_the_header_and_the_metadata() {
    let answer = envoy::pick("10.0.0.1:8000,10.0.0.2:8000");
    let Some(Response::RequestHeaders(h)) = answer.response else {
        panic!("an answer to the request headers");
    };
    let common = h.response.expect("common response");
    assert!(common.clear_route_cache);
    let set = &common.header_mutation.expect("mutation").set_headers;
    let header = set[0].header.as_ref().expect("header");
    assert_eq!(header.key, envoy::DESTINATION);
    assert_eq!(header.raw_value, b"10.0.0.1:8000,10.0.0.2:8000");
    let md = answer.dynamic_metadata.expect("metadata");
    let Some(Kind::StructValue(lb)) = &md.fields[envoy::LB_NAMESPACE].kind else {
        panic!("envoy.lb is a struct");
    };
    assert_eq!(
        lb.fields[envoy::DESTINATION].kind,
        Some(Kind::StringValue("10.0.0.1:8000,10.0.0.2:8000".into()))
    );
}

#[test]
fn bodies_go_back_in_chunks_of_at_most_62000_bytes() {
    let body = vec![b'x'; 2 * CHUNK + 5];
    let chunks = envoy::body_chunks(&body, true, false);
    let parts: Vec<(usize, bool)> = chunks
        .iter()
        .map(|c| {
            let Some(Response::RequestBody(b)) = &c.response else {
                panic!("a request body answer");
            };
            let m = b.response.as_ref().and_then(|r| r.body_mutation.as_ref());
            let Some(Mutation::StreamedResponse(s)) = m.and_then(|m| m.mutation.as_ref()) else {
                panic!("a streamed response");
            };
            (s.body.len(), s.end_of_stream)
        })
        .collect();
    assert_eq!(parts, vec![(CHUNK, false), (CHUNK, false), (5, true)]);
    assert_eq!(envoy::body_chunks(&[], true, true).len(), 1);
}

#[test]
fn a_refusal_is_an_immediate_response_with_the_json_body() {
    let body = serde_json::json!({"error": {"code": "queue_full"}});
    let Some(Response::ImmediateResponse(r)) =
        envoy::refuse(429, &body, "queue_full", Some(1)).response
    else {
        panic!("an immediate response");
    };
    assert_eq!(r.status.map(|s| s.code), Some(429));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&r.body).ok(),
        Some(body)
    );
}

#[test]
fn the_fallback_list_follows_the_runners_up_then_the_rest() {
    let t: Vec<Target> = (1..=6).map(|n| target(n, n != 4)).collect();
    let first = endpoint_of(&t[0].url);
    // Runner-up 3 first; 4 is not ready; then the rest in order, three at most.
    let list = destinations(&first, &[t[2].id, t[3].id], &t, &[]);
    assert_eq!(
        list,
        "10.0.0.1:8000,10.0.0.3:8000,10.0.0.2:8000,10.0.0.5:8000"
    );
    // Left out by the subset: never in the list.
    let list = destinations(&first, &[t[2].id], &t, &[t[1].worker, t[2].worker]);
    assert_eq!(list, "10.0.0.1:8000,10.0.0.5:8000,10.0.0.6:8000");
}

#[test]
fn the_subset_leaves_out_every_other_worker() {
    let t: Vec<Target> = (1..=3).map(|n| target(n, true)).collect();
    assert_eq!(outside(&t, None), Some(vec![]));
    let subset = vec!["10.0.0.2:8000".to_owned(), "10.9.9.9:1".to_owned()];
    assert_eq!(
        outside(&t, Some(&subset)),
        Some(vec![t[0].worker, t[2].worker])
    );
    assert_eq!(outside(&t, Some(&["10.9.9.9:1".to_owned()])), None);
    assert_eq!(outside(&t, Some(&[])), None);
}
