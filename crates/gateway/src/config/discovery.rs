//! Workers discovered from the Kubernetes API (`service_discovery*`, `selector`): the
//! reference gateway's flag names.

use std::path::PathBuf;

use kvgate_discovery::DiscoveryConfig;
use serde::{Deserialize, Serialize};

use super::ConfigError;
use super::section::{Section, invalid};

/// Whether to watch pods, which ones and where their engines listen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoverySection {
    /// Watch the Kubernetes API for worker pods.
    pub service_discovery: bool,
    /// `key=value` labels a pod must all carry.
    pub selector: Vec<String>,
    /// `None`: the gateway pod's own namespace, else `default`.
    pub service_discovery_namespace: Option<String>,
    /// The engines' port in every pod.
    pub service_discovery_port: u16,
    /// A kubeconfig to read instead of the standard resolution (`KUBECONFIG`, then the
    /// in-cluster service account): a gateway run outside the cluster.
    pub service_discovery_kubeconfig: Option<PathBuf>,
    /// An InferencePool (`inference.networking.k8s.io/v1`) of the namespace whose
    /// selector and first target port say which pods are the engines, followed as it
    /// changes; in place of `selector` and `service_discovery_port`.
    pub inference_pool: Option<String>,
}

impl Default for DiscoverySection {
    fn default() -> Self {
        DiscoverySection {
            service_discovery: false,
            selector: Vec::new(),
            service_discovery_namespace: None,
            service_discovery_port: 8000,
            service_discovery_kubeconfig: None,
            inference_pool: None,
        }
    }
}

/// `key=value` → its two halves, when the key is a label key (a non-empty name of
/// letters, digits, `-`, `_`, `.`, optionally behind a `prefix/`) and the value a label
/// value (possibly empty); the API server would refuse anything else.
fn label(pair: &str) -> Option<(&str, &str)> {
    let (k, v) = pair.split_once('=')?;
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let key_ok = match k.split_once('/') {
        Some((prefix, name)) => name_ok(prefix) && name_ok(name) && name.len() <= 63,
        None => name_ok(k) && k.len() <= 63,
    };
    let value_ok = v.is_empty() || (name_ok(v) && v.len() <= 63);
    (key_ok && value_ok).then_some((k, v))
}

/// A namespace name: a DNS label (lowercase letters, digits and `-`, at most 63, starting
/// and ending with a letter or digit).
fn dns_label(s: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    s.len() <= 63
        && edge(s.chars().next())
        && edge(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

impl DiscoverySection {
    /// What to watch, when discovery is on (the values checked by `validate`); with an
    /// InferencePool, its selector and port replace these once it is read.
    pub(crate) fn watch(&self) -> Option<DiscoveryConfig> {
        (self.service_discovery || self.inference_pool.is_some()).then(|| {
            DiscoveryConfig::new(
                self.selector.iter().filter_map(|p| label(p)),
                self.service_discovery_namespace.clone(),
                self.service_discovery_port,
            )
        })
    }
}

impl Section for DiscoverySection {
    fn validate(&self) -> Result<(), ConfigError> {
        for pair in &self.selector {
            if label(pair).is_none() {
                return invalid(
                    "selector",
                    format!("'{pair}' is not key=value with a Kubernetes label key and value"),
                );
            }
        }
        if let Some(pool) = &self.inference_pool {
            // A DNS subdomain, as every object name.
            if pool.len() > 253 || !pool.split('.').all(dns_label) {
                return invalid("inference_pool", "must be a Kubernetes object name");
            }
            if !self.selector.is_empty() {
                return invalid(
                    "selector",
                    "the InferencePool's selector is used: give either --selector or --inference-pool",
                );
            }
        } else if !self.service_discovery {
            return Ok(());
        }
        // Every pod of the namespace would be taken for an engine.
        if self.selector.is_empty() && self.inference_pool.is_none() {
            return invalid(
                "selector",
                "--service-discovery needs at least one key=value label",
            );
        }
        if self.service_discovery_port == 0 {
            return invalid("service_discovery_port", "must be a port from 1 to 65535");
        }
        if self
            .service_discovery_namespace
            .as_deref()
            .is_some_and(|ns| !dns_label(ns))
        {
            return invalid(
                "service_discovery_namespace",
                "must be a Kubernetes namespace name",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(selector: &[&str]) -> DiscoverySection {
        DiscoverySection {
            service_discovery: true,
            selector: selector.iter().map(|s| (*s).to_owned()).collect(),
            ..DiscoverySection::default()
        }
    }

    fn key_of(s: &DiscoverySection) -> Option<&'static str> {
        match s.validate() {
            Err(ConfigError::Invalid { key, .. }) => Some(key),
            _ => None,
        }
    }

    #[test]
    fn the_selector_is_labels_and_required_when_on() {
        let s = on(&["app=sglang", "example.com/tier=gpu", "empty="]);
        assert_eq!(key_of(&s), None);
        let w = s.watch().unwrap();
        assert_eq!(w.label_selector(), "app=sglang,empty=,example.com/tier=gpu");
        assert_eq!(w.port, 8000);
        assert_eq!(w.namespace, None);
        assert_eq!(key_of(&on(&[])), Some("selector"));
        for bad in ["app", "=x", "a b=c", "app=x,y", "a/b/c=d"] {
            assert_eq!(key_of(&on(&[bad])), Some("selector"), "{bad}");
        }
        assert_eq!(DiscoverySection::default().watch(), None, "off by default");
    }

    #[test]
    fn port_and_namespace_are_checked() {
        let mut s = on(&["app=x"]);
        s.service_discovery_port = 0;
        assert_eq!(key_of(&s), Some("service_discovery_port"));
        let mut s = on(&["app=x"]);
        for bad in ["has space", "Upper", "under_score", "-edge", ""] {
            s.service_discovery_namespace = Some(bad.into());
            assert_eq!(key_of(&s), Some("service_discovery_namespace"), "{bad}");
        }
        s.service_discovery_namespace = Some("ml-serving".into());
        assert_eq!(key_of(&s), None);
        assert_eq!(s.watch().unwrap().namespace.as_deref(), Some("ml-serving"));
    }

    #[test]
    fn an_inference_pool_turns_discovery_on_in_place_of_the_selector() {
        let pool = |name: &str| DiscoverySection {
            inference_pool: Some(name.into()),
            ..DiscoverySection::default()
        };
        let s = pool("vllm-llama");
        assert_eq!(key_of(&s), None);
        assert!(s.watch().is_some(), "on without --service-discovery");
        assert_eq!(key_of(&pool("Bad_Name")), Some("inference_pool"));
        assert_eq!(key_of(&pool("")), Some("inference_pool"));
        let mut both = pool("p");
        both.selector = vec!["app=x".into()];
        assert_eq!(key_of(&both), Some("selector"));
    }
}
