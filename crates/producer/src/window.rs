//! The window (SPEC §3): requests that arrive close together are planned together.
//!
//! - The first request into an empty window opens it, snapshots the config in force, and arms a
//!   one-shot timer of `windowDurationMs` (fixed from that first request, not sliding).
//! - When the timer fires the window is sealed (taken out under the lock, so the next request
//!   opens a new one), planned with [`plan_batch`] on a blocking thread, and every waiter is
//!   released at once through its oneshot channel. The timer wakes that thread shortly before
//!   the deadline and it sleeps the rest precisely: tokio's own timer would fire up to a
//!   millisecond late.
//! - A full window (`maxBatchSize`) refuses further requests at once.
//! - A waiter whose client goes away drops its [`Ticket`], which takes its slot out of the
//!   window if it is still open: cancelled requests are never planned.
//!
//! The lock is held only to push, remove or take slots; hashing happens before joining and
//! planning after sealing, both outside it.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use burst_prefix_api::PlannerConfig;
use burst_prefix_planner::{BlockSpec, Plan, Replica};
use tokio::sync::oneshot;

use crate::batch::{plan_batch, HashedRequest};
use crate::config_store::{ConfigStore, Snapshot};
use crate::metrics::{Metrics, Outcome};

/// How long before a window's deadline the (millisecond-granular) tokio timer wakes; the rest
/// is slept precisely on the planning thread.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// What a request gets when its window is planned.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Index into `snapshot.config.endpoints`, or `None` for no affinity.
    pub assigned: Option<usize>,
    pub total_blocks: usize,
    pub window_id: u64,
    /// Requests planned in the window (cancelled ones excluded).
    pub window_size: usize,
    /// From joining the window to being released.
    pub waited: Duration,
    /// The config the window was planned with.
    pub snapshot: Arc<Snapshot>,
}

/// Why a request could not join the window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JoinError {
    /// No config with at least one endpoint is in force.
    NoEndpoints,
    /// The open window already holds `limit` requests; it is planned in `retry_after`.
    BatchFull { limit: usize, retry_after: Duration },
    /// The service is shutting down.
    ShuttingDown,
}

/// The planning of a request's window was lost (the planner panicked); logged where it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned;

pub struct Window {
    state: Mutex<State>,
    store: Arc<ConfigStore>,
    metrics: Arc<Metrics>,
}

#[derive(Default)]
struct State {
    open: Option<Open>,
    last_id: u64,
    closed: bool,
}

struct Open {
    id: u64,
    deadline: Instant,
    snapshot: Arc<Snapshot>,
    /// Arrival order; a cancelled request leaves `None`.
    slots: Vec<Option<Slot>>,
    live: usize,
}

struct Slot {
    request: HashedRequest,
    joined: Instant,
    reply: oneshot::Sender<Placement>,
}

/// A sealed window, out of the lock, ready to plan.
struct Sealed {
    id: u64,
    snapshot: Arc<Snapshot>,
    slots: Vec<Slot>,
}

