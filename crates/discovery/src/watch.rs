//! The client and the watch: the maintained client's own configuration resolution and
//! watcher, as a stream of change batches.

use std::path::Path;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config};

use crate::{Change, DiscoveryConfig, DiscoveryError, Tracker};

/// A client: from the kubeconfig at `kubeconfig` when given, else the standard
/// resolution (`KUBECONFIG` or `~/.kube/config`, then the in-cluster service account).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, DiscoveryError> {
    let config = match kubeconfig {
        None => Config::infer()
            .await
            .map_err(|e| DiscoveryError::Config(e.to_string()))?,
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| DiscoveryError::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| DiscoveryError::Config(format!("{}: {e}", path.display())))?
        }
    };
    Client::try_from(config).map_err(DiscoveryError::Client)
}

/// The pods of `cfg` as batches of changes, one batch per watcher event that changed
/// something. The watcher lists, then watches from the list's `resourceVersion` with
/// bookmarks; after a `410 Gone` it lists again, and after an error it backs off
/// (`default_backoff`) and retries, yielding the error as an `Err` item in the meantime.
/// The stream does not end by itself.
pub fn changes(
    client: Client,
    cfg: &DiscoveryConfig,
) -> impl Stream<Item = Result<Vec<Change>, DiscoveryError>> + Send + 'static {
    let api: Api<Pod> = Api::namespaced(client, &cfg.resolved_namespace());
    let mut wc = watcher::Config::default();
    if !cfg.selector.is_empty() {
        wc = wc.labels(&cfg.label_selector());
    }
    let mut tracker = Tracker::new(cfg.clone());
    watcher(api, wc).default_backoff().filter_map(move |event| {
        let out = match event {
            Ok(e) => {
                let batch = tracker.apply(e);
                (!batch.is_empty()).then_some(Ok(batch))
            }
            Err(e) => Some(Err(DiscoveryError::Watch(e))),
        };
        futures_util::future::ready(out)
    })
}
