//! The on-arrival placer (zero-wait mode, `windowDurationMs: 0`, docs/behaviour.md §3): a
//! request is placed the moment it is read, from what is known then: the placements still in
//! flight and the memory (the planner's `InFlight`). The models' lock is held for that one
//! placement only.
//!
//! What is in flight ends two ways: a front-end that sees the answer end (the proxy, the
//! endpoint picker) drops its route's handle, which finishes the placement (its
//! [`Completion`]);
//! otherwise (`/v1/produce`) a placement counts with a half-life of
//! [`UNREPORTED_HALF_LIFE_MS`], about a completion's length.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use burst_prefix_planner::{
    Arrival, ArrivalPlacement, BalanceBy, InFlight, InFlightSettings, PlacementId,
};

use super::memory::{self, SharedModels};
use super::{Completion, Decision, NotPlaced, Placer, RequestHeld, SealReason, ToPlace};
use crate::config_store::Snapshot;
use crate::engines::Engines;
use crate::error::PlaceError;
use crate::live::LiveEndpoints;

/// How long a placement counts that nobody reports finished, in half-lives.
pub const UNREPORTED_HALF_LIFE_MS: u64 = 10_000;

/// The memory's touches are merged at most this often, in ms of the placers' clock (each merge
/// passes over the replicas).
const SETTLE_EVERY_MS: u64 = 10;

/// Places requests as they arrive.
pub struct Arrivals {
    state: Mutex<State>,
    models: SharedModels,
    live: Arc<LiveEndpoints>,
    /// Set once the producer shuts down: nothing more is placed.
    closed: Arc<AtomicBool>,
}

/// The placements on arrival in flight, on the replicas usable when they were last looked at.
struct State {
    in_flight: InFlight,
    /// Config indices of the replicas `in_flight` knows, in its order.
    usable: Vec<usize>,
    /// Endpoint id to its position in `usable`.
    position: HashMap<String, usize>,
    /// What `usable` was computed from: the config generation and the cool-downs.
    seen: Option<(u64, u64)>,
    /// Some endpoint was cooling down then: look again, its cool-down may have ended.
    cooling: bool,
    /// What the engines had said when the paces were last set (`Engines::heard`).
    heard: Option<u64>,
    /// Placements made (the `window` id of the next one).
    placed: u64,
    /// When the memory was last settled, on the placers' clock.
    last_settle_ms: u64,
}

impl Arrivals {
    pub fn new(models: SharedModels, live: Arc<LiveEndpoints>, closed: Arc<AtomicBool>) -> Self {
        Arrivals {
            state: Mutex::new(State {
                in_flight: InFlight::new(InFlightSettings {
                    load_half_life_ms: UNREPORTED_HALF_LIFE_MS,
                }),
                usable: Vec::new(),
                position: HashMap::new(),
                seen: None,
                heard: None,
                cooling: false,
                placed: 0,
                last_settle_ms: 0,
            }),
            models,
            live,
            closed,
        }
    }

    /// Takes placement `id` off the work in flight; learns its answer's length when known.
    fn finish(&self, id: PlacementId, answer_tokens: Option<u32>) {
        // The order `place` takes them in.
        let mut state = self.state();
        let mut models = memory::lock(&self.models);
        let now_ms = models.now_ms();
        let prompt = state.in_flight.finish(id, now_ms);
        if let (Some(prompt), Some(tokens)) = (prompt, answer_tokens) {
            models.answered(prompt, tokens);
        }
    }

