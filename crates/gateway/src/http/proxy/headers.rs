//! Which headers cross the gateway each way, and the data-parallel rank added to a body.

use actix_web::HttpResponseBuilder;
use actix_web::http::header::{self, HeaderName, HeaderValue};

/// The policies' routing-key headers, as typed names.
pub(crate) static ROUTING_KEY_NAMES: [HeaderName; 2] = [
    HeaderName::from_static(kvgate_policies::ROUTING_KEY_HEADERS[0]),
    HeaderName::from_static(kvgate_policies::ROUTING_KEY_HEADERS[1]),
];
// A header added to the policies' list must be added above too.
const _: () = assert!(kvgate_policies::ROUTING_KEY_HEADERS.len() == ROUTING_KEY_NAMES.len());

/// The hop-by-hop headers (RFC 9110 §7.6.1): for one connection, never relayed either way.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "trailers"
            | "transfer-encoding"
            | "upgrade"
    )
}

/// Whether `name` is one of the tokens of the `Connection` values in `connection`
/// (names compared without case, no allocation).
fn named_by(connection: &[&HeaderValue], name: &HeaderName) -> bool {
    connection.iter().any(|v| {
        (v.as_bytes().split(|b| *b == b',')).any(|t| {
            t.trim_ascii()
                .eq_ignore_ascii_case(name.as_str().as_bytes())
        })
    })
}

/// Request headers that stay at the gateway besides the hop-by-hop ones: those it writes
/// itself for the request out (`host`, `content-length`, its `x-request-id`), `expect`
/// (the body goes out whole, so no interim answer is wanted), and the intake's own
/// `x-kvgate-body` (a client's is dropped by the intake). Every other header is end to end
/// and reaches the worker: tracing, tenant, session and adapter headers included.
fn stays_here(name: &HeaderName) -> bool {
    hop_by_hop(name)
        || matches!(
            name.as_str(),
            "host" | "content-length" | "x-request-id" | "expect" | "x-kvgate-body"
        )
}

/// The client's request headers to send on: all but those that stay here and those its
/// `Connection` header names as hop-by-hop. `authorization` is left out when
/// `pass_authorization` is false (it carried the gateway's own key, or the worker's key
/// replaces it).
pub(super) fn request_headers_out(
    from: &header::HeaderMap,
    pass_authorization: bool,
) -> Vec<(&str, &[u8])> {
    let connection: Vec<&HeaderValue> = from.get_all(header::CONNECTION).collect();
    let mut out = Vec::with_capacity(from.len() + 2);
    for (name, value) in from {
        if stays_here(name)
            || (!pass_authorization && name == header::AUTHORIZATION)
            || named_by(&connection, name)
        {
            continue;
        }
        out.push((name.as_str(), value.as_bytes()));
    }
    out
}

/// Response headers the gateway does not relay: the hop-by-hop ones, and the framing and
/// identity headers the gateway's own server writes for its answer.
fn set_by_this_hop(name: &HeaderName) -> bool {
    hop_by_hop(name) || matches!(name.as_str(), "content-length" | "date" | "server")
}

/// Copies the worker's response headers, less those set by this hop and those the
/// worker's `Connection` header names as hop-by-hop for its connection.
pub(super) fn copy_response_headers(
    from: Vec<(HeaderName, HeaderValue)>,
    to: &mut HttpResponseBuilder,
) {
    // Cloned out first (a shared buffer each), as the headers themselves move on.
    let connection: Vec<HeaderValue> = (from.iter())
        .filter(|(n, _)| n == header::CONNECTION)
        .map(|(_, v)| v.clone())
        .collect();
    let connection: Vec<&HeaderValue> = connection.iter().collect();
    for (name, value) in from {
        if !set_by_this_hop(&name) && !named_by(&connection, &name) {
            to.append_header((name, value));
        }
    }
}

/// Where and what to add to a JSON object body so the engine serves it on data-parallel
/// rank `rank` (`field`: SGLang's `routed_dp_rank`, or `data_parallel_rank` for releases
/// that read only that): right after the opening brace. `None` when the body names a rank
/// already (either name): the client's own choice stands. A quote inside a JSON string is
/// escaped, so only a member name matches.
pub(crate) fn rank_member(body: &[u8], rank: u32, field: &str) -> Option<(usize, Vec<u8>)> {
    let named = |key: &[u8]| memchr::memmem::find(body, key).is_some();
    if named(b"\"routed_dp_rank\"") || named(b"\"data_parallel_rank\"") {
        return None;
    }
    let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[open] != b'{' {
        return None;
    }
    let empty = body[open + 1..]
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| *b == b'}');
    let member = format!("\"{field}\":{rank}{}", if empty { "" } else { "," });
    Some((open + 1, member.into_bytes()))
}
