//! The producer's core: one operation, [`Producer::place`], that every front-end calls.
//!
//! Follow one request: [`request`] parses the body into prompts, [`window`] hashes it under the
//! window's config and holds it until the window is sealed, [`batch`] maps the window onto the
//! planner and back to endpoint ids, and the caller gets a [`Placement`]. Around it:
//! [`config_store`] (the config in force, fed by a config source) and [`metrics`].

pub mod batch;
pub mod config_store;
pub mod endpoints;
pub mod error;
pub mod memory;
pub mod metrics;
pub mod request;
pub mod window;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use error::PlaceError;
pub use window::Placement;

use batch::HashedRequest;
use config_store::{ConfigSource, ConfigStore, Snapshot};
use endpoints::LiveEndpoints;
use metrics::{Metrics, Outcome};
use request::{Hints, InferenceRequest};
use window::Window;

/// Default limit of a request body: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Default budget of the bytes the open window holds: 256 MiB.
pub const DEFAULT_MAX_WINDOW_BYTES: usize = 256 * 1024 * 1024;

/// Limits every front-end applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Most bytes the open window holds: its requests' hashes, and the bodies front-ends keep
    /// while their requests wait; beyond, `window_full`.
    pub max_window_bytes: usize,
    /// Most replicas a `POST /v1/plan` batch may name.
    pub max_plan_replicas: usize,
}

/// Default of `--max-plan-replicas`.
pub const DEFAULT_MAX_PLAN_REPLICAS: usize = 10_000;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_window_bytes: DEFAULT_MAX_WINDOW_BYTES,
            max_plan_replicas: DEFAULT_MAX_PLAN_REPLICAS,
        }
    }
}

/// One request to place, as a front-end received it.
#[derive(Clone, Copy, Debug, Default)]
pub struct PlaceRequest<'a> {
    /// The inference request body (completions or chat completions JSON).
    pub body: &'a [u8],
    /// Addresses (`ip:port`) the caller allows, e.g. a gateway's subset hint; `None`: all.
    pub subset: Option<&'a [String]>,
    /// Hints from the caller's protocol (headers); a hint in the body counts where these are
    /// unset.
    pub hints: Hints,
    /// Bytes the caller keeps for this request while it waits (a proxy keeps the body to
    /// forward it); they count against the window's byte budget.
    pub held_bytes: usize,
}

/// One running producer: the config in force, the window and the metrics.
#[derive(Clone)]
pub struct Producer {
    pub store: Arc<ConfigStore>,
    pub window: Arc<Window>,
    pub live: Arc<LiveEndpoints>,
    pub metrics: Arc<Metrics>,
    pub limits: Limits,
    /// Whether this replica leads (SPEC §10); true unless leader election says otherwise.
    leading: Arc<AtomicBool>,
}

impl Producer {
    /// A producer with no config yet; a config source fills `store`.
    pub fn new(source: ConfigSource, limits: Limits) -> Self {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(source, metrics.clone()));
        let live = Arc::new(LiveEndpoints::default());
        let window = Window::new(
            store.clone(),
            live.clone(),
            metrics.clone(),
            limits.max_window_bytes,
        );
        let leading = Arc::new(AtomicBool::new(true));
        Producer {
            store,
            window,
            live,
            metrics,
            limits,
            leading,
        }
    }

    /// Ready: a valid config with at least one endpoint is in force, this replica leads, and
    /// it is not shutting down.
    pub fn ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// Why this producer is not ready, if it is not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.window.is_closed() {
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

    /// Parses the body, joins the open window and waits until it is planned. Refusals are
    /// counted (`burst_prefix_requests_total{outcome="rejected"}`). If the caller drops the
    /// future before the window is sealed, the request leaves the window: it is never planned.
    pub async fn place(&self, request: PlaceRequest<'_>) -> Result<Placement, PlaceError> {
        let result = self.join_and_wait(request).await;
        if result.is_err() {
            self.metrics.request(Outcome::Rejected);
        }
        result
    }

    async fn join_and_wait(&self, request: PlaceRequest<'_>) -> Result<Placement, PlaceError> {
        if !self.leading() {
            // Windows are the leader's: a follower that planned too would split bursts.
            return Err(PlaceError::NotLeader);
        }
        let ticket = {
            // The parsed request borrows the body; it is gone once the hashes are in the window.
            let parsed = InferenceRequest::parse(request.body)?;
            let group_size = request.hints.group_size.or(parsed.hints.group_size);
            self.window
                .join(group_size, request.held_bytes, |snapshot| {
                    let mut hashed = HashedRequest::new(&parsed, snapshot.settings.block_spec);
                    if let Some(subset) = request.subset {
                        hashed.endpoints = Some(allowed_by_subset(snapshot, subset, &hashed)?);
                    }
                    Ok(hashed)
                })?
        };
        ticket.placement().await.map_err(|_| PlaceError::Abandoned)
    }
}

/// The endpoint ids of `snapshot` whose address is in `subset` (and in the request's own list,
/// when it has one); none is an error.
fn allowed_by_subset(
    snapshot: &Snapshot,
    subset: &[String],
    request: &HashedRequest,
) -> Result<Vec<String>, PlaceError> {
    let allowed: Vec<String> = snapshot
        .config
        .endpoints
        .iter()
        .filter(|endpoint| subset.contains(&endpoint.address))
        .filter(|endpoint| {
            request
                .endpoints
                .as_ref()
                .is_none_or(|ids| ids.contains(&endpoint.id))
        })
        .map(|endpoint| endpoint.id.clone())
        .collect();
    if allowed.is_empty() {
        Err(PlaceError::NoEligibleEndpoint)
    } else {
        Ok(allowed)
    }
}
