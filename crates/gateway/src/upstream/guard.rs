//! Names vetted when a worker was added, vetted again at each new connection.
//!
//! An API-added worker named by a host name passed the allow-list (or, without one, the
//! link-local and metadata refusal) with the addresses the name had then. The pool opens
//! connections long after, and DNS can answer differently by then (rebinding): a name
//! that resolved to an engine can come to point at the host's metadata service. For a
//! watched name the pool resolves itself, keeps only the addresses the same rule allows,
//! and connects to those; a name that now resolves to none of them fails as a refused
//! connection, which the engine certainly never saw.
//!
//! The guard also carries the TLS settings of `https://` workers (`tls`), so the pools and
//! the checks' and polls' `awc` clients, which all take it, connect alike.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, PoisonError, RwLock};

/// Whether a name may be reached at an address it resolved to.
pub(crate) type Judge = Arc<dyn Fn(&str, IpAddr) -> bool + Send + Sync>;

struct Inner {
    names: RwLock<HashSet<String>>,
    judge: Judge,
}

/// How connections to workers are made: shared by the registry's checks, the poller and
/// every HTTP thread's pool. It vets watched names (the default watches nothing) and
/// holds the TLS settings of `https://` workers (the default has none).
#[derive(Clone, Default)]
pub(crate) struct ConnectGuard {
    names: Option<Arc<Inner>>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for ConnectGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.names.as_ref().map_or(0, |i| {
            i.names.read().unwrap_or_else(PoisonError::into_inner).len()
        });
        f.debug_struct("ConnectGuard")
            .field("names", &n)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// Why a watched name cannot be connected to.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error("resolving the worker's name: {0}")]
    Resolve(#[source] std::io::Error),
    #[error("the worker's name now resolves only outside the allowed hosts")]
    Refused,
}

impl ConnectGuard {
    pub(crate) fn new(judge: Judge) -> ConnectGuard {
        ConnectGuard {
            names: Some(Arc::new(Inner {
                names: RwLock::new(HashSet::new()),
                judge,
            })),
            tls: None,
        }
    }

    /// With the TLS settings of `https://` workers, for the pools and the `awc` clients.
    pub(crate) fn with_tls(mut self, tls: Arc<rustls::ClientConfig>) -> ConnectGuard {
        self.tls = Some(tls);
        self
    }

    pub(super) fn tls(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.tls.clone()
    }

    /// Re-vets `host` at each connection from now on (stored lowercased, without a
    /// trailing dot, as URLs compare). An address literal cannot change: not watched.
    pub(crate) fn watch(&self, host: &str) {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() {
            return;
        }
        if let Some(i) = &self.names {
            i.names
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(normal(host));
        }
    }

    fn watched(&self, host: &str) -> Option<&Inner> {
        let i = self.names.as_deref()?;
        let names = i.names.read().unwrap_or_else(PoisonError::into_inner);
        // Most hosts are never watched; an empty set costs no allocation.
        (!names.is_empty() && names.contains(&normal(host))).then_some(i)
    }

