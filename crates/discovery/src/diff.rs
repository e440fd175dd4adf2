//! The watcher's events → what changed in the set of workers.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::Event;

use crate::{DiscoveryConfig, Endpoint, endpoint};

/// One change in the set of discovered workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A pod became ready to serve at `url` (or came back as a new incarnation).
    Added {
        url: String,
        pod: String,
        namespace: String,
        uid: String,
        /// The pod's `kvgate.io/kv-events-config` annotation.
        kv_events_config: Option<String>,
    },
    /// The worker at this URL stopped serving: its pod turned unready, is being deleted,
    /// is gone, changed IP or was replaced.
    Removed(String),
}

impl Change {
    fn added(e: &Endpoint) -> Change {
        Change::Added {
            url: e.url.clone(),
            pod: e.pod.clone(),
            namespace: e.namespace.clone(),
            uid: e.uid.clone(),
            kv_events_config: e.kv_events_config.clone(),
        }
    }
}

/// Namespace and name: a pod's identity across its updates.
type PodKey = (String, String);

fn key(pod: &Pod) -> PodKey {
    let m = &pod.metadata;
    (
        m.namespace.clone().unwrap_or_default(),
        m.name.clone().unwrap_or_default(),
    )
}

/// Turns watcher events into [`Change`]s: which pods serve, as of the last event. A
/// pod whose IP or uid changed is a new incarnation (its engine's cache is not the old
/// one's): the old URL is removed, then the new one added. A relist (`Init` …
/// `InitDone`, after a start, a `410 Gone` or a reconnect) is compared whole with what
/// was known, so pods that vanished while the watch was down are removed.
#[derive(Debug, Clone)]
pub struct Tracker {
    cfg: DiscoveryConfig,
    serving: BTreeMap<PodKey, Endpoint>,
    /// The relist being read, between `Init` and `InitDone`.
    relist: Option<BTreeMap<PodKey, Endpoint>>,
}

impl Tracker {
    pub fn new(cfg: DiscoveryConfig) -> Tracker {
        Tracker {
            cfg,
            serving: BTreeMap::new(),
            relist: None,
        }
    }

    /// The pods that serve now.
    pub fn serving(&self) -> impl Iterator<Item = &Endpoint> {
        self.serving.values()
    }

    fn endpoint_of(&self, pod: &Pod) -> Option<Endpoint> {
        if !self.cfg.matches(pod.metadata.labels.as_ref()) {
            return None;
        }
        endpoint(pod, self.cfg.port)
    }

    /// The changes one event makes (none while a relist is being read).
    pub fn apply(&mut self, event: Event<Pod>) -> Vec<Change> {
        match event {
            Event::Init => {
                self.relist = Some(BTreeMap::new());
                Vec::new()
            }
            Event::InitApply(pod) => {
                let e = self.endpoint_of(&pod);
                if let (Some(relist), Some(e)) = (self.relist.as_mut(), e) {
                    relist.insert(key(&pod), e);
                }
                Vec::new()
            }
            Event::InitDone => {
                let next = self.relist.take().unwrap_or_default();
                self.replace(next)
            }
            Event::Apply(pod) => {
                let mut next = self.serving.clone();
                let k = key(&pod);
                match self.endpoint_of(&pod) {
                    Some(e) => {
                        // A pod given the address of one not yet seen leaving replaces it.
                        next.retain(|other, o| o.url != e.url || *other == k);
                        next.insert(k, e);
                    }
                    None => {
                        next.remove(&k);
                    }
                }
                self.replace(next)
            }
            Event::Delete(pod) => {
                let mut next = self.serving.clone();
                next.remove(&key(&pod));
                self.replace(next)
            }
        }
    }

