use super::*;
use crate::prefixhash::{hash_prompts, BlockHash, BlockSpec, Prompt};
use crate::testing::{batch, blocks, copies, params, per_replica, replica_ids, replicas};
use proptest::prelude::*;

fn run(prompts: &[Vec<BlockHash>], replica_count: usize, params: PlanParams) -> Plan {
    assign(
        &batch(prompts),
        &replicas(&replica_ids(replica_count)),
        &params,
    )
}

#[test]
fn identical_unlimited_k_lands_on_one_replica() {
    let plan = run(
        &copies(blocks(1, 4, 0, 0), 8),
        4,
        params(-1, 0, BalanceBy::Requests),
    );
    assert_eq!(per_replica(&plan, 4), vec![8, 0, 0, 0]);
    assert_eq!((plan.group_units, plan.single_units), (1, 0));
}

#[test]
fn identical_k2_spreads_two_per_replica() {
    let plan = run(
        &copies(blocks(1, 4, 0, 0), 8),
        4,
        params(2, 0, BalanceBy::Requests),
    );
    assert_eq!(per_replica(&plan, 4), vec![2, 2, 2, 2]);
    // Members fill in arrival order: the first two share the first replica.
    assert_eq!(plan.assignments[0], plan.assignments[1]);
    assert_ne!(plan.assignments[1], plan.assignments[2]);
}

#[test]
fn identical_k4_fills_two_replicas() {
    let plan = run(
        &copies(blocks(1, 4, 0, 0), 8),
        4,
        params(4, 0, BalanceBy::Requests),
    );
    assert_eq!(per_replica(&plan, 4), vec![4, 4, 0, 0]);
}

#[test]
fn identical_k2_two_replicas_overflow_evenly() {
    let plan = run(
        &copies(blocks(1, 4, 0, 0), 8),
        2,
        params(2, 0, BalanceBy::Requests),
    );
    assert_eq!(per_replica(&plan, 2), vec![4, 4]);
}

#[test]
fn lone_request_and_empty_request_get_no_affinity() {
    let prompts = vec![blocks(1, 4, 0, 0), vec![], vec![]];
    let plan = run(&prompts, 4, params(-1, 0, BalanceBy::Requests));
    assert_eq!(plan.assignments, vec![None, None, None]);
    // Even with N > 0, two empty requests are no group and no unit.
    let plan = run(&prompts, 4, params(-1, 1, BalanceBy::Requests));
    assert_eq!(plan.assignments, vec![None, None, None]);
}

#[test]
fn a_lone_request_beside_a_group_gets_no_affinity_in_every_balance_mode_with_memory() {
    // The seed's settings: 12 copies of one prompt and one unrelated request, in one window.
    let mut prompts = copies(blocks(1, 190, 0, 0), 12);
    prompts.push(blocks(2, 0, 9, 40));
    for balance_by in [BalanceBy::Requests, BalanceBy::Tokens, BalanceBy::Time] {
        let mut memory = crate::testing::memory(100_000, 0);
        let plan = assign_with_memory(
            &batch(&prompts),
            &replicas(&replica_ids(3)),
            &params(-1, 0, balance_by),
            &mut memory,
            0,
        );
        assert!(
            plan.assignments[..12]
                .iter()
                .all(|a| *a == plan.assignments[0]),
            "{balance_by:?}: {:?}",
            plan.assignments
        );
        assert!(plan.assignments[0].is_some(), "{balance_by:?}");
        assert_eq!(plan.assignments[12], None, "{balance_by:?}");
    }
}

#[test]
fn two_distinct_groups_land_on_different_replicas() {
    let mut prompts = copies(blocks(1, 4, 0, 0), 8);
    prompts.extend(copies(blocks(2, 4, 0, 0), 8));
    let plan = run(&prompts, 4, params(-1, 0, BalanceBy::Requests));
    let first = plan.assignments[0].unwrap();
    let second = plan.assignments[8].unwrap();
    assert_ne!(first, second);
    assert!(plan.assignments[..8].iter().all(|a| *a == Some(first)));
    assert!(plan.assignments[8..].iter().all(|a| *a == Some(second)));
}

