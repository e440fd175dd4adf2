//! Who may call what: client keys on the inference routes, admin keys on the control
//! plane, and the allow-list of workers the admin API may add.

use std::net::IpAddr;

use actix_web::HttpRequest;
use actix_web::http::header::AUTHORIZATION;
use kvgate_core::WorkerUrl;

use crate::config::{AccessConfig, Allowed};
use crate::http::error::ApiError;
use kvgate_core::Secret;

/// The configured keys.
#[derive(Clone, Default)]
pub(crate) struct Keys {
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
    pub(crate) fn new(cfg: &AccessConfig) -> Keys {
        Keys {
            client: cfg.api_keys.clone(),
            admin: cfg.admin_keys(),
        }
    }

    fn matches(keys: &[Secret], token: &[u8]) -> bool {
        // Every key is compared, so the time says nothing about which one matched.
        keys.iter().fold(false, |hit, k| hit | k.matches(token))
    }

    /// The client key on inference routes and `/v1/models` (401 without it).
    pub(crate) fn client(&self, req: &HttpRequest) -> Result<(), ApiError> {
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
    pub(crate) fn admin(&self, req: &HttpRequest) -> Result<(), ApiError> {
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
    pub(crate) fn any(&self) -> bool {
        !self.client.is_empty() || !self.admin.is_empty()
    }

    /// The key a rate limit counts a request under: its bearer token when keys are set.
    pub(crate) fn client_id(&self, req: &HttpRequest) -> Option<String> {
        if self.client.is_empty() {
            return None;
        }
        bearer(req).map(|t| String::from_utf8_lossy(t).into_owned())
    }
}

/// Where workers added through the API may be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AllowList(Vec<Allowed>);

impl AllowList {
    pub(crate) fn new(entries: Vec<Allowed>) -> AllowList {
        AllowList(entries)
    }

    /// Whether `url` may be added. A host name is allowed when it is listed by name, or
    /// when every address it resolves to is in a listed range: a name cannot smuggle in
    /// an address the list leaves out.
    pub(crate) async fn allows(&self, url: &WorkerUrl) -> bool {
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
        self.0.iter().any(|a| a.contains(ip))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowList {
        let parsed = entries.iter().map(|e| Allowed::parse(e).expect("parses"));
        AllowList::new(parsed.collect())
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
    }
}
