//! The HTTP routes.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};

use crate::controls::Controls;
use crate::openai::{self, Answer, Api, Request};
use crate::record::{self, InFlight, Recorder};
use crate::Options;

/// The header every answer carries: the id of the stub that served it.
pub const ENGINE_ID_HEADER: &str = "x-stub-engine-id";

/// Tokens in an answer when neither `stub.chunks` nor `max_tokens` says.
const DEFAULT_TOKENS: u32 = 8;

#[derive(Clone)]
struct AppState {
    options: std::sync::Arc<Options>,
    engine_id_header: HeaderValue,
    recorder: Recorder,
}

pub(crate) fn router(options: Options, recorder: Recorder) -> Result<Router, String> {
    let engine_id_header = HeaderValue::from_str(&options.id)
        .map_err(|_| format!("--id {:?} is not a valid header value", options.id))?;
    let max_body_bytes = options.max_body_bytes;
    let state = AppState {
        options: std::sync::Arc::new(options),
        engine_id_header,
        recorder,
    };
    Ok(Router::new()
        .route(Api::Completions.path(), post(completions))
        .route(Api::Chat.path(), post(chat_completions))
        .route("/v1/models", get(models))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/stub/requests", get(requests).delete(clear_requests))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state))
}

async fn completions(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    infer(state, Api::Completions, headers, body).await
}

async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    infer(state, Api::Chat, headers, body).await
}

async fn infer(state: AppState, api: Api, headers: HeaderMap, body: Bytes) -> Response {
    let parsed: Result<Value, _> = serde_json::from_slice(&body);
    let recorded_body = match &parsed {
        Ok(value) => value.clone(),
        Err(_) => Value::String(String::from_utf8_lossy(&body).into_owned()),
    };
    let stream = parsed
        .as_ref()
        .ok()
        .and_then(|v| v.get("stream"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let in_flight = state.recorder.begin(
        Method::POST.as_str(),
        api.path(),
        &headers,
        recorded_body,
        stream,
    );
    tracing::debug!(seq = in_flight.seq(), path = api.path(), stream, "request");

    let request = parsed
        .map_err(|e| format!("the request body is not valid JSON: {e}"))
        .and_then(|body| Ok((Request::parse(api, &body)?, Controls::from_body(&body)?)));
    let (request, controls) = match request {
        Ok(parsed) => parsed,
        Err(message) => {
            return error(&state, in_flight, StatusCode::BAD_REQUEST, &message);
        }
    };

    sleep_ms(controls.delay_ms).await;
    if let Some(location) = &controls.location {
        return redirect(&state, in_flight, controls.status, location);
    }
    let status = controls
        .status
        .or(state.options.fail_status)
        .map(|code| StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR));
    if let Some(status) = status.filter(|s| *s != StatusCode::OK) {
        return error(
            &state,
            in_flight,
            status,
            &format!("stub-engine answers {status} as asked"),
        );
    }

    let tokens = controls
        .chunks
        .or(request.max_tokens.filter(|n| *n > 0))
        .unwrap_or(DEFAULT_TOKENS)
        .min(crate::controls::MAX_CHUNKS);
    let model = request
        .model
        .clone()
        .unwrap_or_else(|| state.options.model.clone());
    let created = record::now_unix_micros() / 1_000_000;
    if request.stream {
        stream_answer(
            state, api, in_flight, request, controls, tokens, model, created,
        )
    } else {
        let answer = Answer::new(api, &state.options.id, in_flight.seq(), &model, created)
            .complete(tokens, request.prompt_words);
        in_flight.status(200);
        in_flight.complete();
        with_engine_id(&state, Json(answer).into_response())
    }
}

#[allow(clippy::too_many_arguments)]
fn stream_answer(
    state: AppState,
    api: Api,
    in_flight: InFlight,
    request: Request,
    controls: Controls,
    tokens: u32,
    model: String,
    created: u64,
) -> Response {
    in_flight.status(200);
    let engine_id = state.options.id.clone();
    let seq = in_flight.seq();
    let abort_after = controls.abort_after_chunks;
    let chunk_delay = controls.chunk_delay_ms;
    let include_usage = request.include_usage;
    let prompt_words = request.prompt_words;

    // One step per chunk; the step after the last sends `[DONE]` (and the usage) and completes
    // the record. `in_flight` lives in the stream: dropped early means the client went away.
    let body = stream::unfold((Some(in_flight), 0u32), move |(in_flight, i)| {
        let engine_id = engine_id.clone();
        let model = model.clone();
        async move {
            let in_flight = in_flight?;
            let answer = Answer::new(api, &engine_id, seq, &model, created);
            if abort_after == Some(i) {
                // Let the server flush what was sent (it does when the body is pending), so
                // the client sees the chunks and then the cut, as from an engine that died.
                tokio::time::sleep(Duration::from_millis(10)).await;
                in_flight.abort();
                let cut = std::io::Error::other("stub.abortAfterChunks: cutting the stream");
                return Some((Err(cut), (None, i)));
            }
            if i == tokens {
                let mut tail = String::new();
                if include_usage {
                    tail += &sse(&answer.usage_chunk(tokens, prompt_words));
                }
                tail += "data: [DONE]\n\n";
                in_flight.complete();
                return Some((Ok(Bytes::from(tail)), (None, i)));
            }
            if i > 0 {
                sleep_ms(chunk_delay).await;
            }
            let chunk = sse(&answer.chunk(i, tokens));
            in_flight.chunk_sent();
            Some((
                Ok::<_, std::io::Error>(Bytes::from(chunk)),
                (Some(in_flight), i + 1),
            ))
        }
    })
    .boxed();

    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    with_engine_id(&state, response)
}

fn sse(value: &Value) -> String {
    format!("data: {value}\n\n")
}

fn error(state: &AppState, in_flight: InFlight, status: StatusCode, message: &str) -> Response {
    let kind = if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    };
    in_flight.status(status.as_u16());
    in_flight.complete();
    let body = openai::error(message, kind, status.as_u16());
    with_engine_id(state, (status, Json(body)).into_response())
}

/// A redirect to `location` (`stub.location`), with `status` or 302, and no body.
fn redirect(
    state: &AppState,
    in_flight: InFlight,
    status: Option<u16>,
    location: &str,
) -> Response {
    let status = status
        .and_then(|code| StatusCode::from_u16(code).ok())
        .unwrap_or(StatusCode::FOUND);
    let Ok(value) = HeaderValue::from_str(location) else {
        return error(
            state,
            in_flight,
            StatusCode::BAD_REQUEST,
            "\"stub.location\" is not a valid header value",
        );
    };
    in_flight.status(status.as_u16());
    in_flight.complete();
    let mut response = status.into_response();
    response.headers_mut().insert(header::LOCATION, value);
    with_engine_id(state, response)
}

fn with_engine_id(state: &AppState, mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(ENGINE_ID_HEADER, state.engine_id_header.clone());
    response
}

async fn models(State(state): State<AppState>) -> Response {
    let body = openai::models(&state.options.model, &state.options.id);
    with_engine_id(&state, Json(body).into_response())
}

async fn requests(State(state): State<AppState>) -> Response {
    let body = json!({
        "engineId": state.options.id,
        "requests": state.recorder.requests(),
    });
    with_engine_id(&state, Json(body).into_response())
}

async fn clear_requests(State(state): State<AppState>) -> Result<StatusCode, Infallible> {
    state.recorder.clear();
    Ok(StatusCode::NO_CONTENT)
}

async fn sleep_ms(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
