//! Placement priced in seconds (`BalanceBy::Time`, docs/behaviour.md §4 "Time"): in a window
//! and on arrival, each request goes where it is predicted to be answered first.

use burst_prefix_planner::agree::{self, Priced};
use burst_prefix_planner::testing::{a100, batch, blocks, memory, replica_ids, rl_step};
use burst_prefix_planner::{
    assign_with_memory, Arrival, BalanceBy, BlockHash, Busy, InFlight, InFlightSettings, Pace,
    PlacementReason, Plan, PlanParams, Replica, Speed,
};

/// 32-token blocks, 256-token answers: an RL step's prompt of 64 blocks is 2,048 tokens.
fn params() -> PlanParams {
    PlanParams {
        balance_by: BalanceBy::Time,
        block_tokens: 32,
        output_tokens: 256,
        ..PlanParams::default()
    }
}

fn fleet<'a>(ids: &'a [String], slow: &[usize]) -> Vec<Replica<'a>> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| Replica {
            pace: Pace {
                speed: if slow.contains(&i) {
                    a100()
                } else {
                    Speed::default()
                },
                busy: Busy::default(),
            },
            ..Replica::new(id)
        })
        .collect()
}

/// Per replica, how many requests it got.
fn counts(assignments: &[Option<usize>], replicas: usize) -> Vec<usize> {
    let mut counts = vec![0; replicas];
    for replica in assignments.iter().flatten() {
        counts[*replica] += 1;
    }
    counts
}

/// How many replicas each distinct prompt was placed on.
fn spread(prompts: &[Vec<BlockHash>], assignments: &[Option<usize>]) -> Vec<usize> {
    let mut distinct: Vec<&Vec<BlockHash>> = prompts.iter().collect();
    distinct.sort();
    distinct.dedup();
    distinct
        .iter()
        .map(|prompt| {
            let mut on: Vec<usize> = prompts
                .iter()
                .zip(assignments)
                .filter(|(p, _)| p == prompt)
                .filter_map(|(_, a)| *a)
                .collect();
            on.sort_unstable();
            on.dedup();
            on.len()
        })
        .collect()
}

