//! What the producer knows live about each endpoint, beyond the config: requests in flight
//! through it (the proxy and the endpoint picker count them) and a cool-down after it failed
//! (passive health, like Envoy's outlier detection). Planning uses only the endpoints that are
//! not cooling down, and takes the in-flight counts as running requests.
//!
//! A cool-down follows what says a replica is unwell, never what one request made it answer: a
//! refused connection cools it at once; 502, 503 or 504 answers cool it only after several in a
//! row, and answers to retries do not count (a request that fails everywhere it is sent would
//! otherwise cool every replica it is retried on).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use burst_prefix_api::Endpoint;

#[derive(Default)]
pub struct LiveEndpoints {
    states: RwLock<HashMap<String, Arc<EndpointState>>>,
    /// Cool-downs begun so far: who caches the usable set knows when to look again.
    cool_downs: AtomicU64,
    /// When the last cool-down to end ends: none is cooling after it, and asking is then free
    /// of a lookup per endpoint.
    cooling_ends: Mutex<Option<Instant>>,
}

#[derive(Default)]
struct EndpointState {
    in_flight: AtomicU64,
    cooling_until: Mutex<Option<Instant>>,
    /// 502, 503 or 504 answers to first attempts in a row.
    failed_in_a_row: AtomicU32,
}

/// What an attempt to send a request to an endpoint showed of its health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempted {
    /// No connection: the replica is down or gone.
    Unreachable,
    /// It answered 502, 503 or 504; `retry` when the request had failed elsewhere first.
    Failed { retry: bool },
    /// It answered otherwise.
    Answered,
}

/// When an endpoint that failed is left out of planning and routing (a front-end's settings:
/// the proxy's `--upstream-cooldown-ms` and `--upstream-cooldown-after`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoolDown {
    /// How long it is left out.
    pub duration: Duration,
    /// Answers 502, 503 or 504 in a row (to first attempts) after which it is; a refused
    /// connection cools it at once.
    pub after_failures: u32,
}

/// Why an endpoint was cooled down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CooldownReason {
    Unreachable,
    FailedInARow,
}

impl CooldownReason {
    pub fn label(self) -> &'static str {
        match self {
            CooldownReason::Unreachable => "unreachable",
            CooldownReason::FailedInARow => "failed_in_a_row",
        }
    }
}

impl EndpointState {
    fn cooling(&self, now: Instant) -> bool {
        self.cooling_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some_and(|until| until > now)
    }
}

/// One request counted in flight through an endpoint, until dropped (held by a route's handle).
pub struct Counted(Arc<EndpointState>);

impl Drop for Counted {
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

    /// Counts a request in flight through `id` until the count is dropped.
    pub fn start(&self, id: &str) -> Counted {
        let state = self.state(id);
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        Counted(state)
    }

    pub fn in_flight(&self, id: &str) -> u64 {
        self.read()
            .get(id)
            .map_or(0, |state| state.in_flight.load(Ordering::Relaxed))
    }

    /// Cool-downs begun so far.
    pub fn cool_downs(&self) -> u64 {
        self.cool_downs.load(Ordering::Relaxed)
    }

    /// Whether any of `endpoints` is cooling down at `now`.
    pub fn any_cooling(&self, endpoints: &[Endpoint], now: Instant) -> bool {
        self.some_may_be_cooling(now) && endpoints.iter().any(|e| self.cooling(&e.id, now))
    }

    fn some_may_be_cooling(&self, now: Instant) -> bool {
        self.cooling_ends
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .is_some_and(|ends| ends > now)
    }

    /// Leaves `id` out of planning and routing until `until`.
    pub fn cool_down(&self, id: &str, until: Instant) {
        self.cool_downs.fetch_add(1, Ordering::Relaxed);
        let mut ends = self
            .cooling_ends
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *ends = Some(ends.map_or(until, |ends| ends.max(until)));
        drop(ends);
        *self
            .state(id)
            .cooling_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(until);
    }

    /// Records what an attempt showed of `id`; whether it now cools down, and why. It cools
    /// down when unreachable, or on its `failed_in_a_row`-th failure in a row to a first attempt.
    pub fn attempted(
        &self,
        id: &str,
        attempted: Attempted,
        failed_in_a_row: u32,
    ) -> Option<CooldownReason> {
        let state = self.state(id);
        match attempted {
            Attempted::Unreachable => Some(CooldownReason::Unreachable),
            Attempted::Failed { retry: true } => None,
            Attempted::Failed { retry: false } => {
                let failed = state.failed_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
                (failed >= failed_in_a_row).then(|| {
                    state.failed_in_a_row.store(0, Ordering::Relaxed);
                    CooldownReason::FailedInARow
                })
            }
            Attempted::Answered => {
                state.failed_in_a_row.store(0, Ordering::Relaxed);
                None
            }
        }
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
        if !self.some_may_be_cooling(now) {
            return (0..endpoints.len()).collect();
        }
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
    fn only_an_unreachable_replica_or_failures_in_a_row_to_first_attempts_cool_it_down() {
        let live = LiveEndpoints::default();
        let failed = |retry| Attempted::Failed { retry };
        assert_eq!(
            live.attempted("a", Attempted::Unreachable, 3),
            Some(CooldownReason::Unreachable)
        );
        assert_eq!(live.attempted("a", failed(false), 3), None);
        assert_eq!(live.attempted("a", failed(false), 3), None);
        assert_eq!(
            live.attempted("a", failed(true), 3),
            None,
            "a retry does not count"
        );
        assert_eq!(
            live.attempted("a", failed(false), 3),
            Some(CooldownReason::FailedInARow)
        );
        // Counted afresh after a cool-down, and an answer in between resets the count.
        assert_eq!(live.attempted("a", failed(false), 3), None);
        assert_eq!(live.attempted("a", Attempted::Answered, 3), None);
        assert_eq!(live.attempted("a", failed(false), 3), None);
        assert_eq!(live.attempted("a", failed(false), 3), None);
        assert_eq!(
            live.attempted("b", failed(false), 1),
            Some(CooldownReason::FailedInARow)
        );
    }

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
