//! The window (docs/behaviour.md §3): requests that arrive close together are planned together.
//!
//! - The first request into an empty window opens it, snapshots the config in force, and arms a
//!   one-shot timer of `windowDurationMs` (fixed from that first request, not sliding): the
//!   upper bound of every request's wait.
//! - A window seals earlier when it can: when every group a client hinted the size of
//!   (`group_size`) is complete (`hints`), when no request arrived for `idleSealMs` (`idle`, off
//!   by default), or when it holds `maxBatchSize` requests (`full`). Sealing takes the window out
//!   under the lock, so the next request opens a new one.
//! - A sealed window is planned on a blocking thread and every waiter is released at once
//!   through its oneshot channel. Windows are planned one at a time. The timer wakes
//!   that thread shortly before the deadline and it sleeps the rest precisely: tokio's own timer
//!   fires up to a millisecond late.
//! - When windows are sealed faster than they are planned (more than [`MAX_SEALED`] waiting), a
//!   full window stays open and refuses further requests with `batch_full`: backpressure instead
//!   of an unbounded queue.
//! - A waiter whose client goes away drops its [`Ticket`], which takes its slot out of the
//!   window if it is still open: cancelled requests are never planned.
//!
//! The lock is held only to push, remove or take slots; hashing happens before joining and
//! planning after sealing, both outside it.

pub mod seal;

use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::budget::{ByteBudget, Reserved};
use super::config_store::{ConfigStore, Snapshot};
use super::error::PlaceError;
use super::live::LiveEndpoints;
use super::metrics::{Metrics, Outcome};
use super::placement::{Placement, RequestHeld};
use super::planning::{Planner, WindowPlan};
use super::request::HashedRequest;
pub use seal::SealReason;
use seal::{GroupKey, HintedGroups};

/// How long before a window's deadline the (millisecond-granular) tokio timer wakes; the rest
/// is slept precisely on the planning thread.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// Windows sealed but not yet released beyond which a full window is not sealed early.
const MAX_SEALED: usize = 2;

/// The planning of a request's window was lost (the planner panicked); logged where it happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Abandoned;

pub struct Window {
    state: Mutex<State>,
    /// Held while a window is planned: windows are planned one at a time, each with the
    /// policy's memory of the earlier ones.
    planning: Arc<Mutex<Planner>>,
    store: Arc<ConfigStore>,
    live: Arc<LiveEndpoints>,
    metrics: Arc<Metrics>,
    /// What requests hold before they are placed: the open window's hashes, and what callers
    /// keep for their requests (a proxy, the body).
    budget: Arc<ByteBudget>,
}

#[derive(Default)]
struct State {
    open: Option<Open>,
    last_id: u64,
    /// Windows sealed and not yet released.
    sealed: usize,
    closed: bool,
}

struct Open {
    id: u64,
    deadline: Instant,
    snapshot: Arc<Snapshot>,
    /// Arrival order; a cancelled request leaves `None`.
    slots: Vec<Option<Slot>>,
    live: usize,
    last_arrival: Instant,
    /// Its groups of identical prompts, as far as clients hinted their sizes.
    groups: HintedGroups,
}

struct Slot {
    request: HashedRequest,
    /// Its bytes in the budget (hashes, and what its caller keeps), given back once answered.
    reserved: Reserved,
    group: Option<GroupKey>,
    joined: Instant,
    reply: oneshot::Sender<Placement>,
}

impl Open {
    /// Why this window should be sealed now, if it should.
    fn seal_now(&self, sealed_elsewhere: usize) -> Option<SealReason> {
        let settings = &self.snapshot.settings;
        if settings
            .max_batch_size
            .is_some_and(|limit| self.live >= limit)
            && sealed_elsewhere < MAX_SEALED
        {
            return Some(SealReason::Full);
        }
        if settings.seal_on_hints && self.groups.all_complete() {
            return Some(SealReason::Hints);
        }
        None
    }
}

/// A sealed window, out of the lock, ready to plan.
struct Sealed {
    id: u64,
    reason: SealReason,
    snapshot: Arc<Snapshot>,
    slots: Vec<Slot>,
}

