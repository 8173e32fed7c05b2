//! The scoring API (`--listen`, beside the proxy routes): for clients that send the inference
//! request themselves and ask the producer only where it goes. Thin adapters around the core.
//!
//! - `POST /v1/produce`: the inference request body itself (optionally with `"endpoints"`); it
//!   takes the core's path up to placement (admit, read, place: docs/architecture.md), bounded
//!   as a whole by [`REQUEST_TIMEOUT`] (a refusal, `request_timeout`, counted like any), and
//!   gets a [`ProduceResponse`]; `?matches=all|nonzero|none` chooses which endpoints its
//!   `matches` lists. Nothing is routed, so a placement on arrival counts with a half-life.
//! - `POST /v1/plan`: a whole batch at once, no waiting (the `plan` subcommand's format).
//! - `GET /v1/endpoints`: the replica set in force, its source and generation.

pub mod error;
pub mod response;

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use burst_prefix_api::PlannerConfig;
use tokio::sync::Semaphore;

use burst_prefix_core::metrics::Metrics;
use burst_prefix_core::read::RequestError;
use burst_prefix_core::whole_batch::{plan_input, PlanBounds, PlanError, PlanInput, PlanOutput};
use burst_prefix_core::{KeepBody, PlaceError, Producer};
use error::ApiError;
use prometheus::{IntCounterVec, Opts};
use response::{MatchesShown, ProduceResponse};

pub fn router(producer: Producer) -> Router {
    router_within(producer, REQUEST_TIMEOUT)
}

/// The scoring API with its own bound on a request (the tests take a shorter one than
/// [`REQUEST_TIMEOUT`]).
pub fn router_within(producer: Producer, request_timeout: Duration) -> Router {
    let state = Scoring {
        request_timeout,
        metrics: producer.metrics().front_end(ScoringMetrics::register),
        producer,
    };
    // `/v1/produce` bounds itself (its timeout is a refusal the core counts); the others
    // through the layer.
    Router::new()
        .route("/v1/plan", post(plan_whole_batch))
        .route("/v1/endpoints", get(endpoints))
        .route("/v1/memory/reset", post(reset_memory))
        .fallback(not_found)
        .layer(middleware::from_fn(move |request, next| {
            bounded(request_timeout, request, next)
        }))
        .route("/v1/produce", post(produce))
        .with_state(state)
}

/// What the scoring API's handlers share.
#[derive(Clone)]
struct Scoring {
    producer: Producer,
    /// No request takes longer ([`REQUEST_TIMEOUT`]).
    request_timeout: Duration,
    metrics: Arc<ScoringMetrics>,
}

/// The scoring API's metrics, in the producer's registry.
struct ScoringMetrics {
    plans: IntCounterVec,
}

impl ScoringMetrics {
    fn register(metrics: &Metrics) -> Self {
        let plans = IntCounterVec::new(
            Opts::new(
                "burst_prefix_plans_total",
                "POST /v1/plan batches by result: planned, refused (bad input or too large), abandoned (client gone or shutting down)",
            ),
            &["result"],
        )
        .unwrap();
        for result in ["planned", "refused", "abandoned"] {
            plans.with_label_values(&[result]);
        }
        metrics
            .registry()
            .register(Box::new(plans.clone()))
            .expect("registered once per producer");
        ScoringMetrics { plans }
    }

    fn count_plan(&self, result: &str) {
        self.plans.with_label_values(&[result]).inc();
    }
}

/// No request takes longer than this, however slowly its client sends the body. A produce
/// request that has joined a window is answered long before (windows last at most 10 s).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Answers 408 `request_timeout` for a call that takes longer than `limit` (`/v1/plan` counts
/// it abandoned).
async fn bounded(limit: Duration, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::Timeout {
            seconds: limit.as_secs(),
        }
        .into_response(),
    }
}

#[derive(Deserialize)]
struct ProduceQuery {
    matches: Option<String>,
}

async fn produce(
    State(Scoring {
        producer,
        request_timeout,
        ..
    }): State<Scoring>,
    Query(query): Query<ProduceQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ProduceResponse>, ApiError> {
    let shown = match query.matches.as_deref() {
        None | Some("all") => MatchesShown::All,
        Some("nonzero") => MatchesShown::NonZero,
        Some("none") => MatchesShown::None,
        Some(other) => {
            let error = RequestError::Field {
                field: "query parameter matches".into(),
                problem: format!("expected all, nonzero or none, got {other:?}"),
            };
            return Err(producer.refuse(error.into()).into());
        }
    };
    let admission = producer
        .admit_http(&headers, body, Some(request_timeout))
        .await?;
    let placed = admission.place(None, KeepBody::Drop).await?;
    Ok(Json(ProduceResponse::new(placed.placement(), shown)))
}

/// At most as many `/v1/plan` jobs run at once as there are cores; the windows' own planning
/// never waits behind them (it has its own threads).
fn plan_slots() -> &'static Semaphore {
    static SLOTS: OnceLock<Semaphore> = OnceLock::new();
    SLOTS
        .get_or_init(|| Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())))
}

