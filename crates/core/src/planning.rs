//! Planning: what the two ways of placing share, behind one lock held for one window or one
//! request at a time. A sealed window is planned here on the endpoints usable now (not cooling
//! down), with the requests in flight through each as its running requests; a request placed on
//! arrival (zero-wait mode) is placed in [`super::arrival`]. Both use the planner's memory across
//! windows (docs/behaviour.md §7): one model per policy, its time from a monotonic clock started
//! with the producer, dropped for an endpoint when the endpoint leaves the config, and rebuilt
//! when its settings (or the block size) change. Its metrics are registered here:
//!
//! - `burst_prefix_memory_blocks{endpoint}`: blocks the model holds per endpoint;
//! - `burst_prefix_placements_total{source}`: placed requests by why they landed there:
//!   `memory` (a prefix remembered from earlier windows), `window` (a prefix placed earlier in
//!   the same window), `least_loaded` (no usable prefix).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use burst_prefix_api::Endpoint;
use burst_prefix_planner::{Memory, MemorySettings, PlacementReason, Plan, Replica};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::arrival::Arrivals;
use super::batch::plan_batch;
use super::config_store::Snapshot;
use super::engines::Engines;
use super::live::LiveEndpoints;
use super::placement::WindowHeld;
use super::request::HashedRequest;

/// Places windows and arrivals one at a time, remembering the earlier ones when the config
/// enables memory.
pub struct Planner {
    /// The model and what it was built for: settings and block size; `None` while disabled.
    pub(super) model: Option<(Memory, usize)>,
    /// The config generation the model's endpoints were last checked against.
    generation: u64,
    started: Instant,
    blocks: IntGaugeVec,
    /// The endpoints `blocks` has a series for: one the model no longer holds (left the config,
    /// or forgotten on a reset or new weights) loses its series at the next settle.
    reported: HashSet<String>,
    pub(super) placements: IntCounterVec,
    /// Placements on arrival that are not finished yet (zero-wait mode).
    pub(super) arrivals: Arrivals,
    /// Touches since the model was last settled.
    pub(super) unsettled: bool,
    /// What the engines hold and their load, applied to the model before each plan.
    pub(super) engines: Arc<Engines>,
}

impl Planner {
    pub fn new(registry: &Registry, engines: Arc<Engines>) -> Self {
        let blocks = IntGaugeVec::new(
            Opts::new(
                "burst_prefix_memory_blocks",
                "Prefix blocks the planner's memory holds for an endpoint (docs/behaviour.md §7)",
            ),
            &["endpoint"],
        )
        .unwrap();
        let placements = IntCounterVec::new(
            Opts::new(
                "burst_prefix_placements_total",
                "Placed requests by source: memory (a prefix remembered from earlier windows), window (a prefix placed earlier in the window), least_loaded (no usable prefix)",
            ),
            &["source"],
        )
        .unwrap();
        for source in PlacementReason::ALL {
            placements.with_label_values(&[source.label()]);
        }
        registry.register(Box::new(blocks.clone())).unwrap();
        registry.register(Box::new(placements.clone())).unwrap();
        Planner {
            model: None,
            generation: 0,
            started: Instant::now(),
            blocks,
            reported: HashSet::new(),
            placements,
            arrivals: Arrivals::default(),
            unsettled: false,
            engines,
        }
    }

    /// Plans one sealed window's `requests` under `snapshot`'s config on the endpoints usable
    /// now. The window's touches wait for [`Planner::settle`] (or the next window's planning).
    pub fn plan_window(
        &mut self,
        snapshot: &Snapshot,
        requests: &[HashedRequest],
        live: &LiveEndpoints,
    ) -> WindowPlan {
        let started = Instant::now();
        let endpoints = &snapshot.config.endpoints;
        let usable = live.usable(endpoints, started);
        let replicas: Vec<Replica<'_>> = usable
            .iter()
            .map(|&i| Replica {
                id: &endpoints[i].id,
                running_requests: running_requests(&endpoints[i], live, &self.engines),
            })
            .collect();
        if snapshot.generation != self.generation {
            live.retain(endpoints);
        }
        let mut plan = self.plan(snapshot, &replicas, requests);
        // Back from the usable list to the config's endpoint indices.
        for assigned in plan.assignments.iter_mut().flatten() {
            *assigned = usable[*assigned];
        }
        let held = WindowHeld::new(std::mem::take(&mut plan.held), usable);
        WindowPlan {
            held,
            seconds: started.elapsed().as_secs_f64(),
            plan,
        }
    }