#[test]
fn families_sharing_n_blocks_stay_together() {
    // Two families, each of two groups of 2 that share 2 leading blocks; interleaved arrival.
    let mut prompts = Vec::new();
    for tag in 0..2 {
        for family in 1..=2 {
            prompts.extend(copies(blocks(family, 2, family * 10 + tag, 2), 2));
        }
    }
    let plan = run(&prompts, 2, params(-1, 2, BalanceBy::Requests));
    assert_eq!(per_replica(&plan, 2), vec![4, 4]);
    let family_one: Vec<_> = [0, 1, 4, 5].iter().map(|&i| plan.assignments[i]).collect();
    let family_two: Vec<_> = [2, 3, 6, 7].iter().map(|&i| plan.assignments[i]).collect();
    assert!(family_one.iter().all(|a| *a == family_one[0]));
    assert!(family_two.iter().all(|a| *a == family_two[0]));
    assert_ne!(family_one[0], family_two[0]);
}

#[test]
fn fair_share_prevents_a_stampede() {
    // Four groups of 2, all sharing 2 leading blocks: prefix preference alone would pile all
    // eight requests on one replica.
    let mut prompts = Vec::new();
    for tag in 0..4 {
        prompts.extend(copies(blocks(1, 2, tag, 2), 2));
    }
    let plan = run(&prompts, 4, params(-1, 2, BalanceBy::Requests));
    assert_eq!(per_replica(&plan, 4), vec![2, 2, 2, 2]);
}

#[test]
fn single_sharing_n_blocks_attaches_to_its_group() {
    // Group A (2 members, family 1) and three other groups leave fair-share room on A's replica.
    let mut prompts = copies(blocks(1, 3, 0, 1), 2);
    for family in 2..=4 {
        prompts.extend(copies(blocks(family, 3, 0, 1), 2));
    }
    prompts.push(blocks(1, 3, 99, 1)); // shares 3 blocks with group A
    let plan = run(&prompts, 4, params(-1, 3, BalanceBy::Requests));
    assert_eq!(plan.single_units, 1);
    assert_eq!(plan.assignments[8], plan.assignments[0]);
    assert!(plan.assignments[8].is_some());
}

#[test]
fn single_sharing_fewer_than_n_blocks_is_not_attached() {
    let mut prompts = copies(blocks(1, 2, 0, 2), 2);
    for family in 2..=4 {
        prompts.extend(copies(blocks(family, 4, 0, 0), 2));
    }
    prompts.push(blocks(1, 2, 99, 2)); // shares only 2 blocks with group A
    let plan = run(&prompts, 4, params(-1, 3, BalanceBy::Requests));
    assert_eq!(plan.single_units, 0);
    assert_eq!(plan.assignments[8], None);
}

#[test]
fn singles_sharing_n_blocks_are_units_bounded_by_fair_share() {
    let prompts: Vec<_> = (0..3).map(|tag| blocks(1, 4, tag, 2)).collect();
    let plan = run(&prompts, 4, params(-1, 4, BalanceBy::Requests));
    assert_eq!(plan.single_units, 3);
    // Fair share is ceil(3/4) = 1, so prefix preference stops after the first; they still get
    // an assignment each.
    assert!(plan.assignments.iter().all(Option::is_some));
    let plan = run(&prompts, 1, params(-1, 4, BalanceBy::Requests));
    assert_eq!(per_replica(&plan, 1), vec![3]);
}

#[test]
fn tokens_mode_keeps_a_long_group_apart_from_short_ones() {
    // A 40-block group and four 10-block groups on 2 replicas: by requests they would split
    // evenly by count; by tokens the long group gets a replica to itself.
    let mut prompts = copies(blocks(1, 40, 0, 0), 2);
    for family in 2..=5 {
        prompts.extend(copies(blocks(family, 10, 0, 0), 2));
    }
    let plan = run(&prompts, 2, params(-1, 0, BalanceBy::Tokens));
    let long = plan.assignments[0].unwrap();
    assert!(plan.assignments[2..].iter().all(|a| a.unwrap() != long));
    assert_eq!(plan.loads[long], 40);
    assert_eq!(plan.loads[1 - long], 40);
}

