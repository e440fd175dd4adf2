//! One pod → the worker it is, if it should get traffic.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::Pod;

/// A pod that serves: its engine's URL and which pod it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `http://{podIP}:{port}` (`http://[{ip}]:{port}` for IPv6).
    pub url: String,
    pub pod: String,
    pub namespace: String,
    /// The pod's uid: a pod deleted and created again under the same name has a new one.
    pub uid: String,
    /// The pod's [`KV_EVENTS_ANNOTATION`]: its engine's KV-event publisher settings, for an
    /// engine that does not advertise them.
    pub kv_events_config: Option<String>,
}

/// The pod annotation that gives its engine's `--kv-events-config` JSON.
pub const KV_EVENTS_ANNOTATION: &str = "kvgate.io/kv-events-config";

/// The worker `pod` is, when it should get traffic: phase `Running`, its `Ready`
/// condition `True`, an IP, and no deletion timestamp (a pod being deleted may still be
/// Ready for a moment; it gets no new work). `None` otherwise, or when the pod has no name.
pub fn endpoint(pod: &Pod, port: u16) -> Option<Endpoint> {
    let meta = &pod.metadata;
    if meta.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running") {
        return None;
    }
    let ready =
        (status.conditions.iter().flatten()).any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    // An address the API server sent that is not an IP is not dialled.
    let ip: IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    let url = match ip {
        IpAddr::V4(v4) => format!("http://{v4}:{port}"),
        IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
    };
    Some(Endpoint {
        url,
        pod: meta.name.clone()?,
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        kv_events_config: (meta.annotations.as_ref())
            .and_then(|a| a.get(KV_EVENTS_ANNOTATION))
            .cloned(),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A pod as the API server sends it, with the fields that matter here.
    pub(crate) fn pod_json(name: &str, uid: &str, ip: Option<&str>, ready: bool) -> Value {
        let mut status = json!({
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": if ready { "True" } else { "False" }},
                {"type": "ContainersReady", "status": if ready { "True" } else { "False" }},
                {"type": "PodScheduled", "status": "True"}
            ],
            "hostIP": "10.0.0.1",
            "startTime": "2026-01-01T00:00:00Z"
        });
        if let Some(ip) = ip {
            status["podIP"] = json!(ip);
            status["podIPs"] = json!([{"ip": ip}]);
        }
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "ml",
                "uid": uid,
                "resourceVersion": "1",
                "labels": {"app": "sglang"}
            },
            "spec": {"containers": [{"name": "engine", "image": "sglang"}]},
            "status": status
        })
    }

    pub(crate) fn pod(v: Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_running_ready_pod_with_an_ip_is_a_worker() {
        let e = endpoint(&pod(pod_json("a", "u1", Some("10.1.2.3"), true)), 8000).unwrap();
        assert_eq!(
            e,
            Endpoint {
                url: "http://10.1.2.3:8000".into(),
                pod: "a".into(),
                namespace: "ml".into(),
                uid: "u1".into(),
                kv_events_config: None,
            }
        );
        // An engine that does not advertise its KV events says where they are.
        let mut annotated = pod_json("a", "u1", Some("10.1.2.3"), true);
        annotated["metadata"]["annotations"] =
            json!({KV_EVENTS_ANNOTATION: r#"{"endpoint": "tcp://*:5557"}"#});
        let e = endpoint(&pod(annotated), 8000).unwrap();
        assert_eq!(
            e.kv_events_config.as_deref(),
            Some(r#"{"endpoint": "tcp://*:5557"}"#)
        );
        let v6 = endpoint(&pod(pod_json("a", "u1", Some("fd00::7"), true)), 30000).unwrap();
        assert_eq!(v6.url, "http://[fd00::7]:30000");
    }

    #[test]
    fn any_missing_condition_means_no_worker() {
        let port = 8000;
        assert_eq!(
            endpoint(&pod(pod_json("a", "u", Some("10.1.2.3"), false)), port),
            None,
            "not ready"
        );
        assert_eq!(
            endpoint(&pod(pod_json("a", "u", None, true)), port),
            None,
            "no IP"
        );
        assert_eq!(
            endpoint(&pod(pod_json("a", "u", Some("not-an-ip"), true)), port),
            None
        );
        for phase in ["Pending", "Succeeded", "Failed", "Unknown"] {
            let mut v = pod_json("a", "u", Some("10.1.2.3"), true);
            v["status"]["phase"] = json!(phase);
            assert_eq!(endpoint(&pod(v), port), None, "{phase}");
        }
        let mut v = pod_json("a", "u", Some("10.1.2.3"), true);
        v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        assert_eq!(endpoint(&pod(v), port), None, "being deleted, still Ready");
        let mut v = pod_json("a", "u", Some("10.1.2.3"), true);
        v["status"]["conditions"] = json!([]);
        assert_eq!(endpoint(&pod(v), port), None, "no conditions yet");
        let mut v = pod_json("a", "u", Some("10.1.2.3"), true);
        v["status"] = json!(null);
        assert_eq!(endpoint(&pod(v), port), None, "no status");
    }
}
