//! The producer NetworkPolicy (the chart's `networkPolicy`, the operator's
//! `--producer-network-policy`): who may reach each port of a policy's producer pods, and, when
//! the producer binds one (`engines.kvEvents.bind`), its KV-event port for the policy's own
//! inference pods (its selector, or its InferencePool's). Ingress only: the producers' own
//! connections (the API server, the model servers, their event and replay sockets when the
//! producers connect to the engines) are not limited.
//! A port with no peers is reachable by nobody (the kubelet's probes come from the node, which
//! CNIs that enforce NetworkPolicy let through); a NetworkPolicy only has effect where the
//! cluster's network plugin enforces it (docs/behaviour.md §9).

use burst_prefix_api::policy::BurstPrefixPolicy;
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;

use super::{kv_events_port, metadata, selector_labels};

/// Who may reach each producer port, as NetworkPolicy peers (pods by label, namespaces by label,
/// address blocks); the same for every policy's producers. Parsed from the operator's
/// `--producer-network-policy` JSON: `{"api": [...], "endpointPicker": [...], "admin": [...]}`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkPolicyPeers {
    /// The API port: the scoring API and the OpenAI-compatible proxy (`spec.producer.port`).
    #[serde(default)]
    pub api: Vec<NetworkPolicyPeer>,
    /// The endpoint picker (`spec.producer.eppPort`): the gateway's pods.
    #[serde(default)]
    pub endpoint_picker: Vec<NetworkPolicyPeer>,
    /// The admin port (`spec.producer.metricsPort`): `/metrics`, `/healthz`, `/readyz`.
    #[serde(default)]
    pub admin: Vec<NetworkPolicyPeer>,
}

/// The fields of a peer and of what it holds. k8s-openapi drops keys it does not know, so a
/// misspelled one would silently widen a peer (`namespaceSelector: {}` without its
/// `podSelector` admits every pod of every namespace): they are checked by name first.
const PEER_FIELDS: &[&str] = &["podSelector", "namespaceSelector", "ipBlock"];
const SELECTOR_FIELDS: &[&str] = &["matchLabels", "matchExpressions"];
const IP_BLOCK_FIELDS: &[&str] = &["cidr", "except"];

/// The first key of `object` that is not in `known`, if `object` is an object.
fn unknown_key<'a>(object: &'a serde_json::Value, known: &[&str]) -> Option<&'a str> {
    object
        .as_object()?
        .keys()
        .map(String::as_str)
        .find(|key| !known.contains(key))
}

impl NetworkPolicyPeers {
    /// Parses the operator flag's JSON. A key it does not know, or a peer the API server would
    /// refuse (none of its three fields set), is named here, at the operator's start.
    pub fn from_json(json: &str) -> Result<Self, String> {
        let shape = "a JSON object of api, endpointPicker and admin peer lists";
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| format!("not {shape}: {e}"))?;
        for port in ["api", "endpointPicker", "admin"] {
            let peers = value.get(port).and_then(|v| v.as_array());
            for (index, peer) in peers.into_iter().flatten().enumerate() {
                let at = format!("{port}[{index}]");
                if let Some(key) = unknown_key(peer, PEER_FIELDS) {
                    return Err(format!("{at}: unknown field `{key}`"));
                }
                for (field, known) in [
                    ("podSelector", SELECTOR_FIELDS),
                    ("namespaceSelector", SELECTOR_FIELDS),
                    ("ipBlock", IP_BLOCK_FIELDS),
                ] {
                    if let Some(key) = peer.get(field).and_then(|f| unknown_key(f, known)) {
                        return Err(format!("{at}.{field}: unknown field `{key}`"));
                    }
                }
            }
        }
        let peers: NetworkPolicyPeers =
            serde_json::from_value(value).map_err(|e| format!("not {shape}: {e}"))?;
        for (port, list) in [
            ("api", &peers.api),
            ("endpointPicker", &peers.endpoint_picker),
            ("admin", &peers.admin),
        ] {
            if let Some(index) = list.iter().position(|p| *p == NetworkPolicyPeer::default()) {
                return Err(format!(
                    "{port}[{index}] sets none of podSelector, namespaceSelector and ipBlock"
                ));
            }
        }
        Ok(peers)
    }
}