    /// Placements still in flight (not finished, not expired).
    pub fn in_flight(&self) -> usize {
        self.state().in_flight.len()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Placer for Arc<Arrivals> {
    /// Places `request` now on the endpoints usable now, under the config it was read with.
    async fn place(&self, request: ToPlace) -> Result<Decision, NotPlaced> {
        let started = Instant::now();
        if self.closed.load(Ordering::Relaxed) {
            return Err(PlaceError::ShuttingDown.into());
        }
        let snapshot = request.snapshot;
        if snapshot.config.endpoints.is_empty() {
            return Err(PlaceError::NoEndpoints.into());
        }
        let mut state = self.state();
        let mut models = memory::lock(&self.models);
        models.follow(&snapshot);
        let engines = models.engines().clone();
        let engines_changed = models.apply_engines();
        // The touches of earlier placements are merged before this one, not after: a placement
        // finished since (its flight gone) is then known from the memory alone. A burst merges
        // at most every SETTLE_EVERY_MS (its own flights cover it meanwhile); what the engines
        // hold counts for this very placement.
        let now_ms = models.now_ms();
        let due =
            models.unsettled() && now_ms.saturating_sub(state.last_settle_ms) >= SETTLE_EVERY_MS;
        if engines_changed || due {
            state.last_settle_ms = now_ms;
            models.settle();
        }
        state.look_at_replicas(&snapshot, &self.live, &engines, started);
        let allowed: Option<Vec<usize>> = request.request.endpoints.as_ref().map(|ids| {
            let mut allowed: Vec<usize> = ids
                .iter()
                .filter_map(|id| state.position.get(id).copied())
                .collect();
            allowed.sort_unstable();
            allowed
        });
        let arrival = Arrival {
            blocks: &request.request.blocks,
            allowed_replicas: allowed.as_deref(),
            group_size: request.group_size.map(|size| size.get() as usize),
            max_answer_tokens: request.request.max_answer_tokens,
            expected_answer_tokens: request
                .request
                .blocks
                .last()
                .and_then(|&prompt| models.answers().expect(prompt)),
        };
        let placed: ArrivalPlacement = state.in_flight.place(
            &arrival,
            &snapshot.settings.plan,
            models.memory_to_touch(),
            now_ms,
        );
        if let Some(reason) = placed.reason {
            models.count(reason);
        }
        drop(models);
        state.placed += 1;
        let to_config = |position: usize| state.usable[position];
        let held = placed
            .held
            .iter()
            .map(|&(position, blocks)| (to_config(position), blocks))
            .collect();
        Ok(Decision {
            assigned: placed.replica.map(to_config),
            window_id: state.placed,
            window_size: 1,
            sealed_by: SealReason::Arrival,
            waited: started.elapsed(),
            memory: Some(RequestHeld::OnArrival(held)),
            finish: Some({
                let (arrivals, id) = (self.clone(), placed.id);
                Completion::new(move |answer| arrivals.finish(id, answer))
            }),
            request: request.request,
            snapshot,
        })
    }
}

impl State {
    /// Gives the planner the endpoints usable now when they may have changed: a new config, a
    /// cool-down begun, or one that may have ended.
    fn look_at_replicas(
        &mut self,
        snapshot: &Snapshot,
        live: &LiveEndpoints,
        engines: &Engines,
        now: Instant,
    ) {
        let seen = (snapshot.generation, live.cool_downs());
        if self.seen == Some(seen) && !self.cooling {
            self.look_at_paces(snapshot, engines);
            return;
        }
        let endpoints = &snapshot.config.endpoints;
        let (usable, replicas) = memory::replicas_now(snapshot, live, engines, now);
        self.cooling = usable.len() < endpoints.len() || live.any_cooling(endpoints, now);
        self.seen = Some(seen);
        if usable == self.usable && self.position.len() == usable.len() {
            return;
        }
        self.in_flight.set_replicas(&replicas);
        self.position = usable
            .iter()
            .enumerate()
            .map(|(position, &i)| (endpoints[i].id.clone(), position))
            .collect();
        self.usable = usable;
        self.heard = None;
        self.look_at_paces(snapshot, engines);
    }

    /// Time mode: gives the planner each replica's pace when the engines said something new
    /// (a scrape of their `/metrics`): its speed, and what it runs that we did not place (our
    /// own placements are the planner's flights).
    fn look_at_paces(&mut self, snapshot: &Snapshot, engines: &Engines) {
        let heard = engines.heard();
        if snapshot.settings.plan.balance_by != BalanceBy::Time || self.heard == Some(heard) {
            return;
        }
        self.heard = Some(heard);
        for (position, &i) in self.usable.iter().enumerate() {
            let endpoint = &snapshot.config.endpoints[i];
            let running = memory::running_elsewhere(endpoint, engines);
            let pace = memory::pace(snapshot, endpoint, engines, running);
            self.in_flight.set_pace(position, pace);
        }
    }
}
