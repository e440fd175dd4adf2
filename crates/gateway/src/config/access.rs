//! Who may call what, and where workers may be (`api_keys`, `control_plane_api_keys`,
//! `allow_open_admin`, `worker_allow`, `worker_api_key`, `trusted_proxies`).

use std::net::IpAddr;

use ipnet::IpNet;
use kvgate_core::Secret;
use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, invalid};

/// Keys and the worker allow-list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AccessConfig {
    /// Keys a client must present (`Authorization: Bearer`) on the inference routes and
    /// `/v1/models`; empty: open.
    pub api_keys: Vec<Secret>,
    /// Keys of the admin routes (`id:name:role:key` is accepted, its last part used);
    /// empty: admin is open, which a non-loopback `host` refuses without `allow_open_admin`.
    pub control_plane_api_keys: Vec<Secret>,
    pub allow_open_admin: bool,
    /// Hosts, IP addresses and CIDR ranges that workers added through the API must be in;
    /// empty: any. Workers from `worker_urls` are trusted.
    pub worker_allow: Vec<String>,
    /// Sent as `Authorization: Bearer` to every worker (inference, probes, polls), in
    /// place of the client's.
    pub worker_api_key: Option<Secret>,
    /// Addresses and CIDR ranges of proxies whose `X-Forwarded-For` / `Forwarded` name the
    /// client (for the per-address rate limit); empty: the peer is the client.
    pub trusted_proxies: Vec<String>,
}

impl Section for AccessConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        let usable = |k: &Secret| Secret::new(admin_key(k.expose())).is_usable();
        if !self.api_keys.iter().all(Secret::is_usable) {
            return invalid("api_keys", "a key must be non-empty visible ASCII");
        }
        if !self.control_plane_api_keys.iter().all(usable) {
            return invalid(
                "control_plane_api_keys",
                "a key must be non-empty visible ASCII",
            );
        }
        if self.worker_api_key.as_ref().is_some_and(|k| !k.is_usable()) {
            return invalid("worker_api_key", "a key must be non-empty visible ASCII");
        }
        if self
            .control_plane_api_keys
            .iter()
            .any(|k| user_role(k.expose()))
        {
            return invalid(
                "control_plane_api_keys",
                "a 'user' role entry is not an admin key: give client keys with --api-key",
            );
        }
        if let Err(e) = self.allowed() {
            return invalid("worker_allow", e.to_string());
        }
        if let Err(e) = self.trusted() {
            return invalid("trusted_proxies", e.to_string());
        }
        Ok(())
    }
}

impl AccessConfig {
    /// The admin keys, the reference's `id:name:role:key` entries read as their key.
    pub fn admin_keys(&self) -> Vec<Secret> {
        (self.control_plane_api_keys.iter())
            .map(|k| Secret::new(admin_key(k.expose())))
            .collect()
    }

    /// The trusted proxies, parsed: an address is a range of one.
    pub fn trusted(&self) -> Result<Vec<IpNet>, ProxyError> {
        (self.trusted_proxies.iter())
            .map(|e| {
                let e = e.trim();
                (e.parse::<IpNet>().ok())
                    .or_else(|| e.parse::<IpAddr>().ok().map(IpNet::from))
                    .ok_or_else(|| ProxyError {
                        entry: e.to_owned(),
                    })
            })
            .collect()
    }

    /// The allow-list, parsed.
    pub fn allowed(&self) -> Result<Vec<Allowed>, AllowError> {
        self.worker_allow
            .iter()
            .map(|e| Allowed::parse(e))
            .collect()
    }
}

/// An entry of `--trusted-proxies` that is no address or CIDR range.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("'{entry}' is not an IP address or a CIDR range")]
pub struct ProxyError {
    pub entry: String,
}

/// The key of a `--control-plane-api-keys` entry: the reference's `id:name:role:key` form
/// gives its last part, anything else is the key itself.
fn admin_key(entry: &str) -> &str {
    let parts: Vec<&str> = entry.splitn(4, ':').collect();
    match parts.as_slice() {
        [_, _, role, key] if matches!(*role, "admin" | "user") => key,
        _ => entry,
    }
}

/// Whether a `--control-plane-api-keys` entry is the reference's `id:name:user:key` form,
/// which grants no admin rights.
fn user_role(entry: &str) -> bool {
    matches!(
        entry.splitn(4, ':').collect::<Vec<_>>().as_slice(),
        [_, _, "user", _]
    )
}

/// An entry of `--worker-allow` that cannot be read.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("'{entry}' is not a host name, an IP address or a CIDR range")]
pub struct AllowError {
    pub entry: String,
}

/// One entry of the worker allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowed {
    /// A host name, lowercased, without a trailing dot.
    Name(String),
    /// An address (a range of one) or a CIDR range.
    Net(IpNet),
}

impl Allowed {
    pub fn parse(entry: &str) -> Result<Allowed, AllowError> {
        let bad = || AllowError {
            entry: entry.to_owned(),
        };
        let t = entry.trim();
        if t.contains('/') {
            return t.parse::<IpNet>().map(Allowed::Net).map_err(|_| bad());
        }
        if let Ok(addr) = t.trim_matches(['[', ']']).parse::<IpAddr>() {
            return Ok(Allowed::Net(IpNet::from(addr)));
        }
        let name = t.trim_end_matches('.').to_ascii_lowercase();
        let label_ok =
            |l: &str| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !name.split('.').all(label_ok) {
            return Err(bad());
        }
        Ok(Allowed::Name(name))
    }

    /// Whether `ip` is in this entry's range; an IPv4-mapped IPv6 address is its IPv4
    /// address.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let Allowed::Net(net) = self else {
            return false;
        };
        let v4 = match ip {
            IpAddr::V6(a) => a.to_ipv4_mapped().map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        net.contains(&ip) || v4.is_some_and(|v4| net.contains(&v4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_form_gives_its_key() {
        assert_eq!(admin_key("ops:Ops team:admin:sk-admin"), "sk-admin");
        assert_eq!(admin_key("sk-plain"), "sk-plain");
        assert_eq!(admin_key("a:b:c"), "a:b:c");
        assert!(user_role("u:n:user:k") && !user_role("u:n:admin:k"));
    }

    #[test]
    fn entries_are_names_addresses_and_ranges() {
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        let net = Allowed::parse("10.1.0.0/16").expect("range");
        assert!(net.contains(ip("10.1.2.3")) && !net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.0.9")));
        assert!(
            Allowed::parse("[fd00::1]")
                .expect("v6")
                .contains(ip("fd00::1"))
        );
        assert_eq!(
            Allowed::parse("GPU-7.example.").expect("name"),
            Allowed::Name("gpu-7.example".into())
        );
        for bad in ["10.0.0.0/33", "not a host", "1.2.3.4/x", "a..b"] {
            assert!(Allowed::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn trusted_proxies_are_addresses_and_ranges() {
        let with = |e: &[&str]| AccessConfig {
            trusted_proxies: e.iter().map(|s| (*s).to_owned()).collect(),
            ..AccessConfig::default()
        };
        let got = with(&["10.0.0.0/8", "192.168.1.7", "fd00::/8"])
            .trusted()
            .expect("parses");
        assert_eq!(got.len(), 3);
        assert!(got[1].contains(&"192.168.1.7".parse::<IpAddr>().expect("ip")));
        assert_eq!(got[1].prefix_len(), 32);
        for bad in ["proxy.example", "10.0.0.0/33", ""] {
            let err = with(&[bad]).validate().expect_err(bad);
            assert!(err.to_string().contains("trusted_proxies"), "{err}");
        }
    }
}
