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
