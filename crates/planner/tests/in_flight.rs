//! Zero-wait placement (`InFlight`): the window's rules applied one request at a time.

use std::collections::HashMap;

use burst_prefix_planner::testing::{batch, blocks, copies, memory, params, replica_ids, replicas};
use burst_prefix_planner::{
    assign, Arrival, BalanceBy, BlockHash, InFlight, InFlightSettings, PlacementReason, PlanParams,
};
use proptest::prelude::*;

fn in_flight(count: usize, half_life_ms: u64) -> InFlight {
    let mut in_flight = InFlight::new(InFlightSettings {
        load_half_life_ms: half_life_ms,
    });
    in_flight.set_replicas(&replicas(&replica_ids(count)));
    in_flight
}

fn arrival(blocks: &[BlockHash], group_size: Option<usize>) -> Arrival<'_> {
    Arrival {
        blocks,
        allowed_replicas: None,
        group_size,
        max_answer_tokens: None,
        expected_answer_tokens: None,
    }
}

#[test]
fn siblings_follow_the_first_member_up_to_k_then_spill() {
    let mut placer = in_flight(4, 0);
    let prompt = blocks(1, 4, 0, 2);
    let placed: Vec<usize> = (0..6)
        .map(|_| {
            placer
                .place(
                    &arrival(&prompt, None),
                    &params(2, 0, BalanceBy::Requests),
                    None,
                    0,
                )
                .replica
                .unwrap()
        })
        .collect();
    assert_eq!(placed, vec![0, 0, 1, 1, 2, 2]);
}

#[test]
fn a_single_attaches_to_the_holder_of_n_blocks_within_the_fair_share() {
    let mut placer = in_flight(4, 0);
    let p = params(-1, 2, BalanceBy::Requests);
    // Four groups of 2, one per replica (8 in flight).
    for family in 1..=4 {
        let group = blocks(family, 2, 0, 2);
        for _ in 0..2 {
            placer.place(&arrival(&group, None), &p, None, 0);
        }
    }
    // A single sharing 2 blocks with the first group: the share is ceil(9 / 4) = 3, p1 carries
    // 2, so it attaches there.
    let single = placer.place(&arrival(&blocks(1, 2, 7, 2), None), &p, None, 0);
    assert_eq!(single.replica, Some(0));
    assert_eq!(single.reason, Some(PlacementReason::Window));
    assert_eq!(single.held, vec![(0, 2)]);
    // The next one would take p1 to 4 against a share of ceil(10 / 4) = 3: least loaded.
    let next = placer.place(&arrival(&blocks(1, 2, 8, 2), None), &p, None, 0);
    assert_eq!(next.replica, Some(1));
    assert_eq!(next.reason, Some(PlacementReason::LeastLoaded));
    // Sharing fewer than N blocks is no reason to attach.
    let p3 = params(-1, 3, BalanceBy::Requests);
    let short = placer.place(&arrival(&blocks(1, 2, 9, 2), None), &p3, None, 0);
    assert_eq!(short.reason, Some(PlacementReason::LeastLoaded));
}

#[test]
fn finishing_takes_the_load_off_and_a_half_life_decays_it() {
    let p = PlanParams::default();
    let mut placer = in_flight(2, 0);
    let a = placer.place(&arrival(&[1, 2], None), &p, None, 0);
    assert_eq!(placer.load(0, 0), 1.0);
    placer.finish(a.id, 10);
    assert_eq!(placer.load(0, 10), 0.0);
    assert!(placer.is_empty());

    let mut decaying = in_flight(2, 100);
    decaying.place(&arrival(&[1, 2], None), &p, None, 0);
    assert!((decaying.load(0, 100) - 0.5).abs() < 1e-9);
    // Expired after 20 half-lives: nothing is left in flight.
    decaying.place(&arrival(&[3], None), &p, None, 2_000);
    assert_eq!(decaying.len(), 1);
    assert_eq!(
        decaying.load(0, 2_000),
        1.0,
        "the new one, on the emptied p1"
    );
}

#[test]
fn a_hinted_group_books_its_seats_as_the_window_would() {
    // Two groups of 4, k = 2, 4 replicas, arriving interleaved: the window gives each two
    // replicas of its own.
    let p = params(2, 0, BalanceBy::Requests);
    let a = blocks(1, 4, 0, 0);
    let b = blocks(2, 4, 0, 0);
    let mut placer = in_flight(4, 0);
    let mut on: HashMap<u64, Vec<usize>> = HashMap::new();
    for _ in 0..4 {
        for (family, prompt) in [(1, &a), (2, &b)] {
            let placement = placer.place(&arrival(prompt, Some(4)), &p, None, 0);
            on.entry(family)
                .or_default()
                .push(placement.replica.unwrap());
        }
    }
    assert_eq!(on[&1], vec![0, 0, 1, 1]);
    assert_eq!(on[&2], vec![2, 2, 3, 3]);
    // Without the hint, b's first member would land on p2 while a fills p1, and a's spill would
    // share p2 or p3 with b.
}

