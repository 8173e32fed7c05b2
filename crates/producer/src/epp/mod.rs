//! Endpoint picker mode (docs/behaviour.md §9): the Endpoint Picker Protocol of the Gateway API
//! Inference Extension, so that any GAIE gateway (Envoy Gateway, kgateway, Istio, GKE Gateway) can
//! use burst-prefix as an `InferencePool`'s endpoint picker.
//!
//! It is Envoy's external processing gRPC service (`envoy.service.ext_proc.v3.ExternalProcessor`),
//! one stream per HTTP request:
//!
//! 1. Request headers: the subset hint (filter metadata `envoy.lb.subset_hint`) and the
//!    `x-burst-prefix-group-size` hint are kept. With no body, the request goes to the least busy
//!    candidate at once. In `BUFFERED` body mode the headers are answered at once (the data plane
//!    waits for that before it sends the body); in `FULL_DUPLEX_STREAMED` mode they are answered
//!    with the routing decision.
//! 2. Request body, in one or several chunks until `end_of_stream`: the request joins the window
//!    like `/v1/produce` and is answered with header `x-gateway-destination-endpoint:
//!    ip:port[,ip:port...]` (its replica first, then its group's fallbacks) and the same value in
//!    dynamic metadata `envoy.lb`; in full duplex the body goes back unchanged. Refusals are an
//!    `ImmediateResponse`: 400 (bad body, naming the field), 413 (too large), 429 (window full),
//!    503 (no endpoint, or none of the subset is eligible).
//! 3. Response path: `envoy.lb` / `x-gateway-destination-endpoint-served` is counted per
//!    endpoint; headers, body chunks and trailers pass through.
//!
//! The request takes the core's path (docs/architecture.md): admitted on its headers, its body
//! fed to the admission message by message, placed and routed once whole. The stream holds the
//! route's handle until it ends, so the request counts as in flight on its endpoint until then
//! (the planner gets the count as running requests, as in proxy mode). gRPC health
//! (`grpc.health.v1`) answers for `liveness` (the process serves), `readiness` and the ext_proc
//! service (ready: a config with endpoints is in force, this producer leads, and it is not
//! shutting down). The picker's metrics (`burst_prefix_epp_*`) are here.

pub mod data_plane;
pub mod messages;
mod transit;

use std::pin::Pin;
use std::time::Duration;

use axum::Router;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, CommonResponse, ProcessingRequest, ProcessingResponse,
};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};
use tonic_health::ServingStatus;

use burst_prefix_core::metrics::{EndpointSeries, Metrics};
use burst_prefix_core::{Admission, Handle, Hints, KeepBody, PlaceError, Producer, Refused};
use messages::Routing;
use prometheus::{IntCounterVec, Opts};
use std::sync::Arc;

/// The gRPC service name of the ext_proc service, as health checks name it.
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
/// At most this many endpoints in `x-gateway-destination-endpoint`: the pick, then fallbacks.
pub const MAX_DESTINATIONS: usize = 4;
/// What an ext_proc message holds besides a body chunk (headers, metadata), at most.
const MESSAGE_OVERHEAD: usize = 1 << 20;

/// The gRPC services of the endpoint-picker port: ext_proc and health. Needs a runtime: it
/// starts the task that keeps the health statuses current.
pub fn router(producer: Producer) -> Router {
    let (health, health_service) = tonic_health::server::health_reporter();
    let watched = producer.clone();
    tokio::spawn(async move { keep_health_current(watched, health).await });
    // A message may carry a whole body: the decoder takes a body at the limit with room for the
    // message around it, so a body over the limit reaches the picker and gets its 413 (tonic's
    // own limit, 4 MiB by default, would end the stream without an answer).
    let max_message = producer
        .limits()
        .max_body_bytes
        .saturating_add(MESSAGE_OVERHEAD);
    // Every stream's inbound bytes through a TransitBody: a message not yet whole counts in the
    // byte budget (tonic holds it before the picker sees it).
    let budget = producer.clone();
    let metrics = producer.metrics().front_end(EppMetrics::register);
    let processor = ExternalProcessorServer::new(Epp { producer, metrics })
        .max_decoding_message_size(max_message)
        .max_encoding_message_size(max_message);
    tonic::service::Routes::new(processor)
        .add_service(health_service)
        .into_axum_router()
        .layer(axum::middleware::map_request(
            move |request: axum::extract::Request| {
                let reserved = budget.reserve();
                async move {
                    request.map(|body| {
                        axum::body::Body::new(transit::TransitBody::new(body, reserved))
                    })
                }
            },
        ))
}

