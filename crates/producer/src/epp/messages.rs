//! Reading and building the Envoy ext_proc messages of the Endpoint Picker Protocol: headers,
//! metadata keys, header mutations, dynamic metadata and immediate responses.

use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, processing_response, BodyMutation, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ImmediateResponse, ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// The metadata namespace the data plane puts the subset hint in.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key of the subset hint: a list of `ip:port`.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The metadata namespace of the picked (and served) endpoints.
pub const DESTINATION_NAMESPACE: &str = "envoy.lb";
/// The header and metadata key of the picked endpoints, `ip:port[,ip:port...]`.
pub const DESTINATION_KEY: &str = "x-gateway-destination-endpoint";
/// The metadata key, on the response path, of the endpoint that served the request.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";

/// The value of header `name` (lowercase), from `raw_value` or `value`.
pub fn header_bytes<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a [u8]> {
    let header = headers?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))?;
    if header.raw_value.is_empty() {
        Some(header.value.as_bytes())
    } else {
        Some(&header.raw_value)
    }
}

/// The subset hint of a request: `Some(list)` when the data plane set one (possibly empty).
pub fn subset(metadata: Option<&Metadata>) -> Option<Vec<String>> {
    let value = metadata?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?
        .fields
        .get(SUBSET_KEY)?;
    Some(match &value.kind {
        Some(Kind::ListValue(list)) => list
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(address)) => Some(address.clone()),
                _ => None,
            })
            .collect(),
        Some(Kind::StringValue(addresses)) => addresses
            .split(',')
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect(),
        _ => Vec::new(),
    })
}

/// The endpoint that served the request, from the response path's metadata.
pub fn served(metadata: Option<&Metadata>) -> Option<String> {
    let value = metadata?
        .filter_metadata
        .get(DESTINATION_NAMESPACE)?
        .fields
        .get(SERVED_KEY)?;
    match &value.kind {
        Some(Kind::StringValue(address)) => Some(address.clone()),
        _ => None,
    }
}

fn set_header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(HeaderValue {
            key: key.to_string(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        }),
        ..HeaderValueOption::default()
    }
}

/// What the data plane needs to route to `destinations` (`ip:port,...`): the header, and the same
/// value in dynamic metadata.
pub struct Routing {
    pub mutation: CommonResponse,
    pub metadata: Struct,
}

impl Routing {
    /// `content_length`: the body's length when the body goes back in the stream (full duplex).
    pub fn new(destinations: &str, content_length: Option<usize>) -> Self {
        let mut headers = vec![set_header(DESTINATION_KEY, destinations)];
        if let Some(length) = content_length {
            headers.push(set_header("content-length", &length.to_string()));
        }
        let endpoint = Struct {
            fields: [(
                DESTINATION_KEY.to_string(),
                Value {
                    kind: Some(Kind::StringValue(destinations.to_string())),
                },
            )]
            .into(),
        };
        Routing {
            mutation: CommonResponse {
                header_mutation: Some(HeaderMutation {
                    set_headers: headers,
                    ..HeaderMutation::default()
                }),
                clear_route_cache: true,
                ..CommonResponse::default()
            },
            metadata: Struct {
                fields: [(
                    DESTINATION_NAMESPACE.to_string(),
                    Value {
                        kind: Some(Kind::StructValue(endpoint)),
                    },
                )]
                .into(),
            },
        }
    }
}

/// The answer to request headers.
pub fn request_headers(response: CommonResponse, metadata: Option<Struct>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(
            HeadersResponse {
                response: Some(response),
            },
        )),
        dynamic_metadata: metadata,
        ..ProcessingResponse::default()
    }
}

/// The answer to (the end of) a request body.
pub fn request_body(response: CommonResponse, metadata: Option<Struct>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestBody(BodyResponse {
            response: Some(response),
        })),
        dynamic_metadata: metadata,
        ..ProcessingResponse::default()
    }
}

/// A common response that hands `body` back (full duplex: the processor owns the body).
pub fn streamed_body(body: Vec<u8>, end_of_stream: bool) -> CommonResponse {
    CommonResponse {
        body_mutation: Some(BodyMutation {
            mutation: Some(body_mutation::Mutation::StreamedResponse(
                StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..StreamedBodyResponse::default()
                },
            )),
        }),
        ..CommonResponse::default()
    }
}

pub fn request_trailers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestTrailers(
            TrailersResponse::default(),
        )),
        ..ProcessingResponse::default()
    }
}

pub fn response_headers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            HeadersResponse {
                response: Some(CommonResponse::default()),
            },
        )),
        ..ProcessingResponse::default()
    }
}

pub fn response_body(response: CommonResponse) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(BodyResponse {
            response: Some(response),
        })),
        ..ProcessingResponse::default()
    }
}

pub fn response_trailers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseTrailers(
            TrailersResponse::default(),
        )),
        ..ProcessingResponse::default()
    }
}

/// An answer the data plane sends to the client instead of forwarding the request: `status`
/// with a JSON body `{"error": code, "message": ...}` (and `Retry-After`, when given).
pub fn immediate(
    status: u16,
    code: &str,
    message: &str,
    retry_after_seconds: Option<u64>,
) -> ProcessingResponse {
    let mut headers = vec![set_header("content-type", "application/json")];
    if let Some(seconds) = retry_after_seconds {
        headers.push(set_header("retry-after", &seconds.to_string()));
    }
    let body = serde_json::json!({"error": code, "message": message}).to_string();
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus {
                    code: i32::from(status),
                }),
                headers: Some(HeaderMutation {
                    set_headers: headers,
                    ..HeaderMutation::default()
                }),
                body: body.into_bytes(),
                details: format!("burst_prefix_{code}"),
                ..ImmediateResponse::default()
            },
        )),
        ..ProcessingResponse::default()
    }
}