    /// Moves to `next`, saying what changed: removals first, so a URL that passes from
    /// one pod (or incarnation) to another is removed before it is added again.
    fn replace(&mut self, next: BTreeMap<PodKey, Endpoint>) -> Vec<Change> {
        // By URL: two pods cannot serve one address; the later one wins.
        let by_url = |m: &BTreeMap<PodKey, Endpoint>| -> BTreeMap<String, Endpoint> {
            m.values().map(|e| (e.url.clone(), e.clone())).collect()
        };
        let (before, after) = (by_url(&self.serving), by_url(&next));
        let mut out = Vec::new();
        for (url, e) in &before {
            if after.get(url) != Some(e) {
                out.push(Change::Removed(url.clone()));
            }
        }
        for (url, e) in &after {
            if before.get(url) != Some(e) {
                out.push(Change::added(e));
            }
        }
        self.serving = next;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::tests::{pod, pod_json};
    use serde_json::json;

    fn tracker() -> Tracker {
        Tracker::new(DiscoveryConfig::new([("app", "sglang")], None, 8000))
    }

    fn p(name: &str, uid: &str, ip: &str, ready: bool) -> Pod {
        pod(pod_json(name, uid, Some(ip), ready))
    }

    fn added(url: &str, name: &str, uid: &str) -> Change {
        Change::Added {
            url: url.into(),
            pod: name.into(),
            namespace: "ml".into(),
            uid: uid.into(),
            kv_events_config: None,
        }
    }

    #[test]
    fn the_first_list_adds_the_ready_matching_pods() {
        let mut t = tracker();
        assert!(t.apply(Event::Init).is_empty());
        let mut stranger = pod_json("c", "u3", Some("10.0.0.3"), true);
        stranger["metadata"]["labels"] = json!({"app": "vllm"});
        for pod_ in [
            p("a", "u1", "10.0.0.1", true),
            p("b", "u2", "10.0.0.2", false),
            pod(stranger),
        ] {
            assert!(
                t.apply(Event::InitApply(pod_)).is_empty(),
                "nothing before InitDone"
            );
        }
        assert_eq!(
            t.apply(Event::InitDone),
            [added("http://10.0.0.1:8000", "a", "u1")]
        );
        // Readiness arrives: added; the same state again: nothing.
        let ready = p("b", "u2", "10.0.0.2", true);
        assert_eq!(
            t.apply(Event::Apply(ready.clone())),
            [added("http://10.0.0.2:8000", "b", "u2")]
        );
        assert!(t.apply(Event::Apply(ready)).is_empty());
        assert_eq!(t.serving().count(), 2);
    }

    #[test]
    fn unready_deleted_and_reincarnated_pods_are_removed() {
        let mut t = tracker();
        t.apply(Event::Apply(p("a", "u1", "10.0.0.1", true)));
        t.apply(Event::Apply(p("b", "u2", "10.0.0.2", true)));
        // The kubelet's order: deletion timestamp (removed at once), not ready, DELETED.
        let mut deleting = pod_json("a", "u1", Some("10.0.0.1"), true);
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(
            t.apply(Event::Apply(pod(deleting))),
            [Change::Removed("http://10.0.0.1:8000".into())]
        );
        assert!(
            t.apply(Event::Apply(p("a", "u1", "10.0.0.1", false)))
                .is_empty()
        );
        assert!(
            t.apply(Event::Delete(p("a", "u1", "10.0.0.1", false)))
                .is_empty()
        );
        // Same name, new IP: the old worker goes, the new one comes.
        assert_eq!(
            t.apply(Event::Apply(p("b", "u2", "10.0.0.9", true))),
            [
                Change::Removed("http://10.0.0.2:8000".into()),
                added("http://10.0.0.9:8000", "b", "u2")
            ]
        );
        // Same name and IP, new uid (re-created): a new incarnation.
        assert_eq!(
            t.apply(Event::Apply(p("b", "u3", "10.0.0.9", true))),
            [
                Change::Removed("http://10.0.0.9:8000".into()),
                added("http://10.0.0.9:8000", "b", "u3")
            ]
        );
        assert_eq!(
            t.apply(Event::Delete(p("b", "u3", "10.0.0.9", true))),
            [Change::Removed("http://10.0.0.9:8000".into())]
        );
        assert_eq!(t.serving().count(), 0);
    }

    #[test]
    fn a_relist_removes_what_vanished_and_keeps_what_stayed() {
        let mut t = tracker();
        t.apply(Event::Apply(p("a", "u1", "10.0.0.1", true)));
        t.apply(Event::Apply(p("b", "u2", "10.0.0.2", true)));
        // A 410 Gone or a reconnect: the watcher lists again.
        t.apply(Event::Init);
        t.apply(Event::InitApply(p("b", "u2", "10.0.0.2", true)));
        t.apply(Event::InitApply(p("c", "u4", "10.0.0.3", true)));
        assert!(t.serving().count() == 2, "unchanged until InitDone");
        assert_eq!(
            t.apply(Event::InitDone),
            [
                Change::Removed("http://10.0.0.1:8000".into()),
                added("http://10.0.0.3:8000", "c", "u4")
            ]
        );
    }

    #[test]
    fn an_address_taken_over_by_another_pod_is_a_new_worker() {
        let mut t = tracker();
        // `z` has not been seen going away yet, and `a` already has its IP.
        t.apply(Event::Apply(p("z", "u1", "10.0.0.1", true)));
        assert_eq!(
            t.apply(Event::Apply(p("a", "u2", "10.0.0.1", true))),
            [
                Change::Removed("http://10.0.0.1:8000".into()),
                added("http://10.0.0.1:8000", "a", "u2")
            ]
        );
        // `z`'s own end changes nothing now.
        assert!(
            t.apply(Event::Delete(p("z", "u1", "10.0.0.1", false)))
                .is_empty()
        );
        assert_eq!(t.serving().count(), 1);
    }
}
