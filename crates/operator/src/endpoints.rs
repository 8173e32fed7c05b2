//! docs/behaviour.md §6: which pods are endpoints, and what they are called.

use burst_prefix_api::Endpoint;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{Selector, SelectorExt};
use kube::ResourceExt;

/// Ready pods matching `selector`, one endpoint per (pod, port), sorted by id. The id is
/// `namespace/pod-rank-i` with i the index of the port; the address is `podIP:port`.
pub fn endpoints(pods: &[Pod], selector: &Selector, ports: &[i32]) -> Vec<Endpoint> {
    let mut endpoints: Vec<Endpoint> = pods
        .iter()
        .filter(|pod| selector.matches(pod.labels()) && eligible(pod))
        .flat_map(|pod| {
            let namespace = pod.namespace().unwrap_or_default();
            let name = pod.name_any();
            let ip = pod_ip(pod).unwrap_or_default();
            ports.iter().enumerate().map(move |(rank, port)| Endpoint {
                id: format!("{namespace}/{name}-rank-{rank}"),
                address: if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                },
                running_requests: None,
            })
        })
        .collect();
    endpoints.sort_by(|a, b| a.id.cmp(&b.id));
    endpoints
}

/// Ready=True, a pod IP, and not being deleted.
pub fn eligible(pod: &Pod) -> bool {
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        });
    ready && pod_ip(pod).is_some() && pod.metadata.deletion_timestamp.is_none()
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .filter(|ip| !ip.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn pod(name: &str, app: &str, ready: &str, ip: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "labels": {"app": app}},
            "status": {
                "podIP": ip,
                "conditions": [{"type": "Ready", "status": ready}],
            },
        }))
        .unwrap()
    }

    fn selector() -> Selector {
        [("app", "vllm")].into_iter().collect()
    }

    #[test]
    fn ready_matching_pods_give_one_endpoint_per_port_sorted() {
        let pods = vec![
            pod("b", "vllm", "True", Some("10.0.0.2")),
            pod("a", "vllm", "True", Some("10.0.0.1")),
            pod("other", "web", "True", Some("10.0.0.3")),
        ];
        let found = endpoints(&pods, &selector(), &[8000, 8001]);
        let ids: Vec<_> = found.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(
            ids,
            ["ml/a-rank-0", "ml/a-rank-1", "ml/b-rank-0", "ml/b-rank-1"]
        );
        assert_eq!(found[1].address, "10.0.0.1:8001");
    }

    #[test]
    fn unready_ipless_and_deleting_pods_are_not_endpoints() {
        let mut deleting = pod("d", "vllm", "True", Some("10.0.0.4"));
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        let pods = vec![
            pod("u", "vllm", "False", Some("10.0.0.1")),
            pod("n", "vllm", "True", None),
            deleting,
        ];
        assert!(endpoints(&pods, &selector(), &[8000]).is_empty());
    }

    #[test]
    fn ipv6_addresses_are_bracketed() {
        let pods = vec![pod("a", "vllm", "True", Some("fd00::1"))];
        assert_eq!(
            endpoints(&pods, &selector(), &[8000])[0].address,
            "[fd00::1]:8000"
        );
    }
}