    /// Plans on `replicas` (a subset of the config's endpoints, by index in that subset).
    fn plan(
        &mut self,
        snapshot: &Snapshot,
        replicas: &[Replica<'_>],
        requests: &[HashedRequest],
    ) -> Plan {
        self.follow(snapshot);
        self.engines
            .apply_pending(self.model.as_mut().map(|(memory, _)| memory));
        let params = &snapshot.settings.plan;
        let now_ms = self.now_ms();
        let memory = self.model.as_mut().map(|(memory, _)| (memory, now_ms));
        let plan = plan_batch(params, replicas, requests, memory);
        for source in plan.reasons.iter().flatten() {
            self.placements.with_label_values(&[source.label()]).inc();
        }
        plan
    }

    /// Merges the windows planned so far into the model, and updates its metrics: called once
    /// a window's requests are answered, so that they do not wait for it.
    pub fn settle(&mut self) {
        self.unsettled = false;
        let mut reported = HashSet::new();
        if let Some((memory, _)) = &mut self.model {
            memory.settle();
            for (endpoint, blocks) in memory.replica_blocks() {
                self.blocks
                    .with_label_values(&[endpoint])
                    .set(blocks as i64);
                reported.insert(endpoint.to_string());
            }
        }
        for gone in self.reported.difference(&reported) {
            let _ = self.blocks.remove_label_values(&[gone]);
        }
        self.reported = reported;
    }

    /// Milliseconds on the planner's clock (the memory's and the arrivals' time).
    pub(super) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Builds, rebuilds or drops the model for `snapshot`'s memory settings, and drops the
    /// models of endpoints that left the config.
    pub(super) fn follow(&mut self, snapshot: &Snapshot) {
        let settings: Option<MemorySettings> = snapshot.config.planner.memory_settings();
        let block_size = snapshot.settings.block_spec.block_size_tokens;
        let fits = match (&self.model, settings) {
            (Some((memory, size)), Some(settings)) => {
                memory.settings() == settings && *size == block_size
            }
            (None, None) => true,
            _ => false,
        };
        if !fits {
            self.model = settings.map(|settings| (Memory::new(settings), block_size));
            self.blocks.reset();
            self.reported.clear();
        }
        if snapshot.generation != self.generation {
            self.generation = snapshot.generation;
            if let Some((memory, _)) = &mut self.model {
                let ids: HashSet<&str> = snapshot
                    .config
                    .endpoints
                    .iter()
                    .map(|e| e.id.as_str())
                    .collect();
                let mut gone = Vec::new();
                memory.retain_replicas(|id| {
                    let keep = ids.contains(id);
                    if !keep {
                        gone.push(id.to_string());
                    }
                    keep
                });
                // Their series go now, before the window is answered.
                for id in gone {
                    let _ = self.blocks.remove_label_values(&[&id]);
                    self.reported.remove(&id);
                }
            }
        }
    }
}

/// One window's plan, in the config's endpoint indices.
pub struct WindowPlan {
    /// The planner's answer; its assignments are config indices.
    pub plan: Plan,
    /// What the memory said each endpoint held of each request (with memory only).
    pub held: Option<Arc<WindowHeld>>,
    /// How long planning took.
    pub seconds: f64,
}

/// What an endpoint runs now, for the tie-break: the config's figure plus the requests in flight
/// through this producer, or its engine's own count (running and waiting) when that is known and
/// larger (requests that reached it some other way).
pub(super) fn running_requests(
    endpoint: &Endpoint,
    live: &LiveEndpoints,
    engines: &Engines,
) -> u64 {
    let ours = endpoint.running_requests.unwrap_or(0) + live.in_flight(&endpoint.id);
    engines
        .load(&endpoint.id)
        .map_or(ours, |engine| engine.max(ours))
}
