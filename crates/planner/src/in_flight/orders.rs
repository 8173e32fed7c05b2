//! The replicas in the orders the placer on arrival searches: by load for the least-loaded, and,
//! for time mode while every replica has one pace, the orders in which the cheapest replica
//! holding none of a prompt is found without pricing every replica. Such a replica's cost rises
//! with its load and with the prefill queued on it (`crate::cost`), and with nothing else.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::ops::Bound::{Excluded, Unbounded};

use crate::agree::by_cost;

/// Where a replica stands: its load and the prompt tokens queued on it to prefill, both as of
/// the placer's frame and never negative (so their bits order as the numbers do), and its rank.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Standing {
    pub load: f64,
    pub queued: f64,
    pub rank: u32,
}

/// Keys are (a figure's bits, rank): by the figure, ties by rank.
type Order = BTreeSet<(u64, u32)>;

#[derive(Debug, Default)]
pub(super) struct Orders {
    /// Every replica by load: the least-loaded first.
    by_load: Order,
    /// Replicas with no prefill queued, by load.
    resting: Order,
    /// Replicas with prefill queued, by load and by the tokens queued.
    prefilling_by_load: Order,
    prefilling_by_queue: Order,
}

impl Orders {
    pub fn insert(&mut self, standing: Standing) {
        self.by_load.insert(load_key(standing));
        if standing.queued > 0.0 {
            self.prefilling_by_load.insert(load_key(standing));
            self.prefilling_by_queue.insert(queue_key(standing));
        } else {
            self.resting.insert(load_key(standing));
        }
    }

    pub fn remove(&mut self, standing: Standing) {
        self.by_load.remove(&load_key(standing));
        if standing.queued > 0.0 {
            self.prefilling_by_load.remove(&load_key(standing));
            self.prefilling_by_queue.remove(&queue_key(standing));
        } else {
            self.resting.remove(&load_key(standing));
        }
    }

    pub fn clear(&mut self) {
        *self = Orders::default();
    }

    /// Every replica's rank, the least-loaded first (ties by rank).
    pub fn ranks_by_load(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_load.iter().map(|&(_, rank)| rank)
    }

    /// The rank of the cheapest replica with no prefill queued that `skip` leaves, by `price`
    /// (seconds; ties by rank). Along the load order their prices never fall, so the search
    /// stops at the first load priced higher than the cheapest, and of each load prices only
    /// the lowest rank `skip` leaves: the others of that load cost as much and lose the tie.
    pub fn cheapest_resting(
        &self,
        skip: impl Fn(u32) -> bool,
        mut price: impl FnMut(u32) -> f64,
    ) -> Option<u32> {
        let mut cheapest: Option<(f64, u32)> = None;
        let mut from = Unbounded;
        while let Some(&(load, rank)) = self
            .resting
            .range((from, Unbounded))
            .find(|&&(_, rank)| !skip(rank))
        {
            let priced = (price(rank), rank);
            if let Some(best) = cheapest {
                // Higher loads cost no less; one costing the same may still win by rank.
                if by_cost((priced.0, ()), (best.0, ())) == Ordering::Greater {
                    break;
                }
            }
            if cheapest.is_none_or(|best| by_cost(priced, best) == Ordering::Less) {
                cheapest = Some(priced);
            }
            from = Excluded((load, u32::MAX));
        }
        cheapest.map(|(_, rank)| rank)
    }

