//! Placement on arrival (zero-wait mode, `windowDurationMs: 0`, docs/behaviour.md §3): a
//! request is placed the moment it is parsed, from what is known then: the placements still in
//! flight and the memory (the planner's `InFlight`). The planner's lock is held for that one
//! placement only.
//!
//! What is in flight ends two ways: a front-end that sees the answer end (the proxy, the
//! endpoint picker) reports it ([`Finish`]); otherwise (`/v1/produce`) a placement counts with
//! a half-life of [`UNREPORTED_HALF_LIFE_MS`], about a completion's length.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use burst_prefix_planner::ArrivalPlacement as Placed;
use burst_prefix_planner::{
    Arrival, InFlight, InFlightSettings, PlacementId, PlacementReason, Replica,
};

use super::config_store::Snapshot;
use super::engines::Engines;
use super::live::LiveEndpoints;
use super::planning::{running_requests, Planner};
use super::request::HashedRequest;

/// How long a placement counts that nobody reports finished, in half-lives.
pub const UNREPORTED_HALF_LIFE_MS: u64 = 10_000;

/// The memory's touches are merged at most this often (each merge passes over the replicas).
const SETTLE_EVERY: Duration = Duration::from_millis(10);

/// The placements on arrival in flight, on the replicas usable when they were last looked at.
pub(super) struct Arrivals {
    in_flight: InFlight,
    /// Config indices of the replicas `in_flight` knows, in its order.
    usable: Vec<usize>,
    /// Endpoint id to its position in `usable`.
    position: HashMap<String, usize>,
    /// What `usable` was computed from: the config generation and the cool-downs.
    seen: Option<(u64, u64)>,
    /// Some endpoint was cooling down then: look again, its cool-down may have ended.
    cooling: bool,
    /// Placements made (the `window` id of the next one).
    placed: u64,
    last_settle: Instant,
}

impl Default for Arrivals {
    fn default() -> Self {
        Arrivals {
            in_flight: InFlight::new(InFlightSettings {
                load_half_life_ms: UNREPORTED_HALF_LIFE_MS,
            }),
            usable: Vec::new(),
            position: HashMap::new(),
            seen: None,
            cooling: false,
            placed: 0,
            last_settle: Instant::now(),
        }
    }
}

/// Where one request was placed on arrival, in the config's endpoint indices.
pub(super) struct Arrived {
    pub assigned: Option<usize>,
    pub source: Option<PlacementReason>,
    /// `(endpoint, leading blocks held)`, sorted by endpoint.
    pub held: Vec<(usize, usize)>,
    pub id: PlacementId,
    /// Its number among the placements on arrival.
    pub sequence: u64,
}

impl Planner {
    /// Places `request` now on the endpoints usable now.
    pub(super) fn place_on_arrival(
        &mut self,
        snapshot: &Snapshot,
        request: &HashedRequest,
        group_size: Option<NonZeroU32>,
        live: &LiveEndpoints,
    ) -> Arrived {
        self.follow(snapshot);
        let engines = self.engines.clone();
        let now = Instant::now();
        let engines_changed = engines.apply_pending(self.model.as_mut().map(|(memory, _)| memory));
        // The touches of earlier placements are merged before this one, not after: a placement
        // finished since (its flight gone) is then known from the memory alone. A burst merges
        // at most every SETTLE_EVERY (its own flights cover it meanwhile); what the engines
        // hold counts for this very placement.
        let due = self.unsettled && now.duration_since(self.arrivals.last_settle) >= SETTLE_EVERY;
        if engines_changed || due {
            self.arrivals.last_settle = now;
            self.settle();
        }
        self.arrivals
            .look_at_replicas(snapshot, live, &engines, now);
        let now_ms = self.now_ms();
        let arrivals = &mut self.arrivals;
        let allowed: Option<Vec<usize>> = request.endpoints.as_ref().map(|ids| {
            let mut allowed: Vec<usize> = ids
                .iter()
                .filter_map(|id| arrivals.position.get(id).copied())
                .collect();
            allowed.sort_unstable();
            allowed
        });
        let arrival = Arrival {
            blocks: &request.blocks,
            allowed_replicas: allowed.as_deref(),
            group_size: group_size.map(|size| size.get() as usize),
        };
        let memory = self.model.as_mut().map(|(memory, _)| memory);
        let remembers = memory.is_some();
        let placed: Placed =
            arrivals
                .in_flight
                .place(&arrival, &snapshot.settings.plan, memory, now_ms);
        arrivals.placed += 1;
        let to_config = |position: usize| arrivals.usable[position];
        let arrived = Arrived {
            assigned: placed.replica.map(to_config),
            source: placed.reason,
            held: placed
                .held
                .iter()
                .map(|&(position, blocks)| (to_config(position), blocks))
                .collect(),
            id: placed.id,
            sequence: arrivals.placed,
        };
        if let Some(source) = arrived.source {
            self.placements.with_label_values(&[source.label()]).inc();
        }
        if remembers {
            self.unsettled = true;
        }
        arrived
    }

    /// Takes a placement on arrival off the work in flight.
    pub(super) fn finish_arrival(&mut self, id: PlacementId) {
        let now_ms = self.now_ms();
        self.arrivals.in_flight.finish(id, now_ms);
    }
}

impl Arrivals {
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
            return;
        }
        let endpoints = &snapshot.config.endpoints;
        let usable = live.usable(endpoints, now);
        self.cooling = usable.len() < endpoints.len() || live.any_cooling(endpoints, now);
        self.seen = Some(seen);
        if usable == self.usable && self.position.len() == usable.len() {
            return;
        }
        let replicas: Vec<Replica<'_>> = usable
            .iter()
            .map(|&i| Replica {
                id: &endpoints[i].id,
                running_requests: running_requests(&endpoints[i], live, engines),
            })
            .collect();
        self.in_flight.set_replicas(&replicas);
        self.position = usable
            .iter()
            .enumerate()
            .map(|(position, &i)| (endpoints[i].id.clone(), position))
            .collect();
        self.usable = usable;
    }
}

/// A placement on arrival that counts as in flight until this is dropped (the front-end saw
/// its answer end).
pub struct Finish {
    planner: Arc<Mutex<Planner>>,
    id: PlacementId,
}

impl Finish {
    pub(super) fn new(planner: Arc<Mutex<Planner>>, id: PlacementId) -> Self {
        Finish { planner, id }
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        self.planner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .finish_arrival(self.id);
    }
}
