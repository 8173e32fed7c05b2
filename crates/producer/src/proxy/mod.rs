//! Proxy mode (SPEC §8): an OpenAI-compatible router in front of the replicas, so that adopting
//! burst-prefix is changing one base URL.
//!
//! `POST /v1/completions` and `POST /v1/chat/completions` join the window like `/v1/produce`,
//! then go to their replica ([`LiveEndpoints::destination`]: the assigned one, else the one with
//! the fewest requests in flight). The body and headers are forwarded as they came (less
//! hop-by-hop headers), and the answer streams back chunk by chunk, SSE included; a client that
//! goes away drops the upstream request with it. A replica that refuses the connection or answers
//! 502/503 is left out for a cool-down and the request is retried on the next replica of its
//! group's fallback order (every member of a group fails over to the same one); nothing is
//! retried once the upstream has answered otherwise, so no request reaches an upstream twice
//! but for those refusals. `GET /v1/models` goes to any usable replica.
//!
//! [`LiveEndpoints::destination`]: crate::core::endpoints::LiveEndpoints::destination
//!
//! Errors are in OpenAI's shape, `{"error": {"message", "type", "code", "param"}}`, so that
//! OpenAI clients raise them as they would for OpenAI (and retry 429 and 503 after Retry-After).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, OriginalUri, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;

use burst_prefix_api::Endpoint;
use prometheus::IntGauge;

use crate::core::endpoints::InFlight;
use crate::core::error::retry_after_seconds;
use crate::core::metrics::{Metrics, Outcome, UpstreamClass};
use crate::core::{PlaceError, PlaceRequest, Producer};
use crate::http::error::place_status;
use crate::http::header_hints;

/// Response header: the id of the endpoint that served the request.
pub const ENDPOINT_HEADER: &str = "x-burst-prefix-endpoint";
/// Response header: the id of the window the request was planned in.
pub const WINDOW_HEADER: &str = "x-burst-prefix-window";

/// How the proxy talks to the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Connecting to a replica takes at most this long (a refusal is a failover).
    pub connect_timeout: Duration,
    /// The longest wait for the next bytes from a replica (its response head, then each chunk).
    pub upstream_timeout: Duration,
    /// How many times a refused request is tried again on the next replica.
    pub retries: usize,
    /// How long a replica that refused is left out of planning and routing.
    pub cooldown: Duration,
    /// An idle pooled connection to a replica is closed after this long. Below the servers'
    /// own keep-alive timeout (5 s for uvicorn, i.e. vLLM and SGLang, and for llama-server's
    /// cpp-httplib), so the proxy never sends on a connection the server is closing: such a
    /// request fails mid-flight and cannot be retried safely.
    pub idle_timeout: Duration,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            connect_timeout: Duration::from_secs(5),
            upstream_timeout: Duration::from_secs(300),
            retries: 1,
            cooldown: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(3),
        }
    }
}

/// The proxy's shared state.
pub struct Proxy {
    producer: Producer,
    client: reqwest::Client,
    config: ProxyConfig,
}

pub fn router(producer: Producer, config: ProxyConfig) -> Router {
    let limit = producer.limits.max_body_bytes;
    let client = reqwest::Client::builder()
        .connect_timeout(config.connect_timeout)
        .read_timeout(config.upstream_timeout)
        .pool_idle_timeout(config.idle_timeout)
        .tcp_nodelay(true)
        // Straight to the pods, whatever HTTP_PROXY says.
        .no_proxy()
        .build()
        .expect("an HTTP client with plain settings builds");
    let proxy = Arc::new(Proxy {
        producer,
        client,
        config,
    });
    Router::new()
        .route("/v1/completions", post(forward))
        .route("/v1/chat/completions", post(forward))
        .route("/v1/models", get(models))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(proxy)
}

/// Why the proxy answered instead of a replica.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("{0}")]
    Place(#[from] PlaceError),
    #[error("the request body is larger than the limit of {limit} bytes (--max-body-bytes)")]
    BodyTooLarge { limit: usize },
    #[error("the body could not be read: {0}")]
    BodyUnreadable(String),
    #[error("{0}")]
    BadHeader(String),
    #[error("upstream {endpoint} ({address}) failed: {detail}")]
    UpstreamFailed {
        endpoint: String,
        address: String,
        detail: String,
    },
    #[error(
        "upstream {endpoint} ({address}) sent nothing for {seconds} s (--upstream-timeout-ms)"
    )]
    UpstreamTimeout {
        endpoint: String,
        address: String,
        seconds: u64,
    },
}

