//! The admin port of both binaries, apart from their APIs: liveness, readiness and metrics.
//!
//! - `GET /healthz`: 200 `ok` while the process serves.
//! - `GET /readyz`: 200 `ready` when the binary's readiness check passes, else 503 with its
//!   reason (one line).
//! - `GET /metrics`: the Prometheus text format, from the binary's own registry.

use std::future::Future;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

/// Why the process is not ready, or `Ok`.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The admin router: `ready` decides `/readyz`, `registry` is what `/metrics` shows.
pub fn router(ready: Readiness, registry: prometheus::Registry) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    match ready() {
                        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                        Err(reason) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {}\n", reason.replace('\n', " ")),
                        ),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let registry = registry.clone();
                async move {
                    let text = prometheus::TextEncoder::new()
                        .encode_to_string(&registry.gather())
                        .unwrap_or_default();
                    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text)
                }
            }),
        )
}

/// Serves `router` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tower::ServiceExt;

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let response = router
            .clone()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_follows_the_check_and_says_why() {
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let registry = prometheus::Registry::new();
        let counter = prometheus::IntCounter::new("test_total", "a test counter").unwrap();
        registry.register(Box::new(counter.clone())).unwrap();
        counter.inc();
        let router = router(
            Arc::new(move || {
                if flag.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("still starting".into())
                }
            }),
            registry,
        );
        assert_eq!(
            get(&router, "/healthz").await,
            (StatusCode::OK, "ok\n".into())
        );
        assert_eq!(
            get(&router, "/readyz").await,
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: still starting\n".into()
            )
        );
        ready.store(true, Ordering::Relaxed);
        assert_eq!(get(&router, "/readyz").await.0, StatusCode::OK);
        let (status, metrics) = get(&router, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(metrics.contains("test_total 1"), "{metrics}");
    }
}