    /// The addresses a connection to `host:port` may use: `None` when `host` is not
    /// watched (connect as usual), else those of its current addresses the rule allows.
    pub(crate) async fn addresses(
        &self,
        host: &str,
        port: u16,
    ) -> Option<Result<Vec<SocketAddr>, GuardError>> {
        let inner = self.watched(host)?;
        let judge = inner.judge.clone();
        let found = match tokio::net::lookup_host((host, port)).await {
            Ok(a) => a.collect::<Vec<_>>(),
            Err(e) => return Some(Err(GuardError::Resolve(e))),
        };
        let allowed: Vec<SocketAddr> = found.into_iter().filter(|a| judge(host, a.ip())).collect();
        Some(if allowed.is_empty() {
            Err(GuardError::Refused)
        } else {
            Ok(allowed)
        })
    }
}

impl ConnectGuard {
    /// An `awc` client for the worker checks and load polls (no redirects followed, a
    /// `timeout` per request) whose connections go through this guard, as the pool's do: a
    /// watched name connects only to the addresses the rule allows, and an `https://`
    /// worker is verified with the pool's TLS settings.
    pub(crate) fn awc_client(&self, timeout: std::time::Duration) -> awc::Client {
        let tcp = actix_tls::connect::Connector::new(actix_tls::connect::Resolver::custom(
            Guarded(self.clone()),
        ))
        .service();
        let mut connector = awc::Connector::new().connector(tcp);
        if let Some(tls) = &self.tls {
            connector = connector.rustls_0_23(tls.clone());
        }
        awc::Client::builder()
            .connector(connector)
            .timeout(timeout)
            .disable_redirects()
            .finish()
    }
}

/// The resolver of [`ConnectGuard::awc_client`].
struct Guarded(ConnectGuard);

impl actix_tls::connect::Resolve for Guarded {
    fn lookup<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> futures_util::future::LocalBoxFuture<'a, Result<Vec<SocketAddr>, Box<dyn std::error::Error>>>
    {
        Box::pin(async move {
            match self.0.addresses(host, port).await {
                Some(Ok(allowed)) => Ok(allowed),
                Some(Err(e)) => Err(Box::new(e) as Box<dyn std::error::Error>),
                None => Ok(tokio::net::lookup_host((host, port)).await?.collect()),
            }
        })
    }
}

fn normal(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn a_watched_name_connects_only_to_addresses_the_rule_allows() {
        // "localhost" resolves to loopback; the rule refuses 127.0.0.1 as a rebound name would be.
        let refuse_v4_loopback: Judge = Arc::new(|_, ip| ip != IpAddr::from([127, 0, 0, 1]));
        let g = ConnectGuard::new(refuse_v4_loopback);
        assert!(
            g.addresses("localhost", 80).await.is_none(),
            "not watched yet"
        );
        g.watch("LocalHost.");
        match g.addresses("localhost", 80).await {
            Some(Ok(a)) => assert!(
                a.iter().all(|a| a.ip() != IpAddr::from([127, 0, 0, 1])),
                "{a:?}"
            ),
            Some(Err(GuardError::Refused)) => {}
            other => panic!("{other:?}"),
        }
        let allow_all: Judge = Arc::new(|_, _| true);
        let open = ConnectGuard::new(allow_all);
        open.watch("localhost");
        let a = open.addresses("localhost", 8080).await;
        assert!(
            matches!(&a, Some(Ok(v)) if v.iter().all(|s| s.port() == 8080)),
            "{a:?}"
        );
        assert!(
            ConnectGuard::default()
                .addresses("localhost", 80)
                .await
                .is_none()
        );
    }

    /// A one-route server on 127.0.0.1; its port.
    fn health_server() -> u16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let srv = actix_web::HttpServer::new(|| {
                    actix_web::App::new().route(
                        "/health",
                        actix_web::web::get()
                            .to(|| async { actix_web::HttpResponse::Ok().finish() }),
                    )
                })
                .workers(1)
                .listen(listener)
                .expect("listen")
                .run();
                let _ = srv.await;
            });
        });
        port
    }

    #[actix_rt::test]
    async fn checks_and_polls_by_name_go_through_the_guard() {
        let port = health_server();
        let url = format!("http://localhost:{port}/health");
        let timeout = std::time::Duration::from_secs(5);
        // Watched, and its name now resolves only where the rule refuses: not connected.
        let refuse_all: Judge = Arc::new(|_, _| false);
        let closed = ConnectGuard::new(refuse_all);
        closed.watch("localhost");
        let r = closed.awc_client(timeout).get(&url).send().await;
        assert!(r.is_err(), "connected: {:?}", r.map(|r| r.status()));
        // The same name allowed (or not watched at all): the check goes through.
        let allow_v4: Judge = Arc::new(|_, ip| ip == IpAddr::from([127, 0, 0, 1]));
        let open = ConnectGuard::new(allow_v4);
        open.watch("localhost");
        for g in [open, ConnectGuard::default()] {
            let r = g.awc_client(timeout).get(&url).send().await;
            assert_eq!(r.map(|r| r.status().as_u16()).ok(), Some(200));
        }
    }
}
