//! Choices that independent producers agree on without talking (docs/behaviour.md §10,
//! active-active): two producers that price the replicas alike choose the same one, and two
//! that price them a little differently (each counts only its own placements in flight on top
//! of what the engines report) still do, as long as the replica they would agree on is within
//! a small slack of both cheapest.
//!
//! The rule, for a prompt no replica holds whole when the producer runs beside others
//! (`PlanParams::agree_with_peers`; alone, the cheapest replica is the better choice), applied
//! after the time cost (`crate::cost`) has priced every allowed replica: among the replicas
//! costing at most the cheapest plus [`slack`], the highest rendezvous score of the prompt with the replica's id
//! (highest-random-weight hashing: the same prompt ranks the replicas the same way in every
//! producer, and a replica that leaves moves only its own prompts). So the first copy of a
//! prompt goes to the first replica of its own ranking that the cost accepts, in every
//! producer, and the copies a producer places after it follow it there by the cost alone (which
//! prefers the replica holding it by a whole prefill, and spreads the copies evenly once that
//! one is busy).

use std::cmp::Ordering;

use xxhash_rust::xxh64::xxh64;

use crate::cost::Speed;
use crate::prefixhash::BlockHash;

/// One allowed replica as priced for a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Priced<'a> {
    pub replica: usize,
    /// Its id: the rendezvous hash's other half, the same in every producer.
    pub id: &'a str,
    /// The request's cost there, in seconds.
    pub seconds: f64,
}

/// How much more than the cheapest a replica may cost and still be chosen for agreement:
/// `SLACK_OF_A_PREFILL` of the request's prompt prefilled once from nothing at `speed` (the
/// cheapest replica's).
pub fn slack(speed: &Speed, prompt_tokens: f64) -> f64 {
    SLACK_OF_A_PREFILL
        * (speed.prefill_overhead_seconds + prompt_tokens * speed.prefill_seconds_per_token)
}

/// What another producer's placements can make the cost of a replica differ by, unseen, is its
/// own few requests in flight: each adds its prompt's prefill until its first token and a
/// little decoding after. A slack of a whole prefill let one replica take a second prompt
/// while another was idle (the planner's time tests); a quarter keeps them spread and still
/// covers a few decoding requests.
const SLACK_OF_A_PREFILL: f64 = 0.25;

/// A cost as choices compare it: one that is not a number is the worst, never free (a NaN's
/// sign would order it first or last).
fn worst_if_nan(seconds: f64) -> f64 {
    if seconds.is_nan() {
        f64::INFINITY
    } else {
        seconds
    }
}

/// The replica independent producers agree on for a prompt whose chain ends in `prompt` (its
/// last block's hash, which names all its blocks), among `priced` (none: `None`). `slack` as
/// [`slack`] gives it for the cheapest replica.
pub fn choose(priced: &[Priced<'_>], prompt: BlockHash, slack: f64) -> Option<usize> {
    let cheapest = priced
        .iter()
        .map(|p| worst_if_nan(p.seconds))
        .min_by(|a, b| a.total_cmp(b))?;
    let slack = worst_if_nan(slack).max(0.0);
    priced
        .iter()
        .filter(|p| worst_if_nan(p.seconds) <= cheapest + slack)
        .max_by(|a, b| {
            score(prompt, a.id)
                .cmp(&score(prompt, b.id))
                // Equal scores (equal ids): the lower index, as every producer sees it.
                .then_with(|| b.replica.cmp(&a.replica))
        })
        .map(|p| p.replica)
}

/// The rendezvous score of a prompt on a replica.
fn score(prompt: BlockHash, id: &str) -> u64 {
    xxh64(id.as_bytes(), prompt)
}

/// The cheapest of `priced`, ties by `tie` (the caller's static order): where there is nothing
/// to agree on (a lone producer, a prompt a replica holds whole, a request without blocks).
pub fn cheapest<'a, K: Ord>(
    priced: impl IntoIterator<Item = Priced<'a>>,
    tie: impl Fn(usize) -> K,
) -> Option<usize> {
    priced
        .into_iter()
        .min_by(|a, b| by_cost((a.seconds, tie(a.replica)), (b.seconds, tie(b.replica))))
        .map(|p| p.replica)
}

