//! The ext_proc messages the picker reads and writes, as the endpoint-picker protocol uses
//! them (`docs/endpoint-picker.md` cites the sources): header values, the subset hint and
//! the served endpoint in the request's metadata, the pick as a header mutation and as
//! dynamic metadata, the body sent back in streamed chunks, the immediate refusal. Pure
//! functions over the `envoy-types` messages, nothing async.

use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation,
    processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

/// The header (and metadata key) that carries the pick and its fallbacks, `IP:PORT,...`.
pub(crate) const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The metadata namespace of the pick, and of the served endpoint Envoy reports back.
pub(crate) const LB_NAMESPACE: &str = "envoy.lb";
/// The metadata namespace and key of the gateway's subset hint.
pub(crate) const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
pub(crate) const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The endpoint that served the request (metadata key, also read as a header).
pub(crate) const SERVED: &str = "x-gateway-destination-endpoint-served";
/// The largest body chunk sent back (the extension's own picker uses the same bound).
pub(crate) const CHUNK: usize = 62_000;

/// A header's value: `raw_value` as Envoy sends it, else `value`.
pub(crate) fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    let h = headers?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))?;
    if h.raw_value.is_empty() {
        Some(h.value.as_str())
    } else {
        std::str::from_utf8(&h.raw_value).ok()
    }
}

/// The strings under `key` in `namespace`: a list of strings, or one comma-separated string.
/// `None` when the key is absent (an empty list is `Some` and empty).
fn metadata_strings(md: Option<&Metadata>, namespace: &str, key: &str) -> Option<Vec<String>> {
    let value = md?.filter_metadata.get(namespace)?.fields.get(key)?;
    Some(match &value.kind {
        Some(Kind::ListValue(l)) => l
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.trim().to_owned()),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(s)) => split_list(s),
        _ => Vec::new(),
    })
}

/// `a, b,c` as `[a, b, c]`, empty entries dropped.
pub(crate) fn split_list(s: &str) -> Vec<String> {
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The subset hint: the only endpoints the pick may name; `None`: no restriction.
pub(crate) fn subset_hint(md: Option<&Metadata>) -> Option<Vec<String>> {
    metadata_strings(md, SUBSET_NAMESPACE, SUBSET_KEY)
}

/// The endpoint Envoy says served the request, from the metadata or else the headers.
pub(crate) fn served(md: Option<&Metadata>, headers: Option<&HeaderMap>) -> Option<String> {
    metadata_strings(md, LB_NAMESPACE, SERVED)
        .and_then(|v| v.into_iter().next())
        .or_else(|| header(headers, SERVED).and_then(|h| split_list(h).into_iter().next()))
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_owned(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        ..HeaderValueOption::default()
    }
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// The answer to the request headers that routes the request: the destination header
/// set, the route cache cleared (so Envoy routes on it), and the same value in the
/// `envoy.lb` dynamic metadata.
pub(crate) fn pick(destinations: &str) -> ProcessingResponse {
    let lb = Struct {
        fields: [(DESTINATION.to_owned(), string_value(destinations))].into(),
    };
    let metadata = Struct {
        fields: [(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]
        .into(),
    };
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers: vec![set_header(DESTINATION, destinations)],
                    ..HeaderMutation::default()
                }),
                clear_route_cache: true,
                ..CommonResponse::default()
            }),
        })),
        dynamic_metadata: Some(metadata),
        ..ProcessingResponse::default()
    }
}

/// `body` as streamed body answers of at most [`CHUNK`] bytes each, the last carrying
/// `end_of_stream`; an empty body is one empty chunk. `response`: the response body's
/// answers, else the request body's.
pub(crate) fn body_chunks(
    body: &[u8],
    end_of_stream: bool,
    response: bool,
) -> Vec<ProcessingResponse> {
    let mut parts: Vec<&[u8]> = body.chunks(CHUNK).collect();
    if parts.is_empty() {
        parts.push(&[]);
    }
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            let answer = BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::StreamedResponse(
                            StreamedBodyResponse {
                                body: part.to_vec(),
                                end_of_stream: end_of_stream && i == last,
                                ..StreamedBodyResponse::default()
                            },
                        )),
                    }),
                    ..CommonResponse::default()
                }),
            };
            ProcessingResponse {
                response: Some(if response {
                    Response::ResponseBody(answer)
                } else {
                    Response::RequestBody(answer)
                }),
                ..ProcessingResponse::default()
            }
        })
        .collect()
}

/// Headers passed on unchanged (the response's).
pub(crate) fn continue_headers(response: bool) -> ProcessingResponse {
    let h = HeadersResponse {
        response: Some(CommonResponse::default()),
    };
    ProcessingResponse {
        response: Some(if response {
            Response::ResponseHeaders(h)
        } else {
            Response::RequestHeaders(h)
        }),
        ..ProcessingResponse::default()
    }
}

/// Trailers passed on unchanged.
pub(crate) fn continue_trailers(response: bool) -> ProcessingResponse {
    let t = TrailersResponse::default();
    ProcessingResponse {
        response: Some(if response {
            Response::ResponseTrailers(t)
        } else {
            Response::RequestTrailers(t)
        }),
        ..ProcessingResponse::default()
    }
}

/// Envoy answers the client itself with `status` and the JSON `body`; `code` goes in
/// `x-kvgate-error-code` as the HTTP door sends it.
pub(crate) fn refuse(
    status: u16,
    body: &serde_json::Value,
    code: &str,
    retry_after: Option<u64>,
) -> ProcessingResponse {
    let mut set_headers = vec![
        set_header("content-type", "application/json"),
        set_header("x-kvgate-error-code", code),
    ];
    if let Some(s) = retry_after {
        set_headers.push(set_header("retry-after", &s.to_string()));
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                ..HeaderMutation::default()
            }),
            body: body.to_string().into_bytes(),
            details: code.to_owned(),
            ..ImmediateResponse::default()
        })),
        ..ProcessingResponse::default()
    }
}

/// `IP:PORT` of a worker URL, as the protocol names endpoints (the scheme's port when the
/// URL gives none).
pub(crate) fn endpoint_of(url: &str) -> String {
    let p = kvgate_core::split_url(url);
    let port = p.port.unwrap_or(match p.scheme {
        Some(s) if s.eq_ignore_ascii_case("https") => "443",
        _ => "80",
    });
    format!("{}:{port}", p.host)
}
