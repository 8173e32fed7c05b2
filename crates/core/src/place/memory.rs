//! What both placers remember (docs/behaviour.md §7), and what they feed the planner of each
//! replica.
//!
//! [`CacheModels`]: one model per policy of what each replica caches, its time from a monotonic
//! clock started with the producer, dropped for an endpoint when the endpoint leaves the config,
//! and rebuilt when its settings (or the block size) change; what the engines say they hold is
//! touched in it before each plan. The placers hold it under one lock, so windows and arrivals
//! are placed one at a time. Its metrics are registered here:
//!
//! - `burst_prefix_memory_blocks{endpoint}`: blocks the model holds per endpoint;
//! - `burst_prefix_placements_total{source}`: placed requests by why they landed there:
//!   `memory` (a prefix remembered from earlier windows), `window` (a prefix placed earlier in
//!   the same window), `least_loaded` (no usable prefix).
//!
//! [`replicas_now`]: the endpoints usable now (not cooling down), each with the requests it runs
//! and its pace for the time cost ([`pace`]): its speed as its engine's counters taught it (the
//! config's `time` figures until then) and what it is busy with.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use burst_prefix_api::Endpoint;
use burst_prefix_planner::{
    AnswerBook, Busy, Memory, MemorySettings, Pace, PlacementReason, Plan, Replica,
};
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::batch::plan_batch;
use crate::clock::Clock;
use crate::config_store::Snapshot;
use crate::engines::Engines;
use crate::live::LiveEndpoints;
use crate::read::HashedRequest;

/// The cache models, shared by the placers.
pub type SharedModels = Arc<Mutex<CacheModels>>;

/// Locks the models (a panic while planning leaves them usable: recover rather than cascade).
pub fn lock(models: &SharedModels) -> MutexGuard<'_, CacheModels> {
    models
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the placers remember of earlier placements, when the config enables memory.
pub struct CacheModels {
    /// The model and what it was built for: settings and block size; `None` while disabled.
    model: Option<(Memory, usize)>,
    /// The config generation the model's endpoints were last checked against.
    generation: u64,
    /// The memory's and the arrivals' time.
    clock: Clock,
    blocks: IntGaugeVec,
    /// The endpoints `blocks` has a series for: one the model no longer holds (left the config,
    /// or forgotten on a reset or new weights) loses its series at the next settle.
    reported: HashSet<String>,
    placements: IntCounterVec,
    /// Touches since the model was last settled.
    unsettled: bool,
    /// What the engines hold and their load, applied to the model before each plan.
    engines: Arc<Engines>,
    /// How long each prompt's answers were (what the time cost prices a decode at).
    answers: AnswerBook,
}

impl CacheModels {
    pub fn new(registry: &Registry, engines: Arc<Engines>, clock: Clock) -> Self {
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
        for reason in PlacementReason::ALL {
            placements.with_label_values(&[reason.label()]);
        }
        registry.register(Box::new(blocks.clone())).unwrap();
        registry.register(Box::new(placements.clone())).unwrap();
        CacheModels {
            model: None,
            generation: 0,
            clock,
            blocks,
            reported: HashSet::new(),
            placements,
            unsettled: false,
            engines,
            answers: AnswerBook::default(),
        }
    }

    pub fn engines(&self) -> &Arc<Engines> {
        &self.engines
    }

