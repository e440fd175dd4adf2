//! Where a worker added through the API, or a KV-event endpoint a worker names, may be:
//! inside `--worker-allow` when it is set; without it, anywhere but link-local and cloud
//! metadata addresses, which would let an admin call or a worker's answer reach the
//! host's own credentials.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

use crate::config::Allowed;

/// Why a host may not be used.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    #[error("outside the allowed hosts (--worker-allow)")]
    NotListed,
    #[error("a link-local address, refused unless --worker-allow names it")]
    LinkLocal,
    #[error("a cloud metadata address, refused unless --worker-allow names it")]
    Metadata,
}

/// Instance metadata services outside the link-local ranges: AWS over IPv6, Alibaba
/// Cloud, Azure's WireServer.
const METADATA_ADDRS: [IpAddr; 3] = [
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
];

/// Names of metadata services (Google Cloud's, AWS's), refused before any lookup.
const METADATA_NAMES: [&str; 4] = [
    "metadata",
    "metadata.google.internal",
    "instance-data",
    "instance-data.ec2.internal",
];

/// Whether `ip` is an address no API-added worker may have without the allow-list naming
/// it: a metadata service, or link-local (169.254.0.0/16, fe80::/10). An IPv4-mapped IPv6
/// address is its IPv4 address.
fn reserved(ip: IpAddr) -> Option<Refusal> {
    let ip = match ip {
        IpAddr::V6(a) => a.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let link_local = match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => a.is_unicast_link_local(),
    };
    if ip == IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)) || METADATA_ADDRS.contains(&ip) {
        Some(Refusal::Metadata)
    } else if link_local {
        Some(Refusal::LinkLocal)
    } else {
        None
    }
}

/// A host as compared: lowercased, without IPv6 brackets or a trailing dot.
fn normal(host: &str) -> String {
    host.trim()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase()
}

/// Where workers added through the API, and KV-event endpoints, may be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AllowList(Vec<Allowed>);

impl AllowList {
    pub(crate) fn new(entries: Vec<Allowed>) -> AllowList {
        AllowList(entries)
    }

    /// The rule for one address a vetted name resolves to at connect time
    /// ([`ConnectGuard`](crate::upstream::ConnectGuard)): the same as when it was added.
    pub(crate) fn connect_judge(&self) -> crate::upstream::Judge {
        let list = self.clone();
        std::sync::Arc::new(move |host: &str, ip: IpAddr| list.judge(host, &[ip]).is_ok())
    }

    /// Whether `url` may be added.
    #[cfg(test)]
    pub(crate) async fn allows(&self, url: &kvgate_core::WorkerUrl) -> bool {
        self.check(url.host(), url.port()).await.is_ok()
    }

    /// Whether `host` may be used, resolving it (at `port`) when its name alone does not
    /// decide. A name is allowed when listed by name, or when every address it resolves
    /// to is in a listed range: a name cannot smuggle in an address the list leaves out.
    pub(crate) async fn check(&self, host: &str, port: u16) -> Result<(), Refusal> {
        let host = normal(host);
        let addrs: Vec<IpAddr> = if self.needs_lookup(&host) {
            match tokio::net::lookup_host((host.as_str(), port)).await {
                Ok(a) => a.map(|a| a.ip()).collect(),
                Err(_) => Vec::new(),
            }
        } else {
            Vec::new()
        };
        self.judge(&host, &addrs)
    }

    /// Whether judging `host` needs the addresses it resolves to.
    fn needs_lookup(&self, host: &str) -> bool {
        let host = normal(host);
        if host.parse::<IpAddr>().is_ok() {
            return false;
        }
        if self.0.is_empty() {
            !METADATA_NAMES.contains(&host.as_str())
        } else {
            !self.0.contains(&Allowed::Name(host))
        }
    }

    /// The verdict on `host`, given the addresses it resolved to (none for an address,
    /// for a name its name decides, or for one that did not resolve). Without a list, a
    /// name that does not resolve is let through: it reaches nothing now, and it is
    /// resolved again at each connection.
    pub(crate) fn judge(&self, host: &str, addrs: &[IpAddr]) -> Result<(), Refusal> {
        let host = normal(host);
        let ip = host.parse::<IpAddr>().ok();
        if self.0.is_empty() {
            if METADATA_NAMES.contains(&host.as_str()) {
                return Err(Refusal::Metadata);
            }
            return match ip.iter().chain(addrs).find_map(|a| reserved(*a)) {
                Some(r) => Err(r),
                None => Ok(()),
            };
        }
        let listed = match ip {
            Some(ip) => self.allows_ip(ip),
            None => {
                self.0.contains(&Allowed::Name(host))
                    || (!addrs.is_empty() && addrs.iter().all(|a| self.allows_ip(*a)))
            }
        };
        if listed {
            Ok(())
        } else {
            Err(Refusal::NotListed)
        }
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|a| a.contains(ip))
    }
}

#[cfg(test)]
mod tests;
