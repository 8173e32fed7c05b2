//! The producer Service: the API and proxy port, the gRPC endpoint-picker port (what an
//! InferencePool's `endpointPickerRef` names) and the metrics port.

use burst_prefix_api::policy::BurstPrefixPolicy;
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{metadata, selector_labels};

/// Port names, shared by the Service and the container.
pub const HTTP: &str = "http";
pub const EPP: &str = "epp";
pub const METRICS: &str = "metrics";
/// The appProtocol of the endpoint-picker port: gRPC is HTTP/2 without TLS (GAIE's convention).
pub const EPP_APP_PROTOCOL: &str = "kubernetes.io/h2c";

pub fn build(policy: &BurstPrefixPolicy) -> Service {
    let producer = &policy.spec.producer;
    let port = |name: &str, number: i32, app_protocol: Option<&str>| ServicePort {
        name: Some(name.into()),
        port: number,
        target_port: Some(IntOrString::String(name.into())),
        protocol: Some("TCP".into()),
        app_protocol: app_protocol.map(Into::into),
        ..ServicePort::default()
    };
    Service {
        metadata: metadata(policy),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(policy)),
            ports: Some(vec![
                port(HTTP, producer.port, Some("http")),
                port(EPP, producer.epp_port, Some(EPP_APP_PROTOCOL)),
                port(METRICS, producer.metrics_port, Some("http")),
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::tests::policy;

    #[test]
    fn exposes_the_api_the_endpoint_picker_and_metrics() {
        let ports = build(&policy()).spec.unwrap().ports.unwrap();
        let summary: Vec<_> = ports
            .iter()
            .map(|p| {
                (
                    p.name.clone().unwrap(),
                    p.port,
                    p.app_protocol.clone().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("http".to_string(), 8081, "http".to_string()),
                ("epp".to_string(), 9002, "kubernetes.io/h2c".to_string()),
                ("metrics".to_string(), 9090, "http".to_string()),
            ]
        );
    }
}
