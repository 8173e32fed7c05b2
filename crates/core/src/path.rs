//! The producer ([`Producer`]: the config in force, the two placers, what it knows live of each
//! endpoint, the metrics) and the request's path through it, in order, written here once
//! (docs/architecture.md):
//!
//! 1. **admit** ([`crate::admit`]): [`Producer::admit`] refuses at once as a follower or while
//!    shutting down, and reads the headers' hints; the front-end then feeds the body to the
//!    [`Admission`], a chunk at a time ([`Admission::take`]) or as an HTTP body
//!    ([`Admission::read_http`]), under the body limit, the body timeout and the byte budget.
//! 2. **read** ([`crate::read`]) and 3. **place** ([`crate::place`]): [`Admission::place`] reads
//!    the whole body into the request (parsed, hinted, tokenized, hashed under the config in
//!    force) and places it with the placer that config names: the window, or on arrival. A
//!    window opened under another config takes it hashed again under its own.
//! 4. **route** ([`crate::route`]): [`Placed::route`] gives the endpoints to send it to and the
//!    [`Handle`] its front-end holds until its answer ends.
//!
//! A front-end is: read its protocol, call these in this order (the types allow no other), map
//! a [`Refused`] to its protocol, and hold the handle. Every refusal is counted once, by the
//! stage that refuses; every placed request's outcome by the place stage. A request routed
//! without a prompt (`GET /v1/models`, a body-less request at the endpoint picker) takes the
//! short path, [`Producer::route_by_load`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::Body;

use crate::admit::{self, BodyReader, Door, Hints, Limits, WholeBody};
use crate::budget::{self, ByteBudget};
use crate::clock::{Clock, ClockHand};
use crate::config_store::{ConfigOrigin, ConfigStore, Snapshot};
use crate::engines::Engines;
use crate::error::{PlaceError, Refused};
use crate::live::LiveEndpoints;
use crate::metrics::{Metrics, Outcome};
use crate::place::memory::CacheModels;
use crate::place::on_arrival::Arrivals;
use crate::place::window::Window;
use crate::place::{self, NotPlaced, Placement, RequestBound, ToPlace};
use crate::read;
use crate::route::{self, Handle};

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
    /// Set the first time it is Ready: the wait for the engines' first `/metrics` round is
    /// behind it.
    been_ready: Arc<AtomicBool>,
    /// Set once the producer shuts down: nothing more is admitted or placed.
    closed: Arc<AtomicBool>,
}

impl Producer {
    /// A producer with no config yet; a config source fills it through [`Producer::config_store`].
    pub fn new(origin: ConfigOrigin, limits: Limits) -> Self {
        Producer::keeping_time(origin, limits, Clock::wall())
    }

    /// A producer serving `yaml` whose placers' clock its driver sets (a simulator, e.g. the
    /// BLIS bench): the same placements follow from the same arrivals, at any speed.
    pub fn driven(yaml: &str, limits: Limits) -> Result<(Self, ClockHand), String> {
        let (clock, hand) = Clock::driven();
        let producer = Producer::keeping_time(ConfigOrigin::Demo, limits, clock);
        producer.store.apply_text(yaml).map_err(|e| e.to_string())?;
        Ok((producer, hand))
    }

