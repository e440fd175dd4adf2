//! The endpoint picker's listeners (`ext_proc_port`, `ext_proc_host`, `grpc_health_port`,
//! `ext_proc_tls_cert`, `ext_proc_tls_key`):
//! kvgate as the picker an Envoy-based gateway asks over ext_proc (`docs/endpoint-picker.md`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, invalid};

/// Where the ext_proc front door listens; off unless `ext_proc_port` is given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PickerConfig {
    /// The gRPC port of `envoy.service.ext_proc.v3.ExternalProcessor` and
    /// `grpc.health.v1.Health` (h2c); `None`: no picker. llm-d's default is 9002.
    pub ext_proc_port: Option<u16>,
    /// Where that listener (and the health one) binds; `0.0.0.0` in a pod.
    pub ext_proc_host: String,
    /// A second listener serving only `grpc.health.v1.Health` (llm-d's default is 9003),
    /// always in cleartext: the kubelet's gRPC probes speak no TLS.
    pub grpc_health_port: Option<u16>,
    /// PEM certificate chain and key: the ext_proc port speaks TLS instead of h2c.
    pub ext_proc_tls_cert: Option<PathBuf>,
    pub ext_proc_tls_key: Option<PathBuf>,
    /// With the picker on, the HTTP port keeps its inference routes too (off: the gateway
    /// in front proxies, and the HTTP port serves the admin API, `/metrics` and the
    /// dashboard alone).
    pub http_inference: bool,
}

impl Default for PickerConfig {
    fn default() -> Self {
        PickerConfig {
            ext_proc_port: None,
            ext_proc_host: "127.0.0.1".into(),
            grpc_health_port: None,
            ext_proc_tls_cert: None,
            ext_proc_tls_key: None,
            http_inference: false,
        }
    }
}

impl PickerConfig {
    /// Whether the HTTP port serves the inference routes: always without the picker.
    pub(crate) fn http_serves_inference(&self) -> bool {
        self.ext_proc_port.is_none() || self.http_inference
    }
}

impl Section for PickerConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.ext_proc_host.is_empty() {
            return invalid("ext_proc_host", "must not be empty");
        }
        if self.ext_proc_tls_cert.is_some() != self.ext_proc_tls_key.is_some() {
            return invalid(
                "ext_proc_tls_cert",
                "give the certificate and the key together (ext_proc_tls_key)",
            );
        }
        if self.grpc_health_port.is_some() && self.ext_proc_port.is_none() {
            return invalid(
                "grpc_health_port",
                "serves the picker's health: give ext_proc_port too",
            );
        }
        if let (Some(a), Some(b)) = (self.ext_proc_port, self.grpc_health_port)
            && a != 0
            && a == b
        {
            return invalid("grpc_health_port", "must differ from ext_proc_port");
        }
        Ok(())
    }
}
