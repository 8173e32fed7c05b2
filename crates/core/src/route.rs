//! Stage 4 of the path, **route** (docs/architecture.md): where a request goes once placed, the
//! same for every front-end, and the [`Handle`] its front-end holds until its answer ends.
//!
//! The [`Route`]: its assigned endpoint while that is usable, else the first of its group's
//! fallbacks (so that every member of a group fails over to the same replica); without affinity,
//! the usable candidate with the fewest requests in flight. Then the fallbacks, in the order to
//! try them (docs/behaviour.md §8).
//!
//! The [`Handle`] is the request's one completion hook: while it lives the request counts in
//! flight on the endpoint it is sent to (planning takes the count as running requests, routing
//! by load reads it), a front-end reports through it what each attempt showed of an endpoint's
//! health (the cool-down), and when it is dropped the request is finished once: its count ends
//! and, placed on arrival, its placement leaves the work in flight.

use std::sync::Arc;
use std::time::Instant;

use burst_prefix_api::Endpoint;

use crate::config_store::Snapshot;
use crate::live::{Attempted, CoolDown, CooldownReason, Counted, LiveEndpoints};
use crate::place::{Completion, Placement};

/// The endpoints to send a request to, in order: the pick, then fallbacks.
#[derive(Clone, Debug)]
pub struct Route {
    snapshot: Arc<Snapshot>,
    /// Indices into the snapshot's endpoints; never empty.
    order: Vec<usize>,
}

impl Route {
    /// The endpoint to send to first.
    pub fn first(&self) -> &Endpoint {
        &self.snapshot.config.endpoints[self.order[0]]
    }

    /// Every endpoint of the route, the pick first.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = &Endpoint> + '_ {
        self.order
            .iter()
            .map(|&i| &self.snapshot.config.endpoints[i])
    }

    /// `ip:port` of every endpoint of the route, comma-separated (a gateway's destination list).
    pub fn addresses(&self) -> String {
        let addresses: Vec<&str> = self.endpoints().map(|e| e.address.as_str()).collect();
        addresses.join(",")
    }
}

/// A routed request's hold on what the producer knows live of each endpoint, until its answer
/// ends (dropped).
pub struct Handle {
    route: Route,
    live: Arc<LiveEndpoints>,
    /// Counted in flight on this endpoint.
    sending_to: Option<(String, Counted)>,
    finish: Option<Completion>,
    /// The answer's length in tokens, once its front-end saw it.
    answer_tokens: Option<u32>,
}

impl Handle {
    /// A handle on `route`, counted in flight on its first endpoint from now.
    pub(crate) fn new(route: Route, live: Arc<LiveEndpoints>, finish: Option<Completion>) -> Self {
        let mut handle = Handle {
            route,
            live,
            sending_to: None,
            finish,
            answer_tokens: None,
        };
        let first = handle.route.first().id.clone();
        handle.send_to(&first);
        handle
    }

    pub fn route(&self) -> &Route {
        &self.route
    }

    /// The answer had `tokens` tokens (what its usage or its stream said): the placer learns
    /// from it when the request finishes (docs/behaviour.md §4, "Time").
    pub fn answered(&mut self, tokens: u32) {
        self.answer_tokens = Some(tokens);
    }

    /// The request is sent to endpoint `id` now (a retry, or where the data plane says it was
    /// served): counted in flight there instead.
    pub fn send_to(&mut self, id: &str) {
        if self.sending_to.as_ref().is_some_and(|(on, _)| on == id) {
            return;
        }
        self.sending_to = Some((id.to_string(), self.live.start(id)));
    }

    /// The endpoint of the route's config at `address` (`ip:port`): the data plane says it
    /// served the request, which counts in flight there from now.
    pub fn served_at(&mut self, address: &str) -> Option<Endpoint> {
        let endpoint = self
            .route
            .snapshot
            .config
            .endpoints
            .iter()
            .find(|e| e.address == address)?
            .clone();
        self.send_to(&endpoint.id);
        Some(endpoint)
    }

    /// Records what an attempt to send the request to endpoint `id` showed; when it says the
    /// endpoint is unwell (docs/behaviour.md §8), leaves it out of planning and routing for
    /// `cool_down.duration`, and says why.
    pub fn attempted(
        &self,
        id: &str,
        attempted: Attempted,
        cool_down: CoolDown,
    ) -> Option<CooldownReason> {
        let reason = self
            .live
            .attempted(id, attempted, cool_down.after_failures)?;
        self.live.cool_down(id, Instant::now() + cool_down.duration);
        Some(reason)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.sending_to = None;
        if let Some(finish) = self.finish.take() {
            finish.finish(self.answer_tokens);
        }
    }
}

/// The route of a placed request with at most `fallbacks` fallbacks; `None` when none of its
/// candidates is in the config.
pub(crate) fn of_placement(
    live: &LiveEndpoints,
    placement: &Placement,
    fallbacks: usize,
    now: Instant,
) -> Option<Route> {
    let endpoints = &placement.snapshot.config.endpoints;
    let candidates: Vec<usize> = live
        .usable(endpoints, now)
        .into_iter()
        .filter(|&i| {
            placement
                .endpoints
                .as_ref()
                .is_none_or(|ids| ids.contains(&endpoints[i].id))
        })
        .collect();
    let first = match placement.assigned {
        Some(assigned) if candidates.contains(&assigned) => assigned,
        Some(assigned) => {
            *by_rendezvous(placement.group, endpoints, &candidates, &[assigned], 1).first()?
        }
        None => *by_load(live, endpoints, candidates.clone()).first()?,
    };
    let mut order = vec![first];
    let mut tried = vec![first];
    tried.extend(placement.assigned);
    order.extend(by_rendezvous(
        placement.group,
        endpoints,
        &candidates,
        &tried,
        fallbacks,
    ));
    Some(Route {
        snapshot: placement.snapshot.clone(),
        order,
    })
}

