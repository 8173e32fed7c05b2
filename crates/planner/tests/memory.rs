//! Placement with memory across windows (docs/behaviour.md §7).

use burst_prefix_planner::testing::{batch, blocks, memory, replica_ids, replicas};
use burst_prefix_planner::{
    assign, assign_with_memory, BalanceBy, BatchRequest, BlockHash, PlacementReason, PlanParams,
};

/// A conversation's prompt after `turns` turns: a system prompt, then 2 blocks per turn.
fn turn(session: u64, turns: usize) -> Vec<BlockHash> {
    blocks(0, 4, session, turns * 2)
}

#[test]
fn a_second_turn_lands_where_the_first_was_placed() {
    let ids = replica_ids(4);
    let params = PlanParams::default();
    let mut memory = memory(1_000, 1_000);
    // Window 1: four sessions' first turns, each a pair (so that §4 places them).
    let first: Vec<Vec<BlockHash>> = (0..4).flat_map(|s| [turn(s, 1), turn(s, 1)]).collect();
    let plan = assign_with_memory(&batch(&first), &replicas(&ids), &params, &mut memory, 0);
    let served: Vec<usize> = (0..4).map(|s| plan.assignments[2 * s].unwrap()).collect();
    assert_eq!(plan.reasons[0], Some(PlacementReason::LeastLoaded));
    // Window 2: each session's second turn alone, in another order.
    let second: Vec<Vec<BlockHash>> = [2, 0, 3, 1].iter().map(|&s| turn(s, 2)).collect();
    let plan = assign_with_memory(&batch(&second), &replicas(&ids), &params, &mut memory, 50);
    // Singles sharing the system prompt: units (N counts as 1 with memory), placed by memory.
    assert_eq!(plan.single_units + plan.warm_singles, 4);
    for (i, &s) in [2, 0, 3, 1].iter().enumerate() {
        assert_eq!(plan.assignments[i], Some(served[s]), "session {s}");
        assert_eq!(plan.reasons[i], Some(PlacementReason::Memory));
        // Its replica held the first turn's 6 blocks; another holds only the system prompt.
        assert_eq!(plan.held.blocks(i, served[s]), 6);
        assert_eq!(plan.held.blocks(i, served[(s + 1) % 4]), 4);
    }
    // Without memory, a lone second turn has no affinity.
    let plan = assign(&batch(&second), &replicas(&ids), &params);
    assert!(plan.assignments.iter().all(Option::is_none));
    assert_eq!(plan.held.of(0), &[]);
}

#[test]
fn carried_load_spreads_new_work_and_decays() {
    let ids = replica_ids(4);
    let params = PlanParams::default();
    let mut memory = memory(1_000, 100);
    let busy: Vec<Vec<BlockHash>> = vec![vec![1, 2]; 6];
    let plan = assign_with_memory(&batch(&busy), &replicas(&ids), &params, &mut memory, 0);
    assert_eq!(plan.assignments[0], Some(0), "p1 on an empty fleet");
    // Right after, a cold group avoids p1, which carries 6 requests.
    let cold: Vec<Vec<BlockHash>> = vec![vec![7, 8]; 2];
    let plan = assign_with_memory(&batch(&cold), &replicas(&ids), &params, &mut memory, 0);
    assert_eq!(plan.assignments[0], Some(1));
    assert_eq!(plan.loads, vec![6, 2, 0, 0]);
    // Twenty half-lives later the carried load is gone: the tie-break is the id again.
    let other: Vec<Vec<BlockHash>> = vec![vec![9, 10]; 2];
    let plan = assign_with_memory(&batch(&other), &replicas(&ids), &params, &mut memory, 2_000);
    assert_eq!(plan.assignments[0], Some(0));
}

#[test]
fn affinity_yields_to_the_fair_share() {
    let ids = replica_ids(4);
    // Eight sessions all served by p1 earlier (k = -1 groups, one replica): the next turns do
    // not all pile onto p1.
    let params = PlanParams::default();
    let mut memory = memory(10_000, 60_000);
    let replicas = replicas(&ids);
    let only_p1 = &replicas[..1];
    let first: Vec<Vec<BlockHash>> = (0..8).flat_map(|s| [turn(s, 1), turn(s, 1)]).collect();
    assign_with_memory(&batch(&first), only_p1, &params, &mut memory, 0);
    let second: Vec<Vec<BlockHash>> = (0..8).map(|s| turn(s, 2)).collect();
    let plan = assign_with_memory(&batch(&second), &replicas, &params, &mut memory, 10);
    let on_p1 = plan.assignments.iter().filter(|a| **a == Some(0)).count();
    assert!(plan.assignments.iter().all(Option::is_some));
    assert!(on_p1 < 8, "{:?}", plan.assignments);
}

