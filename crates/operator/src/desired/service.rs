//! The producer Service: the API and proxy port, the gRPC endpoint-picker port (what an
//! InferencePool's `endpointPickerRef` names) and the metrics port. Each port's `appProtocol`
//! says what a client must speak to it, following the producer's TLS ([`super::tls`]).

use burst_prefix_api::policy::BurstPrefixPolicy;
use burst_prefix_runtime::producer::EppTransport;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{metadata, selector_labels, tls};

/// Port names, shared by the Service and the container.
pub const HTTP: &str = "http";
pub const EPP: &str = "epp";
pub const METRICS: &str = "metrics";
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
            ports: Some(vec![
                port(HTTP, producer.port, api_scheme(policy)),
                port(EPP, producer.epp_port, epp_app_protocol(policy)),
                port(METRICS, producer.metrics_port, "http"),
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::{policy, policy_with};
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
}