impl Window {
    pub fn new(store: Arc<ConfigStore>, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Window {
            state: Mutex::new(State::default()),
            store,
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock; recover rather than cascade if it ever did.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// True once [`Window::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The open window's id and live request count, if one is open.
    pub fn open_requests(&self) -> Option<(u64, usize)> {
        self.lock().open.as_ref().map(|open| (open.id, open.live))
    }

    /// Hashes a request under the config of the window it will join (`hash` runs outside the
    /// lock) and joins. If the config's block layout changes in between, hashes again.
    pub fn join(
        self: &Arc<Self>,
        hash: impl Fn(&PlannerConfig) -> HashedRequest,
    ) -> Result<Ticket, JoinError> {
        let mut snapshot = self.joining_snapshot()?;
        loop {
            let request = hash(&snapshot.config.planner);
            match self.try_join(request, snapshot.config.planner.block_spec())? {
                Ok(ticket) => return Ok(ticket),
                Err(newer) => snapshot = newer,
            }
        }
    }

    /// The config a request arriving now would be planned with.
    fn joining_snapshot(&self) -> Result<Arc<Snapshot>, JoinError> {
        if let Some(open) = self.lock().open.as_ref() {
            return Ok(open.snapshot.clone());
        }
        self.store.current().ok_or(JoinError::NoEndpoints)
    }

    /// Joins, or hands back the snapshot to hash under when `spec` is not the window's.
    #[allow(clippy::type_complexity)]
    fn try_join(
        self: &Arc<Self>,
        request: HashedRequest,
        spec: BlockSpec,
    ) -> Result<Result<Ticket, Arc<Snapshot>>, JoinError> {
        let now = Instant::now();
        let mut state = self.lock();
        if state.closed {
            return Err(JoinError::ShuttingDown);
        }
        if state.open.is_none() {
            let snapshot = self.store.current().ok_or(JoinError::NoEndpoints)?;
            if snapshot.config.endpoints.is_empty() {
                return Err(JoinError::NoEndpoints);
            }
            if snapshot.config.planner.block_spec() != spec {
                return Ok(Err(snapshot));
            }
            state.last_id += 1;
            let id = state.last_id;
            let duration = Duration::from_millis(
                u64::try_from(snapshot.config.planner.window_duration_ms).unwrap_or(1),
            );
            let deadline = now + duration;
            state.open = Some(Open {
                id,
                deadline,
                snapshot,
                slots: Vec::new(),
                live: 0,
            });
            let window = self.clone();
            tokio::spawn(async move {
                // tokio's timer has millisecond granularity and fires late, never early: wake
                // a little before the deadline, and sleep the rest precisely while sealing.
                let early = deadline.checked_sub(TIMER_SLACK).unwrap_or(deadline);
                tokio::time::sleep_until(early.into()).await;
                window.seal(Some((id, deadline))).await;
            });
        }
        let open = state.open.as_mut().expect("a window is open here");
        if open.snapshot.config.planner.block_spec() != spec {
            return Ok(Err(open.snapshot.clone()));
        }
        if let Some(limit) = open.snapshot.config.planner.max_batch_size() {
            if open.live >= limit {
                return Err(JoinError::BatchFull {
                    limit,
                    retry_after: open.deadline.saturating_duration_since(now),
                });
            }
        }
        let (reply, receiver) = oneshot::channel();
        let index = open.slots.len();
        open.slots.push(Some(Slot {
            request,
            joined: now,
            reply,
        }));
        open.live += 1;
        self.metrics.window_open_requests.set(open.live as i64);
        Ok(Ok(Ticket {
            window: self.clone(),
            window_id: open.id,
            index,
            receiver: Some(receiver),
        }))
    }

    /// Takes a waiter out of its window, if that window is still open.
    fn cancel(&self, window_id: u64, index: usize) {
        let mut state = self.lock();
        let Some(open) = state.open.as_mut().filter(|open| open.id == window_id) else {
            return; // Already sealed: it is being planned.
        };
        if open.slots.get_mut(index).and_then(Option::take).is_some() {
            open.live -= 1;
            self.metrics.window_open_requests.set(open.live as i64);
            drop(state);
            self.metrics.request(Outcome::Cancelled);
            tracing::debug!(
                window = window_id,
                "client went away; removed from the window"
            );
        }
    }

    /// Seals the open window, plans it and releases its waiters. With `(id, deadline)`: only
    /// window `id`, and not before `deadline`.
    async fn seal(self: &Arc<Self>, timer: Option<(u64, Instant)>) {
        let window = self.clone();
        // Planning is CPU work: keep it off the async workers that accept requests. The waiters
        // are released from here, a worker, so that their wake-ups stay on the runtime.
        let planned = tokio::task::spawn_blocking(move || {
            if let Some((_, deadline)) = timer {
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
            }
            window.take(timer.map(|(id, _)| id)).and_then(plan)
        });
        match planned.await {
            Ok(Some(planned)) => release(planned, &self.metrics),
            Ok(None) => {}
            // The waiters' senders were dropped with the task: they answer 500, never hang.
            Err(error) => tracing::error!(%error, "planning a window failed"),
        }
    }

    /// Takes the open window (only window `id`, when given) out of the state: sealed.
    fn take(&self, id: Option<u64>) -> Option<Sealed> {
        let mut state = self.lock();
        if id.is_some() && state.open.as_ref().map(|open| open.id) != id {
            return None;
        }
        let open = state.open.take()?;
        self.metrics.window_open_requests.set(0);
        Some(Sealed {
            id: open.id,
            snapshot: open.snapshot,
            slots: open.slots.into_iter().flatten().collect(),
        })
    }

    /// Refuses new requests from now on, and seals, plans and answers the open window.
    pub async fn close(self: &Arc<Self>) {
        self.lock().closed = true;
        self.seal(None).await;
    }
}

/// A planned window, not yet released.
struct Planned {
    id: u64,
    snapshot: Arc<Snapshot>,
    requests: Vec<HashedRequest>,
    waiters: Vec<(Instant, oneshot::Sender<Placement>)>,
    plan: Plan,
    plan_seconds: f64,
}

/// Plans a sealed window (`None` when all its requests went away).
fn plan(sealed: Sealed) -> Option<Planned> {
    if sealed.slots.is_empty() {
        tracing::debug!(
            window = sealed.id,
            "every request of the window went away; nothing to plan"
        );
        return None;
    }
    let started = Instant::now();
    let (requests, waiters): (Vec<HashedRequest>, Vec<_>) = sealed
        .slots
        .into_iter()
        .map(|slot| (slot.request, (slot.joined, slot.reply)))
        .unzip();
    let config = &sealed.snapshot.config;
    let replicas: Vec<Replica<'_>> = config
        .endpoints
        .iter()
        .map(|endpoint| Replica {
            id: &endpoint.id,
            running_requests: endpoint.running_requests.unwrap_or(0),
        })
        .collect();
    let plan = plan_batch(&config.planner.plan_params(), &replicas, &requests);
    Some(Planned {
        id: sealed.id,
        plan_seconds: started.elapsed().as_secs_f64(),
        snapshot: sealed.snapshot,
        requests,
        waiters,
        plan,
    })
}

/// Releases every waiter of a planned window at once.
fn release(planned: Planned, metrics: &Metrics) {
    let size = planned.requests.len();
    let released = Instant::now();
    let (mut assigned, mut no_affinity, mut cancelled) = (0, 0, 0);
    let members = planned.requests.iter().zip(planned.waiters);
    for ((request, (joined, reply)), replica) in members.zip(&planned.plan.assignments) {
        let waited = released.saturating_duration_since(joined);
        let placement = Placement {
            assigned: *replica,
            total_blocks: request.blocks.len(),
            window_id: planned.id,
            window_size: size,
            waited,
            snapshot: planned.snapshot.clone(),
        };
        metrics.request_wait_seconds.observe(waited.as_secs_f64());
        if reply.send(placement).is_err() {
            cancelled += 1; // Went away after the seal: it was planned, but nobody listens.
        } else if replica.is_some() {
            assigned += 1;
        } else {
            no_affinity += 1;
        }
    }
    metrics.requests(Outcome::Assigned, assigned);
    metrics.requests(Outcome::NoAffinity, no_affinity);
    metrics.requests(Outcome::Cancelled, cancelled);
    metrics.window_size.observe(size as f64);
    metrics.window_plan_seconds.observe(planned.plan_seconds);
    let plan = &planned.plan;
    metrics.units(plan.group_units as u64, plan.single_units as u64);
    tracing::debug!(
        window = planned.id,
        size,
        assigned,
        no_affinity,
        groups = plan.group_units,
        singles = plan.single_units,
        plan_ms = planned.plan_seconds * 1e3,
        generation = planned.snapshot.generation,
        "window planned"
    );
}

/// A request's place in the open window. Dropping it before the window is sealed (the client
/// went away, so axum dropped the handler) takes the request out of the batch.
pub struct Ticket {
    window: Arc<Window>,
    window_id: u64,
    index: usize,
    receiver: Option<oneshot::Receiver<Placement>>,
}

impl Ticket {
    pub fn window_id(&self) -> u64 {
        self.window_id
    }

    /// Waits for the window to be planned.
    pub async fn placement(mut self) -> Result<Placement, Abandoned> {
        let receiver = self.receiver.as_mut().expect("awaited once");
        let result = receiver.await.map_err(|_| Abandoned);
        self.receiver = None; // Answered (or lost): nothing left to cancel.
        result
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.receiver.is_some() {
            self.window.cancel(self.window_id, self.index);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::ConfigSource;
    use crate::request::InferenceRequest;
    use burst_prefix_api::ProducerConfig;

    fn window(yaml: &str) -> (Arc<Window>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(ConfigSource::Demo, metrics.clone()));
        store
            .apply(ProducerConfig::from_yaml(yaml).unwrap())
            .unwrap();
        (Window::new(store, metrics.clone()), metrics)
    }

    fn hasher(prompt: &str) -> impl Fn(&PlannerConfig) -> HashedRequest + '_ {
        move |config| {
            let body = serde_json::json!({"model": "m", "prompt": prompt});
            HashedRequest::new(&InferenceRequest::from_value(&body).unwrap(), config)
        }
    }

    const TWO: &str = "windowDurationMs: 20\nendpoints:\n  - {id: a, address: '1.1.1.1:1'}\n  - {id: b, address: '1.1.1.2:1'}\n";

    #[tokio::test]
    async fn a_window_plans_its_requests_together() {
        let (window, _) = window(TWO);
        let tickets: Vec<Ticket> = (0..3)
            .map(|_| window.join(hasher("same")).unwrap())
            .collect();
        let lone = window.join(hasher("other")).unwrap();
        assert_eq!(window.open_requests(), Some((1, 4)));
        let mut placements = Vec::new();
        for ticket in tickets {
            placements.push(ticket.placement().await.unwrap());
        }
        let lone = lone.placement().await.unwrap();
        assert!(placements
            .iter()
            .all(|p| p.assigned == placements[0].assigned));
        assert!(placements[0].assigned.is_some());
        assert_eq!(lone.assigned, None);
        assert_eq!(lone.window_size, 4);
        assert_eq!(window.open_requests(), None);
        // The next request opens the next window.
        let next = window.join(hasher("same")).unwrap();
        assert_eq!(next.window_id(), 2);
    }

    #[tokio::test]
    async fn a_dropped_ticket_leaves_the_window() {
        let (window, metrics) = window(TWO);
        let kept = window.join(hasher("x")).unwrap();
        drop(window.join(hasher("x")).unwrap());
        assert_eq!(window.open_requests(), Some((1, 1)));
        assert_eq!(kept.placement().await.unwrap().window_size, 1);
        assert!(metrics
            .render()
            .contains("burst_prefix_requests_total{outcome=\"cancelled\"} 1"));
    }

    #[tokio::test]
    async fn a_full_window_refuses_and_no_endpoints_is_refused() {
        let (window, _) = window(&format!("maxBatchSize: 1\n{TWO}"));
        let _first = window.join(hasher("x")).unwrap();
        match window.join(hasher("y")) {
            Err(JoinError::BatchFull { limit: 1, .. }) => {}
            other => panic!("expected batch_full, got {:?}", other.err()),
        }
        let (empty, _) = self::window("endpoints: []\n");
        assert_eq!(empty.join(hasher("x")).err(), Some(JoinError::NoEndpoints));
    }

    #[tokio::test]
    async fn close_answers_the_open_window_and_refuses_more() {
        let (window, _) = window(&TWO.replace("20", "10000"));
        let ticket = window.join(hasher("x")).unwrap();
        window.close().await;
        assert_eq!(ticket.placement().await.unwrap().window_size, 1);
        assert_eq!(
            window.join(hasher("x")).err(),
            Some(JoinError::ShuttingDown)
        );
    }

    #[tokio::test]
    async fn a_block_size_change_rehashes_into_the_new_window() {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(ConfigSource::Demo, metrics.clone()));
        store.apply_text(TWO).unwrap();
        let window = Window::new(store.clone(), metrics);
        let first = window.join(hasher("0123456789abcdef")).unwrap();
        store
            .apply_text(&format!("blockSizeTokens: 1\n{TWO}"))
            .unwrap();
        // Joins the open window: hashed under its config (64-token blocks: one block).
        let second = window.join(hasher("0123456789abcdef")).unwrap();
        assert_eq!(second.placement().await.unwrap().total_blocks, 1);
        first.placement().await.unwrap();
        // The next window uses the new config: 16 bytes are 4 estimate tokens, 4 blocks.
        let third = window.join(hasher("0123456789abcdef")).unwrap();
        let third = third.placement().await.unwrap();
        assert_eq!(third.total_blocks, 4);
        assert_eq!(third.snapshot.generation, 2);
    }
}
