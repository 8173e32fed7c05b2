//! What the producer knows live about each endpoint, beyond the config: requests in flight
//! through it (the proxy and the endpoint picker count them) and a cool-down after it failed
//! (passive health, like Envoy's outlier detection). Planning uses only the endpoints that are
//! not cooling down, and takes the in-flight counts as running requests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use burst_prefix_api::Endpoint;

#[derive(Default)]
pub struct LiveEndpoints {
    states: RwLock<HashMap<String, Arc<EndpointState>>>,
}

#[derive(Default)]
struct EndpointState {
    in_flight: AtomicU64,
    cooling_until: Mutex<Option<Instant>>,
}

impl EndpointState {
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
    fn state(&self, id: &str) -> Arc<EndpointState> {
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
        self.read()
            .get(id)
            .map_or(0, |state| state.in_flight.load(Ordering::Relaxed))
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_api::ProducerConfig;
    use std::time::Duration;

    #[test]
    fn in_flight_counts_until_dropped_and_a_fleet_never_cools_down_whole() {
        let live = LiveEndpoints::default();
        let guard = live.start("e1");
        assert_eq!(live.in_flight("e1"), 1);
        drop(guard);
        assert_eq!(live.in_flight("e1"), 0);
        let config =
            ProducerConfig::from_yaml("endpoints:\n  - {id: e0, address: '10.0.0.1:80'}\n  - {id: e1, address: '10.0.0.2:80'}\n")
                .unwrap();
        let now = Instant::now();
        live.cool_down("e0", now + Duration::from_secs(1));
        assert_eq!(live.usable(&config.endpoints, now), vec![1]);
        live.cool_down("e1", now + Duration::from_secs(1));
        assert_eq!(live.usable(&config.endpoints, now), vec![0, 1]);
        assert_eq!(
            live.usable(&config.endpoints, now + Duration::from_secs(2)),
            vec![0, 1]
        );
    }
}
