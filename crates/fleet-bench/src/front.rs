//! The direct routes' front (round-robin, least-loaded): a process of its own (`fleet-bench
//! front`) that forwards each request to the replica its policy chooses and streams the answer
//! back. inference-perf sends to one URL, so the direct routes need one; running it apart keeps
//! its CPU apart from the client's, as a peer router's is.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use burst_prefix_engine_bench::routes::Direct;
use futures::StreamExt;

/// How long a client of the bench keeps an idle connection: below the 5 s after which the
/// producer (its header-read timeout) and uvicorn close one, as the producer's own proxy keeps
/// its upstream connections (docs/behaviour.md §8).
pub const POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(3);

/// What the front shares between requests.
pub struct Front {
    workers: Vec<String>,
    policy: Direct,
    /// Requests sent to each worker whose answer has not ended.
    in_flight: Vec<AtomicUsize>,
    /// Round-robin's next worker, and where least-loaded starts looking for a tie.
    next: AtomicUsize,
    client: reqwest::Client,
}

impl Front {
    pub fn new(policy: Direct, workers: Vec<String>) -> reqwest::Result<Front> {
        Ok(Front {
            in_flight: workers.iter().map(|_| AtomicUsize::new(0)).collect(),
            workers,
            policy,
            next: AtomicUsize::new(0),
            client: reqwest::Client::builder()
                .no_proxy()
                .tcp_nodelay(true)
                .pool_max_idle_per_host(1024)
                .pool_idle_timeout(POOL_IDLE)
                .build()?,
        })
    }

    /// The worker for the next request: the next in turn, or the one with the fewest requests
    /// in flight (ties: the first from the next in turn, so that a burst spreads).
    fn choose(&self) -> usize {
        let n = self.workers.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        match self.policy {
            Direct::RoundRobin => start,
            Direct::LeastLoaded => (0..n)
                .map(|k| (start + k) % n)
                .min_by_key(|&w| self.in_flight[w].load(Ordering::Relaxed))
                .expect("at least one worker"),
        }
    }
}

/// Counts a request in flight on its worker until dropped (its answer ended, or its client left).
struct InFlight {
    front: Arc<Front>,
    worker: usize,
}

impl InFlight {
    fn new(front: Arc<Front>, worker: usize) -> InFlight {
        front.in_flight[worker].fetch_add(1, Ordering::Relaxed);
        InFlight { front, worker }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.front.in_flight[self.worker].fetch_sub(1, Ordering::Relaxed);
    }
}

async fn forward(
    State(front): State<Arc<Front>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path() == "/health" {
        return StatusCode::OK.into_response();
    }
    let worker = front.choose();
    let in_flight = InFlight::new(front.clone(), worker);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = front
        .client
        .request(method, format!("{}{path}", front.workers[worker]))
        .body(body);
    for name in ["content-type", "x-session-id"] {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value);
        }
    }
    match request.send().await {
        Ok(answer) => {
            let status = answer.status();
            let content_type = answer.headers().get("content-type").cloned();
            let stream = answer.bytes_stream().map(move |chunk| {
                let _counted = &in_flight;
                chunk
            });
            let mut response = Response::new(Body::from_stream(stream));
            *response.status_mut() = status;
            if let Some(content_type) = content_type {
                response.headers_mut().insert("content-type", content_type);
            }
            response
        }
        Err(error) => (StatusCode::BAD_GATEWAY, error.to_string()).into_response(),
    }
}

/// The front's router: every path is forwarded but `GET /health`.
pub fn router(front: Arc<Front>) -> Router {
    Router::new().fallback(forward).with_state(front)
}

/// Serves the front on `listen` until the process is stopped.
pub async fn serve(front: Front, listen: SocketAddr) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(listener, router(Arc::new(front))).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn front(policy: Direct, workers: usize) -> Arc<Front> {
        Arc::new(
            Front::new(
                policy,
                (0..workers).map(|w| format!("http://w{w}")).collect(),
            )
            .unwrap(),
        )
    }

    #[test]
    fn round_robin_cycles() {
        let front = front(Direct::RoundRobin, 3);
        let chosen: Vec<usize> = (0..5).map(|_| front.choose()).collect();
        assert_eq!(chosen, vec![0, 1, 2, 0, 1]);
    }

    #[test]
    fn least_loaded_takes_the_fewest_in_flight_and_spreads_ties() {
        let front = front(Direct::LeastLoaded, 3);
        let a = InFlight::new(front.clone(), front.choose());
        let b = InFlight::new(front.clone(), front.choose());
        assert_eq!((a.worker, b.worker), (0, 1));
        assert_eq!(front.choose(), 2);
        let c = InFlight::new(front.clone(), 2);
        drop(b);
        // Workers 0 and 2 hold one each, worker 1 none.
        assert_eq!(front.choose(), 1);
        drop((a, c));
        assert!(front
            .in_flight
            .iter()
            .all(|n| n.load(Ordering::Relaxed) == 0));
    }
}