#[test]
fn tokens_mode_charges_a_shared_prefix_once() {
    // Two groups sharing 30 of their 32 blocks, N = 30: they co-locate and the replica is
    // charged 32 + 2 blocks, not 64.
    let mut prompts = copies(blocks(1, 30, 0, 2), 2);
    prompts.extend(copies(blocks(1, 30, 1, 2), 2));
    prompts.extend(copies(blocks(2, 32, 0, 0), 2));
    prompts.extend(copies(blocks(3, 32, 0, 0), 2));
    let plan = run(&prompts, 2, params(-1, 30, BalanceBy::Tokens));
    let shared = plan.assignments[0].unwrap();
    assert_eq!(plan.assignments[2], Some(shared));
    assert_eq!(plan.loads[shared], 34);
}

#[test]
fn requests_outside_their_endpoint_list_get_no_affinity() {
    let prompts = copies(blocks(1, 4, 0, 0), 3);
    let only_p4 = [3usize];
    let mut requests = batch(&prompts);
    requests[2].allowed_replicas = Some(&only_p4);
    let ids = replica_ids(4);
    let plan = assign(
        &requests,
        &replicas(&ids),
        &params(-1, 0, BalanceBy::Requests),
    );
    assert_eq!(plan.assignments, vec![Some(0), Some(0), None]);
}

#[test]
fn tie_break_prefers_fewer_running_requests_then_lower_id() {
    let prompts = copies(blocks(1, 4, 0, 0), 2);
    let ids = replica_ids(3);
    let mut live = replicas(&ids);
    live[0].running_requests = 5;
    live[1].running_requests = 1;
    live[2].running_requests = 1;
    let plan = assign(&batch(&prompts), &live, &params(-1, 0, BalanceBy::Requests));
    assert_eq!(plan.assignments, vec![Some(1), Some(1)]);
}

#[test]
fn no_replicas_means_no_assignments() {
    let plan = run(
        &copies(blocks(1, 4, 0, 0), 3),
        0,
        params(-1, 0, BalanceBy::Requests),
    );
    assert_eq!(plan.assignments, vec![None, None, None]);
    assert_eq!(plan.group_units, 1);
}

#[test]
fn larger_units_are_placed_first() {
    // A 2-block group arrives before an 8-block group; the larger one is placed first and so
    // takes p1 (lower id on an empty window).
    let mut prompts = copies(blocks(1, 2, 0, 0), 2);
    prompts.extend(copies(blocks(2, 8, 0, 0), 2));
    let plan = run(&prompts, 2, params(-1, 0, BalanceBy::Requests));
    assert_eq!(plan.assignments, vec![Some(1), Some(1), Some(0), Some(0)]);
}

// ---- properties ----

/// Requests built from real chained hashes: a few roots, each request a root prefix plus a
/// short suffix from a small alphabet, so that groups and shared prefixes both occur.
fn hashed_batch() -> impl Strategy<Value = Vec<Vec<BlockHash>>> {
    let roots = prop::collection::vec(prop::collection::vec(0u32..4, 0..12), 1..4);
    (
        roots,
        prop::collection::vec(
            (0usize..4, 0usize..12, prop::collection::vec(0u32..2, 0..4)),
            0..40,
        ),
    )
        .prop_map(|(roots, picks)| {
            picks
                .into_iter()
                .map(|(root, cut, suffix)| {
                    let root = &roots[root % roots.len()];
                    let mut tokens = root[..cut.min(root.len())].to_vec();
                    tokens.extend(suffix);
                    hash_prompts("m", "", &[Prompt::Tokens(&tokens)], BlockSpec::new(2, 0)).concat()
                })
                .collect()
        })
}

fn plan_params() -> impl Strategy<Value = PlanParams> {
    (
        prop_oneof![Just(-1i64), 1i64..5],
        0usize..4,
        prop_oneof![Just(BalanceBy::Requests), Just(BalanceBy::Tokens)],
    )
        .prop_map(|(k, n, balance_by)| params(k, n, balance_by))
}

