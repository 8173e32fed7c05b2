//! The window placer (docs/behaviour.md §3): requests that arrive close together are planned
//! together.
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
//! - A request hashed under another config than the open window's is handed back to be hashed
//!   again under the window's ([`NotPlaced::Stale`]).
//!
//! The lock is held only to push, remove or take slots; hashing happens before joining and
//! planning after sealing, both outside it. Its metrics (`burst_prefix_window_*`,
//! `burst_prefix_windows_sealed_total`, `burst_prefix_units_total`) are registered here.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use burst_prefix_planner::Plan;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, Opts, Registry};
use tokio::sync::oneshot;

use super::memory::{self, SharedModels};
use super::seal::{GroupKey, HintedGroups};
use super::{Decision, NotPlaced, Placer, RequestHeld, SealReason, ToPlace, WindowHeld};
use crate::budget::{ByteBudget, Reserved};
use crate::config_store::{ConfigStore, Snapshot};
use crate::error::PlaceError;
use crate::live::LiveEndpoints;
use crate::read::HashedRequest;

/// How long before a window's deadline the (millisecond-granular) tokio timer wakes; the rest
/// is slept precisely on the planning thread.
const TIMER_SLACK: Duration = Duration::from_millis(2);

/// Windows sealed but not yet released beyond which a full window is not sealed early.
const MAX_SEALED: usize = 2;