#[test]
fn memory_stays_at_capacity_under_a_stream_of_distinct_prompts() {
    let ids = replica_ids(4);
    let params = PlanParams::default();
    let capacity = 64;
    let mut memory = memory(capacity, 1_000);
    for window in 0..500u64 {
        // 8 distinct pairs of 10 blocks each per window.
        let prompts: Vec<Vec<BlockHash>> = (0..8)
            .flat_map(|g| {
                let blocks: Vec<BlockHash> = (0..10).map(|b| (window * 8 + g) * 100 + b).collect();
                [blocks.clone(), blocks]
            })
            .collect();
        assign_with_memory(
            &batch(&prompts),
            &replicas(&ids),
            &params,
            &mut memory,
            window * 10,
        );
        memory.settle();
        for (_, blocks) in memory.replica_blocks() {
            assert!(blocks <= capacity);
        }
        // The index keeps, besides the held blocks, at most those this window's 80 touches
        // (8 pairs of 10 blocks, each pair on one replica) pushed out: the next merge drops them
        // (each window here is more than a sixteenth of the index, so merges fully).
        assert!(memory.index_entries() <= memory.held_blocks() + 80);
    }
    assert_eq!(memory.held_blocks(), capacity * ids.len());
}

#[test]
fn a_replica_that_leaves_loses_its_model() {
    let ids = replica_ids(4);
    let params = PlanParams::default();
    let mut memory = memory(100, 1_000);
    let pair: Vec<Vec<BlockHash>> = vec![vec![1, 2, 3]; 2];
    let plan = assign_with_memory(&batch(&pair), &replicas(&ids), &params, &mut memory, 0);
    assert_eq!(plan.assignments[0], Some(0));
    memory.retain_replicas(|id| id != "p1");
    assert_eq!(memory.index_entries(), 0);
    let known: Vec<&str> = memory.replica_blocks().map(|(id, _)| id).collect();
    assert!(!known.contains(&"p1"));
    // p1 comes back cold: the lone request finds no model holding its prefix.
    let lone: Vec<Vec<BlockHash>> = vec![vec![1, 2, 3, 4]];
    let plan = assign_with_memory(&batch(&lone), &replicas(&ids), &params, &mut memory, 10);
    assert_eq!(plan.assignments, vec![None]);
}

/// Tokens mode: load and prefill are both blocks.
fn tokens() -> PlanParams {
    PlanParams {
        balance_by: BalanceBy::Tokens,
        ..PlanParams::default()
    }
}

#[test]
fn a_fan_out_copies_its_shared_prefix_once_the_holder_runs_ahead() {
    let ids = replica_ids(4);
    // 64 requests on one 60-block system prompt, 4 blocks of their own each. §4 with N = 60
    // puts all of them on p1 (its share, 64 x 64 / 4 blocks, never binds). With memory the
    // prompt is copied to a second replica once p1 would finish later than a replica that has
    // to prefill it first (and pay its price), and so on.
    let prompts: Vec<Vec<BlockHash>> = (0..64u64)
        .map(|u| (0..60).chain((0..4).map(|b| 1_000 + u * 10 + b)).collect())
        .collect();
    let params = PlanParams {
        min_colocate_blocks: 60,
        ..tokens()
    };
    let without = assign(&batch(&prompts), &replicas(&ids), &params);
    assert!(without.assignments.iter().all(|a| *a == Some(0)));
    assert_eq!(without.loads, vec![60 + 64 * 4, 0, 0, 0]);
    let mut memory = memory(10_000, 0);
    let with = assign_with_memory(&batch(&prompts), &replicas(&ids), &params, &mut memory, 0);
    assert!(with.assignments.iter().all(Option::is_some));
    // Every replica copied the prompt once: the busiest finishes far before p1 alone would.
    assert!(with.loads.iter().all(|&load| load > 60), "{:?}", with.loads);
    assert!(
        *with.loads.iter().max().unwrap() < 60 + 64 * 4 / 2,
        "{:?}",
        with.loads
    );
}