/// `liveness` serves while the process does; `readiness` and the ext_proc service follow
/// [`Producer::ready`].
async fn keep_health_current(producer: Producer, health: tonic_health::server::HealthReporter) {
    health.set_service_status("", ServingStatus::Serving).await;
    health
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    let mut last = None;
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    loop {
        ticks.tick().await;
        let ready = producer.ready();
        if last != Some(ready) {
            let status = if ready {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for service in ["readiness", EXT_PROC_SERVICE] {
                health.set_service_status(service, status).await;
            }
            last = Some(ready);
        }
    }
}

struct Epp {
    producer: Producer,
    metrics: Arc<EppMetrics>,
}

/// The endpoint picker's metrics, in the producer's registry.
pub struct EppMetrics {
    served: IntCounterVec,
    immediate: IntCounterVec,
}

impl EppMetrics {
    fn register(metrics: &Metrics) -> Self {
        let served = IntCounterVec::new(
            Opts::new(
                "burst_prefix_epp_served_total",
                "Requests a gateway reported served (x-gateway-destination-endpoint-served), by endpoint",
            ),
            &["endpoint"],
        )
        .unwrap();
        let immediate = IntCounterVec::new(
            Opts::new(
                "burst_prefix_epp_immediate_responses_total",
                "Requests the endpoint picker answered itself instead of routing them, by HTTP status",
            ),
            &["status"],
        )
        .unwrap();
        for collector in [served.clone(), immediate.clone()] {
            metrics
                .registry()
                .register(Box::new(collector))
                .expect("registered once per producer");
        }
        metrics.per_endpoint(EndpointSeries::Counters(served.clone()));
        EppMetrics { served, immediate }
    }
}

/// The answers of one ext_proc stream, in order.
pub type Responses = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Epp {
    type ProcessStream = Responses;

    async fn process(
        &self,
        request: tonic::Request<Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Responses>, Status> {
        Ok(tonic::Response::new(serve_stream(
            self.producer.clone(),
            self.metrics.clone(),
            request.into_inner(),
        )))
    }
}

/// Serves one HTTP request's ext_proc stream: the data plane's messages in, the answers out
/// (the stream ends after an `ImmediateResponse`, or when `inbound` ends). The gRPC service
/// hands it the data plane's stream; anything else that holds the messages (the fuzz target) may
/// call it the same way. Needs a runtime: the stream is served by a task of its own.
pub fn process<S>(producer: Producer, inbound: S) -> Responses
where
    S: Stream<Item = Result<ProcessingRequest, Status>> + Send + 'static,
{
    let metrics = producer.metrics().front_end(EppMetrics::register);
    serve_stream(producer, metrics, inbound)
}

fn serve_stream<S>(producer: Producer, metrics: Arc<EppMetrics>, inbound: S) -> Responses
where
    S: Stream<Item = Result<ProcessingRequest, Status>> + Send + 'static,
{
    let (responses, outbound) = mpsc::channel(8);
    let stream = HttpStream::new(producer, metrics, responses);
    tokio::spawn(stream.run(inbound));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(outbound))
}

/// How the data plane sends a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyMode {
    /// `FULL_DUPLEX_STREAMED` (what GAIE gateways use, and the default when the data plane does
    /// not say): chunks arrive without waiting; the processor answers once it has decided and
    /// hands the body back.
    FullDuplex,
    /// `BUFFERED`: the data plane waits for the headers' answer, then sends the whole body.
    Buffered,
    /// `NONE`: no body is sent; routing cannot look at the prompt.
    NoBody,
    /// `STREAMED` or a mode this processor cannot route with (the headers would be gone before
    /// the prompt is read).
    Unsupported(i32),
}

impl BodyMode {
    fn of(mode: i32) -> Self {
        match BodySendMode::try_from(mode) {
            Ok(BodySendMode::FullDuplexStreamed) => BodyMode::FullDuplex,
            Ok(BodySendMode::Buffered) | Ok(BodySendMode::BufferedPartial) => BodyMode::Buffered,
            Ok(BodySendMode::None) => BodyMode::NoBody,
            _ => BodyMode::Unsupported(mode),
        }
    }
}

/// One HTTP request's ext_proc stream.
struct HttpStream {
    producer: Producer,
    metrics: Arc<EppMetrics>,
    responses: mpsc::Sender<Result<ProcessingResponse, Status>>,
    request_mode: BodyMode,
    response_full_duplex: bool,
    subset: Option<Vec<String>>,
    /// Admitted on its headers, its body being read.
    admission: Option<Admission>,
    /// The routing decision was sent (or an immediate response ended the request).
    decided: bool,
    /// Routed: the request in flight until the stream ends.
    handle: Option<Handle>,
}