pub struct Window {
    state: Mutex<State>,
    /// Held while a window is planned: windows are planned one at a time, each with the
    /// policy's memory of the earlier ones.
    models: SharedModels,
    store: Arc<ConfigStore>,
    live: Arc<LiveEndpoints>,
    metrics: WindowMetrics,
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
    reply: oneshot::Sender<Decision>,
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

impl Placer for Arc<Window> {
    /// Joins the open window (or opens one) and waits until it is planned.
    async fn place(&self, request: ToPlace) -> Result<Decision, NotPlaced> {
        let ticket = self.join(request)?;
        ticket.decision().await
    }
}

impl Window {
    pub fn new(
        store: Arc<ConfigStore>,
        live: Arc<LiveEndpoints>,
        registry: &Registry,
        budget: Arc<ByteBudget>,
        models: SharedModels,
    ) -> Arc<Self> {
        Arc::new(Window {
            state: Mutex::new(State::default()),
            models,
            store,
            live,
            metrics: WindowMetrics::register(registry),
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

    /// Joins the open window, or opens one, with the request's hashes and what its caller keeps
    /// for it (`held`: with the hashes it stays in the budget until the request is answered);
    /// hands `held` back with the window's config when the request was hashed under another.
    fn join(self: &Arc<Self>, to_place: ToPlace) -> Result<Ticket, NotPlaced> {
        let ToPlace {
            request,
            snapshot: hashed_under,
            group_size,
            held,
        } = to_place;
        let generation = hashed_under.generation;
        let now = Instant::now();
        let mut state = self.lock();
        if state.closed {
            return Err(PlaceError::ShuttingDown.into());
        }
        if state.open.is_none() {
            let snapshot = self.store.current().ok_or(PlaceError::NoEndpoints)?;
            if snapshot.config.endpoints.is_empty() {
                return Err(PlaceError::NoEndpoints.into());
            }
            if snapshot.generation != generation {
                return Err(NotPlaced::Stale {
                    newer: snapshot,
                    held,
                });
            }
            state.last_id += 1;
            self.open(&mut state, snapshot, now);
        }
        let sealed_elsewhere = state.sealed;
        let open = state.open.as_mut().expect("a window is open here");
        if open.snapshot.generation != generation {
            return Err(NotPlaced::Stale {
                newer: open.snapshot.clone(),
                held,
            });
        }
        let retry_after = open.deadline.saturating_duration_since(now);
        if let Some(limit) = open.snapshot.settings.max_batch_size {
            if open.live >= limit {
                return Err(PlaceError::BatchFull { limit, retry_after }.into());
            }
        }
        let mut reserved = held;
        if !reserved.grow(request.held_bytes()) {
            return Err(PlaceError::WindowFull {
                limit: self.budget.limit(),
                retry_after,
            }
            .into());
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
        self.metrics.open_requests.set(open.live as i64);
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
        Ok(ticket)
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
        self.metrics.open_requests.set(open.live as i64);
        drop(state);
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
        self.metrics.open_requests.set(0);
        self.metrics
            .sealed
            .with_label_values(&[reason.label()])
            .inc();
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
        let planned = tokio::task::spawn_blocking(move || window.plan_sealed(sealed));
        let result = planned.await;
        self.lock().sealed -= 1;
        match result {
            // The waiters are released from a worker, so that their wake-ups stay on the runtime.
            Ok(Some(planned)) => release(planned, &self.metrics),
            Ok(None) => {}
            // The waiters' senders were dropped with the task: they get `Abandoned`, never hang.
            Err(error) => tracing::error!(%error, "planning a window failed"),
        }
        let models = self.models.clone();
        if let Err(error) =
            tokio::task::spawn_blocking(move || memory::lock(&models).settle()).await
        {
            tracing::error!(%error, "merging a window into the planner's memory failed");
        }
    }

    /// Plans a sealed window (`None` when all its requests went away) on the endpoints usable
    /// now, with the requests in flight through each as its running requests.
    fn plan_sealed(&self, sealed: Sealed) -> Option<Planned> {
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
        let started = Instant::now();
        let snapshot = &sealed.snapshot;
        let mut models = memory::lock(&self.models);
        let (usable, replicas) =
            memory::replicas_now(snapshot, &self.live, models.engines(), started);
        if snapshot.generation != models.generation() {
            self.live.retain(&snapshot.config.endpoints);
        }
        let mut plan = models.plan(snapshot, &replicas, &requests);
        drop(models);
        // Back from the usable list to the config's endpoint indices.
        for assigned in plan.assignments.iter_mut().flatten() {
            *assigned = usable[*assigned];
        }
        let held = WindowHeld::new(std::mem::take(&mut plan.held), usable);
        let plan = WindowPlan {
            held,
            seconds: started.elapsed().as_secs_f64(),
            plan,
        };
        Some(Planned {
            id: sealed.id,
            reason: sealed.reason,
            snapshot: sealed.snapshot,
            requests,
            waiters,
            plan,
        })
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

/// One window's plan, in the config's endpoint indices.
struct WindowPlan {
    /// The planner's answer; its assignments are config indices.
    plan: Plan,
    /// What the memory said each endpoint held of each request (with memory only).
    held: Option<Arc<WindowHeld>>,
    /// How long planning took.
    seconds: f64,
}

/// A planned window, not yet released.
struct Planned {
    id: u64,
    reason: SealReason,
    snapshot: Arc<Snapshot>,
    requests: Vec<HashedRequest>,
    /// When each joined, where its answer goes, and its bytes in the budget (given back once
    /// it is answered).
    waiters: Vec<(Instant, oneshot::Sender<Decision>, Reserved)>,
    plan: WindowPlan,
}

/// Releases every waiter of a planned window at once (one that went away after the seal was
/// planned, but nobody listens: its caller counted it cancelled).
fn release(planned: Planned, metrics: &WindowMetrics) {
    let size = planned.requests.len();
    let released = Instant::now();
    let (mut assigned, mut no_affinity) = (0, 0);
    let members = planned.requests.into_iter().zip(planned.waiters);
    for (index, ((request, (joined, reply, _reserved)), replica)) in
        members.zip(&planned.plan.plan.assignments).enumerate()
    {
        match replica {
            Some(_) => assigned += 1,
            None => no_affinity += 1,
        }
        let _ = reply.send(Decision {
            request,
            assigned: *replica,
            snapshot: planned.snapshot.clone(),
            window_id: planned.id,
            window_size: size,
            sealed_by: planned.reason,
            waited: released.saturating_duration_since(joined),
            memory: RequestHeld::new(&planned.plan.held, index),
            finish: None,
        });
    }
    metrics.size.observe(size as f64);
    metrics.plan_seconds.observe(planned.plan.seconds);
    let plan = &planned.plan.plan;
    metrics
        .units
        .with_label_values(&["group"])
        .inc_by(plan.group_units as u64);
    metrics
        .units
        .with_label_values(&["single"])
        .inc_by(plan.single_units as u64);
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
    receiver: Option<oneshot::Receiver<Decision>>,
}

impl Ticket {
    pub fn window_id(&self) -> u64 {
        self.window_id
    }

    /// Waits for the window to be planned; refused (`internal`) when its planning was lost
    /// (logged where it happened).
    pub async fn decision(mut self) -> Result<Decision, NotPlaced> {
        let receiver = self.receiver.as_mut().expect("awaited once");
        let result = receiver.await.map_err(|_| PlaceError::Abandoned.into());
        self.receiver = None; // Answered (or lost): nothing left to cancel.
        result
    }
}

/// The window's metrics.
struct WindowMetrics {
    size: Histogram,
    plan_seconds: Histogram,
    units: IntCounterVec,
    /// Requests in the open window right now (0 when none is open).
    open_requests: IntGauge,
    sealed: IntCounterVec,
}

impl WindowMetrics {
    fn register(registry: &Registry) -> Self {
        let size = Histogram::with_opts(
            HistogramOpts::new(
                "burst_prefix_window_size",
                "Requests planned per window (cancelled ones excluded)",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0, 16384.0,
            ]),
        )
        .unwrap();
        let plan_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "burst_prefix_window_plan_seconds",
                "Time to plan one sealed window",
            )
            .buckets(prometheus::exponential_buckets(0.000_01, 4.0, 10).unwrap()),
        )
        .unwrap();
        let units = IntCounterVec::new(
            Opts::new(
                "burst_prefix_units_total",
                "Placement units formed: group (identical prompts) or single (prefix-sharing request)",
            ),
            &["kind"],
        )
        .unwrap();
        let open_requests = IntGauge::new(
            "burst_prefix_window_open_requests",
            "Requests waiting in the open window",
        )
        .unwrap();
        let sealed = IntCounterVec::new(
            Opts::new(
                "burst_prefix_windows_sealed_total",
                "Windows sealed, by reason: timer, hints (every hinted group complete), idle, full, shutdown",
            ),
            &["reason"],
        )
        .unwrap();
        for collector in [
            Box::new(size.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(plan_seconds.clone()),
            Box::new(units.clone()),
            Box::new(open_requests.clone()),
            Box::new(sealed.clone()),
        ] {
            registry.register(collector).unwrap();
        }
        // Every label value exists from the start, so dashboards and tests see zeros.
        for kind in ["group", "single"] {
            units.with_label_values(&[kind]);
        }
        for reason in SealReason::WINDOWS {
            sealed.with_label_values(&[reason.label()]);
        }
        WindowMetrics {
            size,
            plan_seconds,
            units,
            open_requests,
            sealed,
        }
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
    use crate::engines::Engines;
    use crate::metrics::Metrics;
    use crate::read::InferenceRequest;
    use std::num::NonZeroU32;

    fn window_with(store: Arc<ConfigStore>, budget: usize) -> (Arc<Window>, Registry) {
        let registry = Registry::new();
        let engines = Arc::new(Engines::new(&registry));
        let models = Arc::new(Mutex::new(memory::CacheModels::new(
            &registry,
            engines,
            crate::clock::Clock::wall(),
        )));
        let window = Window::new(
            store,
            Arc::default(),
            &registry,
            ByteBudget::new(budget),
            models,
        );
        (window, registry)
    }

    fn store(yaml: &str) -> Arc<ConfigStore> {
        let store = Arc::new(ConfigStore::new(
            ConfigOrigin::Demo,
            Arc::new(Metrics::new()),
        ));
        store.apply_text(yaml).unwrap();
        store
    }

    fn window(yaml: &str) -> (Arc<Window>, Registry) {
        window_with(store(yaml), usize::MAX)
    }

    fn render(registry: &Registry) -> String {
        let mut buffer = Vec::new();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut buffer,
        )
        .unwrap();
        String::from_utf8(buffer).unwrap()
    }

    /// Joins with `prompt` hashed under the config in force, then again under the window's when
    /// that differs (as the path does), holding `held` bytes of the budget (as many as fit).
    fn try_join(
        window: &Arc<Window>,
        prompt: &str,
        group_size: Option<u32>,
        held: usize,
    ) -> Result<Ticket, PlaceError> {
        let body = serde_json::json!({"model": "m", "prompt": prompt}).to_string();
        let request = InferenceRequest::parse(body.as_bytes()).unwrap();
        let mut reserved = window.budget.empty();
        reserved.grow(held);
        let mut snapshot = window.store.current().ok_or(PlaceError::NoEndpoints)?;
        loop {
            let to_place = ToPlace {
                request: HashedRequest::new(&request, snapshot.settings.block_spec),
                snapshot: snapshot.clone(),
                group_size: group_size.and_then(NonZeroU32::new),
                held: reserved,
            };
            match window.join(to_place) {
                Ok(ticket) => return Ok(ticket),
                Err(NotPlaced::Refused(error)) => return Err(error),
                Err(NotPlaced::Stale { newer, held }) => (snapshot, reserved) = (newer, held),
            }
        }
    }

    fn join(window: &Arc<Window>, prompt: &str) -> Ticket {
        try_join(window, prompt, None, 0).unwrap()
    }

    fn hinted(window: &Arc<Window>, prompt: &str, size: u32) -> Ticket {
        try_join(window, prompt, Some(size), 0).unwrap()
    }

    // Requests balanced by count: these tests are of the window, not of the time cost.
    const TWO: &str = "windowDurationMs: 20\nbalanceBy: requests\nendpoints:\n  - {id: a, address: '1.1.1.1:1'}\n  - {id: b, address: '1.1.1.2:1'}\n";

    #[tokio::test]
    async fn a_window_plans_its_requests_together() {
        let (window, _) = window(TWO);
        let tickets: Vec<Ticket> = (0..3).map(|_| join(&window, "same")).collect();
        let lone = join(&window, "other");
        assert_eq!(window.open_requests(), Some((1, 4)));
        let mut placements = Vec::new();
        for ticket in tickets {
            placements.push(ticket.decision().await.unwrap());
        }
        let lone = lone.decision().await.unwrap();
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
        let (window, _) = window(TWO);
        let kept = join(&window, "x");
        drop(join(&window, "x"));
        assert_eq!(window.open_requests(), Some((1, 1)));
        assert_eq!(kept.decision().await.unwrap().window_size, 1);
    }

    #[tokio::test]
    async fn a_full_window_seals_at_once_and_no_endpoints_is_refused() {
        let (window, registry) =
            window(&format!("maxBatchSize: 2\n{}", TWO.replace("20", "10000")));
        let first = join(&window, "x");
        let second = join(&window, "y");
        // Sealed by the second: the third opens the next window.
        let third = join(&window, "z");
        assert_eq!(third.window_id(), 2);
        let placement = first.decision().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (2, SealReason::Full)
        );
        second.decision().await.unwrap();
        assert!(render(&registry).contains("burst_prefix_windows_sealed_total{reason=\"full\"} 1"));
        let (empty, _) = self::window("endpoints: []\n");
        assert_eq!(
            try_join(&empty, "x", None, 0).err(),
            Some(PlaceError::NoEndpoints)
        );
    }

    #[tokio::test]
    async fn full_windows_stay_open_and_refuse_while_planning_lags() {
        let (window, _) = window(&format!("maxBatchSize: 1\n{}", TWO.replace("20", "10000")));
        // Planning is stuck: two windows sealed by `full` wait for it.
        let stuck = window.models.lock().unwrap();
        let first = join(&window, "x");
        let second = join(&window, "y");
        assert_eq!(second.window_id(), 2);
        let third = join(&window, "z");
        assert_eq!(window.open_requests(), Some((3, 1)), "full, but not sealed");
        match try_join(&window, "w", None, 0) {
            Err(PlaceError::BatchFull { limit: 1, .. }) => {}
            other => panic!("expected batch_full, got {:?}", other.err()),
        }
        drop(stuck);
        for ticket in [first, second] {
            assert_eq!(ticket.decision().await.unwrap().sealed_by, SealReason::Full);
        }
        window.close().await;
        assert_eq!(third.decision().await.unwrap().window_id, 3);
    }

    #[tokio::test]
    async fn the_byte_budget_refuses_beyond_it_but_always_takes_one() {
        let (window, _) = window_with(store(&TWO.replace("20", "10000")), 1000);
        let big = try_join(&window, "x", None, 5000).unwrap();
        let refused = try_join(&window, "y", None, 10);
        assert!(
            matches!(refused, Err(PlaceError::WindowFull { limit: 1000, .. })),
            "{:?}",
            refused.err()
        );
        drop(big);
        let small = try_join(&window, "y", None, 100).unwrap();
        assert!(try_join(&window, "z", None, 100).is_ok());
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
        let placement = last.decision().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (6, SealReason::Hints)
        );
        for ticket in a.into_iter().chain(b) {
            assert_eq!(ticket.decision().await.unwrap().window_id, 1);
        }
        assert_eq!(lone.decision().await.unwrap().window_id, 1);
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
        let placement = fourth.decision().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (3, SealReason::Hints)
        );
        first.decision().await.unwrap();
        third.decision().await.unwrap();
    }

    #[tokio::test]
    async fn idle_windows_seal_early() {
        let (window, _) = window(&format!("idleSealMs: 20\n{}", TWO.replace("20", "10000")));
        let first = join(&window, "x");
        let second = join(&window, "x");
        let placement = first.decision().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (2, SealReason::Idle)
        );
        second.decision().await.unwrap();
    }

