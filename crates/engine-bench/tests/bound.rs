//! The lower bound's arithmetic, on small hand-counted steps.

use burst_prefix_engine_bench::bound::{lower_bound_per_step, PrefixTrie};

#[test]
fn distinct_prefixes_once_and_one_token_per_repeat() {
    let steps = vec![
        // 1,2,3 and 1,2,4 share 1,2: 4 distinct prefixes; the second copy of 1,2,3 costs 1.
        vec![vec![1, 2, 3], vec![1, 2, 3], vec![1, 2, 4]],
        // 5 is new; 1,2 was wholly seen in step 0 (a full hit still computes a token); 7,8 new.
        vec![vec![1, 2, 3, 5], vec![1, 2], vec![7, 8]],
        // Nothing new, but every request computes at least one token.
        vec![vec![1, 2, 3, 5], vec![1, 2, 3, 5]],
    ];
    assert_eq!(lower_bound_per_step(&steps), vec![5, 4, 2]);
}

#[test]
fn a_prefix_of_another_prompt_in_its_step_costs_nothing_extra() {
    // Served first, 1,2 is computed and 1,2,3 reuses it.
    assert_eq!(
        lower_bound_per_step(&[vec![vec![1, 2, 3], vec![1, 2]]]),
        vec![3]
    );
    assert_eq!(lower_bound_per_step(&[vec![vec![], vec![9]]]), vec![1]);
}

#[test]
fn multiturn_history_is_charged_once() {
    let system = [1, 2, 3, 4];
    let turn1: Vec<u32> = system.iter().copied().chain([10, 11]).collect();
    let turn2: Vec<u32> = turn1.iter().copied().chain([12, 13, 14]).collect();
    let other1: Vec<u32> = system.iter().copied().chain([20]).collect();
    let steps = vec![vec![turn1.clone(), other1.clone()], vec![turn2, other1]];
    // Step 0: 4 shared + 2 + 1. Step 1: 3 new; other1 resent whole costs 1.
    assert_eq!(lower_bound_per_step(&steps), vec![7, 4]);
}

#[test]
fn trie_counts_new_prefixes() {
    let mut trie = PrefixTrie::default();
    assert!(trie.is_empty());
    assert_eq!(trie.insert(&[1, 2, 3]), 3);
    assert_eq!(trie.insert(&[1, 2, 4]), 1);
    assert_eq!(trie.insert(&[1, 2]), 0);
    assert_eq!(trie.len(), 4);
    assert!(trie.contains(&[1, 2, 4]));
    assert!(!trie.contains(&[2]));
}
