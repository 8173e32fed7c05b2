//! The two rules where our plans differ from llm-d's `assign` (`burstprefix/assign.go` in
//! `llm-d-router`), pinned: docs/behaviour.md §13. Each test builds the smallest batch on which
//! the two differ and asserts our rule, naming what llm-d's code does instead.

use burst_prefix_planner::{
    assign, hash_prompts, BalanceBy, BatchRequest, BlockHash, BlockSpec, PlanParams, Prompt,
    Replica,
};

/// The blocks of a request with these token-id prompts (model `m`, block size 1: one block per
/// token), each prompt its own chain, concatenated as the producer does.
fn request(prompts: &[&[u32]]) -> Vec<BlockHash> {
    let prompts: Vec<Prompt<'_>> = prompts.iter().map(|p| Prompt::Tokens(p)).collect();
    hash_prompts("m", "", &prompts, BlockSpec::new(1, 0)).concat()
}

fn replicas<'a>(ids: &[&'a str]) -> Vec<Replica<'a>> {
    ids.iter().map(|id| Replica::new(id)).collect()
}

fn params(min_colocate_blocks: usize) -> PlanParams {
    PlanParams {
        max_per_replica: None,
        min_colocate_blocks,
        balance_by: BalanceBy::Requests,
        ..PlanParams::default()
    }
}

/// llm-d's `longestPrefix` walks a request's prompts in order and adds one, for every replica,
/// per walked block it holds, also when that replica lacks the request's leading blocks: here the
/// replica holding the second prompt's three blocks scores 3 against 1 for the replica holding
/// the first prompt, and llm-d sends the request there. A replica's match is its leading run of
/// the request's blocks (docs/behaviour.md §4 step 5): 1 and 0, so it goes to the first.
#[test]
fn a_request_with_several_prompts_matches_only_on_its_leading_blocks() {
    let first_prompt: &[u32] = &[7];
    let second_prompt: &[u32] = &[1, 2, 3];
    let holds_first = request(&[first_prompt]);
    let holds_second = request(&[second_prompt]);
    let both = request(&[first_prompt, second_prompt]);
    // Two groups placed first (groups before singles), then the single sharing the first block
    // (N = 1) with one of them.
    let prompts = [
        &holds_first,
        &holds_first,
        &holds_second,
        &holds_second,
        &both,
    ];
    let batch: Vec<BatchRequest<'_>> = prompts
        .iter()
        .map(|blocks| BatchRequest {
            blocks,
            allowed_replicas: None,
        })
        .collect();
    let plan = assign(&batch, &replicas(&["a", "b"]), &params(1));
    let first_group = plan.assignments[0].expect("placed");
    let second_group = plan.assignments[2].expect("placed");
    assert_ne!(first_group, second_group, "two groups, two replicas");
    assert_eq!(
        plan.assignments[4],
        Some(first_group),
        "the request follows its leading blocks, not the most blocks walked"
    );
}

/// llm-d plans a whole batch over the first request's endpoint list: a first request that may
/// use only `a` puts both groups below on `a`. We plan over every replica and apply each
/// request's own list afterwards (docs/behaviour.md §4 step 7), so the two groups, which may use
/// any replica, land on two.
#[test]
fn the_first_requests_endpoint_list_does_not_narrow_the_others() {
    let lone = request(&[&[9, 9]]);
    let one = request(&[&[1, 2]]);
    let other = request(&[&[3, 4]]);
    let only_a = [0usize];
    let mut batch = vec![BatchRequest {
        blocks: &lone,
        allowed_replicas: Some(&only_a),
    }];
    for blocks in [&one, &one, &other, &other] {
        batch.push(BatchRequest {
            blocks,
            allowed_replicas: None,
        });
    }
    let plan = assign(&batch, &replicas(&["a", "b"]), &params(0));
    assert_eq!(plan.assignments[0], None, "a lone request: no affinity");
    assert_eq!(plan.assignments[1], plan.assignments[2]);
    assert_eq!(plan.assignments[3], plan.assignments[4]);
    assert_ne!(
        plan.assignments[1], plan.assignments[3],
        "two groups on two replicas, whatever the first request may use"
    );
}
