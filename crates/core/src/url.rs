//! A worker's base URL, parsed once and shared by everything that talks to the worker,
//! and [`split_url`], the one place a URL is taken apart.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// A URL that cannot name a worker.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("invalid worker url '{url}': {reason}")]
pub struct UrlError {
    pub url: String,
    pub reason: &'static str,
}

/// A worker's base URL in canonical form: `http[s]://host[:port][/prefix]`, scheme and
/// host lowercased, no trailing slash. Cloning is cheap; two URLs are equal when their
/// canonical forms are.
///
/// ```
/// use kvgate_core::WorkerUrl;
///
/// let u = WorkerUrl::parse("HTTP://Engine-1:8000/v1/")?;
/// assert_eq!(u.as_str(), "http://engine-1:8000/v1");
/// assert_eq!((u.host(), u.port(), u.authority(), u.prefix()), ("engine-1", 8000, "engine-1:8000", "/v1"));
/// assert_eq!(u.join("/health"), "http://engine-1:8000/v1/health");
/// let t = WorkerUrl::parse("https://Engine-2/v1")?;
/// assert_eq!((t.as_str(), t.is_tls(), t.port(), t.origin()), ("https://engine-2/v1", true, 443, "https://engine-2"));
/// assert!(WorkerUrl::parse("ftp://a:1").is_err());
/// # Ok::<(), kvgate_core::UrlError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct WorkerUrl(Arc<Parts>);

#[derive(PartialEq, Eq, Hash)]
struct Parts {
    text: String,
    /// Where `host:port` lies in `text`.
    authority: Range<usize>,
    /// The host without IPv6 brackets.
    host: Range<usize>,
    port: u16,
    /// `https://`: the connection speaks TLS.
    tls: bool,
}

impl WorkerUrl {
    pub fn parse(url: &str) -> Result<WorkerUrl, UrlError> {
        let bad = |reason| UrlError {
            url: url.to_owned(),
            reason,
        };
        let p = split_url(url.trim().trim_end_matches('/'));
        let scheme = p.scheme.ok_or_else(|| bad("expected http://host:port"))?;
        let (scheme, tls, default_port) = if scheme.eq_ignore_ascii_case("http") {
            ("http://", false, 80)
        } else if scheme.eq_ignore_ascii_case("https") {
            ("https://", true, 443)
        } else {
            return Err(bad("only http:// and https:// workers are supported"));
        };
        // Both go into request lines and Host headers as they are.
        let visible = |s: &str| s.bytes().all(|b| b.is_ascii_graphic());
        if p.authority.is_empty() || p.userinfo.is_some() || !visible(p.authority) {
            return Err(bad("missing or malformed host"));
        }
        if !p.rest.is_empty() {
            return Err(bad("must not carry a query or fragment"));
        }
        if !visible(p.path) {
            return Err(bad("the path must be visible ASCII"));
        }
        let port = match p.port {
            Some(t) => t
                .parse::<u16>()
                .map_err(|_| bad("port must be a number from 0 to 65535"))?,
            None => default_port,
        };
        let bare = p.host.trim_start_matches('[').trim_end_matches(']');
        if bare.is_empty() {
            return Err(bad("missing or malformed host"));
        }
        let text = format!("{scheme}{}{}", p.authority.to_ascii_lowercase(), p.path);
        let host_start = scheme.len() + (p.host.len() - p.host.trim_start_matches('[').len());
        Ok(WorkerUrl(Arc::new(Parts {
            authority: scheme.len()..scheme.len() + p.authority.len(),
            host: host_start..host_start + bare.len(),
            port,
            tls,
            text,
        })))
    }

    /// The canonical form.
    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    /// `host[:port]` as written (lowercased): the `Host` header.
    pub fn authority(&self) -> &str {
        &self.0.text[self.0.authority.clone()]
    }

    /// The host to connect to, without IPv6 brackets.
    pub fn host(&self) -> &str {
        &self.0.text[self.0.host.clone()]
    }

    pub fn port(&self) -> u16 {
        self.0.port
    }

    /// Whether the worker is reached over TLS (`https://`).
    pub fn is_tls(&self) -> bool {
        self.0.tls
    }

    /// `scheme://host[:port]`: what a connection to the worker is, whatever the prefix
    /// (`http://h:443` and `https://h:443` are two).
    pub fn origin(&self) -> &str {
        &self.0.text[..self.0.authority.end]
    }

    /// The path the worker is mounted under, without a trailing slash ("" for none).
    pub fn prefix(&self) -> &str {
        &self.0.text[self.0.authority.end..]
    }

    /// The full URL of one of the worker's routes (`path` starts with `/`).
    pub fn join(&self, path: &str) -> String {
        let mut s = String::with_capacity(self.0.text.len() + path.len());
        s.push_str(&self.0.text);
        s.push_str(path);
        s
    }
}

