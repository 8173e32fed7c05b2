//! Sending a request along its route to the replicas, and streaming the answer back.
//!
//! A replica that refuses the connection or answers 502/503 before any byte is left out for a
//! cool-down and the request goes to the route's next endpoint, up to `--upstream-retries`
//! times; nothing is retried once the upstream has answered otherwise, so no request reaches an
//! upstream twice but for those refusals. The answer streams back chunk by chunk; a client that
//! goes away drops the upstream request with it.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::Response;
use burst_prefix_api::Endpoint;
use futures::StreamExt;
use prometheus::IntGauge;

use super::error::ProxyError;
use super::{ProxyConfig, ENDPOINT_HEADER, WINDOW_HEADER};
use crate::core::metrics::{Metrics, UpstreamClass};
use crate::core::{Attempted, Finish, InFlight, Producer, Route};

/// The replicas as the proxy reaches them: one pooled client, one config.
pub struct Upstreams {
    producer: Producer,
    client: reqwest::Client,
    config: ProxyConfig,
}

/// A request to send upstream, the same for every attempt.
pub struct Outgoing<'a> {
    pub method: Method,
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    /// The client's address, appended to `x-forwarded-for`.
    pub peer: Option<IpAddr>,
    pub body: &'a Bytes,
    /// The window it was planned in, for the response header.
    pub window: Option<u64>,
    /// Placed on arrival: in flight until its last attempt's answer ends.
    pub finish: Option<Arc<Finish>>,
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

impl Upstreams {
    pub fn new(producer: Producer, config: ProxyConfig) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.upstream_timeout)
            .pool_idle_timeout(config.idle_timeout)
            .pool_max_idle_per_host(config.max_idle_per_upstream)
            .tcp_nodelay(true)
            // Straight to the pods, whatever HTTP_PROXY says.
            .no_proxy()
            // A redirect goes back to the client: followed, it would make any replica (or a
            // reused pod IP) a relay to whatever the producer can reach.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client with plain settings builds");
        Upstreams {
            producer,
            client,
            config,
        }
    }

    pub fn producer(&self) -> &Producer {
        &self.producer
    }

    /// How many fallbacks a route needs: one per retry.
    pub fn retries(&self) -> usize {
        self.config.retries
    }

    /// Sends to the route's first endpoint; on a refusal, to the next, up to `retries` times.
    /// The last refusal's own answer (a 502 or 503) is passed on as it is.
    pub async fn send_along(
        &self,
        request: &Outgoing<'_>,
        route: &Route,
    ) -> Result<Response, ProxyError> {
        let mut targets = route.endpoints().take(self.config.retries + 1);
        let mut target = targets.next().expect("a route is never empty");
        let mut retry = false;
        loop {
            match self.send(request, target, retry).await {
                Sent::Answer(response) => return Ok(response),
                Sent::Failed(error) => return Err(error),
                Sent::Refused { error, answer } => {
                    let Some(next) = targets.next() else {
                        return answer.ok_or(error);
                    };
                    self.producer.metrics().upstream_retry();
                    tracing::info!(from = %target.id, to = %next.id, %error, "retrying on the next replica");
                    target = next;
                    retry = true;
                }
            }
        }
    }

    /// Sends one request to `endpoint` (`retry`: after it failed elsewhere), and tells the core
    /// what that showed of the endpoint's health. A refused connection, or 502/503 before any
    /// byte, is worth trying the next endpoint; redirects and other answers go back to the
    /// client as they are.
    async fn send(&self, request: &Outgoing<'_>, endpoint: &Endpoint, retry: bool) -> Sent {
        let metrics = self.producer.metrics();
        let attempt = Attempt::start(&self.producer, &endpoint.id, request.finish.clone());
        let started = Instant::now();
        let result = self
            .client
            .request(
                request.method.clone(),
                format!("http://{}{}", endpoint.address, request.path),
            )
            .headers(forwarded(request.headers, request.peer))
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
                    self.attempted(endpoint, Attempted::Unreachable, &detail);
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
        if status.is_informational() {
            // Only a protocol switch reaches here (hyper handles 100 and skips the others):
            // the client asked for no upgrade, so nothing of it can be passed on.
            return Sent::Failed(failure(format!(
                "answered {status}, an interim answer the client did not ask for"
            )));
        }
        let failed = matches!(status.as_u16(), 502..=504);
        let health = match failed {
            true => Attempted::Failed { retry },
            false => Attempted::Answered,
        };
        self.attempted(endpoint, health, &format!("answered {status}"));
        let answer = streamed(
            upstream,
            &endpoint.id,
            request.window,
            attempt,
            started,
            metrics.clone(),
        );
        if matches!(status.as_u16(), 502 | 503) {
            return Sent::Refused {
                error: failure(format!("answered {status}")),
                answer: Some(answer),
            };
        }
        Sent::Answer(answer)
    }

    fn attempted(&self, endpoint: &Endpoint, attempted: Attempted, detail: &str) {
        self.producer.attempted(
            &endpoint.id,
            attempted,
            detail,
            self.config.cooldown,
            self.config.cooldown_after_5xx,
        );
    }
}

/// One request in flight through an endpoint: counted for planning and in the metrics until
/// its answer is written or dropped.
struct Attempt {
    _in_flight: InFlight,
    _finish: Option<Arc<Finish>>,
    gauge: IntGauge,
}

impl Attempt {
    fn start(producer: &Producer, id: &str, finish: Option<Arc<Finish>>) -> Self {
        let gauge = producer.metrics().upstream_in_flight(id);
        gauge.inc();
        Attempt {
            _in_flight: producer.start_in_flight(id),
            _finish: finish,
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
/// too), `host`, `content-length` and `expect` (the proxy has the whole body already), with the
/// client's address appended to `x-forwarded-for` (what the client sent there is kept, not
/// trusted).
pub fn forwarded(headers: &HeaderMap, peer: Option<IpAddr>) -> HeaderMap {
    let mut out = headers.clone();
    strip_hop_by_hop(&mut out);
    out.remove(header::HOST);
    out.remove(header::CONTENT_LENGTH);
    out.remove(header::EXPECT);
    if let Some(peer) = peer {
        let chain: Vec<&str> = headers
            .get_all(X_FORWARDED_FOR)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .collect();
        let peer = peer.to_string();
        let value = match chain.is_empty() {
            true => peer,
            false => format!("{}, {peer}", chain.join(", ")),
        };
        if let Ok(value) = HeaderValue::from_str(&value) {
            out.insert(X_FORWARDED_FOR, value);
        }
    }
    out
}

const X_FORWARDED_FOR: &str = "x-forwarded-for";

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
        HeaderName::from_static("proxy-connection"),
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
