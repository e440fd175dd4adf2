//! TLS (`worker_ca_cert`, `worker_client_cert`, `worker_client_key`, `tls_cert_path`,
//! `tls_key_path`): how `https://` workers are verified and what the gateway presents to
//! them, and the listener's own certificate.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, invalid};

/// Off by default: `https://` workers verified against the system's roots, no client
/// certificate, the listener in cleartext.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM roots that replace the system's for `https://` workers (a private CA).
    pub worker_ca_cert: Option<PathBuf>,
    /// PEM client certificate chain and key shown to workers that ask for one (mTLS).
    pub worker_client_cert: Option<PathBuf>,
    pub worker_client_key: Option<PathBuf>,
    /// PEM certificate chain and key: the gateway's port speaks TLS. Read again on SIGHUP
    /// and when the files change.
    pub tls_cert_path: Option<PathBuf>,
    pub tls_key_path: Option<PathBuf>,
}

impl TlsConfig {
    /// The listener's certificate and key, when it speaks TLS.
    pub fn listener(&self) -> Option<(&PathBuf, &PathBuf)> {
        self.tls_cert_path.as_ref().zip(self.tls_key_path.as_ref())
    }
}

impl Section for TlsConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.worker_client_cert.is_some() != self.worker_client_key.is_some() {
            return invalid(
                "worker_client_cert",
                "give --worker-client-cert and --worker-client-key together",
            );
        }
        if self.tls_cert_path.is_some() != self.tls_key_path.is_some() {
            return invalid(
                "tls_cert_path",
                "give --tls-cert-path and --tls-key-path together",
            );
        }
        Ok(())
    }
}