/// The parts of `[scheme://][userinfo@]host[:port][/path][?query][#fragment]`, borrowed
/// from the text and not checked: each caller decides what it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UrlParts<'a> {
    /// Before `://`; `None` without one.
    pub scheme: Option<&'a str>,
    pub userinfo: Option<&'a str>,
    /// `host[:port]`, without the userinfo.
    pub authority: &'a str,
    /// As written: an IPv6 literal keeps its brackets.
    pub host: &'a str,
    /// The digits after the host's `:`, not yet a number.
    pub port: Option<&'a str>,
    /// From the first `/` after the authority up to the query or fragment ("" for none).
    pub path: &'a str,
    /// The query and fragment, with their leading `?` or `#` ("" for none).
    pub rest: &'a str,
}

/// Takes a URL apart; never fails (an empty host is an empty `host`).
pub fn split_url(url: &str) -> UrlParts<'_> {
    let (scheme, after) = match url.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, url),
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (full_authority, tail) = after.split_at(end);
    let (userinfo, authority) = match full_authority.rsplit_once('@') {
        Some((u, a)) => (Some(u), a),
        None => (None, full_authority),
    };
    let (host, port) = if authority.starts_with('[') {
        match authority.find(']') {
            Some(close) => {
                let (h, p) = authority.split_at(close + 1);
                (h, p.strip_prefix(':'))
            }
            None => (authority, None),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let (path, rest) = tail.split_at(path_end);
    UrlParts {
        scheme,
        userinfo,
        authority,
        host,
        port,
        path,
        rest,
    }
}

impl fmt::Display for WorkerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for WorkerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl Serialize for WorkerUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for WorkerUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<WorkerUrl, D::Error> {
        let s = String::deserialize(d)?;
        WorkerUrl::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_normalize() {
        let ok = |s: &str| WorkerUrl::parse(s).map(|u| u.to_string()).unwrap();
        assert_eq!(ok("http://A:8000/"), "http://a:8000");
        assert_eq!(ok(" http://h:1/v1 "), "http://h:1/v1");
        assert_eq!(ok("HTTP://[::1]:80"), "http://[::1]:80");
        assert_eq!(ok("HTTPS://H:8443/v1/"), "https://h:8443/v1");
        for bad in [
            "",
            "h:8000",
            "ftp://h",
            "http://",
            "http://h:99999",
            "http://u@h",
            "http://h/x?y",
            "http://h/a b",
            "http://[]:80",
            "http://h\u{e9}:1",
        ] {
            assert!(WorkerUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_split_into_their_parts() {
        let p = split_url("tcp://user@[::1]:5557/x?q#f");
        assert_eq!(
            (
                p.scheme,
                p.userinfo,
                p.authority,
                p.host,
                p.port,
                p.path,
                p.rest
            ),
            (
                Some("tcp"),
                Some("user"),
                "[::1]:5557",
                "[::1]",
                Some("5557"),
                "/x",
                "?q#f"
            )
        );
        let p = split_url("h:1");
        assert_eq!(
            (p.scheme, p.host, p.port, p.path),
            (None, "h", Some("1"), "")
        );
        let p = split_url("*");
        assert_eq!((p.host, p.port), ("*", None));
        let p = split_url("http://[::1");
        assert_eq!((p.host, p.port), ("[::1", None));
    }

    #[test]
    fn parts_are_split_once() {
        let u = WorkerUrl::parse("http://[::1]:9000/mount").unwrap();
        assert_eq!(u.host(), "::1");
        assert_eq!(u.port(), 9000);
        assert_eq!(u.authority(), "[::1]:9000");
        assert_eq!(u.prefix(), "/mount");
        let plain = WorkerUrl::parse("http://Host").unwrap();
        assert_eq!(
            (plain.host(), plain.port(), plain.prefix()),
            ("host", 80, "")
        );
        let json = serde_json::to_string(&plain).unwrap();
        assert_eq!(json, "\"http://host\"");
        assert_eq!(serde_json::from_str::<WorkerUrl>(&json).unwrap(), plain);
        assert!(serde_json::from_str::<WorkerUrl>("\"ftp://x\"").is_err());
        let tls = WorkerUrl::parse("https://[::1]/m").unwrap();
        assert_eq!(
            (
                tls.host(),
                tls.port(),
                tls.authority(),
                tls.prefix(),
                tls.is_tls()
            ),
            ("::1", 443, "[::1]", "/m", true)
        );
        assert_eq!(tls.origin(), "https://[::1]");
        assert!(!plain.is_tls());
        assert_eq!(plain.origin(), "http://host");
    }
}