impl ProxyError {
    fn status(&self) -> StatusCode {
        match self {
            ProxyError::Place(error) => place_status(error),
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::BodyUnreadable(_) | ProxyError::BadHeader(_) => StatusCode::BAD_REQUEST,
            ProxyError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ProxyError::Place(error) => error.code(),
            ProxyError::BodyTooLarge { .. } => "body_too_large",
            ProxyError::BodyUnreadable(_) => "invalid_body",
            ProxyError::BadHeader(_) => "invalid_request",
            ProxyError::UpstreamFailed { .. } => "upstream_failed",
            ProxyError::UpstreamTimeout { .. } => "upstream_timeout",
        }
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let status = self.status();
        let kind = match status.as_u16() {
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        let param = match &self {
            ProxyError::Place(PlaceError::BadRequest(error)) => Some(error.field().to_string()),
            _ => None,
        };
        let message = match &self {
            ProxyError::Place(PlaceError::Abandoned) => {
                tracing::error!(error = %self, "internal error");
                "internal error; see the producer's log".to_string()
            }
            other => other.to_string(),
        };
        let body = serde_json::json!({"error": {
            "message": message, "type": kind, "code": self.code(), "param": param,
        }});
        let mut response = (status, Json(body)).into_response();
        if let ProxyError::Place(error) = &self {
            if let Some(retry_after) = error.retry_after() {
                response.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from(retry_after_seconds(retry_after)),
                );
            }
        }
        response
    }
}

async fn forward(
    State(proxy): State<Arc<Proxy>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    match proxy.forward(path, headers, body).await {
        Ok(response) => response,
        Err(error) => {
            if !matches!(error, ProxyError::Place(_)) {
                // The core counts its own refusals; these are the proxy's.
                proxy.producer.metrics.request(Outcome::Rejected);
            }
            error.into_response()
        }
    }
}

impl Proxy {
    async fn forward(
        &self,
        path: &str,
        headers: HeaderMap,
        body: Result<Bytes, BytesRejection>,
    ) -> Result<Response, ProxyError> {
        let body = body.map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ProxyError::BodyTooLarge {
                    limit: self.producer.limits.max_body_bytes,
                }
            } else {
                ProxyError::BodyUnreadable(rejection.body_text())
            }
        })?;
        let hints = header_hints(&headers).map_err(|e| ProxyError::BadHeader(e.to_string()))?;
        let placement = self
            .producer
            .place(PlaceRequest {
                body: &body,
                subset: None,
                hints,
                held_bytes: body.len(),
            })
            .await?;
        let live = &self.producer.live;
        let first = live
            .destination(&placement, Instant::now())
            .ok_or(ProxyError::Place(PlaceError::NoEligibleEndpoint))?;
        let endpoints = &placement.snapshot.config.endpoints;
        let request = Outgoing {
            method: Method::POST,
            path,
            headers: &headers,
            body: &body,
            window: Some(placement.window_id),
        };
        self.send_with_retries(
            &request,
            first,
            |tried| {
                live.fallbacks(&placement, tried, Instant::now())
                    .first()
                    .map(|&i| &endpoints[i])
            },
            endpoints,
        )
        .await
    }

    /// Sends to `endpoints[first]`; on a refusal, to `next(tried)`, up to `--upstream-retries`
    /// times. The last refusal's own answer (a 502 or 503) is passed on as it is.
    async fn send_with_retries<'e>(
        &self,
        request: &Outgoing<'_>,
        first: usize,
        next: impl Fn(&[usize]) -> Option<&'e Endpoint>,
        endpoints: &'e [Endpoint],
    ) -> Result<Response, ProxyError> {
        let mut target = &endpoints[first];
        let mut tried = vec![first];
        loop {
            match self.send(request, target).await {
                Sent::Answer(response) => return Ok(response),
                Sent::Failed(error) => return Err(error),
                Sent::Refused { error, answer } => {
                    let retry = (tried.len() <= self.config.retries)
                        .then(|| next(&tried))
                        .flatten();
                    let Some(next) = retry else {
                        return answer.ok_or(error);
                    };
                    self.producer.metrics.upstream_retry();
                    tracing::info!(from = %target.id, to = %next.id, %error, "retrying on the next replica");
                    tried.push(
                        endpoints
                            .iter()
                            .position(|e| e.id == next.id)
                            .expect("one of them"),
                    );
                    target = next;
                }
            }
        }
    }

    /// Sends one request to `endpoint`. A refusal (connection refused, or 502/503 before any
    /// byte) cools the endpoint down.
    async fn send(&self, request: &Outgoing<'_>, endpoint: &Endpoint) -> Sent {
        let metrics = &self.producer.metrics;
        let attempt = Attempt::start(&self.producer, &endpoint.id);
        let started = Instant::now();
        let result = self
            .client
            .request(
                request.method.clone(),
                format!("http://{}{}", endpoint.address, request.path),
            )
            .headers(forwarded(request.headers))
            .body(request.body.clone())
            .send()
            .await;
        let failure = |detail: String| ProxyError::UpstreamFailed {
            endpoint: endpoint.id.clone(),
            address: endpoint.address.clone(),
            detail,
        };
        let upstream = match result {
            Ok(upstream) => upstream,
            Err(error) => {
                metrics.upstream_request(&endpoint.id, UpstreamClass::Error);
                if error.is_timeout() {
                    return Sent::Failed(ProxyError::UpstreamTimeout {
                        endpoint: endpoint.id.clone(),
                        address: endpoint.address.clone(),
                        seconds: self.config.upstream_timeout.as_secs(),
                    });
                }
                let detail = error_chain(&error);
                if error.is_connect() {
                    self.cool_down(&endpoint.id, &detail);
                    return Sent::Refused {
                        error: failure(detail),
                        answer: None,
                    };
                }
                return Sent::Failed(failure(detail));
            }
        };
        let status = upstream.status();
        metrics.upstream_request(&endpoint.id, UpstreamClass::of(status.as_u16()));
        let answer = streamed(
            upstream,
            &endpoint.id,
            request.window,
            attempt,
            started,
            metrics.clone(),
        );
        if matches!(status.as_u16(), 502 | 503) {
            self.cool_down(&endpoint.id, &format!("answered {status}"));
            return Sent::Refused {
                error: failure(format!("answered {status}")),
                answer: Some(answer),
            };
        }
        Sent::Answer(answer)
    }

    fn cool_down(&self, id: &str, reason: &str) {
        let until = Instant::now() + self.config.cooldown;
        self.producer.live.cool_down(id, until);
        self.producer.metrics.upstream_cooldown(id);
        tracing::warn!(
            endpoint = id,
            reason,
            cooldown_ms = self.config.cooldown.as_millis() as u64,
            "upstream refused; left out of planning and routing for the cool-down"
        );
    }
}

