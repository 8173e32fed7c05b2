//! `assign` against the naive reading of docs/behaviour.md §4 in `reference/`, on random batches:
//! several prompts per request, caps, salts, k, N, both balance modes, endpoint lists and running
//! requests that decide ties.

mod reference;

use burst_prefix_planner::testing::{
    batch, batch_with_endpoints, copies, params, replica_ids, replicas, rl_step,
};
use burst_prefix_planner::{
    assign, hash_prompts, BalanceBy, BlockHash, BlockSpec, PlanParams, Prompt, Replica,
};
use proptest::prelude::*;
use reference::reference_assign;

/// One request as generated: prompts as cuts of shared roots plus a short suffix each.
#[derive(Clone, Debug)]
struct Template {
    salt: &'static str,
    prompts: Vec<(usize, usize, Vec<u32>)>,
}

#[derive(Clone, Debug)]
struct Case {
    block_size: usize,
    max_prefix_tokens: usize,
    roots: Vec<Vec<u32>>,
    templates: Vec<Template>,
    /// Arrival order: indices into `templates` (repeats form groups).
    arrivals: Vec<usize>,
    /// Per arrival, a bitmask of the replicas it may use (`None`: all).
    allowed: Vec<Option<u8>>,
    /// Per replica: (id, running requests).
    replicas: Vec<(&'static str, u64)>,
    params: PlanParams,
}

/// Ids whose byte order differs from their position, so that index order never decides a tie.
const IDS: [&str; 8] = ["p3", "p10", "p1", "p2", "a9", "p20", "b", "p4"];

fn case() -> impl Strategy<Value = Case> {
    let template = (
        prop_oneof![Just(""), Just("salt")],
        prop::collection::vec(
            (0usize..4, 0usize..14, prop::collection::vec(0u32..3, 0..4)),
            1..4,
        ),
    )
        .prop_map(|(salt, prompts)| Template { salt, prompts });
    (
        1usize..4,
        0usize..4,
        prop::collection::vec(prop::collection::vec(0u32..3, 0..14), 1..4),
        prop::collection::vec(template, 1..10),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..10, any::<u8>()), 0..40),
        (1usize..=8).prop_flat_map(|count| {
            (
                Just(count),
                Just(IDS.to_vec()).prop_shuffle(),
                prop::collection::vec(0u64..3, count),
            )
        }),
        (
            prop_oneof![Just(-1i64), 1i64..5],
            0usize..4,
            prop_oneof![Just(BalanceBy::Requests), Just(BalanceBy::Tokens)],
        ),
    )
        .prop_map(
            |(block_size, cap_blocks, roots, templates, picks, replicas, (k, n, balance_by))| {
                let (count, ids, running) = replicas;
                let (arrivals, allowed) = picks
                    .iter()
                    .map(|(index, restrict, mask)| {
                        (
                            index.index(templates.len()),
                            (*restrict == 0).then_some(*mask),
                        )
                    })
                    .unzip();
                Case {
                    block_size,
                    // 0 (the default cap) or 1-3 blocks per prompt.
                    max_prefix_tokens: cap_blocks * block_size,
                    roots,
                    templates,
                    arrivals,
                    allowed,
                    replicas: ids.into_iter().zip(running).take(count).collect(),
                    params: PlanParams {
                        max_per_replica: (k >= 1).then_some(k as usize),
                        min_colocate_blocks: n,
                        balance_by,
                        ..PlanParams::default()
                    },
                }
            },
        )
}

impl Case {
    fn hashed(&self) -> Vec<Vec<BlockHash>> {
        let spec = BlockSpec::new(self.block_size, self.max_prefix_tokens);
        let templates: Vec<Vec<BlockHash>> = self
            .templates
            .iter()
            .map(|template| {
                let tokens: Vec<Vec<u32>> = template
                    .prompts
                    .iter()
                    .map(|(root, cut, suffix)| {
                        let root = &self.roots[root % self.roots.len()];
                        let mut tokens = root[..(*cut).min(root.len())].to_vec();
                        tokens.extend(suffix);
                        tokens
                    })
                    .collect();
                let prompts: Vec<Prompt<'_>> = tokens.iter().map(|t| Prompt::Tokens(t)).collect();
                hash_prompts("m", template.salt, &prompts, spec).concat()
            })
            .collect();
        self.arrivals
            .iter()
            .map(|&t| templates[t].clone())
            .collect()
    }