fn window(prompts: &[Vec<BlockHash>], replicas: &[Replica<'_>]) -> Plan {
    let mut memory = memory(1_000_000, 0);
    assign_with_memory(&batch(prompts), replicas, &params(), &mut memory, 0)
}

fn on_arrival(prompts: &[Vec<BlockHash>], replicas: &[Replica<'_>]) -> Vec<Option<usize>> {
    in_turn(1, &params(), prompts, replicas, None)
}

#[test]
fn an_rl_step_keeps_each_prompts_samples_together_and_every_replica_equally_busy() {
    let ids = replica_ids(16);
    let replicas = fleet(&ids, &[]);
    // 64 prompts x 8 samples of 2,048 tokens, 256 of them a shared system prompt.
    let step = rl_step(64, 8, 8, 56);
    let plan = window(&step, &replicas);
    assert_eq!(spread(&step, &plan.assignments), vec![1; 64]);
    assert_eq!(counts(&plan.assignments, 16), vec![32; 16]);
    // Arriving one at a time, the samples follow their prompt just the same.
    let placed = on_arrival(&step, &replicas);
    assert_eq!(spread(&step, &placed), vec![1; 64]);
    assert_eq!(counts(&placed, 16), vec![32; 16]);
}

#[test]
fn one_prompt_sampled_many_times_is_prefilled_once_per_replica_it_needs() {
    let ids = replica_ids(16);
    let replicas = fleet(&ids, &[]);
    // 512 samples of one prompt: one replica would decode them 1.3 times slower than 32 each,
    // far more than 15 more prefills of 2,048 tokens cost.
    let step = rl_step(1, 512, 8, 56);
    let plan = window(&step, &replicas);
    assert_eq!(counts(&plan.assignments, 16), vec![32; 16]);
    let placed = on_arrival(&step, &replicas);
    assert_eq!(counts(&placed, 16), vec![32; 16]);
    // With k = 8, at most 8 on one replica while any replica has fewer.
    let k8 = PlanParams {
        max_per_replica: Some(8),
        ..params()
    };
    let mut memory = memory(1_000_000, 0);
    let plan = assign_with_memory(&batch(&step[..64]), &replicas, &k8, &mut memory, 0);
    assert_eq!(
        counts(&plan.assignments, 16),
        [vec![8; 8], vec![0; 8]].concat()
    );
}

#[test]
fn short_answers_keep_more_samples_with_their_prompt() {
    let ids = replica_ids(16);
    let replicas = fleet(&ids, &[]);
    let step = rl_step(1, 512, 8, 56);
    let replicas_used = |max_answer_tokens| {
        let placed = in_turn(1, &params(), &step, &replicas, max_answer_tokens);
        spread(&step, &placed)[0]
    };
    // Priced at the configured 256 tokens, the samples spread over every replica (the test
    // above); asking for 4, each decodes beside the others in next to no time, and the prompt's
    // 2,048-token prefill is worth more than the slowdown.
    assert_eq!(replicas_used(None), 16);
    assert_eq!(replicas_used(Some(1024)), 16);
    let short = replicas_used(Some(4));
    assert!(short <= 2, "512 four-token answers on {short} replicas");
}

#[test]
fn slower_replicas_get_fewer_requests() {
    let ids = replica_ids(16);
    let slow = [1, 5, 9, 13];
    let replicas = fleet(&ids, &slow);
    let step = rl_step(64, 8, 8, 56);
    // An A100 decodes 2.9 times slower: 512 requests on 12 H100s (43 each) are answered
    // before any on an idle A100.
    for placed in [
        window(&step, &replicas).assignments,
        on_arrival(&step, &replicas),
    ] {
        let counts = counts(&placed, 16);
        assert!(slow.iter().all(|&r| counts[r] == 0), "{counts:?}");
        assert_eq!(spread(&step, &placed), vec![1; 64]);
    }
    // Busy enough, they are used: 4,096 requests fill the H100s past their 256 slots.
    let step = rl_step(256, 16, 8, 56);
    let counts = counts(&window(&step, &replicas).assignments, 16);
    let (fast, slowest) = (counts[0], slow.iter().map(|&r| counts[r]).max().unwrap());
    assert!(slowest > 0 && slowest < fast, "{counts:?}");
}

#[test]
fn a_fan_out_on_a_system_prompt_leaves_no_replica_idle() {
    // The README's demo: 6 prompts x 8 samples sharing a system prompt, on 4 replicas.
    let ids = replica_ids(4);
    let replicas = fleet(&ids, &[]);
    let step = rl_step(6, 8, 16, 8);
    for placed in [
        window(&step, &replicas).assignments,
        on_arrival(&step, &replicas),
    ] {
        let counts = counts(&placed, 4);
        eprintln!("{counts:?} {:?}", spread(&step, &placed));
        assert!(counts.iter().all(|&c| (11..=13).contains(&c)), "{counts:?}");
    }
}

#[test]
fn a_conversation_stays_with_its_history_until_that_replica_is_much_busier() {
    let ids = replica_ids(4);
    let mut memory = memory(1_000_000, 0);
    // Turn one of a conversation (a 512-block history, 16,384 tokens) lands somewhere: sent
    // twice, so that the window places it (a lone request gets no affinity, §4 rule 2).
    let history = blocks(7, 0, 7, 512);
    let first = window_with(
        &mut memory,
        &[history.clone(), history.clone()],
        &fleet(&ids, &[]),
    );
    let home = first.assignments[0].unwrap();
    // Its next turn goes back there...
    let next = blocks(7, 0, 7, 520);
    let replicas = fleet(&ids, &[]);
    let plan = window_with(&mut memory, std::slice::from_ref(&next), &replicas);
    assert_eq!(plan.assignments[0], Some(home));
    assert_eq!(plan.reasons[0], Some(PlacementReason::Memory));
    // ... while its replica runs 100 more requests than the others (0.3 s of prefill saved
    // against 0.3 s of decoding slowed), not with 500 more.
    let busy_home = |requests: f64| {
        let mut replicas = fleet(&ids, &[]);
        replicas[home].pace.busy.requests = requests;
        replicas
    };
    let plan = window_with(&mut memory, std::slice::from_ref(&next), &busy_home(100.0));
    assert_eq!(plan.assignments[0], Some(home));
    let plan = window_with(&mut memory, &[next], &busy_home(500.0));
    assert_ne!(plan.assignments[0], Some(home));
}

fn window_with(
    memory: &mut burst_prefix_planner::Memory,
    prompts: &[Vec<BlockHash>],
    replicas: &[Replica<'_>],
) -> Plan {
    assign_with_memory(&batch(prompts), replicas, &params(), memory, 0)
}

#[test]
fn a_prefix_shorter_than_min_colocate_blocks_is_not_followed() {
    let ids = replica_ids(4);
    let mut memory = memory(1_000_000, 0);
    let history = blocks(7, 0, 7, 512);
    let home = window_with(
        &mut memory,
        &[history.clone(), history.clone()],
        &fleet(&ids, &[]),
    )
    .assignments[0]
        .unwrap();
    // Its replica runs one request more than the others: the history (512 blocks) is worth
    // following, unless N asks for more blocks than it has.
    let mut replicas = fleet(&ids, &[]);
    replicas[home].pace.busy.requests = 1.0;
    let next = blocks(7, 0, 7, 520);
    let plan = window_with(&mut memory, std::slice::from_ref(&next), &replicas);
    assert_eq!(plan.assignments[0], Some(home));
    let strict = PlanParams {
        min_colocate_blocks: 600,
        ..params()
    };
    let plan = assign_with_memory(&batch(&[next]), &replicas, &strict, &mut memory, 0);
    assert_ne!(plan.assignments[0], Some(home));
}

#[test]
fn distinct_prompts_spread_on_arrival_and_get_no_affinity_in_a_window() {
    let ids = replica_ids(2);
    let prompts = vec![blocks(1, 0, 1, 30), blocks(2, 0, 2, 30)];
    // On arrival each is the first of a group that may follow: it is placed, apart.
    let placed = on_arrival(&prompts, &fleet(&ids, &[]));
    assert_ne!(placed[0], placed[1], "{placed:?}");
    // In a window neither forms a unit: no affinity, as in `requests` and `tokens` (§4 rule 2).
    let placed = window(&prompts, &fleet(&ids, &[])).assignments;
    assert_eq!(placed, vec![None, None]);
    // Two copies of each do, and the two units spread.
    let pairs = vec![
        prompts[0].clone(),
        prompts[0].clone(),
        prompts[1].clone(),
        prompts[1].clone(),
    ];
    let placed = window(&pairs, &fleet(&ids, &[])).assignments;
    assert_eq!((placed[0], placed[2]), (placed[1], placed[3]));
    assert_ne!(placed[0], placed[2], "{placed:?}");
}

/// The time cost's params of a producer beside others (active-active).
fn beside_peers() -> PlanParams {
    PlanParams {
        agree_with_peers: true,
        ..params()
    }
}

/// `step` sent to `producers` placers beside each other in turn (a round-robin front), each
/// knowing only its own placements.
fn side_by_side(
    producers: usize,
    step: &[Vec<BlockHash>],
    replicas: &[Replica<'_>],
) -> Vec<Option<usize>> {
    in_turn(producers, &beside_peers(), step, replicas, None)
}

/// `prompts` placed on arrival by `placers` placers in turn, each with `params`, every request
/// asking for at most `max_answer_tokens`.
fn in_turn(
    placers: usize,
    params: &PlanParams,
    prompts: &[Vec<BlockHash>],
    replicas: &[Replica<'_>],
    max_answer_tokens: Option<u32>,
) -> Vec<Option<usize>> {
    let mut placers: Vec<InFlight> = (0..placers)
        .map(|_| {
            let mut in_flight = InFlight::new(InFlightSettings::default());
            in_flight.set_replicas(replicas);
            in_flight
        })
        .collect();
    let count = placers.len();
    prompts
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let arrival = Arrival {
                blocks: prompt,
                allowed_replicas: None,
                group_size: None,
                max_answer_tokens,
                expected_answer_tokens: None,
            };
            placers[i % count].place(&arrival, params, None, 0).replica
        })
        .collect()
}

#[test]
fn producers_side_by_side_keep_each_prompts_samples_together() {
    let ids = replica_ids(16);
    let replicas = fleet(&ids, &[]);
    // The GRPO burst: 8 prompts x 8 samples, sharing a system prompt, on 16 replicas.
    let step = rl_step(8, 8, 8, 56);
    let alone = on_arrival(&step, &replicas);
    assert_eq!(spread(&step, &alone), vec![1; 8]);
    // Each prompt's first choice on idle replicas: the top of its own ranking.
    let first_choice = |prompt: &Vec<BlockHash>| {
        let priced: Vec<Priced<'_>> = ids
            .iter()
            .enumerate()
            .map(|(replica, id)| Priced {
                replica,
                id,
                seconds: 1.0,
            })
            .collect();
        agree::choose(&priced, *prompt.last().unwrap(), 0.0).unwrap()
    };
    let firsts: Vec<usize> = step[..8].iter().map(first_choice).collect();
    let unique = |p: usize| firsts.iter().filter(|&&f| f == firsts[p]).count() == 1;
    assert!((0..8).filter(|&p| unique(p)).count() >= 4, "{firsts:?}");
    // Three producers, each sent every third request: none sees the others' placements, yet
    // the samples of each prompt whose first choice no other prompt shares land together,
    // where one producer puts them. Two prompts with one first choice may split (each
    // producer that placed one of them first finds that replica busy for the other).
    let three = side_by_side(3, &step, &replicas);
    let one = side_by_side(1, &step, &replicas);
    assert_eq!(spread(&step, &one), vec![1; 8]);
    // Per prompt (step[i] is prompt i % 8), the replicas its samples went to.
    let on = |placed: &[Option<usize>], p: usize| {
        let mut on: Vec<usize> = (p..placed.len())
            .step_by(8)
            .filter_map(|i| placed[i])
            .collect();
        on.sort_unstable();
        on.dedup();
        on
    };
    for p in 0..8 {
        if unique(p) {
            assert_eq!(on(&three, p), on(&one, p), "prompt {p}: {three:?}");
        } else {
            assert!(on(&three, p).len() <= 2, "prompt {p}: {three:?}");
        }
    }
    let spread_three: Vec<usize> = (0..8).map(|p| on(&three, p).len()).collect();
    // Each producer plans its own window of what it is sent, and they agree the same way.
    let agreeing_window = |prompts: &[Vec<BlockHash>]| {
        let mut memory = memory(1_000_000, 0);
        assign_with_memory(&batch(prompts), &replicas, &beside_peers(), &mut memory, 0)
    };
    let windows: Vec<Vec<Option<usize>>> = (0..3)
        .map(|w| {
            let mine: Vec<Vec<BlockHash>> = step.iter().skip(w).step_by(3).cloned().collect();
            agreeing_window(&mine).assignments
        })
        .collect();
    let in_windows: Vec<Option<usize>> = (0..step.len()).map(|i| windows[i % 3][i / 3]).collect();
    let one_window = agreeing_window(&step).assignments;
    for p in (0..8).filter(|&p| unique(p)) {
        assert_eq!(
            on(&in_windows, p),
            on(&one_window, p),
            "prompt {p}: {in_windows:?}"
        );
    }
    eprintln!(
        "first choices {firsts:?}; replicas per prompt with three producers {spread_three:?}"
    );
}

/// `prompts` placed on arrival by one placer, each expecting the answer `expect(prompt)` its
/// prompt's earlier answers took.
fn on_arrival_expecting(
    prompts: &[Vec<BlockHash>],
    replicas: &[Replica<'_>],
    expect: impl Fn(&[BlockHash]) -> Option<f64>,
) -> Vec<Option<usize>> {
    let mut in_flight = InFlight::new(InFlightSettings::default());
    in_flight.set_replicas(replicas);
    prompts
        .iter()
        .map(|prompt| {
            let arrival = Arrival {
                blocks: prompt,
                allowed_replicas: None,
                group_size: None,
                max_answer_tokens: None,
                expected_answer_tokens: expect(prompt),
            };
            in_flight.place(&arrival, &params(), None, 0).replica
        })
        .collect()
}

#[test]
fn a_system_prompt_every_request_shares_is_not_piled_onto_the_replicas_holding_it() {
    let ids = replica_ids(16);
    let replicas = fleet(&ids, &[]);
    // 128 agents start on one 4,096-token system prompt, each with 512 tokens of its own, one
    // every 50 ms (each prefilled before the next): the prefix they share is worth following
    // only while its holder runs no more than its share.
    let agents: Vec<Vec<BlockHash>> = (0..128).map(|a| blocks(7, 128, a, 16)).collect();
    let mut in_flight = InFlight::new(InFlightSettings::default());
    in_flight.set_replicas(&replicas);
    let placed: Vec<Option<usize>> = agents
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let arrival = Arrival {
                blocks: prompt,
                allowed_replicas: None,
                group_size: None,
                max_answer_tokens: None,
                expected_answer_tokens: None,
            };
            in_flight
                .place(&arrival, &params(), None, 50 * i as u64)
                .replica
        })
        .collect();
    let counts = counts(&placed, 16);
    let mean = 128.0 / 16.0;
    assert!(
        counts.iter().all(|&c| (c as f64) <= 1.1 * mean + 1.0),
        "{counts:?}"
    );
    // A conversation's next turn, which only it shares, stays where its history is.
    let history = blocks(9, 0, 500, 200);
    let mut next = history.clone();
    next.extend(blocks(9, 0, 501, 8));
    let placed = on_arrival(&[history, next], &replicas);
    assert_eq!(placed[0], placed[1]);
}

#[test]
fn a_prompt_whose_answers_ran_long_spreads_its_samples_and_a_short_one_keeps_them_together() {
    let ids = replica_ids(16);
    let replicas = fleet(&ids, &[]);
    // 8 prompts x 8 samples; prompts 0-3 answered 4,096 tokens last epoch, 4-7 answered 32.
    let step = rl_step(8, 8, 0, 64);
    let long: Vec<BlockHash> = step[..4].iter().map(|p| *p.last().unwrap()).collect();
    let placed = on_arrival_expecting(&step, &replicas, |prompt| {
        Some(if long.contains(prompt.last().unwrap()) {
            4_096.0
        } else {
            32.0
        })
    });
    let spread = spread(&step, &placed);
    let (long_spread, short_spread): (Vec<usize>, Vec<usize>) = {
        let mut distinct: Vec<&Vec<BlockHash>> = step.iter().collect();
        distinct.sort();
        distinct.dedup();
        let (mut l, mut s) = (Vec::new(), Vec::new());
        for (prompt, n) in distinct.iter().zip(&spread) {
            if long.contains(prompt.last().unwrap()) {
                l.push(*n)
            } else {
                s.push(*n)
            }
        }
        (l, s)
    };
    assert!(long_spread.iter().all(|&n| n >= 4), "{long_spread:?}");
    assert_eq!(short_spread, vec![1; 4]);
    // The long answers, each weighing its length, are spread over every replica.
    let busy: Vec<usize> = counts(&placed, 16);
    assert!(busy.iter().all(|&c| c >= 1), "{busy:?}");
}

/// A fleet of `speeds.len()` replicas, each of the default speed or the A100's (`true`), with
/// what it is busy with.
fn busy_fleet<'a>(ids: &'a [String], slow: &[bool], busy: &[(u8, u16)]) -> Vec<Replica<'a>> {
    ids.iter()
        .enumerate()
        .map(|(i, id)| Replica {
            running_requests: u64::from(busy[i].0 % 3),
            pace: Pace {
                speed: if slow[i] { a100() } else { Speed::default() },
                busy: Busy {
                    requests: f64::from(busy[i].0),
                    prefill_tokens: f64::from(busy[i].1),
                },
            },
            ..Replica::new(id)
        })
        .collect()
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

    /// Windows of prompts on a few system prompts (conversations' turns among them), in turn
    /// on one memory, in time mode (and with memory in the other modes): units that share a
    /// prefix keep its holders rather than walk and price each of them. The planner's debug
    /// checks compare each unit's walk, each choice (alone and beside peers; by the fair share
    /// and where a unit finishes first) and each held list with walking and pricing every
    /// replica; here, a held list's lookups agree with its pairs.
    #[test]
    fn keeping_a_prefixs_holders_chooses_as_walking_and_pricing_every_replica(
        fleet_shape in proptest::collection::vec((proptest::bool::weighted(0.3), 0u8..5, 0u16..3000), 1..20),
        windows in proptest::collection::vec(
            proptest::collection::vec((0u64..3, 0usize..6, 0u64..6, 0usize..4, 1usize..4), 1..14),
            1..4,
        ),
        k in proptest::prop_oneof![proptest::strategy::Just(-1i64), 1i64..4],
        n in 0usize..3,
        agree_with_peers in proptest::bool::ANY,
        with_memory in proptest::bool::ANY,
        capacity in 2usize..40,
        balance_by in proptest::prop_oneof![
            2 => proptest::strategy::Just(BalanceBy::Time),
            1 => proptest::strategy::Just(BalanceBy::Requests),
            1 => proptest::strategy::Just(BalanceBy::Tokens),
        ],
    ) {
        let ids = replica_ids(fleet_shape.len());
        let slow: Vec<bool> = fleet_shape.iter().map(|s| s.0).collect();
        let busy: Vec<(u8, u16)> = fleet_shape.iter().map(|s| (s.1, s.2)).collect();
        let replicas = busy_fleet(&ids, &slow, &busy);
        let params = PlanParams {
            max_per_replica: (k >= 1).then_some(k as usize),
            min_colocate_blocks: n,
            agree_with_peers,
            balance_by,
            ..params()
        };
        let mut memory = memory(capacity, 0);
        for (now_ms, window) in (0..).zip(&windows) {
            let prompts: Vec<Vec<BlockHash>> = window
                .iter()
                .flat_map(|&(system, system_blocks, tag, own, samples)| {
                    vec![blocks(system, system_blocks, tag, own); samples]
                })
                .collect();
            let requests = batch(&prompts);
            let plan = match with_memory {
                true => assign_with_memory(&requests, &replicas, &params, &mut memory, now_ms),
                false => burst_prefix_planner::assign(&requests, &replicas, &params),
            };
            for request in 0..prompts.len() {
                let pairs = plan.held.of(request);
                for replica in 0..replicas.len() {
                    let listed = pairs.iter().find(|&&(r, _)| r == replica).map_or(0, |p| p.1);
                    proptest::prop_assert_eq!(plan.held.blocks(request, replica), listed);
                }
            }
        }
    }
}
