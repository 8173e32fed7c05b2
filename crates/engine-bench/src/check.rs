//! The simulator checked against the engine: the same prompts through the simulator's model of
//! the same routes, its prefill against what the engine computed.

use burst_prefix_planner::BlockSpec;
use burst_prefix_simulator::policy::{Burst, LeastLoaded, Policy, RoundRobin};
use burst_prefix_simulator::simulate::{simulate_on_slots, Cluster, Slots};
use burst_prefix_simulator::workload::hash_steps;

use crate::report::{RouteFigures, SimulatorCheck};
use crate::routes::{Direct, Route, RouteKind};

/// The simulator's policy for a route: round-robin, least-loaded, or `burst` with the proxy's
/// planner config (its memory, if on, with its clock advanced by `step_ms` a step); none for a
/// peer router, and none for a zero-wait proxy (the simulator plans each step as one window, so
/// it does not model placing each request on arrival).
fn policy(route: &Route, replicas: usize, step_ms: u64) -> Option<Box<dyn Policy>> {
    Some(match &route.kind {
        RouteKind::Direct(Direct::RoundRobin) => Box::new(RoundRobin::new(replicas)),
        RouteKind::Direct(Direct::LeastLoaded) => Box::new(LeastLoaded::new(replicas)),
        RouteKind::Proxy { .. } | RouteKind::ProduceThenDirect { .. } => {
            let config = route.planner()?;
            if config.placement() == burst_prefix_api::Placement::OnArrival {
                return None;
            }
            Box::new(Burst::new(
                replicas,
                config.plan_params(),
                config.memory_settings(),
                step_ms,
            ))
        }
        RouteKind::Peer { .. } => return None,
    })
}

/// For every measured route the simulator models: its prefill on `steps` against the
/// engine's, with the simulator's published model (one request at a time per replica:
/// "blocks") and with the engine's slots ("slots"). Prompts are hashed as `spec` says; a step lasts what the route's steps took on average plus `pause_ms`, so the memory's
/// load decays as the proxy's did.
#[allow(clippy::too_many_arguments)]
pub fn check(
    steps: &[Vec<Vec<u32>>],
    measured: &[(&Route, &RouteFigures)],
    replicas: usize,
    slots: Slots,
    cache_blocks: usize,
    spec: BlockSpec,
    pause_ms: u64,
) -> Vec<SimulatorCheck> {
    let hashed = &hash_steps(steps, spec);
    let cluster = Cluster {
        replicas,
        cache_blocks,
    };
    let mut checks = Vec::new();
    for (route, figures) in measured {
        let one = Slots {
            per_replica: 1,
            overhead_tokens: 0,
        };
        for (model, slots) in [("blocks", one), ("slots", slots)] {
            let step_ms = (figures.wall_ms / steps.len().max(1) as f64) as u64 + pause_ms;
            let Some(mut policy) = policy(route, replicas, step_ms) else {
                continue;
            };
            let outcome = simulate_on_slots(hashed, cluster, slots, policy.as_mut());
            checks.push(SimulatorCheck {
                route: route.name.clone(),
                model,
                simulated_tokens: outcome.prefill_tokens,
                measured_tokens: figures.computed_tokens,
            });
        }
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::{parse, Placeholders};

    fn figures(route: &Route) -> RouteFigures {
        RouteFigures {
            route: route.name.clone(),
            ours: true,
            computed_tokens: 1_000,
            busiest_sum: 500,
            answers_computed_tokens: 1_000,
            answers_without_usage: 0,
            ttft_p50_ms: 1.0,
            ttft_p99_ms: 1.0,
            wall_ms: 1_000.0,
            placements: Vec::new(),
            memory_in_use: None,
            baseline_of: None,
        }
    }

    const ROUTES: &str = r#"
- {name: round-robin, direct: round-robin}
- {name: peer, sglangRouter: []}
- name: "off"
  proxy: "windowDurationMs: 100\nblockSizeTokens: 64\nbalanceBy: tokens\nmemory: {enabled: false}"
- name: "on"
  proxy: "windowDurationMs: 100\nblockSizeTokens: 64\nbalanceBy: tokens\nmemory: {enabled: true}"
"#;

    #[test]
    fn memory_on_is_simulated_with_memory() {
        // Two sessions on 2 replicas, each resending its 8-block history plus one new block:
        // with memory the second turn goes where its history is, without it the planner
        // balances afresh and may swap them.
        let session = |seed: u32, blocks: u32| -> Vec<u32> {
            (0..blocks * 64).map(|i| seed * 100_000 + i).collect()
        };
        let steps: Vec<Vec<Vec<u32>>> = (8..12)
            .map(|blocks| vec![session(1, blocks), session(2, blocks + 2)])
            .collect();
        let placeholders = Placeholders {
            cache_tokens_per_replica: 64_000,
            kv_events_bind: "tcp://127.0.0.1:5557".into(),
            tokenizer_path: "/models/tiny".into(),
        };
        let routes = parse(ROUTES, &placeholders).unwrap();
        let figures: Vec<RouteFigures> = routes.iter().map(figures).collect();
        let measured: Vec<(&Route, &RouteFigures)> = routes.iter().zip(&figures).collect();
        let slots = Slots {
            per_replica: 1,
            overhead_tokens: 0,
        };
        let checks = check(&steps, &measured, 2, slots, 1_000, BlockSpec::new(64, 0), 0);
        assert_eq!(checks.len(), 6, "3 routes (not the peer) x both models");
        let simulated = |route: &str, model| {
            checks
                .iter()
                .find(|c| c.route == route && c.model == model)
                .unwrap()
                .simulated_tokens
        };
        let first_turns = (8 * 64 + 10 * 64) as u64;
        let new_blocks = 6 * 64;
        assert_eq!(
            simulated("on", "blocks"),
            first_turns + new_blocks,
            "with memory, every later turn computes only its new block"
        );
        assert!(simulated("off", "blocks") >= simulated("on", "blocks"));
    }
}
