//! # kvgate-discovery
//!
//! Inference workers discovered from the Kubernetes API: the pods that carry every label
//! of a selector, in one namespace, each a worker at `http://{podIP}:{port}` while it is
//! ready to serve.
//!
//! The pieces, usable on their own:
//! - [`DiscoveryConfig`]: the selector, the namespace (by default the pod's own, read from
//!   the service account, else `default`) and the engines' port.
//! - [`endpoint`]: one pod → the worker it is, if it should get traffic (Running, `Ready`
//!   condition True, an IP, no deletion timestamp).
//! - [`Tracker`]: the watcher's events → [`Change`]s (`Added`, `Removed`), a pod with a new
//!   IP or a new uid being a new incarnation (the old one removed, the new one added).
//! - [`pool_specs`]: an InferencePool (`inference.networking.k8s.io/v1`) watched for its
//!   selector and target port ([`PoolSpec`]), the pods' watch to follow it.
//! - [`client`] and [`changes`]: the maintained client's standard configuration
//!   (`KUBECONFIG`, then the in-cluster service account) and its watcher (list, then watch
//!   from the list's `resourceVersion` with bookmarks, a fresh list after `410 Gone`, a
//!   backoff after errors), as a stream of change batches.
//!
//! ```no_run
//! # async fn run() -> Result<(), kvgate_discovery::DiscoveryError> {
//! use futures_util::StreamExt;
//! let cfg = kvgate_discovery::DiscoveryConfig::new([("app", "sglang")], None, 8000);
//! let client = kvgate_discovery::client(None).await?;
//! let mut stream = std::pin::pin!(kvgate_discovery::changes(client, &cfg));
//! while let Some(batch) = stream.next().await {
//!     match batch {
//!         Ok(changes) => println!("{changes:?}"),
//!         // The watcher retries by itself after a backoff; an error is only news.
//!         Err(e) => eprintln!("{e}"),
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The pods are read with `list` and `watch` on `pods` in the namespace; nothing is
//! written. The account needs a Role granting `get`, `list` and `watch` on `pods` (and on
//! `inferencepools` of `inference.networking.k8s.io` to follow a pool).

mod config;
mod diff;
mod endpoint;
mod error;
mod pool;
mod watch;

pub use config::{DiscoveryConfig, SERVICE_ACCOUNT_NAMESPACE, namespace_from};
pub use diff::{Change, Tracker};
pub use endpoint::{Endpoint, KV_EVENTS_ANNOTATION, endpoint};
pub use error::DiscoveryError;
pub use pool::{PoolSpec, pool_resource, pool_spec, pool_specs};
pub use watch::{changes, client};

/// The Kubernetes objects this crate reads, re-exported so callers need no version
/// feature of their own.
pub use k8s_openapi::api::core::v1::Pod;
/// The API client [`client`] builds, for callers that keep it.
pub use kube::Client;
/// The watcher's events, as [`Tracker::apply`] takes them.
pub use kube::runtime::watcher::Event;
