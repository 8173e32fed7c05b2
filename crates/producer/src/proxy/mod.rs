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
pub mod usage;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, OriginalUri, Request, State};
use axum::http::{HeaderMap, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use burst_prefix_core::{KeepBody, Producer};
pub use error::ProxyError;
use upstream::{Outgoing, Upstreams};
pub use upstream::{ProxyConfig, DEFAULT_MAX_IDLE_PER_UPSTREAM, ENDPOINT_HEADER, WINDOW_HEADER};

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
    let admission = upstreams
        .producer()
        .admit_http(&headers, body, None)
        .await?;
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