/// An independent, naive reading of docs/behaviour.md §4 steps 1-2: which requests belong to a
/// unit, and the members of every group.
fn naive_units(prompts: &[Vec<BlockHash>], n: usize) -> (Vec<bool>, Vec<Vec<usize>>) {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, p) in prompts.iter().enumerate() {
        if p.is_empty() {
            continue;
        }
        match groups.iter_mut().find(|g| prompts[g[0]] == *p) {
            Some(group) => group.push(i),
            None => groups.push(vec![i]),
        }
    }
    let mut in_unit = vec![false; prompts.len()];
    for group in &groups {
        let p = &prompts[group[0]];
        let shares = n > 0
            && p.len() >= n
            && prompts
                .iter()
                .enumerate()
                .any(|(j, q)| j != group[0] && q.len() >= n && q[..n] == p[..n]);
        if group.len() >= 2 || shares {
            for &i in group {
                in_unit[i] = true;
            }
        }
    }
    groups.retain(|g| g.len() >= 2);
    (in_unit, groups)
}

proptest! {
    #[test]
    fn assigned_exactly_when_in_a_unit(prompts in hashed_batch(), p in plan_params(), r in 1usize..6) {
        let plan = run(&prompts, r, p);
        let (in_unit, _) = naive_units(&prompts, p.min_colocate_blocks);
        for (assigned, expected) in plan.assignments.iter().zip(&in_unit) {
            prop_assert_eq!(assigned.is_some(), *expected);
        }
    }

    #[test]
    fn k_is_respected_when_the_unit_fits(prompts in hashed_batch(), p in plan_params(), r in 1usize..6) {
        let plan = run(&prompts, r, p);
        let (_, groups) = naive_units(&prompts, p.min_colocate_blocks);
        for group in groups {
            let mut counts = vec![0usize; r];
            for &i in &group {
                counts[plan.assignments[i].unwrap()] += 1;
            }
            match p.max_per_replica {
                Some(k) if group.len() <= k * r => prop_assert!(counts.iter().all(|&c| c <= k)),
                Some(_) => {}
                None => prop_assert_eq!(counts.iter().filter(|&&c| c > 0).count(), 1),
            }
        }
    }

    #[test]
    fn identical_input_gives_identical_output(prompts in hashed_batch(), p in plan_params(), r in 1usize..6) {
        prop_assert_eq!(run(&prompts, r, p), run(&prompts, r, p));
    }

    #[test]
    fn replica_order_does_not_matter(prompts in hashed_batch(), p in plan_params(), r in 1usize..6, seed in any::<u64>()) {
        let ids = replica_ids(r);
        let forward = replicas(&ids);
        let mut shuffled = forward.clone();
        // A deterministic shuffle from the seed (rotation plus optional reversal).
        shuffled.rotate_left(seed as usize % r);
        if seed & 1 == 1 {
            shuffled.reverse();
        }
        let requests = batch(&prompts);
        let by_id = |plan: &Plan, reps: &[Replica<'_>]| -> Vec<Option<String>> {
            plan.assignments.iter().map(|a| a.map(|i| reps[i].id.to_string())).collect()
        };
        let a = assign(&requests, &forward, &p);
        let b = assign(&requests, &shuffled, &p);
        prop_assert_eq!(by_id(&a, &forward), by_id(&b, &shuffled));
    }

    #[test]
    fn tokens_mode_charges_every_held_block_once(prompts in hashed_batch(), k in prop_oneof![Just(-1i64), 1i64..5], n in 0usize..4, r in 1usize..6) {
        let p = params(k, n, BalanceBy::Tokens);
        let plan = run(&prompts, r, p);
        // With chained hashes, the load of a replica is exactly the number of distinct blocks
        // placed on it: a prefix shared by several units is charged once.
        for replica in 0..r {
            let mut held: Vec<BlockHash> = plan
                .assignments
                .iter()
                .zip(&prompts)
                .filter(|(a, _)| **a == Some(replica))
                .flat_map(|(_, blocks)| blocks.iter().copied())
                .collect();
            held.sort_unstable();
            held.dedup();
            prop_assert_eq!(plan.loads[replica], held.len() as u64);
        }
    }

    #[test]
    fn requests_mode_load_counts_requests(prompts in hashed_batch(), p in plan_params(), r in 1usize..6) {
        let p = PlanParams { balance_by: BalanceBy::Requests, ..p };
        let plan = run(&prompts, r, p);
        prop_assert_eq!(&plan.loads, &per_replica(&plan, r).into_iter().map(|c| c as u64).collect::<Vec<_>>());
    }
}

