//! The InferencePool (`inference.networking.k8s.io/v1`, the Gateway API Inference
//! Extension's) as a source of the discovery's selector and port: its `selector.matchLabels`
//! and its first `targetPorts` number, read and then watched, so a pool that changes
//! moves the pod watch with it.

use std::collections::BTreeMap;

use futures_util::{Stream, StreamExt};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use crate::DiscoveryError;

/// What a pool says of its engines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    /// Labels an engine pod carries, every one.
    pub selector: BTreeMap<String, String>,
    /// The engines' port (the pool's first target port).
    pub port: u16,
}

/// The InferencePool resource, as the dynamic client addresses it.
pub fn pool_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool");
    ApiResource::from_gvk_with_plural(&gvk, "inferencepools")
}

/// A pool object's spec (`{"spec": {...}}`, as the dynamic object's data holds it);
/// `None` when it has no labels or no usable port (its CRD refuses both).
pub fn pool_spec(data: &serde_json::Value) -> Option<PoolSpec> {
    let labels = data["spec"]["selector"]["matchLabels"].as_object()?;
    let selector: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect::<Option<_>>()?;
    let port = data["spec"]["targetPorts"][0]["number"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)?;
    (!selector.is_empty()).then_some(PoolSpec { selector, port })
}

/// The pool `name` in `namespace` as it changes: `Some` for each version of it, `None`
/// when it is deleted, missing from a (re)list, or unusable. Errors are reported and the
/// watcher retries after a backoff, as the pods' watch does.
pub fn pool_specs(
    client: Client,
    name: &str,
    namespace: &str,
) -> impl Stream<Item = Result<Option<PoolSpec>, DiscoveryError>> + Send + 'static {
    let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &pool_resource());
    let wc = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_owned();
    // Whether the list in progress has shown the pool.
    let mut listed = false;
    watcher::watcher(api, wc)
        .default_backoff()
        .filter_map(move |event| {
            let ours = |o: &DynamicObject| o.metadata.name.as_deref() == Some(name.as_str());
            let out = match event {
                Ok(Event::Init) => {
                    listed = false;
                    None
                }
                Ok(Event::InitApply(o)) if ours(&o) => {
                    listed = true;
                    Some(Ok(pool_spec(&o.data)))
                }
                Ok(Event::InitDone) => (!listed).then_some(Ok(None)),
                Ok(Event::Apply(o)) if ours(&o) => Some(Ok(pool_spec(&o.data))),
                Ok(Event::Delete(o)) if ours(&o) => Some(Ok(None)),
                Ok(_) => None,
                Err(e) => Some(Err(DiscoveryError::Watch(e))),
            };
            futures_util::future::ready(out)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pool_gives_its_labels_and_first_port() {
        let data = json!({"spec": {
            "selector": {"matchLabels": {"app": "vllm", "tier": "gpu"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}],
            "endpointPickerRef": {"name": "kvgate", "port": {"number": 9002}},
        }});
        let spec = pool_spec(&data).expect("a spec");
        assert_eq!(spec.port, 8000);
        assert_eq!(
            spec.selector.into_iter().collect::<Vec<_>>(),
            [("app".into(), "vllm".into()), ("tier".into(), "gpu".into())]
        );
        for bad in [
            json!({"spec": {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 1}]}}),
            json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []}}),
            json!({"spec": {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 70000}]}}),
            json!({"spec": {"selector": {"matchLabels": {"a": 1}}, "targetPorts": [{"number": 1}]}}),
            json!({}),
        ] {
            assert_eq!(pool_spec(&bad), None, "{bad}");
        }
        assert_eq!(pool_resource().plural, "inferencepools");
    }
}
