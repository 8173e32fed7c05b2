//! The producer's core: every rule a request meets, behind the operations the front-ends call.
//!
//! Follow one request (docs/architecture.md): a front-end reads its body and hints and calls
//! [`Producer::place`]; [`request`] parses the body into prompts, [`window`] hashes them under
//! the window's config and holds the request until the window is sealed, [`planning`] plans the
//! sealed window (through [`batch`], onto the planner), and the request gets its [`placement`].
//! The front-end then asks [`Producer::route`] where to send it ([`routing`]: its endpoint, then
//! fallbacks, from what [`live`] knows of each endpoint) and answers in its protocol. Every
//! refusal on the way is a [`PlaceError`], counted once as a [`Refused`].
//!
//! Around the path: [`config_store`] (the config in force, fed by a config source), [`limits`],
//! [`hints`], [`metrics`], and [`whole_batch`] (a whole batch planned at once: `POST /v1/plan`
//! and the `plan` subcommand).

pub mod arrival;
pub mod batch;
pub mod body;
pub mod budget;
pub mod config_store;
pub mod engines;
pub mod error;
pub mod hints;
pub mod limits;
pub mod live;
pub mod metrics;
pub mod placement;
pub mod planning;
pub mod request;
pub mod routing;
pub mod whole_batch;
pub mod window;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burst_prefix_api::Endpoint;
use bytes::Bytes;

pub use arrival::Finish;
pub use config_store::{ConfigOrigin, Snapshot};
use engines::Engines;
pub use error::{PlaceError, Refused};
pub use hints::Hints;
pub use limits::Limits;
pub use live::{Attempted, InFlight};
pub use placement::Placement;
pub use routing::Route;

use budget::{ByteBudget, Reserved};
use config_store::ConfigStore;
use live::LiveEndpoints;
use metrics::{Metrics, Outcome};
use placement::RequestHeld;
use planning::Planner;
use request::HashedRequest;
use request::{InferenceRequest, PromptInput};
use window::seal::SealReason;
use window::Window;

/// One request to place, as a front-end received it.
#[derive(Debug)]
pub struct PlaceRequest<'a> {
    /// The inference request body (completions or chat completions JSON).
    pub body: &'a [u8],
    /// Addresses (`ip:port`) the caller allows, e.g. a gateway's subset hint; `None`: all.
    pub subset: Option<&'a [String]>,
    /// Hints from the caller's protocol (headers); a hint in the body counts where these are
    /// unset.
    pub hints: Hints,
    /// What the caller keeps for this request while it waits, in the budget (a proxy keeps the
    /// body to forward it; [`Producer::reserve`] gives an empty one); given back once it is
    /// answered.
    pub held: Reserved,
}

/// One running producer: the config in force, the window, what it knows live of each endpoint,
/// and the metrics. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Producer {
    store: Arc<ConfigStore>,
    window: Arc<Window>,
    live: Arc<LiveEndpoints>,
    metrics: Arc<Metrics>,
    limits: Limits,
    /// What requests hold before they are placed (`--max-window-bytes`).
    budget: Arc<ByteBudget>,
    /// Windows and arrivals are placed under this lock, one at a time.
    planner: Arc<Mutex<Planner>>,
    /// What the engines say themselves: blocks held, tokenizer, load.
    engines: Arc<Engines>,
    /// Whether this replica leads (docs/behaviour.md, "High availability"); true unless leader
    /// election says otherwise.
    leading: Arc<AtomicBool>,
}

