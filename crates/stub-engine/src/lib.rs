//! A stand-in for an OpenAI-compatible inference engine (vLLM, llama.cpp's server), for tests:
//! the end-to-end test's inference pods and the proxy's integration tests on loopback.
//!
//! It answers `POST /v1/completions` and `POST /v1/chat/completions` in OpenAI's shape, whole or
//! as an SSE stream, and says which replica served each answer (header [`ENGINE_ID_HEADER`],
//! field `stub_engine_id`, and the engine id inside `id` and the generated text). A request
//! steers the stub with the body field `"stub"` (see [`Controls`]), and `GET /stub/requests`
//! lists what reached it ([`RecordedRequest`]): path, headers, body, status, chunk times, and
//! whether the client went away early.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use burst_prefix_stub_engine::{Options, StubEngine};
//!
//! let engine = StubEngine::start(Options::with_id("replica-a")).await?;
//! let url = format!("http://{}/v1/completions", engine.addr());
//! // ... send requests to `url` ...
//! let seen = engine.requests();
//! # Ok(()) }
//! ```

pub mod controls;
pub mod openai;
mod record;
mod server;

use std::future::Future;
use std::net::SocketAddr;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use controls::Controls;
pub use record::{RecordedRequest, Recorder};
pub use server::ENGINE_ID_HEADER;

/// Default of `--max-body-bytes`.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Default of `--max-recorded`.
pub const DEFAULT_MAX_RECORDED: usize = 10_000;
/// Default of `--model`.
pub const DEFAULT_MODEL: &str = "stub-model";

/// How a stub behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The replica's name in every answer.
    pub id: String,
    /// The model `GET /v1/models` lists and answers name when the request names none.
    pub model: String,
    /// Answer every inference request with this status (and an OpenAI error body), unless the
    /// request's `stub.status` says otherwise.
    pub fail_status: Option<u16>,
    /// Requests kept by the record (the newest).
    pub max_recorded: usize,
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
}

impl Options {
    /// The defaults, with the replica's name.
    pub fn with_id(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            model: DEFAULT_MODEL.to_owned(),
            fail_status: None,
            max_recorded: DEFAULT_MAX_RECORDED,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
        }
    }
}

/// Serves on `listener` until `shutdown` completes, then finishes the answers in flight.
pub async fn serve(
    listener: TcpListener,
    options: Options,
    recorder: Recorder,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = server::router(options, recorder).map_err(std::io::Error::other)?;
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A stub serving on a free port of 127.0.0.1 in the current Tokio runtime, stopped when dropped.
#[derive(Debug)]
pub struct StubEngine {
    addr: SocketAddr,
    recorder: Recorder,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl StubEngine {
    /// Starts a stub on `127.0.0.1:0`.
    pub async fn start(options: Options) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        Self::start_on(listener, options)
    }

    /// Starts a stub on `listener`.
    pub fn start_on(listener: TcpListener, options: Options) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        // Checked here so that a bad id fails the caller, not the background task.
        let _ = server::router(options.clone(), Recorder::new(1)).map_err(std::io::Error::other)?;
        let recorder = Recorder::new(options.max_recorded);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, options, recorder.clone(), async {
            let _ = stopped.await;
        }));
        Ok(Self {
            addr,
            recorder,
            stop: Some(stop),
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What reached it so far, in order of arrival.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.recorder.requests()
    }

    /// Stops accepting connections and waits for the answers in flight.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.map_err(std::io::Error::other)?
    }
}

impl Drop for StubEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}
