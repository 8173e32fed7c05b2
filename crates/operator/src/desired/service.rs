//! The producer Service: the API and proxy port, the gRPC endpoint-picker port (what an
//! InferencePool's `endpointPickerRef` names), the metrics port and, when the producer binds
//! one (`engines.kvEvents.bind`), the port the engines publish their KV events to. Each port's
//! `appProtocol` says what a client must speak to it, following the producer's TLS
//! ([`super::tls`]).
//!
//! The event port is a plain TCP port behind the Service: each engine's connection reaches the
//! one producer pod the Service picked when it connected, a Ready one: with several producer
//! replicas the leader of that moment (`ha: leaderElection`), or any one of them
//! (`activeActive`), so each hears only some engines (docs/behaviour.md §10). Every replica hears
//! every engine only when the producers connect to the engines (`kvEvents.connectPort`), which
//! needs nothing here.

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_runtime::producer::EppTransport;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{kv_events_port, metadata, selector_labels, tls};

/// Port names, shared by the Service and the container.
pub const HTTP: &str = "http";
pub const EPP: &str = "epp";
pub const METRICS: &str = "metrics";
pub const KV_EVENTS: &str = "kv-events";
/// The event port's appProtocol: ZeroMQ's own protocol over TCP, which no mesh speaks; `tcp`
/// keeps one (Istio) from sniffing it as something else.
pub const KV_EVENTS_APP_PROTOCOL: &str = "tcp";
/// The appProtocol of a TLS endpoint picker: gRPC is HTTP/2, here over TLS (what the Gateway
/// API Inference Extension's reference endpoint-picker Service declares).
pub const EPP_TLS_APP_PROTOCOL: &str = "http2";
/// The appProtocol of a plaintext endpoint picker: HTTP/2 without TLS.
pub const EPP_PLAINTEXT_APP_PROTOCOL: &str = "kubernetes.io/h2c";

/// The endpoint picker port's appProtocol.
pub fn epp_app_protocol(policy: &BurstPrefixPolicy) -> &'static str {
    match tls::epp_transport(policy) {
        EppTransport::Plaintext => EPP_PLAINTEXT_APP_PROTOCOL,
        EppTransport::SelfSignedTls | EppTransport::Tls(_) => EPP_TLS_APP_PROTOCOL,
    }
}

/// The API port's appProtocol, and its URL scheme: `https` with TLS, else `http`.
pub fn api_scheme(policy: &BurstPrefixPolicy) -> &'static str {
    if tls::api_tls(policy).is_some() {
        "https"
    } else {
        "http"
    }
}

pub fn build(policy: &BurstPrefixPolicy) -> Service {
    let producer = &policy.spec.producer;
    let port = |name: &str, number: i32, app_protocol: &str| ServicePort {
        name: Some(name.into()),
        port: number,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        app_protocol: Some(app_protocol.into()),
        ..ServicePort::default()
    };
    Service {
        metadata: metadata(policy),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(policy)),
            ports: Some(
                [
                    Some(port(HTTP, producer.port, api_scheme(policy))),
                    Some(port(EPP, producer.epp_port, epp_app_protocol(policy))),
                    Some(port(METRICS, producer.metrics_port, "http")),
                    kv_events_port(policy)
                        .map(|number| port(KV_EVENTS, number, KV_EVENTS_APP_PROTOCOL)),
                ]
                .into_iter()
                .flatten()
                .collect(),
            ),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{policy, policy_from, policy_with};
    use serde_json::json;

    fn summary(policy: &BurstPrefixPolicy) -> Vec<(String, i32, String)> {
        build(policy)
            .spec
            .unwrap()
            .ports
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap(),
                    p.port,
                    p.app_protocol.clone().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn exposes_the_api_the_endpoint_picker_over_tls_and_metrics() {
        assert_eq!(
            summary(&policy()),
            [
                ("http".to_string(), 8081, "http".to_string()),
                ("epp".to_string(), 9002, "http2".to_string()),
                ("metrics".to_string(), 9090, "http".to_string()),
            ]
        );
        let with_secret = policy_with(json!({"eppTls": {"secretName": "picker-cert"}}));
        assert_eq!(summary(&with_secret)[1].2, "http2");
    }

    #[test]
    fn app_protocols_follow_plaintext_and_api_tls() {
        let policy = policy_with(json!({
            "eppTls": {"plaintext": true},
            "apiTls": {"secretName": "api-cert"},
        }));
        let protocols: Vec<_> = summary(&policy).into_iter().map(|p| p.2).collect();
        assert_eq!(protocols, ["https", "kubernetes.io/h2c", "http"]);
    }

    #[test]
    fn a_bound_event_endpoint_gets_its_own_port_and_nothing_else_does() {
        let bound = policy_from(json!({"engines": {"kvEvents": {"bind": "tcp://0.0.0.0:5557"}}}));
        assert_eq!(
            summary(&bound)[3..],
            [("kv-events".to_string(), 5557, "tcp".to_string())]
        );
        let service = build(&bound).spec.unwrap().ports.unwrap();
        assert_eq!(
            service[3].target_port,
            Some(IntOrString::String("kv-events".into()))
        );
        assert_eq!(service[3].protocol.as_deref(), Some("TCP"));
        // The producers connect to the engines: nothing to expose.
        for engines in [
            json!({"kvEvents": {"connectPort": 5557, "replayPort": 5558}}),
            json!({"loadIntervalMs": 1000}),
            json!({}),
        ] {
            let names: Vec<_> = summary(&policy_from(json!({"engines": engines})))
                .into_iter()
                .map(|p| p.0)
                .collect();
            assert_eq!(names, ["http", "epp", "metrics"], "{engines}");
        }
        // A bind the validation refuses exposes nothing either.
        let refused =
            policy_from(json!({"engines": {"kvEvents": {"bind": "tcp://127.0.0.1:5557"}}}));
        assert_eq!(summary(&refused).len(), 3);
    }
}
