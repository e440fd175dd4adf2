//! The client's address behind trusted proxies (`--trusted-proxies`), for the per-address
//! rate limit. A proxy's `X-Forwarded-For` (or `Forwarded`) is believed only when the
//! peer is one of them: anyone else could write any address there and get a fresh bucket
//! per request.

use std::net::IpAddr;
use std::sync::Arc;

use actix_web::HttpRequest;
use actix_web::http::header::{FORWARDED, HeaderName};
use ipnet::IpNet;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The proxies whose forwarding headers name the client.
#[derive(Debug, Clone, Default)]
pub(crate) struct TrustedProxies(Arc<[IpNet]>);

impl TrustedProxies {
    pub(crate) fn new(nets: Vec<IpNet>) -> TrustedProxies {
        TrustedProxies(nets.into())
    }

    /// The address a request counts against: the peer's, or behind trusted proxies the
    /// client's they name.
    pub(crate) fn client_ip(&self, req: &HttpRequest) -> Option<IpAddr> {
        let peer = req.peer_addr()?.ip().to_canonical();
        if !self.trusts(peer) {
            return Some(peer);
        }
        let values = |name: &HeaderName| -> Vec<String> {
            (req.headers().get_all(name))
                .filter_map(|v| v.to_str().ok().map(str::to_owned))
                .collect()
        };
        Some(self.client_of(peer, &values(&X_FORWARDED_FOR), &values(&FORWARDED)))
    }

    fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|n| n.contains(&ip))
    }

    /// The client named by the hops before a trusted `peer`: `X-Forwarded-For` when sent,
    /// else `Forwarded`'s `for=`. Read from the right, each proxy having appended the
    /// address it saw, the first hop not trusted is the client; a hop that is no address
    /// (`unknown`, an obfuscated name) ends the walk at the last address known, and so does
    /// a chain of trusted proxies only.
    fn client_of(&self, peer: IpAddr, xff: &[String], forwarded: &[String]) -> IpAddr {
        let hops: Vec<Option<IpAddr>> = if xff.is_empty() {
            (forwarded.iter())
                .flat_map(|v| v.split(','))
                .filter_map(forwarded_for)
                .map(|f| hop_address(&f))
                .collect()
        } else {
            (xff.iter())
                .flat_map(|v| v.split(','))
                .map(hop_address)
                .collect()
        };
        let mut client = peer;
        for hop in hops.into_iter().rev() {
            let Some(ip) = hop else {
                break;
            };
            client = ip;
            if !self.trusts(ip) {
                break;
            }
        }
        client
    }
}

/// The `for=` parameter of one `Forwarded` element, unquoted; `None` when it has none.
fn forwarded_for(element: &str) -> Option<String> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("for")
            .then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// One hop's address: `1.2.3.4`, `1.2.3.4:port`, `2001:db8::1`, `[2001:db8::1]:port`.
fn hop_address(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim();
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    let host = match hop.strip_prefix('[') {
        Some(rest) => rest.split_once(']')?.0,
        None => hop.rsplit_once(':')?.0,
    };
    host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests;
