//! TLS to `https://` workers: the client settings, read once at start and shared by the
//! pools and the checks' and polls' `awc` clients, and [`Conn`], a worker connection in
//! plain TCP or TLS over it. The PEM readers serve the listener's certificate too.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// TLS material that cannot be used; the message names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsFileError {
    #[error("reading {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{path}: {what}")]
    Content { path: String, what: String },
    #[error("TLS settings: {0}")]
    Settings(#[source] rustls::Error),
}

/// What the gateway presents and trusts towards `https://` workers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WorkerTlsFiles<'a> {
    /// PEM roots that replace the system's.
    pub(crate) ca: Option<&'a Path>,
    /// A client certificate chain and its key, for workers that ask for one (mTLS).
    pub(crate) client: Option<(&'a Path, &'a Path)>,
}

/// ring, named rather than taken from the process default: kube and tonic link rustls
/// too, and one crypto provider is picked here for all of them.
#[expect(
    deprecated,
    reason = "ring is the provider the tree links already; aws-lc-rs would add a C build"
)]
pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    std::fs::read(path).map_err(|e| TlsFileError::Read {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn content(path: &Path, what: impl std::fmt::Display) -> TlsFileError {
    TlsFileError::Content {
        path: path.display().to_string(),
        what: what.to_string(),
    }
}

/// Every certificate in a PEM file (at least one).
pub(crate) fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(path, e))?;
    if certs.is_empty() {
        return Err(content(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    PrivateKeyDer::from_pem_slice(&read(path)?).map_err(|e| content(path, e))
}

/// The client settings for `https://` workers: the roots of `files.ca`, else the system's,
/// and the client certificate when given. HTTP/1.1 is offered by ALPN: neither the pool
/// nor the checks speak HTTP/2.
pub(crate) fn worker_client_config(
    files: WorkerTlsFiles<'_>,
) -> Result<Arc<ClientConfig>, TlsFileError> {
    let mut roots = RootCertStore::empty();
    match files.ca {
        Some(ca) => {
            for c in read_certs(ca)? {
                roots.add(c).map_err(|e| content(ca, e))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                tracing::warn!(error = %e, "reading the system's root certificates");
            }
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                tracing::warn!(
                    "no system root certificates: https:// workers need --worker-ca-cert"
                );
            }
        }
    }
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsFileError::Settings)?
        .with_root_certificates(roots);
    let mut config = match files.client {
        Some((cert, key)) => builder
            .with_client_auth_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| content(key, e))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// A connection to a worker. The TLS one is boxed: its buffers would make every plain
/// connection as large.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    /// TLS over `tcp`, the worker's host as the name verified and sent (SNI).
    pub(super) async fn tls(
        config: Arc<ClientConfig>,
        host: &str,
        tcp: TcpStream,
    ) -> io::Result<Conn> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let s = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
        Ok(Conn::Tls(Box::new(s)))
    }

    /// Whether an idle connection is still open with nothing unread. A closed peer has
    /// made the socket readable (EOF); a live idle one has not. The plain socket is asked
    /// with `try_read`, which reads only a socket the runtime saw readable since its last
    /// short read, so a live connection is usually checked without a system call. A TLS
    /// one is read through rustls, with a waker that wakes nothing: records without data
    /// (session tickets, sent after the handshake) are consumed, a close or data is seen.
    pub(super) fn idle_alive(&mut self) -> bool {
        match self {
            Conn::Plain(s) => {
                matches!(s.try_read(&mut [0u8; 1]), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            Conn::Tls(s) => {
                let mut cx = Context::from_waker(Waker::noop());
                let mut one = [0u8; 1];
                let mut buf = ReadBuf::new(&mut one);
                Pin::new(s.as_mut())
                    .poll_read(&mut cx, &mut buf)
                    .is_pending()
            }
        }
    }

    /// The TCP socket underneath.
    #[cfg(test)]
    pub(super) fn tcp(&self) -> &TcpStream {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(s) => s.get_ref().0,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use bytes::Bytes;
    use kvgate_core::WorkerUrl;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::upstream::{ConnectGuard, Pool};

    fn fixture(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/tls")
            .join(name)
    }

    /// A TLS server on 127.0.0.1 answering `{}` to each request, closing each connection
    /// (with a TLS close) after `per_conn` answers; its URL and its connection count.
    fn tls_server(per_conn: usize) -> (WorkerUrl, Arc<AtomicUsize>) {
        let key = read_key(&fixture("key.pem")).expect("key");
        let certs = read_certs(&fixture("cert.pem")).expect("cert");
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let conns = Arc::new(AtomicUsize::new(0));
        let count = conns.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            let Ok(rt) = rt else { return };
            rt.block_on(async move {
                let Ok(l) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                while let Ok((tcp, _)) = l.accept().await {
                    count.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut s) = acceptor.accept(tcp).await else {
                        continue;
                    };
                    let mut buf = Vec::new();
                    for _ in 0..per_conn {
                        // Each request is a head and a 5-byte body.
                        while !buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.len() < 5 {
                            let mut chunk = [0u8; 4096];
                            match s.read(&mut chunk).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => buf.extend_from_slice(&chunk[..n]),
                            }
                        }
                        buf.clear();
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}";
                        if s.write_all(ok).await.is_err() {
                            break;
                        }
                    }
                    let _ = s.shutdown().await;
                }
            });
        });
        let url = WorkerUrl::parse(&format!("https://localhost:{port}")).expect("url");
        (url, conns)
    }

    fn pool(ca: &str) -> Pool {
        let tls = worker_client_config(WorkerTlsFiles {
            ca: Some(&fixture(ca)),
            client: None,
        })
        .expect("client config");
        let guard = ConnectGuard::default().with_tls(tls);
        Pool::new(Duration::from_secs(5), Duration::from_secs(30), guard)
    }

    async fn post_ok(p: &Pool, url: &WorkerUrl) {
        let r = p.post(url, "/x", &[], Bytes::from_static(b"hello")).await;
        let r = r.expect("an answer");
        assert_eq!(r.status.as_u16(), 200);
        assert_eq!(r.body.collect(1024).await.expect("body"), &b"{}"[..]);
    }

    #[actix_rt::test]
    async fn tls_connections_are_pooled_and_a_closed_one_is_not_reused() {
        let (url, conns) = tls_server(2);
        let p = pool("ca.pem");
        post_ok(&p, &url).await;
        post_ok(&p, &url).await;
        assert_eq!(conns.load(Ordering::SeqCst), 1, "kept alive over TLS");
        // The server closed it after two answers. Once the socket is readable (if rustls
        // has not read the close already), the idle check reads the TLS close, past any
        // session tickets, and the next request connects again.
        if let Some(conn) = p.checkout(url.origin()) {
            tokio::time::timeout(Duration::from_secs(10), conn.tcp().readable())
                .await
                .expect("the close reaches the idle connection")
                .expect("readable");
            p.checkin(url.origin(), conn);
        }
        post_ok(&p, &url).await;
        assert_eq!(conns.load(Ordering::SeqCst), 2);
        assert_eq!(p.idle_count(&url), 1);
    }

    #[actix_rt::test]
    async fn an_untrusted_certificate_fails_the_connection_and_says_why() {
        let (url, _) = tls_server(1);
        let p = pool("ca2.pem");
        let e = p
            .post(&url, "/x", &[], Bytes::from_static(b"hello"))
            .await
            .expect_err("refused");
        assert!(
            matches!(e, crate::upstream::UpstreamError::Connect(_)),
            "{e}"
        );
        assert!(e.to_string().contains("certificate"), "{e}");
        assert_eq!(p.idle_count(&url), 0);
    }
}
