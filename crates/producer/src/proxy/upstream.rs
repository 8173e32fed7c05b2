//! Sending a request along its route to the replicas, and streaming the answer back.
//!
//! A replica that refuses the connection or answers 502/503 before any byte is left out for a
//! cool-down and the request goes to the route's next endpoint, up to `--upstream-retries`
//! times; nothing is retried once the upstream has answered otherwise, so no request reaches an
//! upstream twice but for those refusals. The answer streams back chunk by chunk, holding the
//! route's handle (the request in flight) until it ends; a client that goes away drops the
//! upstream request with it. The proxy's metrics (`burst_prefix_upstream_*`) are counted here.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::Response;
use burst_prefix_api::Endpoint;
use burst_prefix_core::metrics::{EndpointSeries, Metrics};
use burst_prefix_core::{Attempted, CoolDown, Handle, Producer};
use futures::StreamExt;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

use super::error::ProxyError;
use super::usage::UsageScanner;

/// Response header: the id of the endpoint that served the request.
pub const ENDPOINT_HEADER: &str = "x-burst-prefix-endpoint";
/// Response header: the id of the window the request was planned in.
pub const WINDOW_HEADER: &str = "x-burst-prefix-window";

/// Default of [`ProxyConfig::max_idle_per_upstream`] (`--upstream-max-idle`): a connection per
/// request, the only setting that kept llama-server within 1.1x of direct sends in every run
/// measured (docs/behaviour.md §8).
pub const DEFAULT_MAX_IDLE_PER_UPSTREAM: usize = 0;

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
            max_idle_per_upstream: DEFAULT_MAX_IDLE_PER_UPSTREAM,
        }
    }
}

/// The replicas as the proxy reaches them: one pooled client, one config.
pub struct Upstreams {
    producer: Producer,
    client: reqwest::Client,
    config: ProxyConfig,
    metrics: Arc<UpstreamMetrics>,
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
}

/// An upstream's answer to one attempt, counted in the in-flight gauge of its endpoint until
/// it is dropped or its body has streamed.
struct Answer {
    upstream: reqwest::Response,
    started: Instant,
    _gauge: GaugeGuard,
}

