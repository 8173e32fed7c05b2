//! Proxy mode (docs/behaviour.md, "Proxy"): an OpenAI-compatible router in front of the
//! replicas, so that adopting burst-prefix is changing one base URL.
//!
//! `POST /v1/completions` and `POST /v1/chat/completions` are placed like `/v1/produce`, then
//! sent along their route (the core's [`Producer::route`]: the assigned replica, else its group's
//! fallback; without affinity the one with the fewest requests in flight). The body and headers
//! are forwarded as they came (less hop-by-hop headers), and the answer streams back chunk by
//! chunk, SSE included; a client that goes away drops the upstream request with it
//! ([`upstream`]). `GET /v1/models` goes to the least busy usable replica. Errors are in OpenAI's
//! shape ([`error`]).

pub mod error;
pub mod upstream;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::core::Producer;
pub use error::ProxyError;
use upstream::{Outgoing, Upstreams};

/// Response header: the id of the endpoint that served the request.
pub const ENDPOINT_HEADER: &str = "x-burst-prefix-endpoint";
/// Response header: the id of the window the request was planned in.
pub const WINDOW_HEADER: &str = "x-burst-prefix-window";

/// Default of [`ProxyConfig::max_idle_per_upstream`] (`--upstream-max-idle`).
pub const DEFAULT_MAX_IDLE_PER_UPSTREAM: usize = 2;

/// How the proxy talks to the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Connecting to a replica takes at most this long (a refusal is a failover).
    pub connect_timeout: Duration,
    /// The longest wait for the next bytes from a replica (its response head, then each chunk).
    pub upstream_timeout: Duration,
    /// How many times a refused request is tried again on the next replica.
    pub retries: usize,
    /// How long a replica that failed is left out of planning and routing.
    pub cooldown: Duration,
    /// Answers 502, 503 or 504 in a row (to first attempts) after which a replica cools down;
    /// a refused connection cools it at once (docs/behaviour.md §8).
    pub cooldown_after_5xx: u32,
    /// An idle pooled connection to a replica is closed after this long. Below the servers'
    /// own keep-alive timeout (5 s for uvicorn, i.e. vLLM and SGLang, and for llama-server's
    /// cpp-httplib), so the proxy never sends on a connection the server is closing: such a
    /// request fails mid-flight and cannot be retried safely.
    pub idle_timeout: Duration,
    /// Idle pooled connections kept open to each replica; one more is closed as soon as its
    /// answer ends. A thread-per-connection server (llama-server's cpp-httplib) gives each open
    /// connection one of its few threads until the client closes it or its keep-alive runs
    /// out, so idle connections kept after a burst starve the requests behind them
    /// (docs/behaviour.md §8).
    pub max_idle_per_upstream: usize,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            connect_timeout: Duration::from_secs(5),
            upstream_timeout: Duration::from_secs(300),
            retries: 1,
            cooldown: Duration::from_secs(10),
            cooldown_after_5xx: 3,
            idle_timeout: Duration::from_secs(3),
            max_idle_per_upstream: DEFAULT_MAX_IDLE_PER_UPSTREAM,
        }
    }
}

pub fn router(producer: Producer, config: ProxyConfig) -> Router {
    let upstreams = Arc::new(Upstreams::new(producer, config));
    Router::new()
        .route("/v1/completions", post(forward))
        .route("/v1/chat/completions", post(forward))
        .route("/v1/models", get(models))
        .with_state(upstreams)
}

async fn forward(
    State(upstreams): State<Arc<Upstreams>>,
    OriginalUri(uri): OriginalUri,
    request: Request,
) -> Response {
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let peer = peer_of(&request);
    let (parts, body) = request.into_parts();
    place_and_send(&upstreams, path, parts.headers, peer, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// The client's address, when the listener recorded it.
fn peer_of(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(addr)| addr.ip())
}

async fn place_and_send(
    upstreams: &Upstreams,
    path: &str,
    headers: HeaderMap,
    peer: Option<IpAddr>,
    body: Body,
) -> Result<Response, ProxyError> {
    let producer = upstreams.producer();
    let (body, placement) = producer.place_http(&headers, body, true).await?;
    let route = producer.route(&placement, upstreams.retries())?;
    let request = Outgoing {
        method: Method::POST,
        path,
        headers: &headers,
        peer,
        body: &body,
        window: Some(placement.window_id),
        finish: producer.finish_when_dropped(&placement).map(Arc::new),
    };
    upstreams.send_along(&request, &route).await
}

/// `GET /v1/models`: from the usable replica with the fewest requests in flight.
async fn models(State(upstreams): State<Arc<Upstreams>>, request: Request) -> Response {
    let peer = peer_of(&request);
    let headers = request.headers();
    let send = async {
        let route = upstreams
            .producer()
            .route_by_load(None, upstreams.retries() + 1)?;
        let request = Outgoing {
            method: Method::GET,
            path: "/v1/models",
            headers,
            peer,
            body: &Bytes::new(),
            window: None,
            finish: None,
        };
        upstreams.send_along(&request, &route).await
    };
    send.await.unwrap_or_else(IntoResponse::into_response)
}