    fn keeping_time(origin: ConfigOrigin, limits: Limits, clock: Clock) -> Self {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(origin, metrics.clone()));
        let live = Arc::new(LiveEndpoints::default());
        let budget = ByteBudget::new(limits.max_window_bytes);
        let engines = Arc::new(Engines::new(metrics.registry()));
        let models = Arc::new(Mutex::new(CacheModels::new(
            metrics.registry(),
            engines.clone(),
            clock,
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
            been_ready: Arc::new(AtomicBool::new(false)),
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

    /// Ready: a valid config with at least one endpoint is in force, this replica leads, it is
    /// not shutting down and, the first time, it has heard the engines' load when the config
    /// reads it.
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
            self.heard_the_engines()?;
            self.been_ready.store(true, Ordering::Relaxed);
            Ok(())
        }
    }

    /// A producer whose config reads the engines' load (`engines.loadIntervalMs`) is first Ready
    /// once its first round of `/metrics` scrapes is done, each engine answered or failed (a
    /// scrape is bounded by its timeout), so that a new replica does not place blind
    /// (docs/behaviour.md §10). Only the first time: an engine that joins later does not take a
    /// serving producer out of the Service.
    fn heard_the_engines(&self) -> Result<(), String> {
        let Some(snapshot) = self.store.current() else {
            return Ok(());
        };
        if self.been_ready.load(Ordering::Relaxed)
            || snapshot.config.planner.engines.load_interval_ms <= 0
        {
            return Ok(());
        }
        let scraped: Vec<bool> = snapshot
            .config
            .endpoints
            .iter()
            .filter(|endpoint| endpoint.socket_addr().is_some())
            .map(|endpoint| self.engines.scraped(&endpoint.id))
            .collect();
        let heard = scraped.iter().filter(|&&heard| heard).count();
        if heard < scraped.len() {
            return Err(format!(
                "waiting for the first /metrics round: {heard} of {} engines heard",
                scraped.len()
            ));
        }
        Ok(())
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

/// A request admitted, its body being read.
pub struct Admission {
    producer: Producer,
    hints: Hints,
    body: BodyReader,
    bound: Option<RequestBound>,
}

/// Whether a front-end keeps a request's body while it waits to be placed (a proxy forwards
/// it): kept, its bytes stay in the byte budget until it is placed; else only its hashes do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepBody {
    Keep,
    Drop,
}

/// A request placed, its body kept or not.
pub struct Placed {
    producer: Producer,
    placement: Placement,
    body: Bytes,
}

/// A request routed: the handle its front-end holds until the answer ends, its placement and
/// its body (empty when not kept).
pub struct Routed {
    pub handle: Handle,
    pub placement: Placement,
    pub body: Bytes,
}

impl Producer {
    /// Stage 1, admit: a request whose protocol's header `name` has the value `headers(name)`
    /// (lowercase names).
    pub fn admit<'a>(
        &self,
        headers: impl Fn(&str) -> Option<&'a [u8]>,
    ) -> Result<Admission, Refused> {
        let door = Door {
            leading: self.leading(),
            closed: self.is_closed(),
        };
        let (hints, body) = admit::admit(door, headers, self.limits, self.budget.empty())
            .map_err(|error| self.refuse(error))?;
        Ok(Admission {
            producer: self.clone(),
            hints,
            body,
            bound: None,
        })
    }

    /// Stage 1 for an HTTP request: [`Producer::admit`] with its headers, then its whole body
    /// read, frame by frame ([`Admission::read_http`]); `within`: the front-end's bound on the
    /// whole request ([`Admission::within`]).
    pub async fn admit_http<B>(
        &self,
        headers: &http::HeaderMap,
        body: B,
        within: Option<Duration>,
    ) -> Result<Admission, Refused>
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let mut admission = self.admit(|name| headers.get(name).map(|value| value.as_bytes()))?;
        if let Some(limit) = within {
            admission = admission.within(limit);
        }
        admission.read_http(body).await?;
        Ok(admission)
    }

    /// The path of a request routed without a prompt: stage 4 only, at most `count` usable
    /// endpoints whose address `subset` allows (`None`: all), fewest requests in flight first.
    pub fn route_by_load(
        &self,
        subset: Option<&[String]>,
        count: usize,
    ) -> Result<Handle, Refused> {
        let snapshot = self
            .store
            .current()
            .filter(|s| !s.config.endpoints.is_empty())
            .ok_or_else(|| self.refuse(PlaceError::NoEndpoints))?;
        let route = route::by_load_only(&self.live, &snapshot, subset, count, Instant::now())
            .ok_or_else(|| self.refuse(PlaceError::NoEligibleEndpoint))?;
        Ok(Handle::new(route, self.live.clone(), None))
    }
}

impl Admission {
    /// Bounds the whole request, body and wait (a front-end's own limit): beyond `limit` from
    /// now it is refused, `request_timeout`.
    pub fn within(mut self, limit: Duration) -> Self {
        let bound = RequestBound {
            deadline: tokio::time::Instant::now() + limit,
            limit,
        };
        self.body.bound(bound.deadline, bound.error());
        self.bound = Some(bound);
        self
    }

    /// Takes the body's next chunk.
    pub fn take(&mut self, chunk: &[u8]) -> Result<(), Refused> {
        self.body
            .take(chunk)
            .map_err(|error| self.producer.refuse(error))
    }

