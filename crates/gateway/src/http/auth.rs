//! Who may call what: client keys on the inference routes, admin keys on the control
//! plane (and no change to it from a browser page of another site), and the allow-list of
//! workers the admin API may add.

use actix_web::HttpRequest;
use actix_web::http::Method;
use actix_web::http::header::{AUTHORIZATION, HOST, HeaderName, ORIGIN};
use kvgate_core::Secret;

pub(crate) use crate::actors::registry::AllowList;
use crate::config::AccessConfig;
use crate::http::error::ApiError;

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
    /// A request that changes state and comes from a browser page of another site is 403
    /// unless it carries a valid admin key: with no admin keys set (local use), a page the
    /// operator has open could otherwise add a worker.
    pub(crate) fn admin(&self, req: &HttpRequest) -> Result<(), ApiError> {
        let token = bearer(req);
        if token.is_some_and(|t| Self::matches(&self.admin, t)) {
            return Ok(());
        }
        if let Some(why) = cross_site(req) {
            return Err(ApiError::CrossSite(why));
        }
        if self.admin.is_empty() {
            return Ok(());
        }
        match token {
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

static SEC_FETCH_SITE: HeaderName = HeaderName::from_static("sec-fetch-site");

const CROSS_SITE: &str = "a browser request from another site may not change the gateway \
     without an admin key (its Origin or Sec-Fetch-Site names another site)";

/// Why a request that changes state looks sent by a page of another site, if it does.
/// Browsers send `Origin` on every cross-origin POST and `Sec-Fetch-Site` on every request;
/// scripts and curl send neither, so they are never refused here.
fn cross_site(req: &HttpRequest) -> Option<&'static str> {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return None;
    }
    let header = |name: &HeaderName| req.headers().get(name).map(|v| v.as_bytes());
    foreign(header(&ORIGIN), header(&HOST), header(&SEC_FETCH_SITE)).then_some(CROSS_SITE)
}

/// The rule on the raw headers: `Sec-Fetch-Site` says `cross-site` or `same-site`, or an
/// `Origin` does not name the host the request was sent to.
fn foreign(origin: Option<&[u8]>, host: Option<&[u8]>, fetch_site: Option<&[u8]>) -> bool {
    let other_site = |s: &[u8]| {
        let s = s.trim_ascii();
        s.eq_ignore_ascii_case(b"cross-site") || s.eq_ignore_ascii_case(b"same-site")
    };
    if fetch_site.is_some_and(other_site) {
        return true;
    }
    match (origin, host) {
        (None, _) => false,
        (Some(o), Some(h)) => !names_host(o, h),
        (Some(_), None) => true,
    }
}

/// Whether an `Origin` (`scheme://host[:port]`) names `host` (a `Host` header), a default
/// port written or not. `Origin: null` (a sandboxed or file page) names no host.
fn names_host(origin: &[u8], host: &[u8]) -> bool {
    let (Ok(origin), Ok(host)) = (std::str::from_utf8(origin), std::str::from_utf8(host)) else {
        return false;
    };
    let Some((scheme, authority)) = origin.trim().split_once("://") else {
        return false;
    };
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        ":80"
    } else if scheme.eq_ignore_ascii_case("https") {
        ":443"
    } else {
        return false;
    };
    let bare = |a: &str| {
        let a = a.trim();
        a.strip_suffix(default_port)
            .unwrap_or(a)
            .to_ascii_lowercase()
    };
    !authority.is_empty() && !authority.contains(['/', '@']) && bare(authority) == bare(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `foreign` on (Origin, Host, Sec-Fetch-Site); `None` for a header not sent.
    fn check(origin: Option<&str>, host: Option<&str>, site: Option<&str>, refused: bool) {
        fn b(s: Option<&str>) -> Option<&[u8]> {
            s.map(str::as_bytes)
        }
        assert_eq!(
            foreign(b(origin), b(host), b(site)),
            refused,
            "Origin {origin:?}, Host {host:?}, Sec-Fetch-Site {site:?}"
        );
    }

    #[test]
    fn a_request_from_another_site_is_told_apart() {
        let gw = Some("127.0.0.1:30000");
        // Scripts and curl: no Origin, no Sec-Fetch-Site.
        check(None, gw, None, false);
        check(None, None, None, false);
        // The gateway's own pages.
        check(Some("http://127.0.0.1:30000"), gw, None, false);
        check(
            Some("http://127.0.0.1:30000"),
            gw,
            Some("same-origin"),
            false,
        );
        check(Some("HTTP://LOCALHOST"), Some("localhost:80"), None, false);
        check(
            Some("https://gw.example:443"),
            Some("gw.example"),
            None,
            false,
        );
        check(None, gw, Some("none"), false);
        // Another page.
        check(Some("http://evil.example"), gw, None, true);
        check(Some("http://127.0.0.1:8080"), gw, None, true);
        check(Some("http://127.0.0.1:3000"), gw, None, true);
        check(Some("null"), gw, None, true);
        check(Some("http://a@127.0.0.1:30000"), gw, None, true);
        check(Some("http://127.0.0.1:30000"), None, None, true);
        check(None, gw, Some("cross-site"), true);
        check(Some("http://127.0.0.1:30000"), gw, Some("same-site"), true);
        check(None, gw, Some("Cross-Site"), true);
    }
}