/// `engines` selects the policy's inference pods in its namespace (a peer with only a
/// `podSelector` is in the NetworkPolicy's own namespace).
pub fn build(
    policy: &BurstPrefixPolicy,
    peers: &NetworkPolicyPeers,
    engines: &LabelSelector,
) -> NetworkPolicy {
    let producer = &policy.spec.producer;
    let engine_pods = vec![NetworkPolicyPeer {
        pod_selector: Some(engines.clone()),
        ..NetworkPolicyPeer::default()
    }];
    let ingress = [
        (producer.port, &peers.api),
        (producer.epp_port, &peers.endpoint_picker),
        (producer.metrics_port, &peers.admin),
    ]
    .into_iter()
    .chain(kv_events_port(policy).map(|port| (port, &engine_pods)))
    .filter(|(_, from)| !from.is_empty())
    .map(|(port, from)| NetworkPolicyIngressRule {
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(port)),
            protocol: Some("TCP".into()),
            ..NetworkPolicyPort::default()
        }]),
        from: Some(from.clone()),
    })
    .collect();
    NetworkPolicy {
        metadata: metadata(policy),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(policy)),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".into()]),
            // An empty list, not none: with `Ingress` in policyTypes, no rule means no ingress.
            ingress: Some(ingress),
            ..NetworkPolicySpec::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{policy, policy_from};
    use serde_json::json;

    fn peers(json: serde_json::Value) -> NetworkPolicyPeers {
        NetworkPolicyPeers::from_json(&json.to_string()).unwrap()
    }

    #[test]
    fn selects_the_producer_pods_and_opens_each_port_to_its_peers_only() {
        let peers = peers(json!({
            "api": [{"podSelector": {}}],
            "endpointPicker": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}],
            "admin": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}},
                {"ipBlock": {"cidr": "10.0.0.0/8"}}
            ],
        }));
        let policy = policy();
        let built = build(&policy, &peers, &LabelSelector::default());
        assert_eq!(built.metadata.name.as_deref(), Some("rl-producer"));
        let spec = built.spec.unwrap();
        assert_eq!(
            spec.pod_selector.unwrap().match_labels,
            Some(selector_labels(&policy))
        );
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        assert!(spec.egress.is_none());
        let rules: Vec<(i32, serde_json::Value)> = spec
            .ingress
            .unwrap()
            .into_iter()
            .map(|rule| {
                let ports = rule.ports.unwrap();
                assert_eq!(ports.len(), 1);
                assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
                let IntOrString::Int(port) = ports[0].port.clone().unwrap() else {
                    panic!("a numbered port")
                };
                (port, serde_json::to_value(rule.from.unwrap()).unwrap())
            })
            .collect();
        // The policy's ports: API 8081, endpoint picker 9002, admin 9090.
        assert_eq!(
            rules,
            [
                (8081, json!([{"podSelector": {}}])),
                (9002, serde_json::to_value(&peers.endpoint_picker).unwrap()),
                (9090, serde_json::to_value(&peers.admin).unwrap()),
            ]
        );
    }

    #[test]
    fn a_port_without_peers_is_closed_and_no_peers_at_all_close_every_port() {
        let built = build(
            &policy(),
            &peers(json!({"api": [{"podSelector": {}}]})),
            &LabelSelector::default(),
        );
        let ingress = built.spec.unwrap().ingress.unwrap();
        assert_eq!(ingress.len(), 1);
        assert_eq!(
            ingress[0].ports.as_ref().unwrap()[0].port,
            Some(IntOrString::Int(8081))
        );
        let closed = build(
            &policy(),
            &NetworkPolicyPeers::default(),
            &LabelSelector::default(),
        );
        let spec = closed.spec.unwrap();
        assert_eq!(spec.ingress, Some(vec![]));
        // Serialized as an empty list (deny all ingress), not left out (which would mean the
        // same only because policyTypes says Ingress).
        let value = serde_json::to_value(&spec).unwrap();
        assert_eq!(value["ingress"], json!([]));
    }

    #[test]
    fn the_flag_refuses_unknown_ports_misspelled_peers_and_empty_peers() {
        let error = NetworkPolicyPeers::from_json(r#"{"metrics": []}"#).unwrap_err();
        assert!(error.contains("unknown field `metrics`"), "{error}");
        let error = NetworkPolicyPeers::from_json(r#"{"api": [{}]}"#).unwrap_err();
        assert!(error.contains("api[0] sets none of"), "{error}");
        // k8s-openapi would drop a misspelled key and widen the peer: refused by name.
        let error = NetworkPolicyPeers::from_json(
            r#"{"admin": [{"namespaceSelector": {}, "podSelectr": {"matchLabels": {"a": "b"}}}]}"#,
        )
        .unwrap_err();
        assert_eq!(error, "admin[0]: unknown field `podSelectr`");
        let error = NetworkPolicyPeers::from_json(
            r#"{"api": [{"namespaceSelector": {"matchLabel": {"a": "b"}}}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            error,
            "api[0].namespaceSelector: unknown field `matchLabel`"
        );
        let error =
            NetworkPolicyPeers::from_json(r#"{"api": [{"ipBlock": {"cdr": "10.0.0.0/8"}}]}"#)
                .unwrap_err();
        assert_eq!(error, "api[0].ipBlock: unknown field `cdr`");
        assert_eq!(
            NetworkPolicyPeers::from_json("{}").unwrap(),
            NetworkPolicyPeers::default()
        );
    }

    #[test]
    fn a_bound_event_port_admits_the_policys_inference_pods_only() {
        let engines: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "vllm"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}],
        }))
        .unwrap();
        let bound = policy_from(json!({"engines": {"kvEvents": {"bind": "tcp://[::]:5557"}}}));
        // Even with every other port closed.
        let ingress = build(&bound, &NetworkPolicyPeers::default(), &engines)
            .spec
            .unwrap()
            .ingress
            .unwrap();
        assert_eq!(
            serde_json::to_value(&ingress).unwrap(),
            json!([{
                "ports": [{"port": 5557, "protocol": "TCP"}],
                "from": [{"podSelector": {
                    "matchLabels": {"app": "vllm"},
                    "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}],
                }}],
            }])
        );
        let open = peers(json!({"api": [{"podSelector": {}}]}));
        let ports: Vec<_> = build(&bound, &open, &engines)
            .spec
            .unwrap()
            .ingress
            .unwrap()
            .into_iter()
            .map(|rule| rule.ports.unwrap()[0].port.clone().unwrap())
            .collect();
        assert_eq!(ports, [IntOrString::Int(8080), IntOrString::Int(5557)]);
        // The producers connect out to the engines: no rule (egress is not limited).
        let connecting = policy_from(json!({"engines": {"kvEvents": {"connectPort": 5557}}}));
        let ingress = build(&connecting, &NetworkPolicyPeers::default(), &engines)
            .spec
            .unwrap()
            .ingress
            .unwrap();
        assert!(ingress.is_empty(), "{ingress:?}");
    }
}