/// Why a stream ends early: the data plane is gone, or the request was answered immediately.
struct Ended;

impl HttpStream {
    fn new(
        producer: Producer,
        metrics: Arc<EppMetrics>,
        responses: mpsc::Sender<Result<ProcessingResponse, Status>>,
    ) -> Self {
        HttpStream {
            responses,
            metrics,
            request_mode: BodyMode::FullDuplex,
            response_full_duplex: true,
            subset: None,
            admission: None,
            decided: false,
            handle: None,
            producer,
        }
    }

    async fn run(mut self, inbound: impl Stream<Item = Result<ProcessingRequest, Status>> + Send) {
        let mut inbound = std::pin::pin!(inbound);
        let mut first = true;
        // The request (headers and body) must arrive within the body timeout; the response
        // path, once routed, takes as long as the replica does.
        let timeout = self.producer.limits().body_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let message = tokio::select! {
                message = inbound.next() => message,
                // The data plane cancelled the stream (the client went away).
                () = self.responses.closed() => return,
                () = tokio::time::sleep_until(deadline), if !self.decided => {
                    let seconds = timeout.as_secs_f64();
                    let _ = self.refuse(PlaceError::BodyTimeout { seconds }).await;
                    return;
                }
            };
            let message = match message {
                Some(Ok(message)) => message,
                None => return,
                Some(Err(status)) => {
                    tracing::debug!(%status, "ext_proc stream ended with an error");
                    if !self.decided {
                        // Never end a request's stream without an answer: the data plane
                        // would forward it unrouted.
                        let _ = self.refuse(unreadable(&status, &self.producer)).await;
                    }
                    return;
                }
            };
            if std::mem::take(&mut first) {
                if let Some(config) = message.protocol_config {
                    self.request_mode = BodyMode::of(config.request_body_mode);
                    self.response_full_duplex =
                        BodyMode::of(config.response_body_mode) == BodyMode::FullDuplex;
                }
            }
            if self.handle(message).await.is_err() {
                return;
            }
        }
    }

    async fn handle(&mut self, message: ProcessingRequest) -> Result<(), Ended> {
        use processing_request::Request;
        let metadata = message.metadata_context.as_ref();
        match message.request {
            Some(Request::RequestHeaders(headers)) => {
                self.subset = messages::subset(metadata);
                let header = |name: &str| messages::header_bytes(headers.headers.as_ref(), name);
                let with_body = !headers.end_of_stream;
                match self.request_mode {
                    BodyMode::FullDuplex | BodyMode::Buffered if with_body => {
                        match self.producer.admit(header) {
                            Ok(admission) => self.admission = Some(admission),
                            Err(refused) => return self.answer_refused(refused).await,
                        }
                        if self.request_mode == BodyMode::Buffered {
                            let proceed =
                                messages::request_headers(CommonResponse::default(), None);
                            self.send(proceed).await?;
                        }
                        Ok(())
                    }
                    // Routed by load: the hints are checked all the same.
                    mode => match Hints::from_headers(header) {
                        Err(error) => self.refuse(error.into()).await,
                        Ok(_) => match mode {
                            BodyMode::Unsupported(mode) if with_body => {
                                self.refuse(PlaceError::UnsupportedBodyMode { mode }).await
                            }
                            _ => self.route_without_body().await,
                        },
                    },
                }
            }
            Some(Request::RequestBody(body)) if !self.decided => {
                let Some(admission) = self.admission.as_mut() else {
                    return Ok(()); // A body without headers: nothing to route.
                };
                if let Err(refused) = admission.take(&body.body) {
                    return self.answer_refused(refused).await;
                }
                if body.end_of_stream {
                    self.route_with_body(true).await
                } else {
                    Ok(())
                }
            }
            Some(Request::RequestTrailers(_)) => {
                if !self.decided {
                    // Trailers end a body whose last chunk did not say so.
                    self.route_with_body(false).await?;
                }
                self.send(messages::request_trailers()).await
            }
            Some(Request::ResponseHeaders(_)) => {
                if let Some(address) = messages::served(metadata) {
                    self.count_served(&address);
                }
                self.send(messages::response_headers()).await
            }
            Some(Request::ResponseBody(body)) => {
                let answer = if self.response_full_duplex {
                    messages::streamed_body(body.body, body.end_of_stream)
                } else {
                    CommonResponse::default()
                };
                self.send(messages::response_body(answer)).await
            }
            Some(Request::ResponseTrailers(_)) => self.send(messages::response_trailers()).await,
            // A body after the decision (a data plane that misbehaves), or nothing: no answer.
            Some(Request::RequestBody(_)) | None => Ok(()),
        }
    }

    /// A request without a body: the least busy usable candidates.
    async fn route_without_body(&mut self) -> Result<(), Ended> {
        let handle = match self
            .producer
            .route_by_load(self.subset.as_deref(), MAX_DESTINATIONS)
        {
            Ok(handle) => handle,
            Err(refused) => return self.answer_refused(refused).await,
        };
        let routing = Routing::new(&handle.route().addresses(), None);
        self.handle = Some(handle);
        self.decided = true;
        self.send(messages::request_headers(
            routing.mutation,
            Some(routing.metadata),
        ))
        .await
    }

    /// The body is complete (`end_of_stream` says whether its last chunk said so): place it,
    /// and route it.
    async fn route_with_body(&mut self, end_of_stream: bool) -> Result<(), Ended> {
        let Some(admission) = self.admission.take() else {
            return Ok(()); // Trailers without headers: nothing to route.
        };
        let place = admission.place(self.subset.as_deref(), KeepBody::Keep);
        // If the data plane cancels the stream meanwhile, the request leaves the window.
        let placed = tokio::select! {
            placed = place => placed,
            () = self.responses.closed() => return Err(Ended),
        };
        let routed = match placed.and_then(|placed| placed.route(MAX_DESTINATIONS - 1)) {
            Ok(routed) => routed,
            Err(refused) => return self.answer_refused(refused).await,
        };
        let destinations = routed.handle.route().addresses();
        let body = routed.body;
        self.handle = Some(routed.handle);
        self.decided = true;
        tracing::debug!(%destinations, "picked");
        match self.request_mode {
            BodyMode::Buffered => {
                let routing = Routing::new(&destinations, None);
                self.send(messages::request_body(
                    routing.mutation,
                    Some(routing.metadata),
                ))
                .await
            }
            _ => {
                // Full duplex: route with the headers, then hand the body back unchanged.
                let routing = Routing::new(&destinations, Some(body.len()));
                self.send(messages::request_headers(
                    routing.mutation,
                    Some(routing.metadata),
                ))
                .await?;
                self.send(messages::request_body(
                    messages::streamed_body(body.to_vec(), end_of_stream),
                    None,
                ))
                .await
            }
        }
    }

    /// The data plane says which endpoint served: count it, and move the in-flight count there.
    fn count_served(&mut self, address: &str) {
        let Some(handle) = self.handle.as_mut() else {
            return;
        };
        if let Some(endpoint) = handle.served_at(address) {
            self.metrics.served.with_label_values(&[&endpoint.id]).inc();
        }
    }

    /// Counts a refusal of the endpoint picker's own and answers it.
    async fn refuse(&mut self, error: PlaceError) -> Result<(), Ended> {
        let refused = self.producer.refuse(error);
        self.answer_refused(refused).await
    }

    /// Answers the request instead of routing it; the stream ends.
    async fn answer_refused(&mut self, refused: Refused) -> Result<(), Ended> {
        self.decided = true;
        let status = refused.status().as_u16();
        self.metrics
            .immediate
            .with_label_values(&[&status.to_string()])
            .inc();
        self.send(messages::immediate(
            status,
            refused.code(),
            &refused.client_message(),
            refused.retry_after_seconds(),
        ))
        .await?;
        Err(Ended)
    }

    async fn send(&self, response: ProcessingResponse) -> Result<(), Ended> {
        self.responses.send(Ok(response)).await.map_err(|_| Ended)
    }
}

/// Why the data plane's messages could not be read: a message in transit over the byte budget is
/// a window full; one over the decoder's limit is a body too large (the limit is the body's, plus
/// room for the message around it).
fn unreadable(status: &Status, producer: &Producer) -> PlaceError {
    let limits = producer.limits();
    if let Some(refused) = transit::refused(status, limits.max_window_bytes) {
        return refused;
    }
    if status.code() == tonic::Code::OutOfRange
        || status.message().contains("message length too large")
    {
        PlaceError::BodyTooLarge {
            limit: limits.max_body_bytes,
        }
    } else {
        PlaceError::BodyUnreadable(status.message().to_string())
    }
}
