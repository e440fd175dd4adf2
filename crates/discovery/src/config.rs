//! What to watch: the label selector, the namespace, the engines' port.

use std::collections::BTreeMap;
use std::path::Path;

/// Where a pod finds its own namespace (mounted with its service account token).
pub const SERVICE_ACCOUNT_NAMESPACE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Which pods are workers and where their engines listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryConfig {
    /// Labels a pod must carry, every one with this value.
    pub selector: BTreeMap<String, String>,
    /// `None`: the pod's own namespace (from the service account), else `default`.
    pub namespace: Option<String>,
    /// The port the engines serve on, the same in every pod.
    pub port: u16,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            selector: BTreeMap::new(),
            namespace: None,
            port: 8000,
        }
    }
}

impl DiscoveryConfig {
    pub fn new<K: Into<String>, V: Into<String>>(
        selector: impl IntoIterator<Item = (K, V)>,
        namespace: Option<String>,
        port: u16,
    ) -> Self {
        DiscoveryConfig {
            selector: selector
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            namespace,
            port,
        }
    }

    /// The selector as the API takes it: `app=sglang,tier=gpu`.
    pub fn label_selector(&self) -> String {
        let pairs: Vec<String> = (self.selector.iter())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        pairs.join(",")
    }

    /// The namespace to watch: the configured one, else the pod's own, else `default`.
    pub fn resolved_namespace(&self) -> String {
        match &self.namespace {
            Some(ns) => ns.clone(),
            None => namespace_from(Path::new(SERVICE_ACCOUNT_NAMESPACE)),
        }
    }

    /// Whether a pod's labels carry the whole selector (the API filters already; this
    /// keeps a server that ignored `labelSelector` from adding strangers).
    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.selector
            .iter()
            .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
    }
}

/// The namespace written in `path` (trimmed), or `default` when it is missing or empty.
pub fn namespace_from(path: &Path) -> String {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_joins_every_label() {
        let c = DiscoveryConfig::new([("tier", "gpu"), ("app", "sglang")], None, 8000);
        assert_eq!(c.label_selector(), "app=sglang,tier=gpu");
        let mut labels = BTreeMap::new();
        labels.insert("app".to_owned(), "sglang".to_owned());
        assert!(!c.matches(Some(&labels)), "one label of two");
        labels.insert("tier".to_owned(), "gpu".to_owned());
        labels.insert("other".to_owned(), "x".to_owned());
        assert!(c.matches(Some(&labels)));
        assert!(!c.matches(None));
        assert!(DiscoveryConfig::default().matches(None), "no selector: all");
    }

    #[test]
    fn the_namespace_is_the_given_one_else_the_pods_own_else_default() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("namespace");
        assert_eq!(namespace_from(&file), "default");
        std::fs::write(&file, "  \n").unwrap();
        assert_eq!(namespace_from(&file), "default");
        std::fs::write(&file, "inference\n").unwrap();
        assert_eq!(namespace_from(&file), "inference");
        let c = DiscoveryConfig::new([("a", "b")], Some("ml".into()), 8000);
        assert_eq!(c.resolved_namespace(), "ml");
    }
}