/// What one send to an upstream gave.
enum Sent {
    /// The upstream's answer, to stream back.
    Answer(Answer),
    /// Refused before any byte reached the client: worth trying the next replica. `answer` is
    /// the upstream's own refusal, passed on when no replica is left to try.
    Refused {
        error: ProxyError,
        answer: Option<Answer>,
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
            metrics: producer.metrics().front_end(UpstreamMetrics::register),
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
    /// The last refusal's own answer (a 502 or 503) is passed on as it is. The answer holds
    /// `handle` until it has streamed.
    pub async fn send_along(
        &self,
        request: &Outgoing<'_>,
        mut handle: Handle,
    ) -> Result<Response, ProxyError> {
        let targets: Vec<Endpoint> = handle
            .route()
            .endpoints()
            .take(self.config.retries + 1)
            .cloned()
            .collect();
        let mut targets = targets.iter();
        let mut target = targets.next().expect("a route is never empty");
        let mut retry = false;
        loop {
            handle.send_to(&target.id);
            match self.send(request, target, retry, &handle).await {
                Sent::Answer(answer) => {
                    return Ok(streamed(answer, target, request, handle, &self.metrics))
                }
                Sent::Failed(error) => return Err(error),
                Sent::Refused { error, answer } => {
                    let Some(next) = targets.next() else {
                        return match answer {
                            Some(answer) => {
                                Ok(streamed(answer, target, request, handle, &self.metrics))
                            }
                            None => Err(error),
                        };
                    };
                    self.metrics.retries.inc();
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
    async fn send(
        &self,
        request: &Outgoing<'_>,
        endpoint: &Endpoint,
        retry: bool,
        handle: &Handle,
    ) -> Sent {
        let metrics = &self.metrics;
        let gauge = GaugeGuard::start(metrics.in_flight.with_label_values(&[&endpoint.id]));
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
                metrics.request(&endpoint.id, UpstreamClass::Error);
                if error.is_timeout() {
                    return Sent::Failed(ProxyError::UpstreamTimeout {
                        endpoint: endpoint.id.clone(),
                        address: endpoint.address.clone(),
                        seconds: self.config.upstream_timeout.as_secs(),
                    });
                }
                let detail = error_chain(&error);
                if error.is_connect() {
                    self.attempted(handle, endpoint, Attempted::Unreachable, &detail);
                    return Sent::Refused {
                        error: failure(detail),
                        answer: None,
                    };
                }
                return Sent::Failed(failure(detail));
            }
        };
        let status = upstream.status();
        metrics.request(&endpoint.id, UpstreamClass::of(status.as_u16()));
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
        self.attempted(handle, endpoint, health, &format!("answered {status}"));
        let answer = Answer {
            upstream,
            started,
            _gauge: gauge,
        };
        if matches!(status.as_u16(), 502 | 503) {
            return Sent::Refused {
                error: failure(format!("answered {status}")),
                answer: Some(answer),
            };
        }
        Sent::Answer(answer)
    }

    /// Reports what an attempt showed of `endpoint`'s health through the request's handle;
    /// counts and logs a cool-down it began (docs/behaviour.md §8).
    fn attempted(&self, handle: &Handle, endpoint: &Endpoint, attempted: Attempted, detail: &str) {
        let cool_down = self.config.cool_down();
        let Some(reason) = handle.attempted(&endpoint.id, attempted, cool_down) else {
            return;
        };
        self.metrics
            .cooldowns
            .with_label_values(&[&endpoint.id, reason.label()])
            .inc();
        tracing::warn!(
            endpoint = %endpoint.id,
            reason = reason.label(),
            detail,
            cooldown_ms = cool_down.duration.as_millis() as u64,
            "upstream unwell; left out of planning and routing for the cool-down"
        );
    }
}

/// One attempt counted in `burst_prefix_upstream_in_flight{endpoint}` until dropped.
struct GaugeGuard(IntGauge);

impl GaugeGuard {
    fn start(gauge: IntGauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge)
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// How an upstream request of the proxy ended (`burst_prefix_upstream_requests_total{class}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpstreamClass {
    Informational,
    Success,
    Redirection,
    ClientError,
    ServerError,
    /// No answer: refused, timed out, or broken.
    Error,
}

impl UpstreamClass {
    pub fn of(status: u16) -> Self {
        match status {
            100..=199 => UpstreamClass::Informational,
            200..=299 => UpstreamClass::Success,
            300..=399 => UpstreamClass::Redirection,
            400..=499 => UpstreamClass::ClientError,
            _ => UpstreamClass::ServerError,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            UpstreamClass::Informational => "1xx",
            UpstreamClass::Success => "2xx",
            UpstreamClass::Redirection => "3xx",
            UpstreamClass::ClientError => "4xx",
            UpstreamClass::ServerError => "5xx",
            UpstreamClass::Error => "error",
        }
    }
}

/// The proxy's metrics, in the producer's registry; their per-endpoint series go with the
/// endpoint.
pub struct UpstreamMetrics {
    requests: IntCounterVec,
    /// From sending a proxied request to its first body byte.
    ttfb_seconds: Histogram,
    retries: IntCounter,
    in_flight: IntGaugeVec,
    cooldowns: IntCounterVec,
}

impl UpstreamMetrics {
    fn register(metrics: &Metrics) -> Self {
        let requests = IntCounterVec::new(
            Opts::new(
                "burst_prefix_upstream_requests_total",
                "Requests the proxy sent to a replica, by endpoint and status class (1xx..5xx, or error: no answer)",
            ),
            &["endpoint", "class"],
        )
        .unwrap();
        let ttfb_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "burst_prefix_upstream_ttfb_seconds",
                "Time from sending a proxied request to a replica to its first body byte",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
        )
        .unwrap();
        let retries = IntCounter::new(
            "burst_prefix_upstream_retries_total",
            "Proxied requests sent again to the next replica after a refusal (connection refused, 502, 503)",
        )
        .unwrap();
        let in_flight = IntGaugeVec::new(
            Opts::new(
                "burst_prefix_upstream_in_flight",
                "Proxied requests in flight, by endpoint",
            ),
            &["endpoint"],
        )
        .unwrap();
        let cooldowns = IntCounterVec::new(
            Opts::new(
                "burst_prefix_upstream_cooldowns_total",
                "Times an endpoint was left out of planning and routing, by endpoint and reason: unreachable (a refused connection), failed_in_a_row (502/503/504 answers in a row)",
            ),
            &["endpoint", "reason"],
        )
        .unwrap();
        for collector in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(ttfb_seconds.clone()),
            Box::new(retries.clone()),
            Box::new(in_flight.clone()),
            Box::new(cooldowns.clone()),
        ] {
            metrics
                .registry()
                .register(collector)
                .expect("registered once per producer");
        }
        metrics.per_endpoint(EndpointSeries::Counters(requests.clone()));
        metrics.per_endpoint(EndpointSeries::Counters(cooldowns.clone()));
        metrics.per_endpoint(EndpointSeries::Gauges(in_flight.clone()));
        UpstreamMetrics {
            requests,
            ttfb_seconds,
            retries,
            in_flight,
            cooldowns,
        }
    }

    fn request(&self, endpoint: &str, class: UpstreamClass) {
        self.requests
            .with_label_values(&[endpoint, class.label()])
            .inc();
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
/// (and window) headers; the request stays in flight (`handle`, and the attempt's gauge) until
/// the body ends or is dropped, and tells the handle the answer's length when its usage says.
fn streamed(
    answer: Answer,
    endpoint: &Endpoint,
    request: &Outgoing<'_>,
    handle: Handle,
    metrics: &Arc<UpstreamMetrics>,
) -> Response {
    let Answer {
        upstream,
        started,
        _gauge: gauge,
    } = answer;
    let status = upstream.status();
    let mut headers = upstream.headers().clone();
    strip_hop_by_hop(&mut headers);
    if let Ok(value) = HeaderValue::from_str(&endpoint.id) {
        headers.insert(ENDPOINT_HEADER, value);
    }
    if let Some(window) = request.window {
        headers.insert(WINDOW_HEADER, HeaderValue::from(window));
    }
    let mut first = true;
    let metrics = metrics.clone();
    let mut handle = handle;
    let mut usage = UsageScanner::default();
    let chunks = upstream.bytes_stream().map(move |chunk| {
        let _held = (&handle, &gauge);
        if let Ok(bytes) = &chunk {
            if let Some(tokens) = usage.scan(bytes) {
                handle.answered(tokens);
            }
        }
        if first {
            first = false;
            metrics
                .ttfb_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        chunk
    });
    let mut response = Response::new(Body::from_stream(chunks));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}
