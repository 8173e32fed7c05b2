//! The simulator checked against the engine: the same prompts through the simulator's model of
//! the same routes, its prefill against what the engine computed.

use burst_prefix_api::PlannerConfig;
use burst_prefix_simulator::policy::{Burst, LeastLoaded, Policy, RoundRobin};
use burst_prefix_simulator::simulate::{simulate_on_slots, Cluster, Slots};
use burst_prefix_simulator::workload::hash_steps;

use crate::report::{RouteFigures, SimulatorCheck};
use crate::run::Route;

/// The simulator's policy for a route, when it has one.
fn policy(route: Route, replicas: usize, config: &PlannerConfig) -> Option<Box<dyn Policy>> {
    match route {
        Route::RoundRobin => Some(Box::new(RoundRobin::new(replicas))),
        Route::LeastLoaded => Some(Box::new(LeastLoaded::new(replicas))),
        Route::ProxyMemoryOff => Some(Box::new(Burst::new(
            replicas,
            config.plan_params(),
            None,
            0,
        ))),
        // The simulator's memory policy arrives with the planner's memory (SPEC §7).
        Route::ProxyMemoryOn => None,
    }
}

/// For every measured route the simulator models: its prefill on `steps` against the engine's,
/// with the simulator's published model (one request at a time per replica: "blocks") and with
/// the engine's slots ("slots").
pub fn check(
    steps: &[Vec<Vec<u32>>],
    measured: &[RouteFigures],
    replicas: usize,
    slots: Slots,
    cache_blocks: usize,
    config: &PlannerConfig,
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
                .filter_map(move |(model, slots)| {
                    let mut policy = policy(figures.route, replicas, config)?;
                    let outcome = simulate_on_slots(hashed, cluster, slots, policy.as_mut());
                    Some(SimulatorCheck {
                        route: figures.route,
                        model,
                        simulated_tokens: outcome.prefill_tokens,
                        measured_tokens: figures.computed_tokens,
                    })
                })
        })
        .collect()
}
