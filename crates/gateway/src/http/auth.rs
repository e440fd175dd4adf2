//! Who may call what: client keys on the inference routes, admin keys on the control
//! plane, and the allow-list of workers the admin API may add.

use std::net::IpAddr;

use actix_web::HttpRequest;
use actix_web::http::header::AUTHORIZATION;
use kvgate_core::WorkerUrl;
use thiserror::Error;

use crate::http::error::ApiError;
use kvgate_core::Secret;

/// The key of a `--control-plane-api-keys` entry: the reference's `id:name:role:key` form
/// gives its last part, anything else is the key itself.
pub fn key_part(entry: &str) -> &str {
    let parts: Vec<&str> = entry.splitn(4, ':').collect();
    match parts.as_slice() {
        [_, _, role, key] if matches!(*role, "admin" | "user") => key,
        _ => entry,
    }
}

/// A key that can travel in a header as it is: visible ASCII, no spaces or controls.
pub fn usable_key(k: &str) -> bool {
    !k.is_empty() && k.bytes().all(|b| b.is_ascii_graphic())
}

/// Whether a `--control-plane-api-keys` entry is the reference's `id:name:user:key` form,
/// which grants no admin rights.
pub fn user_role(entry: &str) -> bool {
    matches!(
        entry.splitn(4, ':').collect::<Vec<_>>().as_slice(),
        [_, _, "user", _]
    )
}

/// The configured keys.
#[derive(Clone, Default)]
pub struct Keys {
    client: Vec<Secret>,
    admin: Vec<Secret>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("client", &self.client.len())
            .field("admin", &self.admin.len())
            .finish()
    }
}

/// The bearer token of a request, if it has one.
fn bearer(req: &HttpRequest) -> Option<&[u8]> {
    let v = req.headers().get(AUTHORIZATION)?.as_bytes();
    let scheme = v.get(..7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| v[7..].trim_ascii())
}

impl Keys {
    pub fn new(client: &[Secret], admin: &[Secret]) -> Keys {
        Keys {
            client: client.to_vec(),
            admin: admin
                .iter()
                .map(|k| Secret::new(key_part(k.expose())))
                .collect(),
        }
    }

    fn matches(keys: &[Secret], token: &[u8]) -> bool {
        // Every key is compared, so the time says nothing about which one matched.
        keys.iter().fold(false, |hit, k| hit | k.matches(token))
    }

    /// The client key on inference routes and `/v1/models` (401 without it).
    pub fn client(&self, req: &HttpRequest) -> Result<(), ApiError> {
        if self.client.is_empty() {
            return Ok(());
        }
        match bearer(req) {
            Some(t) if Self::matches(&self.client, t) => Ok(()),
            // An admin key may call what a client may.
            Some(t) if Self::matches(&self.admin, t) => Ok(()),
            Some(_) => Err(ApiError::Unauthorized("the API key is not valid")),
            None => Err(ApiError::Unauthorized(
                "an API key is required (Authorization: Bearer <key>)",
            )),
        }
    }

    /// The admin key on the control plane: 401 without a valid key, 403 for a client key.
    pub fn admin(&self, req: &HttpRequest) -> Result<(), ApiError> {
        if self.admin.is_empty() {
            return Ok(());
        }
        match bearer(req) {
            Some(t) if Self::matches(&self.admin, t) => Ok(()),
            Some(t) if Self::matches(&self.client, t) => {
                Err(ApiError::Forbidden("this key may not use the admin routes"))
            }
            Some(_) => Err(ApiError::Unauthorized("the admin key is not valid")),
            None => Err(ApiError::Unauthorized(
                "an admin key is required (Authorization: Bearer <key>)",
            )),
        }
    }

    /// Whether the gateway checks any key at all.
    pub fn any(&self) -> bool {
        !self.client.is_empty() || !self.admin.is_empty()
    }

    /// The key a rate limit counts a request under: its bearer token when keys are set.
    pub fn client_id(&self, req: &HttpRequest) -> Option<String> {
        if self.client.is_empty() {
            return None;
        }
        bearer(req).map(|t| String::from_utf8_lossy(t).into_owned())
    }
}

