//! The messages a data plane (Envoy's ext_proc filter) sends the endpoint picker for one HTTP
//! request: for the tests and the fuzz target, and for anyone who drives the picker without
//! Envoy.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest,
    ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

use super::messages::{DESTINATION_NAMESPACE, SERVED_KEY, SUBSET_KEY, SUBSET_NAMESPACE};

/// How the data plane sends the request's and the response's bodies.
pub fn protocol(request: BodySendMode, response: BodySendMode) -> ProtocolConfiguration {
    ProtocolConfiguration {
        request_body_mode: request as i32,
        response_body_mode: response as i32,
        ..ProtocolConfiguration::default()
    }
}

/// The request's headers: with the protocol the stream uses (the first message carries it) and
/// the gateway's subset hint (an `ip:port` list) when given.
pub fn request_headers(
    protocol: Option<ProtocolConfiguration>,
    headers: &[(&str, &str)],
    subset: Option<&[&str]>,
    end_of_stream: bool,
) -> ProcessingRequest {
    let metadata_context = subset.map(|subset| {
        let list = Kind::ListValue(ListValue {
            values: subset.iter().map(|address| string(address)).collect(),
        });
        metadata(SUBSET_NAMESPACE, SUBSET_KEY, list)
    });
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(header_map(headers)),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        metadata_context,
        protocol_config: protocol,
        ..ProcessingRequest::default()
    }
}

/// A chunk of the request's body.
pub fn request_body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

pub fn request_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestTrailers(
            HttpTrailers::default(),
        )),
        ..ProcessingRequest::default()
    }
}

/// The response's headers, with the endpoint (`ip:port`) that served it when given.
pub fn response_headers(served: Option<&str>) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::ResponseHeaders(
            HttpHeaders::default(),
        )),
        metadata_context: served.map(|address| {
            metadata(
                DESTINATION_NAMESPACE,
                SERVED_KEY,
                Kind::StringValue(address.to_string()),
            )
        }),
        ..ProcessingRequest::default()
    }
}

/// A chunk of the response's body.
pub fn response_body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::ResponseBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn header_map(headers: &[(&str, &str)]) -> HeaderMap {
    HeaderMap {
        headers: headers
            .iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_string(),
                raw_value: value.as_bytes().to_vec(),
                ..HeaderValue::default()
            })
            .collect(),
    }
}

fn string(value: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(value.to_string())),
    }
}

/// Filter metadata with one `key` in `namespace`.
fn metadata(namespace: &str, key: &str, value: Kind) -> Metadata {
    Metadata {
        filter_metadata: [(
            namespace.to_string(),
            Struct {
                fields: [(key.to_string(), Value { kind: Some(value) })].into(),
            },
        )]
        .into(),
        ..Metadata::default()
    }
}