/// Set when the handler's future is dropped (the client went away, or the request timed
/// out): the plan job stops at its next check.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Counts a `/v1/plan` call as abandoned if its handler is dropped before the plan job takes
/// over (which counts its own outcome): the client left, or the request timed out, while its
/// body was still being read or while it waited for a slot.
struct AbandonedUnlessHandedOver(Option<Arc<ScoringMetrics>>);

impl AbandonedUnlessHandedOver {
    fn hand_over(mut self) {
        self.0 = None;
    }
}

impl Drop for AbandonedUnlessHandedOver {
    fn drop(&mut self) {
        if let Some(metrics) = self.0.take() {
            metrics.count_plan("abandoned");
        }
    }
}

async fn plan_whole_batch(
    State(Scoring {
        producer, metrics, ..
    }): State<Scoring>,
    request: Request,
) -> Result<Json<PlanOutput>, ApiError> {
    let unfinished = AbandonedUnlessHandedOver(Some(metrics.clone()));
    // The body is read here rather than by an extractor, so that a client leaving while it is
    // read is counted (hyper drops the handler as soon as it reads the end of the connection).
    let mut reader = producer.body_reader();
    let body = reader
        .read_http(request.into_body())
        .await
        .map(|()| reader.finish().bytes);
    let slot = match body {
        Ok(body) => plan_slots()
            .acquire()
            .await
            .map(|slot| (body, slot))
            .map_err(|e| ApiError::Internal(e.to_string())),
        Err(error) => {
            metrics.count_plan("refused");
            Err(ApiError::Body(error))
        }
    };
    // From here the plan job counts the outcome.
    unfinished.hand_over();
    let (body, _slot) = slot?;
    let cancelled = Arc::new(AtomicBool::new(false));
    let _cancel = CancelOnDrop(cancelled.clone());
    let max_requests = producer
        .config()
        .map_or(PlannerConfig::default().max_batch_size(), |s| {
            s.settings.max_batch_size
        });
    let max_replicas = producer.limits().max_plan_replicas;
    // A whole batch can take a while to parse and hash: off the async workers.
    let output = tokio::task::spawn_blocking(move || {
        let stop = || cancelled.load(Ordering::Relaxed) || producer.is_closed();
        let bounds = PlanBounds {
            max_requests,
            max_replicas,
            cancelled: &stop,
        };
        let result = PlanInput::parse(&body).and_then(|input| plan_input(&input, &bounds));
        metrics.count_plan(match &result {
            Ok(_) => "planned",
            Err(PlanError::Abandoned) => "abandoned",
            Err(_) => "refused",
        });
        result
    })
    .await
    .map_err(|error| ApiError::Internal(format!("planning a batch failed: {error}")))??;
    Ok(Json(output))
}

/// `POST /v1/memory/reset`: forget what replicas cache (after a weight update, an engine
/// restart): `{"endpoints": [ids]}` for some, an empty body for every one.
async fn reset_memory(
    State(Scoring { producer, .. }): State<Scoring>,
    request: Request,
) -> Result<Json<Value>, ApiError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Reset {
        endpoints: Option<Vec<String>>,
    }
    let mut reader = producer.body_reader();
    reader
        .read_http(request.into_body())
        .await
        .map_err(ApiError::Body)?;
    let body = reader.finish().bytes;
    let reset: Reset = if body.iter().all(u8::is_ascii_whitespace) {
        Reset { endpoints: None }
    } else {
        serde_json::from_slice(&body).map_err(|e| {
            ApiError::Body(PlaceError::BadRequest(RequestError::Field {
                field: "body".into(),
                problem: format!("expected {{\"endpoints\": [ids]}} or nothing: {e}"),
            }))
        })?
    };
    producer.engines().reset(reset.endpoints.as_deref());
    producer
        .engines()
        .forget_learned(reset.endpoints.as_deref());
    tracing::info!(endpoints = ?reset.endpoints, "memory reset");
    Ok(Json(serde_json::json!({
        "reset": reset.endpoints.map_or(Value::from("all"), Value::from),
    })))
}

async fn endpoints(State(Scoring { producer, .. }): State<Scoring>) -> Json<Value> {
    let current = producer.config();
    Json(serde_json::json!({
        "source": producer.config_store().origin(),
        "generation": current.as_ref().map_or(0, |snapshot| snapshot.generation),
        "ready": producer.ready(),
        "endpoints": current.as_ref().map(|s| &s.config.endpoints[..]).unwrap_or(&[]),
        "config": current.as_ref().map(|s| &s.config.planner),
    }))
}

async fn not_found() -> (StatusCode, Json<Value>) {
    (
        StatusCode::NOT_FOUND,
        Json(serde_json::json!({
            "error": "not_found",
            "message": "no such route; see POST /v1/produce, POST /v1/plan, GET /v1/endpoints, POST /v1/memory/reset, and the proxy routes POST /v1/completions, POST /v1/chat/completions, GET /v1/models",
        })),
    )
}