impl Window {
    pub fn new(
        store: Arc<ConfigStore>,
        live: Arc<LiveEndpoints>,
        metrics: Arc<Metrics>,
        budget: Arc<ByteBudget>,
        planning: Arc<Mutex<Planner>>,
    ) -> Arc<Self> {
        Arc::new(Window {
            state: Mutex::new(State::default()),
            planning,
            store,
            live,
            metrics,
            budget,
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

    /// Makes a request under the config of the window it will join (`make` runs outside the
    /// lock: it hashes) and joins. If the config changes in between, makes it again. `held` is
    /// what the caller keeps for the request while it waits (a proxy, its body): with the
    /// request's hashes it stays in the budget until the request is answered.
    pub fn join(
        self: &Arc<Self>,
        group_size: Option<NonZeroU32>,
        held: Reserved,
        make: impl Fn(&Snapshot) -> Result<HashedRequest, PlaceError>,
    ) -> Result<Ticket, PlaceError> {
        let mut snapshot = self.joining_snapshot()?;
        let mut held = Some(held);
        loop {
            let request = make(&snapshot)?;
            match self.try_join(request, &mut held, group_size, snapshot.generation)? {
                Ok(ticket) => return Ok(ticket),
                Err(newer) => snapshot = newer,
            }
        }
    }

    /// The config a request arriving now would be planned with.
    fn joining_snapshot(&self) -> Result<Arc<Snapshot>, PlaceError> {
        if let Some(open) = self.lock().open.as_ref() {
            return Ok(open.snapshot.clone());
        }
        self.store.current().ok_or(PlaceError::NoEndpoints)
    }

    /// Joins, or hands back the snapshot to make the request under when it was made under
    /// another generation than the window's.
    #[allow(clippy::type_complexity)]
    fn try_join(
        self: &Arc<Self>,
        request: HashedRequest,
        held: &mut Option<Reserved>,
        group_size: Option<NonZeroU32>,
        generation: u64,
    ) -> Result<Result<Ticket, Arc<Snapshot>>, PlaceError> {
        let now = Instant::now();
        let mut state = self.lock();
        if state.closed {
            return Err(PlaceError::ShuttingDown);
        }
        if state.open.is_none() {
            let snapshot = self.store.current().ok_or(PlaceError::NoEndpoints)?;
            if snapshot.config.endpoints.is_empty() {
                return Err(PlaceError::NoEndpoints);
            }
            if snapshot.generation != generation {
                return Ok(Err(snapshot));
            }
            state.last_id += 1;
            self.open(&mut state, snapshot, now);
        }
        let sealed_elsewhere = state.sealed;
        let open = state.open.as_mut().expect("a window is open here");
        if open.snapshot.generation != generation {
            return Ok(Err(open.snapshot.clone()));
        }
        let retry_after = open.deadline.saturating_duration_since(now);
        if let Some(limit) = open.snapshot.settings.max_batch_size {
            if open.live >= limit {
                return Err(PlaceError::BatchFull { limit, retry_after });
            }
        }
        let mut reserved = held.take().expect("joined once");
        if !reserved.grow(request.held_bytes()) {
            return Err(PlaceError::WindowFull {
                limit: self.budget.limit(),
                retry_after,
            });
        }
        let group = (!request.blocks.is_empty()).then(|| {
            (
                request.blocks.len(),
                *request.blocks.last().expect("not empty"),
            )
        });
        if let Some(key) = group {
            open.groups.count(key, group_size, 1);
        }
        let (reply, receiver) = oneshot::channel();
        let index = open.slots.len();
        open.slots.push(Some(Slot {
            request,
            reserved,
            group,
            joined: now,
            reply,
        }));
        open.live += 1;
        open.last_arrival = now;
        self.metrics.window_open_requests.set(open.live as i64);
        let ticket = Ticket {
            window: self.clone(),
            window_id: open.id,
            index,
            receiver: Some(receiver),
        };
        if let Some(reason) = open.seal_now(sealed_elsewhere) {
            let sealed = self.take_locked(&mut state, reason);
            drop(state);
            self.plan_in_background(sealed);
        }
        Ok(Ok(ticket))
    }

    /// Opens window `state.last_id` and arms its timers.
    fn open(self: &Arc<Self>, state: &mut State, snapshot: Arc<Snapshot>, now: Instant) {
        let id = state.last_id;
        let settings = snapshot.settings;
        let deadline = now + settings.window;
        state.open = Some(Open {
            id,
            deadline,
            snapshot,
            slots: Vec::new(),
            live: 0,
            last_arrival: now,
            groups: HintedGroups::default(),
        });
        let window = self.clone();
        tokio::spawn(async move {
            // tokio's timer has millisecond granularity and fires late, never early: wake a
            // little before the deadline, and sleep the rest precisely while sealing.
            let early = deadline.checked_sub(TIMER_SLACK).unwrap_or(deadline);
            tokio::time::sleep_until(early.into()).await;
            let precise = window.clone();
            let sealed = tokio::task::spawn_blocking(move || {
                std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                precise.take(id, SealReason::Timer)
            })
            .await;
            if let Ok(Some(sealed)) = sealed {
                window.plan_and_release(sealed).await;
            }
        });
        if let Some(idle) = settings.idle_seal {
            let window = self.clone();
            tokio::spawn(async move { window.seal_when_idle(id, idle).await });
        }
    }

    /// Seals window `id` once no request arrived for `idle` (and it is still open).
    async fn seal_when_idle(self: Arc<Self>, id: u64, idle: Duration) {
        loop {
            let last_arrival = {
                let state = self.lock();
                match state.open.as_ref() {
                    Some(open) if open.id == id => open.last_arrival,
                    _ => return,
                }
            };
            tokio::time::sleep_until((last_arrival + idle).into()).await;
            let sealed = {
                let mut state = self.lock();
                match state.open.as_ref() {
                    Some(open) if open.id == id && open.last_arrival == last_arrival => {
                        self.take_locked(&mut state, SealReason::Idle)
                    }
                    Some(open) if open.id == id => continue,
                    _ => return,
                }
            };
            self.plan_in_background(sealed);
            return;
        }
    }

    /// Takes a waiter out of its window, if that window is still open.
    fn cancel(&self, window_id: u64, index: usize) {
        let mut state = self.lock();
        let Some(open) = state.open.as_mut().filter(|open| open.id == window_id) else {
            return; // Already sealed: it is being planned.
        };
        let Some(slot) = open.slots.get_mut(index).and_then(Option::take) else {
            return;
        };
        open.live -= 1;
        if let Some(key) = slot.group {
            open.groups.count(key, None, -1);
        }
        self.metrics.window_open_requests.set(open.live as i64);
        drop(state);
        self.metrics.request(Outcome::Cancelled);
        tracing::debug!(
            window = window_id,
            "client went away; removed from the window"
        );
    }

    /// Takes window `id` out of the state, if it is still the open one.
    fn take(&self, id: u64, reason: SealReason) -> Option<Sealed> {
        let mut state = self.lock();
        if state.open.as_ref().map(|open| open.id) != Some(id) {
            return None;
        }
        self.take_locked(&mut state, reason)
    }

    fn take_locked(&self, state: &mut State, reason: SealReason) -> Option<Sealed> {
        let open = state.open.take()?;
        state.sealed += 1;
        self.metrics.window_open_requests.set(0);
        self.metrics.window_sealed(reason);
        Some(Sealed {
            id: open.id,
            reason,
            snapshot: open.snapshot,
            slots: open.slots.into_iter().flatten().collect(),
        })
    }

    /// Plans a sealed window and releases its waiters, in a task of its own.
    fn plan_in_background(self: &Arc<Self>, sealed: Option<Sealed>) {
        let Some(sealed) = sealed else { return };
        let window = self.clone();
        tokio::spawn(async move { window.plan_and_release(sealed).await });
    }

    /// Plans a sealed window off the async workers (planning is CPU work; windows are planned
    /// one at a time), releases its waiters, then merges the window into the planner's memory
    /// (also off the async workers; the next window's planning does it if it gets there first).
    async fn plan_and_release(self: Arc<Self>, sealed: Sealed) {
        let window = self.clone();
        let planned = tokio::task::spawn_blocking(move || window.plan(sealed));
        let result = planned.await;
        self.lock().sealed -= 1;
        match result {
            // The waiters are released from a worker, so that their wake-ups stay on the runtime.
            Ok(Some(planned)) => release(planned, &self.metrics),
            Ok(None) => {}
            // The waiters' senders were dropped with the task: they get `Abandoned`, never hang.
            Err(error) => tracing::error!(%error, "planning a window failed"),
        }
        let window = self.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || window.planning().settle()).await {
            tracing::error!(%error, "merging a window into the planner's memory failed");
        }
    }

    /// Plans a sealed window (`None` when all its requests went away).
    fn plan(&self, sealed: Sealed) -> Option<Planned> {
        if sealed.slots.is_empty() {
            tracing::debug!(
                window = sealed.id,
                "every request of the window went away; nothing to plan"
            );
            return None;
        }
        let (requests, waiters): (Vec<HashedRequest>, Vec<_>) = sealed
            .slots
            .into_iter()
            .map(|slot| (slot.request, (slot.joined, slot.reply, slot.reserved)))
            .unzip();
        let plan = self
            .planning()
            .plan_window(&sealed.snapshot, &requests, &self.live);
        Some(Planned {
            id: sealed.id,
            reason: sealed.reason,
            snapshot: sealed.snapshot,
            requests,
            waiters,
            plan,
        })
    }

    /// The planner, for one window's planning or merge at a time.
    fn planning(&self) -> std::sync::MutexGuard<'_, Planner> {
        self.planning
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Refuses new requests from now on, and seals, plans and answers the open window.
    pub async fn close(self: &Arc<Self>) {
        let sealed = {
            let mut state = self.lock();
            state.closed = true;
            self.take_locked(&mut state, SealReason::Shutdown)
        };
        if let Some(sealed) = sealed {
            self.clone().plan_and_release(sealed).await;
        }
    }
}

/// A planned window, not yet released.
struct Planned {
    id: u64,
    reason: SealReason,
    snapshot: Arc<Snapshot>,
    requests: Vec<HashedRequest>,
    /// When each joined, where its answer goes, and its bytes in the budget (given back once
    /// it is answered).
    waiters: Vec<(Instant, oneshot::Sender<Placement>, Reserved)>,
    plan: WindowPlan,
}

/// Releases every waiter of a planned window at once.
fn release(planned: Planned, metrics: &Metrics) {
    let size = planned.requests.len();
    let released = Instant::now();
    let (mut assigned, mut no_affinity, mut cancelled) = (0, 0, 0);
    let members = planned.requests.into_iter().zip(planned.waiters);
    for (index, ((request, (joined, reply, _reserved)), replica)) in
        members.zip(&planned.plan.plan.assignments).enumerate()
    {
        let waited = released.saturating_duration_since(joined);
        let placement = Placement {
            assigned: *replica,
            total_blocks: request.blocks.len(),
            group: request.blocks.last().copied().unwrap_or(0),
            endpoints: request.endpoints,
            window_id: planned.id,
            window_size: size,
            waited,
            sealed_by: planned.reason,
            snapshot: planned.snapshot.clone(),
            memory: RequestHeld::new(&planned.plan.held, index),
            arrival: None,
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
    metrics.window_plan_seconds.observe(planned.plan.seconds);
    let plan = &planned.plan.plan;
    metrics.units(plan.group_units as u64, plan.single_units as u64);
    tracing::debug!(
        window = planned.id,
        sealed_by = planned.reason.label(),
        size,
        assigned,
        no_affinity,
        groups = plan.group_units,
        singles = plan.single_units,
        plan_ms = planned.plan.seconds * 1e3,
        generation = planned.snapshot.generation,
        "window planned"
    );
}

/// A request's place in the open window. Dropping it before the window is sealed (the client
/// went away, so the front-end dropped its future) takes the request out of the batch.
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
    use crate::config_store::ConfigOrigin;
    use crate::request::InferenceRequest;

    fn planner() -> Arc<Mutex<Planner>> {
        let registry = prometheus::Registry::new();
        let engines = Arc::new(crate::engines::Engines::new(&registry));
        Arc::new(Mutex::new(Planner::new(&registry, engines)))
    }

    fn window(yaml: &str) -> (Arc<Window>, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(ConfigOrigin::Demo, metrics.clone()));
        store.apply_text(yaml).unwrap();
        let window = Window::new(
            store,
            Arc::default(),
            metrics.clone(),
            ByteBudget::new(usize::MAX),
            planner(),
        );
        (window, metrics)
    }

    fn hasher(prompt: &str) -> impl Fn(&Snapshot) -> Result<HashedRequest, PlaceError> + '_ {
        move |snapshot| {
            let body = serde_json::json!({"model": "m", "prompt": prompt}).to_string();
            let request = InferenceRequest::parse(body.as_bytes()).unwrap();
            Ok(HashedRequest::new(&request, snapshot.settings.block_spec))
        }
    }

    /// What a caller holds for its request: `bytes` of the window's budget, as many as fit.
    fn held(window: &Window, bytes: usize) -> Reserved {
        let mut held = window.budget.empty();
        held.grow(bytes);
        held
    }

    fn join(window: &Arc<Window>, prompt: &str) -> Ticket {
        window.join(None, held(window, 0), hasher(prompt)).unwrap()
    }

    fn hinted(window: &Arc<Window>, prompt: &str, size: u32) -> Ticket {
        window
            .join(NonZeroU32::new(size), held(window, 0), hasher(prompt))
            .unwrap()
    }

    const TWO: &str = "windowDurationMs: 20\nendpoints:\n  - {id: a, address: '1.1.1.1:1'}\n  - {id: b, address: '1.1.1.2:1'}\n";

    #[tokio::test]
    async fn a_window_plans_its_requests_together() {
        let (window, _) = window(TWO);
        let tickets: Vec<Ticket> = (0..3).map(|_| join(&window, "same")).collect();
        let lone = join(&window, "other");
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
        assert_eq!(lone.sealed_by, SealReason::Timer);
        assert_eq!(window.open_requests(), None);
        // The next request opens the next window.
        assert_eq!(join(&window, "same").window_id(), 2);
    }

    #[tokio::test]
    async fn a_dropped_ticket_leaves_the_window() {
        let (window, metrics) = window(TWO);
        let kept = join(&window, "x");
        drop(join(&window, "x"));
        assert_eq!(window.open_requests(), Some((1, 1)));
        assert_eq!(kept.placement().await.unwrap().window_size, 1);
        assert!(metrics
            .render()
            .contains("burst_prefix_requests_total{outcome=\"cancelled\"} 1"));
    }

    #[tokio::test]
    async fn a_full_window_seals_at_once_and_no_endpoints_is_refused() {
        let (window, metrics) = window(&format!("maxBatchSize: 2\n{}", TWO.replace("20", "10000")));
        let first = join(&window, "x");
        let second = join(&window, "y");
        // Sealed by the second: the third opens the next window.
        let third = join(&window, "z");
        assert_eq!(third.window_id(), 2);
        let placement = first.placement().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (2, SealReason::Full)
        );
        second.placement().await.unwrap();
        assert!(metrics
            .render()
            .contains("burst_prefix_windows_sealed_total{reason=\"full\"} 1"));
        let (empty, _) = self::window("endpoints: []\n");
        assert_eq!(
            empty.join(None, held(&empty, 0), hasher("x")).err(),
            Some(PlaceError::NoEndpoints)
        );
    }