    /// Takes an HTTP body, frame by frame, until it ends.
    pub async fn read_http<B>(&mut self, body: B) -> Result<(), Refused>
    where
        B: Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        match self.body.read_http(body).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self.producer.refuse(error)),
        }
    }

    /// Stages 2 and 3, once the body is whole: reads it and places it among the endpoints
    /// whose address `subset` lists (a gateway's subset hint; `None`: all). If the caller drops
    /// the future before the request is placed, the request leaves its window: it is never
    /// planned.
    pub async fn place(self, subset: Option<&[String]>, keep: KeepBody) -> Result<Placed, Refused> {
        let Admission {
            producer,
            hints,
            body,
            bound,
        } = self;
        let WholeBody { bytes, reserved } = body.finish();
        let held = match keep {
            KeepBody::Keep => reserved,
            // Only the hashes wait in the window; the body's bytes go back now.
            KeepBody::Drop => {
                drop(reserved);
                producer.budget.empty()
            }
        };
        match producer
            .read_and_place(&bytes, hints, subset, held, bound)
            .await
        {
            Ok(placement) => Ok(Placed {
                placement,
                body: match keep {
                    KeepBody::Keep => bytes,
                    KeepBody::Drop => Bytes::new(),
                },
                producer,
            }),
            Err(error) => Err(producer.refuse(error)),
        }
    }
}

impl Producer {
    /// Stage 2, read, then stage 3, place, with the placer the config it was read under names;
    /// hashed again under a window's own config when that differs (docs/behaviour.md §3).
    async fn read_and_place(
        &self,
        body: &[u8],
        hints: Hints,
        subset: Option<&[String]>,
        mut held: crate::budget::Reserved,
        bound: Option<RequestBound>,
    ) -> Result<Placement, PlaceError> {
        let mut read = read::read(body, hints, self.store.current(), subset, &self.engines)?;
        loop {
            let request = ToPlace {
                request: std::mem::take(&mut read.hashed),
                snapshot: read.snapshot.clone(),
                group_size: read.hints.group_size,
                held,
            };
            let placed = if read.snapshot.settings.on_arrival {
                place::place(&self.arrivals, &self.metrics, request, bound).await
            } else {
                place::place(&self.window, &self.metrics, request, bound).await
            };
            match placed {
                Ok(placement) => return Ok(placement),
                Err(NotPlaced::Refused(error)) => return Err(error),
                Err(NotPlaced::Stale { newer, held: back }) => {
                    held = back;
                    read.rehash(newer, subset, &self.engines)?;
                }
            }
        }
    }
}

impl Placed {
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The body, kept for a front-end that forwards it (empty when not kept).
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The placement and the body, for a front-end that routes no further (the scoring API).
    pub fn into_parts(self) -> (Placement, Bytes) {
        (self.placement, self.body)
    }

    /// Stage 4, route: its endpoint, then at most `fallbacks` others to try in order, and the
    /// handle that holds it in flight until dropped.
    pub fn route(self, fallbacks: usize) -> Result<Routed, Refused> {
        let Placed {
            producer,
            mut placement,
            body,
        } = self;
        let finish = placement.finish.take();
        let Some(route) =
            route::of_placement(&producer.live, &placement, fallbacks, Instant::now())
        else {
            // Not sent anywhere: finished at once.
            if let Some(finish) = finish {
                finish.finish(None);
            }
            return Err(producer.refuse(PlaceError::NoEligibleEndpoint));
        };
        Ok(Routed {
            handle: Handle::new(route, producer.live.clone(), finish),
            placement,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limits, Producer};

    const TWO: &str =
        "endpoints:\n  - {id: a, address: '10.0.0.1:80'}\n  - {id: b, address: '10.0.0.2:80'}\n";

    fn producer(window_ms: u64) -> Producer {
        Producer::with_config(
            &format!("windowDurationMs: {window_ms}\n{TWO}"),
            Limits::default(),
        )
        .unwrap()
    }

    fn count(producer: &Producer, outcome: &str) -> u64 {
        let series = format!("burst_prefix_requests_total{{outcome=\"{outcome}\"}} ");
        producer
            .metrics()
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&series)?.parse().ok())
            .unwrap()
    }

    fn admitted(producer: &Producer, prompt: &str) -> Admission {
        let mut admission = producer.admit(|_| None).unwrap();
        let body = serde_json::json!({"model": "m", "prompt": prompt}).to_string();
        admission.take(body.as_bytes()).unwrap();
        admission
    }

    #[tokio::test]
    async fn a_follower_or_a_closing_producer_refuses_at_the_door_and_counts_it() {
        let producer = producer(20);
        producer.set_leading(false);
        let refused = producer.admit(|_| None).err().unwrap();
        assert_eq!(refused.code(), "not_leader");
        producer.set_leading(true);
        producer.close().await;
        let refused = producer.admit(|_| None).err().unwrap();
        assert_eq!(refused.code(), "shutting_down");
        assert_eq!(count(&producer, "rejected"), 2);
    }