    fn allowed_lists(&self) -> Vec<Option<Vec<usize>>> {
        self.allowed
            .iter()
            .map(|mask| {
                mask.map(|mask| {
                    (0..self.replicas.len())
                        .filter(|r| mask & (1 << r) != 0)
                        .collect()
                })
            })
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn assign_is_the_reference_plan(case in case()) {
        let blocks = case.hashed();
        let allowed = case.allowed_lists();
        let requests = batch_with_endpoints(&blocks, &allowed);
        let replicas: Vec<Replica<'_>> = case
            .replicas
            .iter()
            .map(|&(id, running_requests)| Replica {
                running_requests,
                ..Replica::new(id)
            })
            .collect();
        let plan = assign(&requests, &replicas, &case.params);
        let expected = reference_assign(&requests, &replicas, &case.params);
        prop_assert_eq!(&plan.assignments, &expected.assignments);
        prop_assert_eq!(&plan.loads, &expected.loads);
        prop_assert_eq!(plan.group_units, expected.group_units);
        prop_assert_eq!(plan.single_units, expected.single_units);
    }
}

/// The docs/behaviour.md §4 examples, through the reference too: the two readings agree on them.
#[test]
fn reference_reads_the_spec_examples() {
    let ids = replica_ids(4);
    let replicas = replicas(&ids);
    let blocks = copies(vec![1, 2, 3, 4], 8);
    let requests = batch(&blocks);
    let counts = |k: Option<usize>, replicas: &[Replica<'_>]| {
        let params = PlanParams {
            max_per_replica: k,
            ..PlanParams::default()
        };
        let plan = reference_assign(&requests, replicas, &params);
        assert_eq!(
            plan.assignments,
            assign(&requests, replicas, &params).assignments
        );
        let mut counts = vec![0; replicas.len()];
        for r in plan.assignments.iter().flatten() {
            counts[*r] += 1;
        }
        counts
    };
    assert_eq!(counts(None, &replicas), vec![8, 0, 0, 0]);
    assert_eq!(counts(Some(2), &replicas), vec![2, 2, 2, 2]);
    assert_eq!(counts(Some(4), &replicas), vec![4, 4, 0, 0]);
    assert_eq!(counts(Some(2), &replicas[..2]), vec![4, 4]);
}

/// Fleets larger than `case()`'s: RL steps whose prompts share a system prompt (so that a unit's
/// deepest held block has many holders), with N >= 1, on up to 64 replicas.
fn rl_case() -> impl Strategy<Value = (Vec<Vec<BlockHash>>, usize, PlanParams)> {
    (
        1usize..40,
        1usize..6,
        0usize..4,
        1usize..4,
        1usize..65,
        (
            prop_oneof![Just(-1i64), 1i64..4],
            1usize..5,
            prop_oneof![Just(BalanceBy::Requests), Just(BalanceBy::Tokens)],
        ),
    )
        .prop_map(
            |(prompts, samples, system, own, fleet, (k, n, balance_by))| {
                (
                    rl_step(prompts, samples, system, own),
                    fleet,
                    params(k, n, balance_by),
                )
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn assign_is_the_reference_plan_on_larger_fleets((prompts, fleet, params) in rl_case()) {
        let ids = replica_ids(fleet);
        let replicas = replicas(&ids);
        let requests = batch(&prompts);
        let plan = assign(&requests, &replicas, &params);
        let expected = reference_assign(&requests, &replicas, &params);
        prop_assert_eq!(&plan.assignments, &expected.assignments);
        prop_assert_eq!(&plan.loads, &expected.loads);
    }
}