/// The order of two prices: the fewer seconds first (a NaN last), ties by the caller's order.
pub(crate) fn by_cost<K: Ord>((a, a_tie): (f64, K), (b, b_tie): (f64, K)) -> Ordering {
    worst_if_nan(a)
        .total_cmp(&worst_if_nan(b))
        .then_with(|| a_tie.cmp(&b_tie))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn priced<'a>(ids: &'a [&'a str], seconds: &[f64]) -> Vec<Priced<'a>> {
        ids.iter()
            .enumerate()
            .map(|(replica, id)| Priced {
                replica,
                id,
                seconds: seconds[replica],
            })
            .collect()
    }

    const IDS: [&str; 8] = ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"];

    #[test]
    fn equal_costs_choose_by_the_prompts_own_ranking_not_by_order() {
        let prices = priced(&IDS, &[1.0; 8]);
        let chosen: std::collections::BTreeSet<usize> = (0..64u64)
            .map(|prompt| choose(&prices, prompt, 0.0).expect("a replica"))
            .collect();
        // Different prompts spread over the replicas instead of all taking the first.
        assert!(chosen.len() >= 6, "{chosen:?}");
        // The order the replicas are listed in does not matter, only their ids.
        let mut reversed = prices.clone();
        reversed.reverse();
        for prompt in 0..64u64 {
            assert_eq!(
                choose(&prices, prompt, 0.0),
                choose(&reversed, prompt, 0.0),
                "prompt {prompt}"
            );
        }
    }

    #[test]
    fn producers_that_price_a_little_differently_still_agree_within_the_slack() {
        let prompt = 42;
        let alike = priced(&IDS, &[1.0; 8]);
        let agreed = choose(&alike, prompt, 0.05).expect("a replica");
        // Another producer has one request of its own in flight on two replicas, which it
        // prices 30 ms dearer: within a 50 ms slack it chooses the same one.
        let mut other = [1.0; 8];
        other[agreed] += 0.03;
        other[(agreed + 1) % 8] += 0.03;
        let other = priced(&IDS, &other);
        assert_eq!(choose(&other, prompt, 0.05), Some(agreed));
        // Beyond the slack the cost wins: the agreed replica is too busy.
        let mut busy = [1.0; 8];
        busy[agreed] += 0.5;
        let busy = priced(&IDS, &busy);
        let next = choose(&busy, prompt, 0.05).expect("a replica");
        assert_ne!(next, agreed);
    }

    #[test]
    fn the_slack_is_a_share_of_one_prefill_of_the_prompt() {
        let speed = Speed::default();
        let prefill = speed.prefill_overhead_seconds + 1000.0 * speed.prefill_seconds_per_token;
        assert!((slack(&speed, 1000.0) - SLACK_OF_A_PREFILL * prefill).abs() < 1e-12);
    }

    #[test]
    fn a_cost_that_is_not_a_number_is_never_chosen_over_a_number() {
        // A NaN with its sign bit set (x86's 0/0): total_cmp alone would order it first.
        let nan = -f64::NAN;
        let prices = priced(&IDS[..3], &[nan, 2.0, 1.0]);
        assert_eq!(cheapest(prices.iter().copied(), |r| r), Some(2));
        assert_ne!(choose(&prices, 7, 0.5), Some(0));
        assert_ne!(choose(&prices, 7, f64::NAN), Some(0));
    }

    #[test]
    fn nothing_to_choose_from_is_none() {
        assert_eq!(choose(&[], 1, 1.0), None);
        assert_eq!(cheapest(Vec::new(), |r| r), None);
    }
}