    #[test]
    fn reading_the_engines_load_it_is_first_ready_once_each_engine_was_scraped() {
        let producer = Producer::with_config(
            &format!(
                "engines: {{loadIntervalMs: 1000}}\n{TWO}  - {{id: named, address: 'vllm:80'}}\n"
            ),
            Limits::default(),
        )
        .unwrap();
        // A host name is not scraped (the feeds reach IPs), so it is not waited for.
        assert_eq!(
            producer.readiness(),
            Err("waiting for the first /metrics round: 0 of 2 engines heard".into())
        );
        producer.engines().set_load("a", Some(3));
        assert_eq!(
            producer.readiness(),
            Err("waiting for the first /metrics round: 1 of 2 engines heard".into())
        );
        // A failed scrape is heard too: an engine that never answers holds nothing up.
        producer.engines().set_load("b", None);
        assert_eq!(producer.readiness(), Ok(()));
        // Once Ready, an engine that joins does not take it out of service.
        producer
            .config_store()
            .apply_text(&format!(
                "engines: {{loadIntervalMs: 1000}}\n{TWO}  - {{id: c, address: '10.0.0.3:80'}}\n"
            ))
            .unwrap();
        assert_eq!(producer.readiness(), Ok(()));
        // The other reasons still hold.
        producer.set_leading(false);
        assert!(producer.readiness().unwrap_err().contains("follower"));
    }

    #[test]
    fn without_the_engines_load_a_config_is_enough() {
        let producer = producer(20);
        assert_eq!(producer.readiness(), Ok(()));
    }

    #[tokio::test]
    async fn the_stages_in_order_place_route_and_hold_the_request_in_flight() {
        let producer = producer(20);
        let placed = admitted(&producer, "x")
            .place(None, KeepBody::Keep)
            .await
            .unwrap();
        assert!(!placed.body().is_empty(), "a kept body comes back");
        let mut routed = placed.route(1).unwrap();
        let first = routed.handle.route().first().id.clone();
        assert_eq!(producer.in_flight(&first), 1);
        let other = if first == "a" { "b" } else { "a" };
        routed.handle.send_to(other);
        assert_eq!(
            (producer.in_flight(&first), producer.in_flight(other)),
            (0, 1)
        );
        drop(routed);
        assert_eq!(
            producer.in_flight(other),
            0,
            "finished once, when the handle drops"
        );
        assert_eq!(
            count(&producer, "no_affinity") + count(&producer, "assigned"),
            1
        );
    }

    #[tokio::test]
    async fn a_request_past_its_bound_is_refused_once_and_not_counted_cancelled() {
        let producer = producer(10_000);
        let admission = admitted(&producer, "x").within(Duration::from_millis(30));
        let refused = admission.place(None, KeepBody::Drop).await.err().unwrap();
        assert_eq!(refused.code(), "request_timeout");
        assert_eq!(producer.open_window().map(|(_, live)| live), Some(0));
        assert_eq!(
            (count(&producer, "rejected"), count(&producer, "cancelled")),
            (1, 0)
        );
    }

    #[tokio::test]
    async fn a_request_whose_caller_leaves_before_it_is_placed_is_counted_cancelled() {
        let producer = producer(10_000);
        let place = admitted(&producer, "x").place(None, KeepBody::Drop);
        let left = tokio::time::timeout(Duration::from_millis(30), place).await;
        assert!(left.is_err(), "still waiting for its window");
        assert_eq!(producer.open_window().map(|(_, live)| live), Some(0));
        assert_eq!(
            (count(&producer, "rejected"), count(&producer, "cancelled")),
            (0, 1)
        );
    }

    #[tokio::test]
    async fn a_request_placed_on_arrival_is_in_flight_until_its_handle_drops() {
        let producer = producer(0);
        let place = |prompt: &'static str| {
            let producer = producer.clone();
            async move {
                admitted(&producer, prompt)
                    .place(None, KeepBody::Drop)
                    .await
                    .unwrap()
            }
        };
        let routed = place("routed").await.route(0).unwrap();
        let unrouted = place("never routed").await;
        assert_eq!(producer.arrivals.in_flight(), 2);
        drop(routed);
        assert_eq!(producer.arrivals.in_flight(), 1, "finished by its handle");
        drop(unrouted);
        assert_eq!(producer.arrivals.in_flight(), 1, "counts with a half-life");
    }
}
