//! The listener's TLS (`--tls-cert-path`, `--tls-key-path`): the certificate and key read
//! at start (a bad pair fails the start), then read again on SIGHUP and when either
//! file's modification time changes (looked at every [`WATCH_EVERY`]). The pair in use
//! sits behind an `Arc` that a reload swaps, so handshakes never wait for a reload; a new
//! pair that does not load keeps the old one, with a warning.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, SystemTime};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;
use tracing::{info, warn};

use super::StartError;
use crate::upstream::{provider, read_certs, read_key};

/// How often the files' modification times are looked at.
pub(super) const WATCH_EVERY: Duration = Duration::from_secs(2);

/// An accepted connection: plain, or TLS once its handshake is done.
pub(super) type ListenerIo = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// The listener's certificate, reloadable.
#[derive(Debug)]
pub(super) struct ListenerCert {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The files' modification times when last read.
    stamps: RwLock<[Option<SystemTime>; 2]>,
}

impl ResolvesServerCert for ListenerCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

fn stamp(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The pair in `cert` and `key`, checked to belong together.
fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain = read_certs(cert).map_err(|e| e.to_string())?;
    let key_der = read_key(key).map_err(|e| e.to_string())?;
    CertifiedKey::from_der(chain, key_der, &provider())
        .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))
}

impl ListenerCert {
    fn stamps(&self) -> [Option<SystemTime>; 2] {
        [stamp(&self.cert), stamp(&self.key)]
    }

    /// Reads the files again; a pair that does not load leaves the current one.
    pub(super) fn reload(&self, why: &str) {
        let stamps = self.stamps();
        // Recorded first: a bad pair is warned of once, not at every look.
        *self.stamps.write().unwrap_or_else(PoisonError::into_inner) = stamps;
        match load(&self.cert, &self.key) {
            Ok(k) => {
                *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(k);
                info!(cert = %self.cert.display(), why, "TLS certificate reloaded");
            }
            Err(e) => warn!(
                error = %e,
                why,
                "the new TLS certificate cannot be used; serving the previous one"
            ),
        }
    }

    fn changed(&self) -> bool {
        *self.stamps.read().unwrap_or_else(PoisonError::into_inner) != self.stamps()
    }
}

/// The listener's acceptor when `--tls-cert-path` is given, its certificate watched for
/// reloads on `control`.
pub(super) fn listener_tls(
    cfg: &crate::config::GatewayConfig,
    control: &actix::Arbiter,
) -> Result<Option<TlsAcceptor>, StartError> {
    let Some((acceptor, cert)) = acceptor(cfg)? else {
        return Ok(None);
    };
    control.spawn(watch(Arc::downgrade(&cert)));
    Ok(Some(acceptor))
}

/// The listener's acceptor and its certificate.
fn acceptor(
    cfg: &crate::config::GatewayConfig,
) -> Result<Option<(TlsAcceptor, Arc<ListenerCert>)>, StartError> {
    let Some((cert, key)) = cfg.tls.listener() else {
        return Ok(None);
    };
    let stamps = [stamp(cert), stamp(key)];
    let first = load(cert, key).map_err(StartError::Tls)?;
    let resolver = Arc::new(ListenerCert {
        cert: cert.clone(),
        key: key.clone(),
        current: RwLock::new(Arc::new(first)),
        stamps: RwLock::new(stamps),
    });
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| StartError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(resolver.clone());
    // The service speaks HTTP/1.1 only.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some((TlsAcceptor::from(Arc::new(config)), resolver)))
}

/// Reloads on SIGHUP and when the files change, until the certificate is dropped (the
/// listener has stopped). Runs on the control arbiter.
async fn watch(cert: Weak<ListenerCert>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "no SIGHUP handler: the TLS certificate reloads on file change only");
            None
        }
    };
    loop {
        let hangup = async {
            let got = match hup.as_mut() {
                Some(s) => s.recv().await,
                None => None,
            };
            if got.is_none() {
                std::future::pending::<()>().await;
            }
        };
        let why = tokio::select! {
            () = hangup => "SIGHUP",
            () = tokio::time::sleep(WATCH_EVERY) => "changed",
        };
        let Some(c) = cert.upgrade() else { return };
        if why == "SIGHUP" || c.changed() {
            c.reload(why);
        }
    }
}

/// TLS over an accepted connection, within `timeout`.
pub(super) async fn accept(
    acceptor: &TlsAcceptor,
    io: TcpStream,
    timeout: Duration,
) -> std::io::Result<ListenerIo> {
    match tokio::time::timeout(timeout, acceptor.accept(io)).await {
        Ok(Ok(s)) => Ok(Either::Right(Box::new(s))),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tls")
            .join(name)
    }

    fn served(c: &ListenerCert) -> Vec<u8> {
        let k = c
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        k.cert[0].to_vec()
    }

    #[test]
    fn a_bad_new_pair_keeps_the_old_one_and_a_good_one_replaces_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (cert, key) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        let put = |from: &str, to: &Path| {
            std::fs::write(to, std::fs::read(fixture(from)).expect("fixture")).expect("write");
        };
        put("cert.pem", &cert);
        put("key.pem", &key);
        let mut cfg = crate::config::GatewayConfig::default();
        cfg.tls.tls_cert_path = Some(cert.clone());
        cfg.tls.tls_key_path = Some(key.clone());
        let (_, c) = acceptor(&cfg).expect("loads").expect("on");
        let first = served(&c);
        // Not PEM, then a certificate with another's key: both refused, the first kept.
        std::fs::write(&cert, "not a certificate").expect("write");
        c.reload("test");
        assert_eq!(served(&c), first);
        assert!(
            !c.changed(),
            "a refused pair is not tried again until the files change"
        );
        put("cert2.pem", &cert);
        c.reload("test");
        assert_eq!(served(&c), first);
        put("key2.pem", &key);
        c.reload("test");
        let second = read_certs(&fixture("cert2.pem")).expect("cert2");
        assert_eq!(served(&c), second[0].to_vec());
    }
}