/// A request to send upstream, the same for every attempt.
struct Outgoing<'a> {
    method: Method,
    path: &'a str,
    headers: &'a HeaderMap,
    body: &'a Bytes,
    /// The window it was planned in, for the response header.
    window: Option<u64>,
}

/// What one send to an upstream gave.
enum Sent {
    /// The upstream's answer, streaming back.
    Answer(Response),
    /// Refused before any byte reached the client: worth trying the next replica. `answer` is
    /// the upstream's own refusal, passed on when no replica is left to try.
    Refused {
        error: ProxyError,
        answer: Option<Response>,
    },
    /// Failed otherwise (a timeout, a broken connection): not retried.
    Failed(ProxyError),
}

/// One request in flight through an endpoint: counted for the planner and in the metrics until
/// its answer is written or dropped.
struct Attempt {
    _in_flight: InFlight,
    gauge: IntGauge,
}

impl Attempt {
    fn start(producer: &Producer, id: &str) -> Self {
        let gauge = producer.metrics.upstream_in_flight(id);
        gauge.inc();
        Attempt {
            _in_flight: producer.live.start(id),
            gauge,
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// Request headers to pass on: all but hop-by-hop ones (those the `connection` header names
/// too), `host` and `content-length`.
pub fn forwarded(headers: &HeaderMap) -> HeaderMap {
    let mut out = headers.clone();
    strip_hop_by_hop(&mut out);
    out.remove(header::HOST);
    out.remove(header::CONTENT_LENGTH);
    out
}

/// Removes the hop-by-hop headers (RFC 9110 §7.6.1), those the `connection` header names too.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        HeaderName::from_static("keep-alive"),
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `GET /v1/models`: from the usable replica with the fewest requests in flight.
async fn models(State(proxy): State<Arc<Proxy>>, headers: HeaderMap) -> Response {
    let Some(snapshot) = proxy
        .producer
        .store
        .current()
        .filter(|s| !s.config.endpoints.is_empty())
    else {
        return ProxyError::Place(PlaceError::NoEndpoints).into_response();
    };
    let endpoints = &snapshot.config.endpoints;
    let live = &proxy.producer.live;
    let by_load = |tried: &[usize]| {
        live.by_load(endpoints, Instant::now(), |i| !tried.contains(&i))
            .first()
            .copied()
    };
    let first = by_load(&[]).expect("a usable endpoint is never missing");
    let request = Outgoing {
        method: Method::GET,
        path: "/v1/models",
        headers: &headers,
        body: &Bytes::new(),
        window: None,
    };
    proxy
        .send_with_retries(
            &request,
            first,
            |tried| by_load(tried).map(|i| &endpoints[i]),
            endpoints,
        )
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The upstream's answer as a response that streams its body chunk by chunk, with the endpoint
/// (and window) headers; the attempt stays in flight until the body ends or is dropped.
fn streamed(
    upstream: reqwest::Response,
    endpoint: &str,
    window: Option<u64>,
    attempt: Attempt,
    started: Instant,
    metrics: Arc<Metrics>,
) -> Response {
    let status = upstream.status();
    let mut headers = upstream.headers().clone();
    strip_hop_by_hop(&mut headers);
    if let Ok(value) = HeaderValue::from_str(endpoint) {
        headers.insert(ENDPOINT_HEADER, value);
    }
    if let Some(window) = window {
        headers.insert(WINDOW_HEADER, HeaderValue::from(window));
    }
    let mut first = true;
    let chunks = upstream.bytes_stream().map(move |chunk| {
        let _held = &attempt;
        if first {
            first = false;
            metrics
                .upstream_ttfb_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        chunk
    });
    let mut response = Response::new(Body::from_stream(chunks));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}