    /// The rank of the cheapest replica with prefill queued that `skip` leaves, by `price`
    /// (seconds; ties by rank), where `least(load, queued)` is what a replica with at least
    /// that load and that many tokens queued costs at the least. Walks the two orders side by
    /// side (Fagin's threshold algorithm): a replica seen in neither has at least the load and
    /// the queue last seen in each, so the search stops once that bound costs more than the
    /// cheapest priced. A burst keeps load and queue in step, so it stops early.
    pub fn cheapest_prefilling(
        &self,
        skip: impl Fn(u32) -> bool,
        mut price: impl FnMut(u32) -> f64,
        least: impl Fn(f64, f64) -> f64,
    ) -> Option<u32> {
        let mut cheapest: Option<(f64, u32)> = None;
        let (mut by_load, mut by_queue) = (
            self.prefilling_by_load.iter(),
            self.prefilling_by_queue.iter(),
        );
        // Both hold every prefilling replica: once one is walked, all were seen.
        while let (Some(&(load, by_load_rank)), Some(&(queued, by_queue_rank))) =
            (by_load.next(), by_queue.next())
        {
            for rank in [by_load_rank, by_queue_rank] {
                if skip(rank) {
                    continue;
                }
                let priced = (price(rank), rank);
                if cheapest.is_none_or(|best| by_cost(priced, best) == Ordering::Less) {
                    cheapest = Some(priced);
                }
            }
            let unseen = least(f64::from_bits(load), f64::from_bits(queued));
            if cheapest.is_some_and(|(seconds, _)| seconds < unseen) {
                break;
            }
        }
        cheapest.map(|(_, rank)| rank)
    }
}

/// By load, ties by rank.
pub(super) fn load_key(standing: Standing) -> (u64, u32) {
    (standing.load.to_bits(), standing.rank)
}

fn queue_key(standing: Standing) -> (u64, u32) {
    (standing.queued.to_bits(), standing.rank)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replicas at (load, queued), rank = index.
    fn ordered(standings: &[(f64, f64)]) -> Orders {
        let mut orders = Orders::default();
        for (rank, &(load, queued)) in standings.iter().enumerate() {
            orders.insert(Standing {
                load,
                queued,
                rank: rank as u32,
            });
        }
        orders
    }

    /// A price never falling with either, as the time cost's (flat past a load: a replica's
    /// slots full; equal prices at other figures are frequent, to try the ties).
    fn cost(load: f64, queued: f64) -> f64 {
        (load * 3.0).min(6.0) + queued
    }

    fn cheapest_by_pricing_all(
        standings: &[(f64, f64)],
        prefilling: bool,
        skip: impl Fn(u32) -> bool,
    ) -> Option<u32> {
        (0..standings.len() as u32)
            .filter(|&r| (standings[r as usize].1 > 0.0) == prefilling && !skip(r))
            .min_by(|&a, &b| {
                let price = |r: u32| (cost(standings[r as usize].0, standings[r as usize].1), r);
                by_cost(price(a), price(b))
            })
    }

    proptest::proptest! {
        #[test]
        fn the_searches_choose_as_pricing_every_replica(
            standings in proptest::collection::vec((0u8..6, 0u8..4), 1..40),
            skipped in proptest::collection::vec(proptest::bool::ANY, 40),
        ) {
            let standings: Vec<(f64, f64)> = standings
                .iter()
                .map(|&(load, queued)| (f64::from(load) / 2.0, f64::from(queued) * 1.5))
                .collect();
            let orders = ordered(&standings);
            let skip = |r: u32| skipped[r as usize];
            let price = |r: u32| cost(standings[r as usize].0, standings[r as usize].1);
            proptest::prop_assert_eq!(
                orders.cheapest_resting(skip, price),
                cheapest_by_pricing_all(&standings, false, skip)
            );
            proptest::prop_assert_eq!(
                orders.cheapest_prefilling(skip, price, cost),
                cheapest_by_pricing_all(&standings, true, skip)
            );
        }
    }

    #[test]
    fn a_burst_prices_a_few_replicas_not_the_fleet() {
        // 1,024 replicas, each with one request: equal loads, queues of every length.
        let standings: Vec<(f64, f64)> = (0..1_024).map(|r| (1.0, 100.0 + r as f64)).collect();
        let orders = ordered(&standings);
        let mut priced = 0;
        let price = |r: u32| {
            priced += 1;
            cost(standings[r as usize].0, standings[r as usize].1)
        };
        assert_eq!(orders.cheapest_prefilling(|_| false, price, cost), Some(0));
        assert!(priced <= 4, "priced {priced}");
        // Idle replicas of one load: only the first of that load is priced.
        let idle = ordered(&vec![(0.0, 0.0); 1_024]);
        let mut priced = 0;
        let price = |_| {
            priced += 1;
            1.0
        };
        assert_eq!(idle.cheapest_resting(|r| r < 3, price), Some(3));
        assert_eq!(priced, 1);
    }
}
