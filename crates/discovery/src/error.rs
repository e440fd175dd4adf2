//! What can go wrong talking to the API server.

use thiserror::Error;

/// A failure to reach or read the Kubernetes API. The watch stream keeps going after
/// one (it backs off and retries), so these are reports, not ends.
#[derive(Debug, Error)]
pub enum DiscoveryError {
    /// No kubeconfig (`KUBECONFIG`, `~/.kube/config`) and not in a cluster, or a
    /// kubeconfig that cannot be read.
    #[error("kubernetes config: {0}")]
    Config(String),
    /// The client could not be built from the config (a bad URL, TLS material).
    #[error("kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The list or the watch failed (connection refused, a status the watcher does not
    /// recover from by itself); it is retried after a backoff.
    #[error("watching pods: {0}")]
    Watch(#[source] kube::runtime::watcher::Error),
}
