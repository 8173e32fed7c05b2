//! Placement of one window of requests on replicas (docs/behaviour.md §4), and with memory across
//! windows (docs/behaviour.md §7).
//!
//! Requests with identical prompts form groups; with `min_colocate_blocks` (N) > 0, single requests
//! that share their first N blocks with another request become units too. Units are placed one by
//! one, largest first, preferring the replica that already holds the longest prefix of the unit
//! (bounded by a fair share), and filling one replica up to `max_per_replica` (k) members before
//! spilling to the next least-loaded one.
//!
//! With [`Memory`], a replica also holds what its cache model remembers from earlier windows,
//! singles whose prefix a model holds are placed too (warm singles), N counts as at least 1
//! (for single units and the prefix preference), and each replica starts the window with the
//! load it carries over. In tokens mode the fair share then gives way to a cost: each unit starts
//! where it finishes first, paying a price for every block it would prefill again although
//! another replica holds it (`Balance::EarliestFinish`).

mod answer;
mod balance;
mod block_keys;
mod held_blocks;
mod inputs;
mod prefix_holders;
mod recall;
mod unit_placer;
mod units;
mod walk;

use std::collections::HashMap;

pub use answer::{HeldList, HeldPrefixes, PlacementReason, Plan};
pub(crate) use balance::{earliest_finish, Candidate};
pub(crate) use block_keys::BuildBlockHasher;
pub use inputs::{BalanceBy, BatchRequest, PlanParams, Replica};

use answer::NO_LIST;
use balance::{max_share, Balance};
use held_blocks::HeldBlocks;
use recall::{Recall, NO_REPLICA};
use unit_placer::UnitPlacer;
use units::{count_sharers, form_units, most_constrained_first, Unit, UnitKind};

use crate::memory::Memory;

/// Places one window of requests (docs/behaviour.md §4, exactly llm-d's behaviour). Pure and
/// deterministic: the result depends only on the arguments, never on hash iteration order; the
/// order of `replicas` only matters through the indices it gives them.
pub fn assign(batch: &[BatchRequest<'_>], replicas: &[Replica<'_>], params: &PlanParams) -> Plan {
    place_units(batch, replicas, params, None)
}

