//! The lower bound's arithmetic, on small hand-counted steps.

use burst_prefix_engine_bench::bound::{lower_bound_per_step, tail_tokens};

#[test]
fn token_granularity_charges_distinct_prefixes_once_and_one_token_per_repeat() {
    let steps = vec![
        // 1,2,3 and 1,2,4 share 1,2: 4 distinct prefixes; the second copy of 1,2,3 costs 1.
        vec![vec![1, 2, 3], vec![1, 2, 3], vec![1, 2, 4]],
        // 5 is new; 1,2 was wholly seen in step 0 (a full hit still computes a token); 7,8 new.
        vec![vec![1, 2, 3, 5], vec![1, 2], vec![7, 8]],
        // Nothing new, but every request computes at least one token.
        vec![vec![1, 2, 3, 5], vec![1, 2, 3, 5]],
    ];
    assert_eq!(lower_bound_per_step(&steps, 1), vec![5, 4, 2]);
}

#[test]
fn a_prefix_of_another_prompt_in_its_step_costs_nothing_extra() {
    // Served first, 1,2 is computed and 1,2,3 reuses it.
    assert_eq!(
        lower_bound_per_step(&[vec![vec![1, 2, 3], vec![1, 2]]], 1),
        vec![3]
    );
    assert_eq!(lower_bound_per_step(&[vec![vec![], vec![9]]], 1), vec![1]);
}

#[test]
fn multiturn_history_is_charged_once() {
    let system = [1, 2, 3, 4];
    let turn1: Vec<u32> = system.iter().copied().chain([10, 11]).collect();
    let turn2: Vec<u32> = turn1.iter().copied().chain([12, 13, 14]).collect();
    let other1: Vec<u32> = system.iter().copied().chain([20]).collect();
    let steps = vec![vec![turn1.clone(), other1.clone()], vec![turn2, other1]];
    // Step 0: 4 shared + 2 + 1. Step 1: 3 new; other1 resent whole costs 1.
    assert_eq!(lower_bound_per_step(&steps, 1), vec![7, 4]);
}

#[test]
fn copies_of_a_prompt_share_its_full_blocks_and_each_computes_its_partial_block() {
    // vLLM's own figure: 8 copies of a 1,000-token prompt on 128-token blocks compute 7 full
    // blocks once and 104 tokens each.
    let prompt: Vec<u32> = (0..1_000).collect();
    let step = vec![prompt.clone(); 8];
    assert_eq!(lower_bound_per_step(&[step], 128), vec![7 * 128 + 8 * 104]);
    assert_eq!(tail_tokens(1_000, 128), 104);
    // A prompt wholly seen before still computes its tail.
    let steps = vec![vec![prompt.clone()], vec![prompt]];
    assert_eq!(lower_bound_per_step(&steps, 128), vec![1_000, 104]);
}

#[test]
fn a_prompt_of_whole_blocks_recomputes_its_last_block() {
    let prompt: Vec<u32> = (0..8).collect();
    assert_eq!(tail_tokens(8, 4), 4);
    assert_eq!(tail_tokens(9, 4), 1);
    assert_eq!(tail_tokens(0, 4), 0);
    // Two copies: block 0 once, then each its last block: 4 + 4 + 4.
    assert_eq!(
        lower_bound_per_step(&[vec![prompt.clone(), prompt.clone()]], 4),
        vec![12]
    );
    // A longer prompt in the step gets that block from the shorter one's tail: 4 + 4 + 1.
    let longer: Vec<u32> = (0..9).collect();
    assert_eq!(lower_bound_per_step(&[vec![prompt, longer]], 4), vec![9]);
}

#[test]
fn blocks_of_an_earlier_step_are_free_and_partial_blocks_are_never_shared() {
    let a: Vec<u32> = (0..10).collect();
    let mut b = a.clone();
    b.extend([100, 101]);
    // Step 0: a's 2 full blocks + its tail 2. Step 1: b = a's 2 blocks (cached) + block
    // [8, 9, 100, 101], which is b's tail (12 = 3 x 4): 4 tokens.
    assert_eq!(lower_bound_per_step(&[vec![a], vec![b]], 4), vec![10, 4]);
}