    /// The config generation last followed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Plans one batch of `requests` under `snapshot`'s config on `replicas` (indices of that
    /// list), with the memory when enabled. Its touches wait for [`CacheModels::settle`].
    pub fn plan(
        &mut self,
        snapshot: &Snapshot,
        replicas: &[Replica<'_>],
        requests: &[HashedRequest],
    ) -> Plan {
        self.follow(snapshot);
        self.apply_engines();
        let now_ms = self.now_ms();
        let memory = self.model.as_mut().map(|(memory, _)| (memory, now_ms));
        let plan = plan_batch(&snapshot.settings.plan, replicas, requests, memory);
        for reason in plan.reasons.iter().flatten() {
            self.count(*reason);
        }
        plan
    }

    /// The model, to place with (`None` while memory is disabled); a placement touches it, so
    /// that the next settle merges it.
    pub fn memory_to_touch(&mut self) -> Option<&mut Memory> {
        let (memory, _) = self.model.as_mut()?;
        self.unsettled = true;
        Some(memory)
    }

    /// Whether placements touched the model since it was last settled.
    pub fn unsettled(&self) -> bool {
        self.unsettled
    }

    /// The answers learned so far.
    pub fn answers(&self) -> &AnswerBook {
        &self.answers
    }

    /// Learns that an answer to `prompt` had `tokens` tokens.
    pub fn answered(&mut self, prompt: burst_prefix_planner::BlockHash, tokens: u32) {
        self.answers.learn(prompt, tokens);
    }

    /// Counts a placed request's reason.
    pub fn count(&self, reason: PlacementReason) {
        self.placements.with_label_values(&[reason.label()]).inc();
    }

    /// Applies what the engines said since the last plan; true when they touched the model.
    pub fn apply_engines(&mut self) -> bool {
        let engines = self.engines.clone();
        engines.apply_pending(
            self.model.as_mut().map(|(memory, _)| memory),
            &mut self.answers,
        )
    }

    /// Merges the placements so far into the model, and updates its metrics: called once a
    /// window's requests are answered, so that they do not wait for it.
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

    /// Milliseconds on the models' clock (the memory's and the arrivals' time).
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Builds, rebuilds or drops the model for `snapshot`'s memory settings, and drops the
    /// models of endpoints that left the config.
    pub fn follow(&mut self, snapshot: &Snapshot) {
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
            // What was learned of an endpoint that left, or moved, is forgotten.
            self.engines.follow_endpoints(
                snapshot
                    .config
                    .endpoints
                    .iter()
                    .map(|e| (e.id.as_str(), e.address.as_str())),
            );
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

/// The endpoints of `snapshot` usable at `now` (config indices) and the replicas the planner
/// places on, in that order: each with what it runs now (for the tie-break and the time cost).
pub fn replicas_now<'a>(
    snapshot: &'a Snapshot,
    live: &LiveEndpoints,
    engines: &Engines,
    now: Instant,
) -> (Vec<usize>, Vec<Replica<'a>>) {
    let endpoints = &snapshot.config.endpoints;
    let usable = live.usable(endpoints, now);
    let replicas = usable
        .iter()
        .map(|&i| {
            let running = running_requests(&endpoints[i], live, engines);
            Replica {
                id: &endpoints[i].id,
                running_requests: running,
                pace: pace(snapshot, &endpoints[i], engines, running),
            }
        })
        .collect();
    (usable, replicas)
}

/// `endpoint`'s pace for the time cost: its learned speed (the config's until learned) and
/// `running` requests.
pub fn pace(snapshot: &Snapshot, endpoint: &Endpoint, engines: &Engines, running: u64) -> Pace {
    Pace {
        speed: engines.speed(&endpoint.id, snapshot.config.planner.time.speed()),
        busy: Busy {
            requests: running as f64,
            prefill_tokens: 0.0,
        },
    }
}

/// What an endpoint runs now: the config's figure plus the requests in flight through this
/// producer, or its engine's own count (running and waiting) when that is known and larger
/// (requests that reached it some other way).
fn running_requests(endpoint: &Endpoint, live: &LiveEndpoints, engines: &Engines) -> u64 {
    let ours = endpoint.running_requests.unwrap_or(0) + live.in_flight(&endpoint.id);
    engines
        .load(&endpoint.id)
        .map_or(ours, |engine| engine.max(ours))
}

/// What an endpoint runs that this producer did not place: the config's figure, or its
/// engine's own count when known (the placer on arrival counts its own flights itself).
pub fn running_elsewhere(endpoint: &Endpoint, engines: &Engines) -> u64 {
    let config = endpoint.running_requests.unwrap_or(0);
    engines
        .load(&endpoint.id)
        .map_or(config, |engine| engine.max(config))
}