impl Producer {
    /// A producer with no config yet; a config source fills it through [`Producer::config_store`].
    pub fn new(origin: ConfigOrigin, limits: Limits) -> Self {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(origin, metrics.clone()));
        let live = Arc::new(LiveEndpoints::default());
        let budget = ByteBudget::new(limits.max_window_bytes);
        let engines = Arc::new(Engines::new(metrics.registry()));
        let planner = Arc::new(Mutex::new(Planner::new(
            metrics.registry(),
            engines.clone(),
        )));
        let window = Window::new(
            store.clone(),
            live.clone(),
            metrics.clone(),
            budget.clone(),
            planner.clone(),
        );
        Producer {
            store,
            window,
            live,
            metrics,
            limits,
            budget,
            planner,
            engines,
            leading: Arc::new(AtomicBool::new(true)),
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

    /// An empty reservation in the budget of what requests hold before they are placed, for a
    /// front-end to take a body's bytes into as it reads them.
    pub fn reserve(&self) -> Reserved {
        self.budget.empty()
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

    /// The open window's id and live request count, if one is open.
    pub fn open_window(&self) -> Option<(u64, usize)> {
        self.window.open_requests()
    }

    /// True once [`Producer::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.window.is_closed()
    }

    /// Refuses new requests from now on, and seals, plans and answers the open window.
    pub async fn close(&self) {
        self.window.close().await;
    }

    /// Parses the body, joins the open window and waits until it is planned. If the caller
    /// drops the future before the window is sealed, the request leaves the window: it is never
    /// planned.
    pub async fn place(&self, request: PlaceRequest<'_>) -> Result<Placement, Refused> {
        self.join_and_wait(request)
            .await
            .map_err(|error| self.refuse(error))
    }

    async fn join_and_wait(&self, request: PlaceRequest<'_>) -> Result<Placement, PlaceError> {
        if !self.leading() {
            // Windows are the leader's: a follower that planned too would split bursts.
            return Err(PlaceError::NotLeader);
        }
        self.limits.check_body(request.body.len())?;
        if let Some(snapshot) = self.store.current().filter(|s| s.settings.on_arrival()) {
            return self.place_on_arrival(snapshot, request);
        }
        let ticket = {
            // The parsed request borrows the body; it is gone once the hashes are in the window.
            let (parsed, hints) = self.read(&request)?;
            self.window
                .join(hints.group_size, request.held, |snapshot| {
                    self.hash(snapshot, &parsed, request.subset)
                })?
        };
        ticket.placement().await.map_err(|_| PlaceError::Abandoned)
    }

    /// The request as the core places it: parsed, its hints merged (headers win over the
    /// body), a new weight version noted, and its prompts as the engine's token ids when a
    /// tokenizer is in use.
    fn read<'a>(
        &self,
        request: &PlaceRequest<'a>,
    ) -> Result<(InferenceRequest<'a>, Hints), PlaceError> {
        let mut parsed = InferenceRequest::parse(request.body)?;
        let hints = request.hints.clone().or(std::mem::take(&mut parsed.hints));
        if let Some(version) = &hints.weight_version {
            self.engines.weights(version);
        }
        if let Some(tokens) = self.engines.token_prompts(request.body, &parsed) {
            parsed = parsed.with_token_prompts(tokens);
        }
        Ok((parsed, hints))
    }

    /// Hashes a read request under `snapshot`'s config, among its gateway's `subset` when it
    /// has one, and notes what the engines hold of its first prompt.
    fn hash(
        &self,
        snapshot: &Snapshot,
        parsed: &InferenceRequest<'_>,
        subset: Option<&[String]>,
    ) -> Result<HashedRequest, PlaceError> {
        let spec = snapshot.settings.block_spec;
        let chains = parsed.block_hashes(spec);
        if let (Some(PromptInput::Tokens(tokens)), Some(chain)) =
            (parsed.prompts.first(), chains.first())
        {
            if !tokens.is_empty() {
                self.engines
                    .note_held(tokens, chain, spec.block_size_tokens);
            }
        }
        let mut hashed = HashedRequest::from_chains(chains, parsed);
        if let Some(subset) = subset {
            let allowed = routing::ids_in_subset(snapshot, subset, hashed.endpoints.as_deref());
            if allowed.is_empty() {
                return Err(PlaceError::NoEligibleEndpoint);
            }
            hashed.endpoints = Some(allowed);
        }
        Ok(hashed)
    }