#[test]
fn memory_counts_as_held() {
    let p = PlanParams::default();
    let mut memory = memory(1_000, 0);
    let mut placer = in_flight(4, 0);
    let session = blocks(1, 4, 0, 2);
    let first = placer.place(&arrival(&session, None), &p, Some(&mut memory), 0);
    placer.finish(first.id, 5);
    memory.settle();
    // Its next turn, with nothing in flight, goes back where its history is cached.
    let next = blocks(1, 4, 0, 4);
    let second = placer.place(&arrival(&next, None), &p, Some(&mut memory), 10);
    assert_eq!(second.replica, first.replica);
    assert_eq!(second.reason, Some(PlacementReason::Window));
    assert_eq!(second.held, vec![(first.replica.unwrap(), 6)]);
}

#[test]
fn a_request_whose_endpoints_exclude_the_holder_goes_to_its_least_loaded_one() {
    let p = params(-1, 1, BalanceBy::Requests);
    let mut placer = in_flight(4, 0);
    let prompt = blocks(1, 4, 0, 0);
    placer.place(&arrival(&prompt, None), &p, None, 0);
    let only = [2usize, 3];
    let placement = placer.place(
        &Arrival {
            blocks: &prompt,
            allowed_replicas: Some(&only),
            group_size: None,
            max_answer_tokens: None,
            expected_answer_tokens: None,
        },
        &p,
        None,
        0,
    );
    assert_eq!(placement.replica, Some(2));
}

// ---- properties ----

/// Arrivals of a few families' prompts (identical ones form groups), interleaved.
fn arrivals() -> impl Strategy<Value = Vec<Vec<BlockHash>>> {
    prop::collection::vec((0u64..3, 0u64..5, 0usize..4), 1..60).prop_map(|picks| {
        picks
            .into_iter()
            .map(|(family, tag, own)| blocks(family, 3, family * 10 + tag, own))
            .collect()
    })
}

fn knobs() -> impl Strategy<Value = PlanParams> {
    (
        prop_oneof![Just(-1i64), 1i64..4],
        0usize..4,
        prop_oneof![Just(BalanceBy::Requests), Just(BalanceBy::Tokens)],
    )
        .prop_map(|(k, n, balance_by)| params(k, n, balance_by))
}

proptest! {
    #[test]
    fn a_group_never_exceeds_k_per_replica(
        prompts in arrivals(),
        p in knobs(),
        fleet in 1usize..6,
        finish_every in 0usize..5,
    ) {
        let mut placer = in_flight(fleet, 0);
        let k = p.max_per_replica.unwrap_or(usize::MAX);
        // Members in flight per (group, replica), as the test sees them.
        let mut on: HashMap<(Vec<BlockHash>, usize), usize> = HashMap::new();
        let mut live = Vec::new();
        for (i, prompt) in prompts.iter().enumerate() {
            let in_group: usize = on.iter().filter(|((g, _), _)| g == prompt).map(|(_, c)| c).sum();
            let placement = placer.place(&arrival(prompt, None), &p, None, i as u64);
            let replica = placement.replica.unwrap();
            let here = on.entry((prompt.clone(), replica)).or_default();
            *here += 1;
            // Beyond k only once the group holds k on every replica.
            prop_assert!(*here <= k || in_group >= k.saturating_mul(fleet), "{on:?}");
            live.push((placement.id, prompt.clone(), replica));
            if finish_every > 0 && i % finish_every == 0 {
                let (id, prompt, replica) = live.remove(0);
                placer.finish(id, i as u64);
                *on.get_mut(&(prompt, replica)).unwrap() -= 1;
            }
        }
    }

    #[test]
    fn a_request_never_attaches_beyond_the_fair_share(
        prompts in arrivals(),
        p in knobs(),
        fleet in 1usize..6,
    ) {
        let mut placer = in_flight(fleet, 0);
        let mut seen: Vec<Vec<BlockHash>> = Vec::new();
        for (i, prompt) in prompts.iter().enumerate() {
            let loads: Vec<f64> = (0..fleet).map(|r| placer.load(r, i as u64)).collect();
            let own = match p.balance_by {
                BalanceBy::Requests => 1.0,
                BalanceBy::Tokens => prompt.len() as f64,
                BalanceBy::Time => unreachable!("knobs() draws requests or tokens"),
            };
            let share = ((loads.iter().sum::<f64>() + own) / fleet as f64).ceil();
            let placement = placer.place(&arrival(prompt, None), &p, None, i as u64);
            let follows_its_group = seen.contains(prompt);
            if placement.reason == Some(PlacementReason::Window) && !follows_its_group {
                let replica = placement.replica.unwrap();
                prop_assert!(loads[replica] < share, "{loads:?} share {share}");
                prop_assert!(placement.held.iter().any(|&(r, held)| r == replica && held >= p.min_colocate_blocks.max(1)));
            }
            seen.push(prompt.clone());
        }
    }

    #[test]
    fn hinted_groups_arriving_at_once_split_as_the_window_splits_them(
        sizes in prop::collection::vec(2usize..9, 1..6),
        p in knobs(),
        fleet in 1usize..6,
    ) {
        let k = p.max_per_replica.unwrap_or(usize::MAX);
        // Groups that fit k x replicas (beyond, the window spreads the rest by the loads of the
        // units placed before, which arrive in another order here).
        let sizes: Vec<usize> = sizes.into_iter().filter(|&m| m <= k.saturating_mul(fleet)).collect();
        let prompts: Vec<Vec<BlockHash>> = sizes.iter().enumerate().map(|(g, _)| blocks(g as u64, 3, 0, 0)).collect();
        // Interleaved: the i-th member of every group, then the next.
        let mut order = Vec::new();
        for i in 0..sizes.iter().copied().max().unwrap_or(0) {
            order.extend((0..sizes.len()).filter(|&g| i < sizes[g]));
        }
        let window: Vec<Vec<BlockHash>> = order.iter().map(|&g| prompts[g].clone()).collect();
        let ids = replica_ids(fleet);
        let plan = assign(&batch(&window), &replicas(&ids), &p);
        let mut placer = in_flight(fleet, 0);
        let placed: Vec<usize> = order
            .iter()
            .map(|&g| placer.place(&arrival(&prompts[g], Some(sizes[g])), &p, None, 0).replica.unwrap())
            .collect();
        let split = |assigned: &[usize], g: usize| {
            let mut counts = vec![0; fleet];
            for (i, &r) in assigned.iter().enumerate() {
                if order[i] == g {
                    counts[r] += 1;
                }
            }
            counts.retain(|&c| c > 0);
            counts.sort_unstable();
            counts
        };
        let windowed: Vec<usize> = plan.assignments.iter().map(|a| a.unwrap()).collect();
        for g in 0..sizes.len() {
            prop_assert_eq!(split(&placed, g), split(&windowed, g), "group {}", g);
        }
    }

    #[test]
    fn the_same_arrivals_give_the_same_placements(prompts in arrivals(), p in knobs(), fleet in 1usize..6) {
        let run = || {
            let mut placer = in_flight(fleet, 50);
            prompts
                .iter()
                .enumerate()
                .map(|(i, prompt)| placer.place(&arrival(prompt, None), &p, None, i as u64 * 7))
                .collect::<Vec<_>>()
        };
        prop_assert_eq!(run(), run());
    }
}