/// A window in `time` mode (with memory, as the producer plans it), 64-token blocks.
fn run_time(prompts: &[Vec<BlockHash>], replica_count: usize, k: i64, n: usize) -> Plan {
    let mut memory = crate::testing::memory(100_000, 0);
    let params = PlanParams {
        block_tokens: 64,
        ..params(k, n, BalanceBy::Time)
    };
    assign_with_memory(
        &batch(prompts),
        &replicas(&replica_ids(replica_count)),
        &params,
        &mut memory,
        0,
    )
}

#[test]
fn time_mode_keeps_the_rules_of_units_and_prefixes_and_spreads_copies_of_a_short_prompt() {
    // As in `requests` and `tokens`: a lone request and empty ones get no affinity; families
    // sharing N blocks stay together; the fair share stops a stampede; a single sharing N
    // blocks joins its group, sharing fewer it gets no affinity.
    let lone = run_time(&[blocks(1, 4, 0, 0), vec![], vec![]], 4, -1, 0);
    assert_eq!(lone.assignments, vec![None, None, None]);
    let mut families = Vec::new();
    for tag in 0..2 {
        for family in 1..=2 {
            families.extend(copies(blocks(family, 2, family * 10 + tag, 2), 2));
        }
    }
    let plan = run_time(&families, 2, -1, 2);
    assert_eq!(per_replica(&plan, 2), vec![4, 4]);
    assert!([1, 4, 5]
        .iter()
        .all(|&i| plan.assignments[i] == plan.assignments[0]));
    let mut stampede = Vec::new();
    for tag in 0..4 {
        stampede.extend(copies(blocks(1, 2, tag, 2), 2));
    }
    assert_eq!(
        per_replica(&run_time(&stampede, 4, -1, 2), 4),
        vec![2, 2, 2, 2]
    );
    let mut attached = copies(blocks(1, 3, 0, 1), 2);
    for family in 2..=4 {
        attached.extend(copies(blocks(family, 3, 0, 1), 2));
    }
    attached.push(blocks(1, 3, 99, 1));
    let plan = run_time(&attached, 4, -1, 3);
    assert_eq!(plan.assignments[8], plan.assignments[0]);
    attached[8] = blocks(1, 2, 99, 2);
    attached[0] = blocks(1, 2, 0, 2);
    attached[1] = blocks(1, 2, 0, 2);
    assert_eq!(run_time(&attached, 4, -1, 3).assignments[8], None);
    // Unlike them: 8 copies of a 256-token prompt (4 blocks) on 4 idle replicas go 2 to each
    // whatever k allows, where `requests` puts them on one (k = -1) or two (k = 4). Priced in
    // seconds, each copy is answered sooner beside fewer others than beside its prompt's cached
    // prefix, which saves only 256 tokens of prefill; k stays a maximum, never a target.
    let eight = copies(blocks(1, 4, 0, 0), 8);
    for k in [-1, 4, 2] {
        assert_eq!(
            per_replica(&run_time(&eight, 4, k, 0), 4),
            vec![2, 2, 2, 2],
            "k = {k}"
        );
    }
    assert_eq!(
        per_replica(&run(&eight, 4, params(-1, 0, BalanceBy::Requests)), 4),
        vec![8, 0, 0, 0]
    );
    // A long prompt's copies stay together: 2,048 tokens of prefill saved outweigh the decode.
    let long = copies(blocks(1, 32, 0, 0), 8);
    assert_eq!(
        per_replica(&run_time(&long, 4, -1, 0), 4)
            .iter()
            .filter(|&&c| c > 0)
            .count(),
        1
    );
}
