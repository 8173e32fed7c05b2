//! What the producer knows live about each endpoint, beyond the config: requests in flight
//! through it (the proxy counts them exactly) and a cool-down after it failed (passive health,
//! like Envoy's outlier detection). The window plans only on endpoints that are not cooling
//! down, and feeds the in-flight counts to the planner as running requests.
//!
//! Also here, because every front-end needs the same answer: where a placed request goes
//! ([`LiveEndpoints::destination`]) and where it goes next when that fails
//! ([`LiveEndpoints::fallbacks`]), so that every member of a group fails over to the same replica.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use burst_prefix_api::Endpoint;

use super::window::Placement;

#[derive(Default)]
pub struct LiveEndpoints {
    states: RwLock<HashMap<String, Arc<EndpointState>>>,
}

#[derive(Default)]
pub struct EndpointState {
    in_flight: AtomicU64,
    cooling_until: Mutex<Option<Instant>>,
}

impl EndpointState {
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn cooling(&self, now: Instant) -> bool {
        self.cooling_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some_and(|until| until > now)
    }
}

/// One request in flight through an endpoint, until dropped.
pub struct InFlight(Arc<EndpointState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl LiveEndpoints {
    pub fn state(&self, id: &str) -> Arc<EndpointState> {
        if let Some(state) = self.read().get(id) {
            return state.clone();
        }
        self.states
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Arc<EndpointState>>> {
        self.states
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a request in flight through `id` until the guard is dropped.
    pub fn start(&self, id: &str) -> InFlight {
        let state = self.state(id);
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(state)
    }

    pub fn in_flight(&self, id: &str) -> u64 {
        self.read().get(id).map_or(0, |state| state.in_flight())
    }

    /// Leaves `id` out of planning and routing until `until`.
    pub fn cool_down(&self, id: &str, until: Instant) {
        *self
            .state(id)
            .cooling_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(until);
    }

    pub fn cooling(&self, id: &str, now: Instant) -> bool {
        self.read().get(id).is_some_and(|state| state.cooling(now))
    }

    /// Forgets endpoints that are no longer in the config.
    pub fn retain(&self, endpoints: &[Endpoint]) {
        self.states
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|id, _| endpoints.iter().any(|e| &e.id == id));
    }

    /// Indices of the endpoints a request may be sent to now: those not cooling down, or all of
    /// them when every one is (a cool-down must never make the whole fleet unusable).
    pub fn usable(&self, endpoints: &[Endpoint], now: Instant) -> Vec<usize> {
        let usable: Vec<usize> = (0..endpoints.len())
            .filter(|&i| !self.cooling(&endpoints[i].id, now))
            .collect();
        if usable.is_empty() {
            (0..endpoints.len()).collect()
        } else {
            usable
        }
    }

    /// Where a placed request goes: its assigned replica while it is usable, else the first of
    /// its group's fallbacks (where every member goes); without affinity, the usable candidate
    /// with the fewest requests in flight (ties: the lower id).
    pub fn destination(&self, placement: &Placement, now: Instant) -> Option<usize> {
        let endpoints = &placement.snapshot.config.endpoints;
        let candidates = self.candidates(placement, now);
        if let Some(assigned) = placement.assigned {
            if candidates.contains(&assigned) {
                return Some(assigned);
            }
            return self.fallbacks(placement, &[assigned], now).first().copied();
        }
        self.by_load(endpoints, now, |i| candidates.contains(&i))
            .first()
            .copied()
    }

    /// The usable endpoints that `allowed` lets through, fewest requests in flight first (ties:
    /// the lower id).
    pub fn by_load(
        &self,
        endpoints: &[Endpoint],
        now: Instant,
        allowed: impl Fn(usize) -> bool,
    ) -> Vec<usize> {
        let mut order: Vec<usize> = self
            .usable(endpoints, now)
            .into_iter()
            .filter(|&i| allowed(i))
            .collect();
        order.sort_by_cached_key(|&i| (self.in_flight(&endpoints[i].id), endpoints[i].id.clone()));
        order
    }

    /// The usable candidates of a placed request other than `tried`, in the order to try them:
    /// by rendezvous hashing of the request's group over endpoint ids, so that every member of
    /// a group that fails over from one replica lands on the same next one.
    pub fn fallbacks(&self, placement: &Placement, tried: &[usize], now: Instant) -> Vec<usize> {
        let endpoints = &placement.snapshot.config.endpoints;
        let mut order: Vec<(u64, usize)> = self
            .candidates(placement, now)
            .into_iter()
            .filter(|i| !tried.contains(i))
            .map(|i| (rendezvous(placement.group, &endpoints[i].id), i))
            .collect();
        order.sort_unstable_by(|a, b| b.cmp(a));
        order.into_iter().map(|(_, i)| i).collect()
    }

    /// The usable endpoints the request may use.
    fn candidates(&self, placement: &Placement, now: Instant) -> Vec<usize> {
        let endpoints = &placement.snapshot.config.endpoints;
        self.usable(endpoints, now)
            .into_iter()
            .filter(|&i| {
                placement
                    .endpoints
                    .as_ref()
                    .is_none_or(|ids| ids.contains(&endpoints[i].id))
            })
            .collect()
    }
}

/// The weight of `id` for `group` in rendezvous (highest random weight) hashing.
fn rendezvous(group: u64, id: &str) -> u64 {
    let mut hasher = xxhash_rust::xxh64::Xxh64::new(group);
    hasher.update(id.as_bytes());
    hasher.digest()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::config_store::Snapshot;
    use crate::core::metrics::SealReason;
    use burst_prefix_api::ProducerConfig;
    use std::time::Duration;

    fn placement(assigned: Option<usize>, group: u64) -> Placement {
        let mut yaml = String::from("endpoints:\n");
        for i in 0..5 {
            yaml.push_str(&format!("  - {{id: e{i}, address: '10.0.0.{i}:80'}}\n"));
        }
        Placement {
            assigned,
            total_blocks: 1,
            group,
            endpoints: None,
            window_id: 1,
            window_size: 1,
            waited: Duration::ZERO,
            sealed_by: SealReason::Timer,
            snapshot: Arc::new(Snapshot::new(ProducerConfig::from_yaml(&yaml).unwrap(), 1)),
            memory: None,
        }
    }

    #[test]
    fn the_assigned_replica_unless_it_cools_down_then_the_least_busy() {
        let live = LiveEndpoints::default();
        let now = Instant::now();
        assert_eq!(live.destination(&placement(Some(3), 7), now), Some(3));
        let _busy = [live.start("e0"), live.start("e1")];
        assert_eq!(live.destination(&placement(None, 7), now), Some(2));
        live.cool_down("e3", now + Duration::from_secs(1));
        live.cool_down("e2", now + Duration::from_secs(1));
        // The assigned one cools down: the group's first fallback, whoever asks.
        let fallback = live.fallbacks(&placement(Some(3), 7), &[3], now)[0];
        assert_eq!(
            live.destination(&placement(Some(3), 7), now),
            Some(fallback)
        );
        assert!(![2, 3].contains(&fallback));
        assert_eq!(live.destination(&placement(None, 7), now), Some(4));
        // Cooled down: usable again.
        assert_eq!(
            live.destination(&placement(Some(3), 7), now + Duration::from_secs(2)),
            Some(3)
        );
    }

    #[test]
    fn members_of_a_group_fail_over_together_and_groups_spread() {
        let live = LiveEndpoints::default();
        let now = Instant::now();
        let first = live.fallbacks(&placement(Some(0), 42), &[0], now);
        assert_eq!(first.len(), 4);
        assert!(!first.contains(&0));
        assert_eq!(live.fallbacks(&placement(Some(0), 42), &[0], now), first);
        let nexts: std::collections::HashSet<usize> = (0..64)
            .map(|group| live.fallbacks(&placement(Some(0), group), &[0], now)[0])
            .collect();
        assert!(
            nexts.len() > 1,
            "every group failed over to the same replica"
        );
    }

    #[test]
    fn in_flight_counts_until_dropped_and_a_fleet_never_cools_down_whole() {
        let live = LiveEndpoints::default();
        let guard = live.start("e1");
        assert_eq!(live.in_flight("e1"), 1);
        drop(guard);
        assert_eq!(live.in_flight("e1"), 0);
        let endpoints = &placement(None, 0).snapshot.config.endpoints;
        let now = Instant::now();
        for e in endpoints {
            live.cool_down(&e.id, now + Duration::from_secs(1));
        }
        assert_eq!(live.usable(endpoints, now).len(), 5);
    }
}