    #[tokio::test]
    async fn full_windows_stay_open_and_refuse_while_planning_lags() {
        let (window, _) = window(&format!("maxBatchSize: 1\n{}", TWO.replace("20", "10000")));
        // Planning is stuck: two windows sealed by `full` wait for it.
        let stuck = window.planning.lock().unwrap();
        let first = join(&window, "x");
        let second = join(&window, "y");
        assert_eq!(second.window_id(), 2);
        let third = join(&window, "z");
        assert_eq!(window.open_requests(), Some((3, 1)), "full, but not sealed");
        match window.join(None, held(&window, 0), hasher("w")) {
            Err(PlaceError::BatchFull { limit: 1, .. }) => {}
            other => panic!("expected batch_full, got {:?}", other.err()),
        }
        drop(stuck);
        for ticket in [first, second] {
            assert_eq!(
                ticket.placement().await.unwrap().sealed_by,
                SealReason::Full
            );
        }
        window.close().await;
        assert_eq!(third.placement().await.unwrap().window_id, 3);
    }

    #[tokio::test]
    async fn the_byte_budget_refuses_beyond_it_but_always_takes_one() {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(ConfigOrigin::Demo, metrics.clone()));
        store.apply_text(&TWO.replace("20", "10000")).unwrap();
        let window = Window::new(
            store,
            Arc::default(),
            metrics,
            ByteBudget::new(1000),
            planner(),
        );
        let big = window.join(None, held(&window, 5000), hasher("x")).unwrap();
        let refused = window.join(None, held(&window, 10), hasher("y"));
        assert!(
            matches!(refused, Err(PlaceError::WindowFull { limit: 1000, .. })),
            "{:?}",
            refused.err()
        );
        drop(big);
        let small = window.join(None, held(&window, 100), hasher("y")).unwrap();
        assert!(window.join(None, held(&window, 100), hasher("z")).is_ok());
        drop(small);
    }

    #[tokio::test]
    async fn hinted_groups_seal_the_window_when_complete() {
        let (window, _) = window(&TWO.replace("20", "10000"));
        let lone = join(&window, "lone, unhinted");
        let a: Vec<Ticket> = (0..2).map(|_| hinted(&window, "a", 3)).collect();
        let b: Vec<Ticket> = (0..2).map(|_| hinted(&window, "b", 2)).collect();
        // Group a misses one member; a member that comes without a hint still counts.
        assert_eq!(window.open_requests(), Some((1, 5)));
        let last = join(&window, "a");
        let placement = last.placement().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (6, SealReason::Hints)
        );
        for ticket in a.into_iter().chain(b) {
            assert_eq!(ticket.placement().await.unwrap().window_id, 1);
        }
        assert_eq!(lone.placement().await.unwrap().window_id, 1);
    }

    #[tokio::test]
    async fn a_member_that_leaves_counts_out_of_its_group() {
        let (window, _) = window(&TWO.replace("20", "10000"));
        let first = hinted(&window, "a", 3);
        drop(hinted(&window, "a", 3));
        let third = hinted(&window, "a", 3);
        // Two of three are here: still open.
        assert_eq!(window.open_requests(), Some((1, 2)));
        let fourth = hinted(&window, "a", 3);
        let placement = fourth.placement().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (3, SealReason::Hints)
        );
        first.placement().await.unwrap();
        third.placement().await.unwrap();
    }

    #[tokio::test]
    async fn idle_windows_seal_early() {
        let (window, _) = window(&format!("idleSealMs: 20\n{}", TWO.replace("20", "10000")));
        let first = join(&window, "x");
        let second = join(&window, "x");
        let placement = first.placement().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (2, SealReason::Idle)
        );
        second.placement().await.unwrap();
    }

    #[tokio::test]
    async fn hints_are_ignored_when_the_policy_says_so() {
        let (window, _) = window(&format!("sealOnHints: false\n{}", TWO.replace("20", "200")));
        let ticket = hinted(&window, "a", 1);
        assert_eq!(
            ticket.placement().await.unwrap().sealed_by,
            SealReason::Timer
        );
    }

    #[tokio::test]
    async fn close_answers_the_open_window_and_refuses_more() {
        let (window, _) = window(&TWO.replace("20", "10000"));
        let ticket = join(&window, "x");
        window.close().await;
        let placement = ticket.placement().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (1, SealReason::Shutdown)
        );
        assert_eq!(
            window.join(None, held(&window, 0), hasher("x")).err(),
            Some(PlaceError::ShuttingDown)
        );
    }

    #[tokio::test]
    async fn a_config_change_rehashes_into_the_new_window() {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(ConfigOrigin::Demo, metrics.clone()));
        store.apply_text(TWO).unwrap();
        let window = Window::new(
            store.clone(),
            Arc::default(),
            metrics,
            ByteBudget::new(usize::MAX),
            planner(),
        );
        let first = join(&window, "0123456789abcdef");
        store
            .apply_text(&format!("blockSizeTokens: 1\n{TWO}"))
            .unwrap();
        // Joins the open window: hashed under its config (64-token blocks: one block).
        let second = join(&window, "0123456789abcdef");
        assert_eq!(second.placement().await.unwrap().total_blocks, 1);
        first.placement().await.unwrap();
        // The next window uses the new config: 16 bytes are 4 estimate tokens, 4 blocks.
        let third = join(&window, "0123456789abcdef").placement().await.unwrap();
        assert_eq!(third.total_blocks, 4);
        assert_eq!(third.snapshot.generation, 2);
    }
}