#[test]
fn copies_of_one_prompt_without_hints_fill_k_at_a_time() {
    let p = params(3, 0, BalanceBy::Tokens);
    let mut placer = in_flight(2, 0);
    let prompt = copies(blocks(1, 2, 0, 2), 1).remove(0);
    let placed: Vec<usize> = (0..6)
        .map(|_| {
            placer
                .place(&arrival(&prompt, None), &p, None, 0)
                .replica
                .unwrap()
        })
        .collect();
    assert_eq!(placed, vec![0, 0, 0, 1, 1, 1]);
    // Tokens mode: the first copy on a replica prefills the prompt, the others nothing.
    assert_eq!(placer.load(0, 0), 4.0);
    assert_eq!(placer.load(1, 0), 4.0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// In time mode, while every replica has one pace, the placer prices only the replicas that
    /// hold the prompt, those prefilling and the least-loaded (`InFlight::cheapest`); a request
    /// allowed every replica by name is priced on all of them. Both choose alike.
    #[test]
    fn pricing_the_few_that_can_win_chooses_as_pricing_every_replica(
        requests in prop::collection::vec(
            (0u64..6, 0usize..3, 0u64..4, 1u32..4_000, 0u64..40, any::<bool>()),
            1..120,
        ),
        replica_count in 1usize..12,
        half_life_ms in prop::sample::select(vec![0u64, 10_000]),
    ) {
        let ids = replica_ids(replica_count);
        let list = replicas(&ids);
        let all: Vec<usize> = (0..replica_count).collect();
        let params = PlanParams {
            balance_by: BalanceBy::Time,
            block_tokens: 16,
            ..PlanParams::default()
        };
        let settings = InFlightSettings { load_half_life_ms: half_life_ms };
        let (mut few, mut every) = (InFlight::new(settings), InFlight::new(settings));
        few.set_replicas(&list);
        every.set_replicas(&list);
        let mut memory_few = memory(64, 0);
        let mut memory_every = memory(64, 0);
        let mut live = Vec::new();
        let mut now = 0;
        for (family, shared, tag, expected, gap, finish) in requests {
            now += gap;
            let prompt = blocks(family, shared * 8, tag, 4);
            let anywhere = Arrival {
                blocks: &prompt,
                allowed_replicas: None,
                group_size: None,
                max_answer_tokens: None,
                expected_answer_tokens: Some(f64::from(expected)),
            };
            let named = Arrival {
                allowed_replicas: Some(&all),
                ..anywhere
            };
            let a = few.place(&anywhere, &params, Some(&mut memory_few), now);
            let b = every.place(&named, &params, Some(&mut memory_every), now);
            prop_assert_eq!(a.replica, b.replica);
            live.push((a.id, b.id));
            if finish && !live.is_empty() {
                let (x, y) = live.remove(live.len() / 2);
                few.finish(x, now);
                every.finish(y, now);
            }
            if now % 7 == 0 {
                memory_few.settle();
                memory_every.settle();
            }
        }
    }
}
