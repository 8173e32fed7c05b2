//! The producer's core (`burst-prefix-core`): every rule a request meets, and no front-end.
//!
//! A request's path is four stages, in the order [`path`] writes them (docs/architecture.md):
//! [`admit`] (does this producer take it; its body under the limits), [`read`] (parsed, hinted,
//! tokenized, hashed, once), [`place`] (the window or on arrival; one function builds the
//! placement and counts its outcome) and [`route`] (where it goes, and the handle its front-end
//! holds until its answer ends). Every refusal on the way is a [`PlaceError`], counted once as a
//! [`Refused`].
//!
//! Around the path: [`config_store`] (the config in force, fed by a config source), [`live`]
//! (requests in flight and cool-downs per endpoint), [`engines`] (what the engines say),
//! [`budget`] (the bytes requests hold), [`metrics`], and [`whole_batch`] (a whole batch planned
//! at once: `POST /v1/plan` and the `plan` subcommand).

pub mod admit;
pub mod budget;
pub mod config_store;
pub mod engines;
pub mod error;
pub mod live;
pub mod metrics;
pub mod path;
pub mod place;
pub mod read;
pub mod route;
pub mod whole_batch;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

pub use admit::{BodyReader, Hints, Limits};
pub use config_store::{ConfigOrigin, Snapshot};
pub use error::{PlaceError, Refused};
pub use live::{Attempted, CoolDown, CooldownReason};
pub use path::{Admission, KeepBody, Placed, Routed};
pub use place::Placement;
pub use route::{Handle, Route};

use budget::ByteBudget;
use config_store::ConfigStore;
use engines::Engines;
use live::LiveEndpoints;
use metrics::{Metrics, Outcome};
use place::memory::CacheModels;
use place::on_arrival::Arrivals;
use place::window::Window;

/// One running producer: the config in force, the two placers, what it knows live of each
/// endpoint, and the metrics. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Producer {
    store: Arc<ConfigStore>,
    window: Arc<Window>,
    arrivals: Arc<Arrivals>,
    live: Arc<LiveEndpoints>,
    metrics: Arc<Metrics>,
    limits: Limits,
    /// What requests hold before they are placed (`--max-window-bytes`).
    budget: Arc<ByteBudget>,
    /// What the engines say themselves: blocks held, tokenizer, load.
    engines: Arc<Engines>,
    /// Whether this replica leads (docs/behaviour.md §10); true unless leader election says
    /// otherwise.
    leading: Arc<AtomicBool>,
    /// Set once the producer shuts down: nothing more is admitted or placed.
    closed: Arc<AtomicBool>,
}

impl Producer {
    /// A producer with no config yet; a config source fills it through [`Producer::config_store`].
    pub fn new(origin: ConfigOrigin, limits: Limits) -> Self {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(origin, metrics.clone()));
        let live = Arc::new(LiveEndpoints::default());
        let budget = ByteBudget::new(limits.max_window_bytes);
        let engines = Arc::new(Engines::new(metrics.registry()));
        let models = Arc::new(Mutex::new(CacheModels::new(
            metrics.registry(),
            engines.clone(),
        )));
        let closed = Arc::new(AtomicBool::new(false));
        let window = Window::new(
            store.clone(),
            live.clone(),
            metrics.registry(),
            budget.clone(),
            models.clone(),
        );
        let arrivals = Arc::new(Arrivals::new(models, live.clone(), closed.clone()));
        Producer {
            store,
            window,
            arrivals,
            live,
            metrics,
            limits,
            budget,
            engines,
            leading: Arc::new(AtomicBool::new(true)),
            closed,
        }
    }

    /// A producer serving `yaml` (a valid producer config) from the start: for the demo, tests
    /// and benches.
    pub fn with_config(yaml: &str, limits: Limits) -> Result<Self, String> {
        let producer = Producer::new(ConfigOrigin::Demo, limits);
        producer.store.apply_text(yaml).map_err(|e| e.to_string())?;
        Ok(producer)
    }

    /// Where config sources deliver the config.
    pub fn config_store(&self) -> &Arc<ConfigStore> {
        &self.store
    }

    /// The config in force, if one was accepted.
    pub fn config(&self) -> Option<Arc<Snapshot>> {
        self.store.current()
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// What the engines say themselves, for the feeds that tell it (KV events, load) and the
    /// reset call.
    pub fn engines(&self) -> &Arc<Engines> {
        &self.engines
    }

    /// An empty reservation in the budget of what requests hold before they are placed, for
    /// bytes a front-end holds outside a request's body (the endpoint picker's messages in
    /// transit).
    pub fn reserve(&self) -> budget::Reserved {
        self.budget.empty()
    }

    /// A reader for a body that is not an inference request (`POST /v1/plan`, a memory reset)
    /// under the same limits and budget; its refusals are not request outcomes.
    pub fn body_reader(&self) -> BodyReader {
        BodyReader::new(self.limits, self.budget.empty())
    }

    /// Ready: a valid config with at least one endpoint is in force, this replica leads, and
    /// it is not shutting down.
    pub fn ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Why this producer is not ready, if it is not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.is_closed() {
            Err("shutting down".into())
        } else if !self.leading() {
            Err("a follower: another replica holds the Lease and serves".into())
        } else if !self.store.ready() {
            Err("no valid config with at least one endpoint is loaded".into())
        } else {
            Ok(())
        }
    }

    pub fn leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    /// Leader election says whether this replica leads. A follower refuses requests
    /// (`not_leader`) and keeps its config current.
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Relaxed);
        self.metrics.leading.set(i64::from(leading));
    }

    /// The open window's id and live request count, if one is open.
    pub fn open_window(&self) -> Option<(u64, usize)> {
        self.window.open_requests()
    }

    /// True once [`Producer::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Refuses new requests from now on, and seals, plans and answers the open window.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.window.close().await;
    }

    /// Counts a front-end's refusal of a request (one it could not read, or will not route);
    /// with the path's stages, the only way to a [`Refused`].
    pub fn refuse(&self, error: PlaceError) -> Refused {
        self.metrics.request(Outcome::Rejected);
        if matches!(error, PlaceError::Abandoned) {
            tracing::error!(%error, "internal error");
        }
        Refused::counted(error)
    }

    /// Requests in flight through endpoint `id` now.
    pub fn in_flight(&self, id: &str) -> u64 {
        self.live.in_flight(id)
    }
}