/// Places one window remembering earlier ones (docs/behaviour.md §7), then records this window in
/// `memory`: every placed request's blocks are touched in its replica's cache model, and each
/// replica's load is carried over, decaying with the memory's half-life. `now_ms` is the caller's
/// clock (any monotonic origin, the same for every call on one memory). Replicas the memory does
/// not know start cold; the ones it knows that are not candidates now keep their models untouched
/// (drop them with [`Memory::retain_replicas`] when they leave for good).
///
/// The touches are merged into the models by [`Memory::settle`], which this function runs first
/// for the window before, unless the caller already has: the plan does not wait for its own
/// window's merge, and a caller with time between windows (after answering this one) settles
/// then.
pub fn assign_with_memory(
    batch: &[BatchRequest<'_>],
    replicas: &[Replica<'_>],
    params: &PlanParams,
    memory: &mut Memory,
    now_ms: u64,
) -> Plan {
    memory.settle();
    let slots: Vec<u32> = replicas.iter().map(|r| memory.slot(r.id)).collect();
    let carried: Vec<f64> = slots
        .iter()
        .map(|&slot| memory.carried_load(slot, now_ms))
        .collect();
    let mut replica_of_slot = vec![NO_REPLICA; memory.slot_count()];
    for (replica, &slot) in slots.iter().enumerate() {
        replica_of_slot[slot as usize] = replica as u32;
    }
    let recall = Recall {
        memory,
        batch,
        slots: &slots,
        replica_of_slot,
        carried: carried.iter().map(|&load| load.round() as u64).collect(),
        looked_up: HashMap::with_capacity_and_hasher(batch.len(), BuildBlockHasher::default()),
        found: Vec::new(),
        once: Vec::new(),
        restricted: batch
            .iter()
            .any(|request| request.allowed_replicas.is_some()),
    };
    let plan = place_units(batch, replicas, params, Some(recall));
    if params.balance_by == BalanceBy::Time {
        // Time mode reads what each replica is busy with from its pace, not a carried load.
        return plan;
    }
    for (replica, &slot) in slots.iter().enumerate() {
        let start = carried[replica].round() as u64;
        let added = plan.loads[replica].saturating_sub(start);
        memory.set_load(slot, carried[replica] + added as f64, now_ms);
    }
    plan
}

/// Forms the window's units and places them in turn; with memory, each unit's blocks are
/// touched in the models of the replicas it was placed on (those its members may use) as it is
/// placed.
fn place_units(
    batch: &[BatchRequest<'_>],
    replicas: &[Replica<'_>],
    params: &PlanParams,
    mut recall: Option<Recall<'_>>,
) -> Plan {
    let n = params.min_colocate_blocks;
    // With memory the prefix preference applies from one block on (docs/behaviour.md §7).
    let prefer_from = match recall {
        Some(_) => Some(n.max(1)),
        None => (n > 0).then_some(n),
    };
    // With memory, N counts as at least 1 for single units too: requests sharing their first
    // block (a system prompt) are placed, so that their next turns find them remembered.
    let unit_n = if recall.is_some() { n.max(1) } else { n };
    let timed = params.balance_by == BalanceBy::Time;
    let mut units = form_units(batch, unit_n, |blocks| {
        recall
            .as_mut()
            .is_some_and(|recall| recall.holds_leading(blocks, n.max(1)))
    });
    let count = |kind| units.iter().filter(|u| u.kind == kind).count();
    let mut plan = Plan {
        assignments: vec![None; batch.len()],
        reasons: vec![None; batch.len()],
        loads: vec![0; replicas.len()],
        group_units: count(UnitKind::Group),
        single_units: count(UnitKind::Single),
        warm_singles: count(UnitKind::Warm),
        held: HeldPrefixes::default(),
    };
    if replicas.is_empty() {
        return plan;
    }
    // With memory and in time mode, units walk the holders of their blocks.
    let walks = recall.is_some() || timed;
    let shared_blocks = match walks {
        true => count_sharers(&mut units),
        false => 0,
    };
    // Each unit lands on at most ceil(members / k) replicas.
    let k = params.max_per_replica.unwrap_or(usize::MAX);
    let replicas_per_unit = |unit: &Unit<'_>| unit.members.len().div_ceil(k).min(replicas.len());
    // The window's own index: with memory, the prefix each unit shares (`UnitPlacer::place`),
    // walked; without, the blocks two units contain, looked up.
    let (walked, held) = match walks {
        true => {
            let pairs = units
                .iter()
                .map(|unit| unit.shared() * replicas_per_unit(unit))
                .sum();
            ((shared_blocks, pairs), HeldBlocks::new(&[], 0, false))
        }
        false => (
            (0, 0),
            HeldBlocks::new(&units, replicas.len(), prefer_from.is_some()),
        ),
    };
    let carried = recall
        .as_ref()
        .map_or_else(|| vec![0; replicas.len()], |r| r.carried.clone());
    let balance = match (&mut recall, params.balance_by) {
        (Some(recall), BalanceBy::Tokens) => {
            most_constrained_first(&mut units, recall);
            Balance::EarliestFinish
        }
        (recall, BalanceBy::Time) => {
            if let Some(recall) = recall {
                most_constrained_first(&mut units, recall);
            }
            Balance::Seconds
        }
        _ => Balance::FairShare {
            max_share: max_share(&units, &carried, params),
        },
    };
    let mut placer = UnitPlacer::new(
        replicas,
        params,
        balance,
        prefer_from,
        carried,
        recall,
        walked,
        held,
    );
    if placer.remembers() {
        plan.held.list_of = vec![NO_LIST; batch.len()];
    }
    for unit in &units {
        placer.place(unit, &mut plan);
    }
    if placer.remembers() {
        // Requests outside every unit: what the replicas hold of them, for their answers.
        for (request, entry) in batch.iter().zip(0..) {
            if plan.held.list_of[entry] == NO_LIST && !request.blocks.is_empty() {
                placer.keep_held_list_of(request.blocks, entry, &mut plan.held);
            }
        }
        plan.held.index();
    }
    plan.loads = placer.into_loads();
    // A request that may not use its assigned replica gets zero everywhere (step 7).
    for (request, entry) in batch.iter().zip(0..) {
        if let (Some(replica), Some(allowed)) = (plan.assignments[entry], request.allowed_replicas)
        {
            if !allowed.contains(&replica) {
                plan.assignments[entry] = None;
                plan.reasons[entry] = None;
                if let Some(list) = plan.held.list_of.get_mut(entry) {
                    *list = NO_LIST;
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests;