    /// Reads an HTTP request's body (under the body limit) and hints, and places it. The body
    /// comes back for a front-end that forwards it (`forwarded`: its bytes count against the
    /// window's budget while it waits).
    pub async fn place_http<B>(
        &self,
        headers: &http::HeaderMap,
        body: B,
        forwarded: bool,
    ) -> Result<(Bytes, Placement), Refused>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let hints = Hints::from_headers(headers).map_err(|e| self.refuse(e.into()))?;
        let mut reserved = self.reserve();
        let body = body::read_body(body, &self.limits, &mut reserved)
            .await
            .map_err(|e| self.refuse(e))?;
        if !forwarded {
            // Only the hashes wait in the window; the body is gone once they are made.
            reserved = self.reserve();
        }
        let placement = self
            .place(PlaceRequest {
                body: &body,
                subset: None,
                hints,
                held: reserved,
            })
            .await?;
        Ok((body, placement))
    }

    /// Places a request now, with no window (`windowDurationMs: 0`).
    fn place_on_arrival(
        &self,
        snapshot: Arc<Snapshot>,
        request: PlaceRequest<'_>,
    ) -> Result<Placement, PlaceError> {
        let started = Instant::now();
        if self.window.is_closed() {
            return Err(PlaceError::ShuttingDown);
        }
        if snapshot.config.endpoints.is_empty() {
            return Err(PlaceError::NoEndpoints);
        }
        let (parsed, hints) = self.read(&request)?;
        let hashed = self.hash(&snapshot, &parsed, request.subset)?;
        drop(parsed);
        let group_size = hints.group_size;
        let arrived = self
            .planner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .place_on_arrival(&snapshot, &hashed, group_size, &self.live);
        let outcome = match arrived.assigned {
            Some(_) => Outcome::Assigned,
            None => Outcome::NoAffinity,
        };
        self.metrics.request(outcome);
        let waited = started.elapsed();
        self.metrics
            .request_wait_seconds
            .observe(waited.as_secs_f64());
        Ok(Placement {
            assigned: arrived.assigned,
            total_blocks: hashed.blocks.len(),
            group: hashed.blocks.last().copied().unwrap_or(0),
            endpoints: hashed.endpoints,
            window_id: arrived.sequence,
            window_size: 1,
            waited,
            sealed_by: SealReason::Arrival,
            snapshot,
            memory: Some(RequestHeld::OnArrival(arrived.held)),
            arrival: Some(arrived.id),
        })
    }

    /// For a request placed on arrival, a guard that takes it off the work in flight when
    /// dropped: a front-end that sees its answer end holds it until then (otherwise the
    /// placement counts with a half-life).
    pub fn finish_when_dropped(&self, placement: &Placement) -> Option<Finish> {
        placement
            .arrival
            .map(|id| Finish::new(self.planner.clone(), id))
    }

    /// Where a placed request goes: its endpoint, then at most `fallbacks` others to try in
    /// order (the docs' "Routing after placement").
    pub fn route(&self, placement: &Placement, fallbacks: usize) -> Result<Route, Refused> {
        routing::of_placement(&self.live, placement, fallbacks, Instant::now())
            .ok_or_else(|| self.refuse(PlaceError::NoEligibleEndpoint))
    }

    /// Where a request goes that is routed without a prompt (`GET /v1/models`, a body-less
    /// request at the endpoint picker): at most `count` usable endpoints whose address `subset`
    /// allows, fewest requests in flight first.
    pub fn route_by_load(&self, subset: Option<&[String]>, count: usize) -> Result<Route, Refused> {
        let snapshot = self
            .store
            .current()
            .filter(|s| !s.config.endpoints.is_empty())
            .ok_or_else(|| self.refuse(PlaceError::NoEndpoints))?;
        routing::by_load_only(&self.live, &snapshot, subset, count, Instant::now())
            .ok_or_else(|| self.refuse(PlaceError::NoEligibleEndpoint))
    }

    /// Counts a front-end's refusal of a request (one it could not read, or will not route);
    /// the only way a front-end gets a [`Refused`] to answer with.
    pub fn refuse(&self, error: PlaceError) -> Refused {
        self.metrics.request(Outcome::Rejected);
        if matches!(error, PlaceError::Abandoned) {
            tracing::error!(%error, "internal error");
        }
        Refused::counted(error)
    }

    /// Counts a request in flight through endpoint `id` (for planning and routing) until the
    /// guard is dropped.
    pub fn start_in_flight(&self, id: &str) -> InFlight {
        self.live.start(id)
    }

    /// Requests in flight through endpoint `id` now.
    pub fn in_flight(&self, id: &str) -> u64 {
        self.live.in_flight(id)
    }

    /// Records what an attempt to send a request to endpoint `id` showed (`detail` says what
    /// happened); when it says the endpoint is unwell (docs/behaviour.md §8), leaves it out of
    /// planning and routing for `cooldown`.
    pub fn attempted(
        &self,
        id: &str,
        attempted: Attempted,
        detail: &str,
        cooldown: Duration,
        failed_in_a_row: u32,
    ) {
        let Some(reason) = self.live.attempted(id, attempted, failed_in_a_row) else {
            return;
        };
        self.live.cool_down(id, Instant::now() + cooldown);
        self.metrics.upstream_cooldown(id, reason.label());
        tracing::warn!(
            endpoint = id,
            reason = reason.label(),
            detail,
            cooldown_ms = cooldown.as_millis() as u64,
            "upstream unwell; left out of planning and routing for the cool-down"
        );
    }

    /// The endpoint of the config in force at `address` (`ip:port`).
    pub fn endpoint_at(&self, address: &str) -> Option<Endpoint> {
        self.store
            .current()?
            .config
            .endpoints
            .iter()
            .find(|e| e.address == address)
            .cloned()
    }
}