#[test]
fn a_few_new_conversations_on_one_system_prompt_spread_over_the_replicas() {
    let ids = replica_ids(4);
    // Eight first turns on one 8-block system prompt, 2 blocks of their own each, 4 replicas:
    // by the price alone (8 x (0.7 + 12 / 8) = 17.6 to copy the prompt) p1 would take all eight
    // (it finishes the eighth at 24 blocks, before a cold replica's 27.6), and their next turns
    // with them. The pile cap (1.35 x the larger of the mean load and a unit's 10 blocks)
    // stops p1 at two, and each replica given the prompt after it.
    let system: Vec<BlockHash> = (0..8).collect();
    let prompts: Vec<Vec<BlockHash>> = (0..8u64)
        .map(|s| {
            system
                .iter()
                .copied()
                .chain([100 + s * 2, 101 + s * 2])
                .collect()
        })
        .collect();
    let mut memory = memory(10_000, 0);
    let plan = assign_with_memory(&batch(&prompts), &replicas(&ids), &tokens(), &mut memory, 0);
    for replica in 0..4 {
        let sessions = plan
            .assignments
            .iter()
            .filter(|a| **a == Some(replica))
            .count();
        assert_eq!(sessions, 2, "{:?}", plan.assignments);
    }
    assert_eq!(plan.loads, vec![12; 4]);
}

#[test]
fn a_conversation_moves_only_to_a_replica_lighter_by_much_more_than_its_history() {
    let ids = replica_ids(4);
    // Sixteen conversations on p1 (the only replica then), 4 system blocks + 2 of their own
    // each: p1 carries their 36 blocks of prefill into the next window (no decay at the same
    // instant). Eight of them take a turn of 2 blocks: on p1 it finishes at p1's load + 2.
    // On an empty replica at 8 blocks prefilled + the price of the 6 that p1 holds: the 4
    // system blocks (0.7 + 12 / 8 units each) and the 2 of its own (0.7 + 12 / 1 each),
    // 8 + 8.8 + 25.4 = 42.2. So p1 keeps turns while it finishes by 42.2: 38, 40, 42.
    let mut memory = memory(10_000, 3_600_000);
    let replicas = replicas(&ids);
    let first: Vec<Vec<BlockHash>> = (0..16).flat_map(|s| [turn(s, 1), turn(s, 1)]).collect();
    let plan = assign_with_memory(&batch(&first), &replicas[..1], &tokens(), &mut memory, 0);
    assert_eq!(plan.loads, vec![4 + 16 * 2]);
    let second: Vec<Vec<BlockHash>> = (0..8).map(|s| turn(s, 2)).collect();
    let plan = assign_with_memory(&batch(&second), &replicas, &tokens(), &mut memory, 0);
    let on_p1: Vec<usize> = (0..8).filter(|&s| plan.assignments[s] == Some(0)).collect();
    assert_eq!(on_p1, vec![0, 1, 2], "{:?}", plan.assignments);
    assert_eq!(plan.reasons[..3], [Some(PlacementReason::Memory); 3]);
    // The fourth moves to p2, which holds nothing: it prefills its whole prompt there.
    assert_eq!(plan.assignments[3], Some(1));
    assert_eq!(plan.reasons[3], Some(PlacementReason::LeastLoaded));
    assert!(plan.assignments.iter().all(Option::is_some));
}

#[test]
fn an_endpoint_list_without_the_remembered_replica_gets_nothing() {
    let ids = replica_ids(4);
    let params = PlanParams::default();
    // No carried load, so that p1 stays under the fair share.
    let mut memory = memory(100, 0);
    let pair: Vec<Vec<BlockHash>> = vec![vec![1, 2, 3]; 2];
    assign_with_memory(&batch(&pair), &replicas(&ids), &params, &mut memory, 0);
    let next = [vec![1, 2, 3, 4]];
    let only_p2 = [1usize];
    let requests = vec![BatchRequest {
        blocks: &next[0],
        allowed_replicas: Some(&only_p2),
    }];
    let plan = assign_with_memory(&requests, &replicas(&ids), &params, &mut memory, 10);
    assert_eq!(plan.assignments, vec![None]);
    assert_eq!(plan.reasons, vec![None]);
    assert_eq!(plan.held.of(0), &[]);
}
