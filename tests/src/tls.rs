//! TLS for the tests: the fixtures of `tests/fixtures/tls` and a relay that terminates
//! TLS in front of a plain server (a simulated engine, a scripted upstream, a gateway),
//! optionally asking for a client certificate.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A file of `tests/fixtures/tls`.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/tls")
        .join(name)
}

/// Every certificate of a PEM file.
pub fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .expect("a PEM file")
        .collect::<Result<_, _>>()
        .expect("PEM certificates")
}

#[expect(deprecated, reason = "ring, the provider the gateway uses")]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server config with `cert` and `key`; with `client_ca`, a client certificate signed
/// by it is required.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Arc<rustls::ServerConfig> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions");
    let builder = match client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in certs(ca) {
                roots.add(c).expect("a CA certificate");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .expect("a client verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let key = PrivateKeyDer::from_pem_file(key).expect("a PEM key");
    Arc::new(
        builder
            .with_single_cert(certs(cert), key)
            .expect("a certificate and its key"),
    )
}

/// A client config that trusts the certificates of `ca` only.
pub fn client_config(ca: &[&Path]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for path in ca {
        for c in certs(path) {
            roots.add(c).expect("a CA certificate");
        }
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// A TLS-terminating TCP relay on 127.0.0.1 (an OS-picked port) to a plain address, on a
/// thread of its own for the rest of the test process.
#[derive(Debug)]
pub struct TlsRelay {
    pub addr: SocketAddr,
    /// Connections whose TLS handshake failed.
    pub refused: Arc<AtomicUsize>,
    /// Connections relayed.
    pub relayed: Arc<AtomicUsize>,
}

impl TlsRelay {
    pub fn start(target: SocketAddr, config: Arc<rustls::ServerConfig>) -> TlsRelay {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        listener.set_nonblocking(true).expect("nonblocking");
        let refused = Arc::new(AtomicUsize::new(0));
        let relayed = Arc::new(AtomicUsize::new(0));
        let (r, ok) = (refused.clone(), relayed.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, r, ok) = (acceptor.clone(), r.clone(), ok.clone());
                    #[expect(
                        clippy::disallowed_methods,
                        reason = "a test relay's connections, on its own runtime"
                    )]
                    tokio::spawn(async move {
                        let Ok(mut tls) = acceptor.accept(tcp).await else {
                            r.fetch_add(1, Ordering::SeqCst);
                            return;
                        };
                        ok.fetch_add(1, Ordering::SeqCst);
                        if let Ok(mut up) = tokio::net::TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                        }
                    });
                }
            });
        });
        TlsRelay {
            addr,
            refused,
            relayed,
        }
    }

    /// The relay's `https://` URL by the name its certificate carries.
    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

/// The `host:port` of a plain `http://` URL.
pub fn addr_of(url: &str) -> SocketAddr {
    url.trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .expect("an http://ip:port URL")
}

/// The certificate a TLS server at `addr` presents for `localhost`, verified against `ca`.
pub async fn served_certificate(addr: SocketAddr, ca: &[&Path]) -> CertificateDer<'static> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("a name");
    let tls = tokio_rustls::TlsConnector::from(client_config(ca))
        .connect(name, tcp)
        .await
        .expect("a TLS handshake");
    let certs = tls.get_ref().1.peer_certificates().expect("a certificate");
    certs[0].clone().into_owned()
}

/// An `awc` client that trusts the certificates of `ca` only.
pub fn https_client(ca: &[&Path]) -> awc::Client {
    let mut config = (*client_config(ca)).clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    awc::Client::builder()
        .connector(awc::Connector::new().rustls_0_23(Arc::new(config)))
        .timeout(std::time::Duration::from_secs(30))
        .finish()
}