/// The route of a request routed without looking at a prompt (`GET /v1/models`, a body-less
/// request at the endpoint picker): the usable endpoints whose address `subset` allows (`None`:
/// all), fewest requests in flight first, at most `count`; `None` when none is allowed.
pub(crate) fn by_load_only(
    live: &LiveEndpoints,
    snapshot: &Arc<Snapshot>,
    subset: Option<&[String]>,
    count: usize,
    now: Instant,
) -> Option<Route> {
    let endpoints = &snapshot.config.endpoints;
    let allowed = live
        .usable(endpoints, now)
        .into_iter()
        .filter(|&i| subset.is_none_or(|s| s.contains(&endpoints[i].address)))
        .collect();
    let mut order = by_load(live, endpoints, allowed);
    order.truncate(count.max(1));
    (!order.is_empty()).then(|| Route {
        snapshot: snapshot.clone(),
        order,
    })
}

/// `candidates`, fewest requests in flight first (ties: the lower id).
fn by_load(live: &LiveEndpoints, endpoints: &[Endpoint], mut candidates: Vec<usize>) -> Vec<usize> {
    candidates.sort_by_cached_key(|&i| (live.in_flight(&endpoints[i].id), endpoints[i].id.clone()));
    candidates
}

/// The first `count` of `candidates` other than `tried`, by rendezvous hashing of `group` over
/// endpoint ids, so that every member of a group that fails over from one replica lands on the
/// same next one.
fn by_rendezvous(
    group: u64,
    endpoints: &[Endpoint],
    candidates: &[usize],
    tried: &[usize],
    count: usize,
) -> Vec<usize> {
    if count == 0 {
        return Vec::new();
    }
    let mut order: Vec<(u64, usize)> = candidates
        .iter()
        .filter(|i| !tried.contains(i))
        .map(|&i| (rendezvous(group, &endpoints[i].id), i))
        .collect();
    let highest_first = |a: &(u64, usize), b: &(u64, usize)| b.cmp(a);
    // Only the first `count` are ever tried: a large fleet is not sorted whole.
    if order.len() > count {
        order.select_nth_unstable_by(count - 1, highest_first);
        order.truncate(count);
    }
    order.sort_unstable_by(highest_first);
    order.into_iter().map(|(_, i)| i).collect()
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
    use crate::place::SealReason;
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
            finish: None,
        }
    }

    fn ids(route: &Route) -> Vec<&str> {
        route.endpoints().map(|e| e.id.as_str()).collect()
    }

    fn first(live: &LiveEndpoints, placement: &Placement, now: Instant) -> String {
        of_placement(live, placement, 0, now)
            .unwrap()
            .first()
            .id
            .clone()
    }

    #[test]
    fn the_assigned_replica_unless_it_cools_down_then_the_least_busy() {
        let live = LiveEndpoints::default();
        let now = Instant::now();
        assert_eq!(first(&live, &placement(Some(3), 7), now), "e3");
        let _busy = [live.start("e0"), live.start("e1")];
        assert_eq!(first(&live, &placement(None, 7), now), "e2");
        live.cool_down("e3", now + Duration::from_secs(1));
        live.cool_down("e2", now + Duration::from_secs(1));
        // The assigned one cools down: the group's first fallback, whoever asks.
        let route = of_placement(&live, &placement(Some(3), 7), 4, now).unwrap();
        let order = ids(&route);
        assert_eq!(order.len(), 3, "{order:?}");
        assert!(
            !order.contains(&"e2") && !order.contains(&"e3"),
            "{order:?}"
        );
        assert_eq!(first(&live, &placement(Some(3), 7), now), order[0]);
        assert_eq!(first(&live, &placement(None, 7), now), "e4");
        // Cooled down: usable again.
        assert_eq!(
            first(&live, &placement(Some(3), 7), now + Duration::from_secs(2)),
            "e3"
        );
    }

    #[test]
    fn members_of_a_group_fail_over_together_and_groups_spread() {
        let live = LiveEndpoints::default();
        let now = Instant::now();
        let route = of_placement(&live, &placement(Some(0), 42), 4, now).unwrap();
        let order = ids(&route);
        assert_eq!(order.len(), 5);
        assert_eq!(order[0], "e0");
        assert_eq!(
            ids(&of_placement(&live, &placement(Some(0), 42), 4, now).unwrap()),
            order
        );
        let nexts: std::collections::HashSet<String> = (0..64)
            .map(|group| {
                let route = of_placement(&live, &placement(Some(0), group), 1, now).unwrap();
                ids(&route)[1].to_string()
            })
            .collect();
        assert!(
            nexts.len() > 1,
            "every group failed over to the same replica"
        );
    }

    #[test]
    fn routes_without_a_prompt_go_by_load_within_the_subset() {
        let live = LiveEndpoints::default();
        let now = Instant::now();
        let snapshot = placement(None, 0).snapshot;
        let _busy = live.start("e0");
        let route = by_load_only(&live, &snapshot, None, 2, now).unwrap();
        assert_eq!(ids(&route), vec!["e1", "e2"]);
        let subset = vec!["10.0.0.0:80".to_string(), "10.0.0.4:80".to_string()];
        let route = by_load_only(&live, &snapshot, Some(&subset), 4, now).unwrap();
        assert_eq!(ids(&route), vec!["e4", "e0"]);
        assert_eq!(route.addresses(), "10.0.0.4:80,10.0.0.0:80");
        assert!(by_load_only(&live, &snapshot, Some(&[]), 4, now).is_none());
    }
}