    #[tokio::test]
    async fn hints_are_ignored_when_the_policy_says_so() {
        let (window, _) = window(&format!("sealOnHints: false\n{}", TWO.replace("20", "200")));
        let ticket = hinted(&window, "a", 1);
        assert_eq!(
            ticket.decision().await.unwrap().sealed_by,
            SealReason::Timer
        );
    }

    #[tokio::test]
    async fn close_answers_the_open_window_and_refuses_more() {
        let (window, _) = window(&TWO.replace("20", "10000"));
        let ticket = join(&window, "x");
        window.close().await;
        let placement = ticket.decision().await.unwrap();
        assert_eq!(
            (placement.window_size, placement.sealed_by),
            (1, SealReason::Shutdown)
        );
        assert_eq!(
            try_join(&window, "x", None, 0).err(),
            Some(PlaceError::ShuttingDown)
        );
    }

    #[tokio::test]
    async fn a_config_change_rehashes_into_the_new_window() {
        let store = store(TWO);
        let (window, _) = window_with(store.clone(), usize::MAX);
        let first = join(&window, "0123456789abcdef");
        store
            .apply_text(&format!("blockSizeTokens: 1\n{TWO}"))
            .unwrap();
        // Joins the open window: hashed under its config (64-token blocks: one block).
        let second = join(&window, "0123456789abcdef");
        assert_eq!(second.decision().await.unwrap().request.blocks.len(), 1);
        first.decision().await.unwrap();
        // The next window uses the new config: 16 bytes are 4 estimate tokens, 4 blocks.
        let third = join(&window, "0123456789abcdef").decision().await.unwrap();
        assert_eq!(third.request.blocks.len(), 4);
        assert_eq!(third.snapshot.generation, 2);
    }
}