/// An entry of `--worker-allow` that cannot be read.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("'{entry}' is not a host name, an IP address or a CIDR range")]
pub struct AllowError {
    pub entry: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Allowed {
    Name(String),
    Net { addr: IpAddr, prefix: u8 },
}

/// Where workers added through the API may be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(Vec<Allowed>);

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        // An IPv4-mapped IPv6 address is its IPv4 address.
        (IpAddr::V6(a), IpAddr::V4(_)) => a
            .to_ipv4_mapped()
            .is_some_and(|v4| in_net(IpAddr::V4(v4), net, prefix)),
        (IpAddr::V4(_), IpAddr::V6(_)) => false,
    }
}

impl AllowList {
    pub fn parse(entries: &[String]) -> Result<AllowList, AllowError> {
        let mut out = Vec::new();
        for e in entries {
            let bad = || AllowError { entry: e.clone() };
            let t = e.trim();
            let allowed = if let Some((addr, bits)) = t.split_once('/') {
                let addr: IpAddr = addr.parse().map_err(|_| bad())?;
                let max = if addr.is_ipv4() { 32 } else { 128 };
                let prefix: u8 = bits.parse().ok().filter(|p| *p <= max).ok_or_else(bad)?;
                Allowed::Net { addr, prefix }
            } else if let Ok(addr) = t.trim_matches(['[', ']']).parse::<IpAddr>() {
                let prefix = if addr.is_ipv4() { 32 } else { 128 };
                Allowed::Net { addr, prefix }
            } else {
                let name = t.trim_end_matches('.').to_ascii_lowercase();
                let label_ok = |l: &str| {
                    !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                };
                if !name.split('.').all(label_ok) {
                    return Err(bad());
                }
                Allowed::Name(name)
            };
            out.push(allowed);
        }
        Ok(AllowList(out))
    }

    /// Whether `url` may be added. A host name is allowed when it is listed by name, or
    /// when every address it resolves to is in a listed range: a name cannot smuggle in
    /// an address the list leaves out.
    pub async fn allows(&self, url: &WorkerUrl) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let host = url.host().trim_end_matches('.').to_ascii_lowercase();
        if let Ok(ip) = host.parse::<IpAddr>() {
            return self.allows_ip(ip);
        }
        if self.0.iter().any(|a| *a == Allowed::Name(host.clone())) {
            return true;
        }
        match tokio::net::lookup_host((host.as_str(), url.port())).await {
            Ok(addrs) => {
                let ips: Vec<IpAddr> = addrs.map(|a| a.ip()).collect();
                !ips.is_empty() && ips.iter().all(|ip| self.allows_ip(*ip))
            }
            Err(_) => false,
        }
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|a| match a {
            Allowed::Net { addr, prefix } => in_net(ip, *addr, *prefix),
            Allowed::Name(_) => false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        AllowList::parse(&entries.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("parses")
    }

    fn url(s: &str) -> WorkerUrl {
        WorkerUrl::parse(s).expect("url")
    }

    #[actix_rt::test]
    async fn the_allow_list_takes_names_addresses_and_ranges() {
        let l = list(&["10.1.0.0/16", "gpu-7.example", "fd00::/8", "192.168.5.5"]);
        assert!(l.allows(&url("http://10.1.2.3:8000")).await);
        assert!(!l.allows(&url("http://10.2.0.1:8000")).await);
        assert!(l.allows(&url("http://GPU-7.example:1")).await);
        assert!(l.allows(&url("http://[fd12::1]:1")).await);
        assert!(l.allows(&url("http://192.168.5.5:1")).await);
        assert!(!l.allows(&url("http://192.168.5.6:1")).await);
        // localhost resolves to loopback, which no entry covers.
        assert!(!l.allows(&url("http://localhost:1")).await);
        assert!(
            list(&["127.0.0.0/8", "::1/128"])
                .allows(&url("http://localhost:1"))
                .await
        );
        assert!(AllowList::default().allows(&url("http://anything:1")).await);
        for bad in ["10.0.0.0/33", "not a host", "1.2.3.4/x", "a..b"] {
            assert!(AllowList::parse(&[bad.to_string()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_reference_form_gives_its_key() {
        assert_eq!(key_part("ops:Ops team:admin:sk-admin"), "sk-admin");
        assert_eq!(key_part("sk-plain"), "sk-plain");
        assert_eq!(key_part("a:b:c"), "a:b:c");
    }
}
