//! Proxy mode (docs/behaviour.md, "Proxy"): an OpenAI-compatible router in front of the
//! replicas, so that adopting burst-prefix is changing one base URL.
//!
//! `POST /v1/completions` and `POST /v1/chat/completions` take the core's path (admit, read,
//! place, route: docs/architecture.md), their body kept to be forwarded, then are sent along
//! their route (the assigned replica, else its group's fallback; without affinity the one with
//! the fewest requests in flight). The body and headers are forwarded as they came (less
//! hop-by-hop headers), and the answer streams back chunk by chunk, SSE included, holding the
//! route's handle until it ends; a client that goes away drops the upstream request with it
//! ([`upstream`]). `GET /v1/models` goes to the least busy usable replica. Errors are in
//! OpenAI's shape ([`error`]). The proxy's own settings ([`ProxyConfig`]: timeouts, retries, the
//! cool-down) and metrics (`burst_prefix_upstream_*`) are here, not in the core.

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

use burst_prefix_core::{CoolDown, KeepBody, Producer};
pub use error::ProxyError;
use upstream::{Outgoing, Upstreams};

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
}

impl ProxyConfig {
    /// When a replica that failed is left out of planning and routing.
    pub fn cool_down(&self) -> CoolDown {
        CoolDown {
            duration: self.cooldown,
            after_failures: self.cooldown_after_5xx,
        }
    }
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
    let mut admission = upstreams.producer().admit_http(&headers)?;
    admission.read_http(body).await?;
    let placed = admission.place(None, KeepBody::Keep).await?;
    let routed = placed.route(upstreams.retries())?;
    let request = Outgoing {
        method: Method::POST,
        path,
        headers: &headers,
        peer,
        body: &routed.body,
        window: Some(routed.placement.window_id),
    };
    upstreams.send_along(&request, routed.handle).await
}

/// `GET /v1/models`: from the usable replica with the fewest requests in flight.
async fn models(State(upstreams): State<Arc<Upstreams>>, request: Request) -> Response {
    let peer = peer_of(&request);
    let headers = request.headers();
    let send = async {
        let handle = upstreams
            .producer()
            .route_by_load(None, upstreams.retries() + 1)?;
        let request = Outgoing {
            method: Method::GET,
            path: "/v1/models",
            headers,
            peer,
            body: &Bytes::new(),
            window: None,
        };
        upstreams.send_along(&request, handle).await
    };
    send.await.unwrap_or_else(IntoResponse::into_response)
}
