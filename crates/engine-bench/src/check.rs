//! The simulator checked against the engine: the same prompts through the simulator's model of
//! the same routes, its prefill against what the engine computed.

use burst_prefix_api::PlannerConfig;
use burst_prefix_simulator::policy::{Burst, LeastLoaded, Policy, RoundRobin};
use burst_prefix_simulator::simulate::{simulate_on_slots, Cluster, Slots};
use burst_prefix_simulator::workload::hash_steps;

use crate::report::{RouteFigures, SimulatorCheck};
use crate::run::Route;

/// The simulator's policy for a route: `burst-nomem` for memory off, `burst` (the memory of
/// `config`, its clock advanced by `step_ms` a step) for memory on.
fn policy(route: Route, replicas: usize, config: &PlannerConfig, step_ms: u64) -> Box<dyn Policy> {
    let burst = |memory| Box::new(Burst::new(replicas, config.plan_params(), memory, step_ms));
    match route {
        Route::RoundRobin => Box::new(RoundRobin::new(replicas)),
        Route::LeastLoaded => Box::new(LeastLoaded::new(replicas)),
        Route::ProxyMemoryOff => burst(None),
        Route::ProxyMemoryOn => burst(config.memory_settings()),
    }
}

/// For every measured route: the simulator's prefill on `steps` against the engine's, with the
/// simulator's published model (one request at a time per replica: "blocks") and with the
/// engine's slots ("slots"). `config` is the memory-on proxy's; a step lasts what the route's
/// steps took on average plus `pause_ms`, so the memory's load decays as the proxy's did.
pub fn check(
    steps: &[Vec<Vec<u32>>],
    measured: &[RouteFigures],
    replicas: usize,
    slots: Slots,
    cache_blocks: usize,
    config: &PlannerConfig,
    pause_ms: u64,
) -> Vec<SimulatorCheck> {
    let hashed = &hash_steps(steps, config.block_spec());
    let cluster = Cluster {
        replicas,
        cache_blocks,
    };
    measured
        .iter()
        .flat_map(|figures| {
            let one = Slots {
                per_replica: 1,
                overhead_tokens: 0,
            };
            [("blocks", one), ("slots", slots)]
                .into_iter()
                .map(move |(model, slots)| {
                    let step_ms = (figures.wall_ms / steps.len().max(1) as f64) as u64 + pause_ms;
                    let mut policy = policy(figures.route, replicas, config, step_ms);
                    let outcome = simulate_on_slots(hashed, cluster, slots, policy.as_mut());
                    SimulatorCheck {
                        route: figures.route,
                        model,
                        simulated_tokens: outcome.prefill_tokens,
                        measured_tokens: figures.computed_tokens,
                    }
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_api::ProducerConfig;

    fn figures(route: Route) -> RouteFigures {
        RouteFigures {
            route,
            name: route.name(),
            computed_tokens: 1_000,
            ttft_p50_ms: 1.0,
            ttft_p99_ms: 1.0,
            wall_ms: 1_000.0,
            imbalance: 1.0,
        }
    }

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
        let config = ProducerConfig::from_yaml(
            "blockSizeTokens: 64\nbalanceBy: tokens\nmemory: {enabled: true}\nendpoints: []\n",
        )
        .unwrap()
        .planner;
        let slots = Slots {
            per_replica: 1,
            overhead_tokens: 0,
        };
        let checks = check(
            &steps,
            &[
                figures(Route::ProxyMemoryOff),
                figures(Route::ProxyMemoryOn),
            ],
            2,
            slots,
            1_000,
            &config,
            0,
        );
        assert_eq!(checks.len(), 4, "both routes, both models");
        let simulated = |route, model| {
            checks
                .iter()
                .find(|c| c.route == route && c.model == model)
                .unwrap()
                .simulated_tokens
        };
        let first_turns = (8 * 64 + 10 * 64) as u64;
        let new_blocks = 6 * 64;
        assert_eq!(
            simulated(Route::ProxyMemoryOn, "blocks"),
            first_turns + new_blocks,
            "with memory, every later turn computes only its new block"
        );
        assert!(
            simulated(Route::ProxyMemoryOff, "blocks") >= simulated(Route::ProxyMemoryOn, "blocks")
        );
    }
}
