//! Step 5 of the spec's placement: each unit's first replica, filled up to k, then spilled to
//! the next least-loaded replica; the load it adds.

use std::collections::BTreeSet;

use super::answer::WholeHolders;
use super::balance::{earliest_finish, Balance, Candidate};
use super::held_blocks::HeldBlocks;
use super::prefix_holders::NO_HOLDERS;
use super::recall::Recall;
use super::units::Unit;
use super::walk::{Matches, WindowHolders};
use super::{BalanceBy, HeldPrefixes, PlacementReason, Plan, PlanParams, Replica};
use crate::agree::{self, Priced};
use crate::cost::Pace;
use crate::prefixhash::BlockHash;

/// Step 5: the state of one window's placement.
///
/// Cost: with memory, each unit walks the holders of its leading blocks once (a per-replica
/// marker, never a scan of a holder list per replica), since its answer lists them all; without
/// it, the replicas a unit lands on look up what they hold, and with the prefix preference
/// (N > 0) the unit's first replica comes from the holders of its deepest held block by load
/// (`HeldBlocks`). The least-loaded replica comes from an ordered index, not a scan of the
/// replicas.
pub(super) struct UnitPlacer<'a> {
    params: &'a PlanParams,
    /// With memory: the walk reads its models beside the window's own index.
    recall: Option<Recall<'a>>,
    /// k, with unlimited as `usize::MAX`.
    k: usize,
    balance: Balance,
    /// The prefix preference: replicas need at least this many leading blocks.
    prefer_from: Option<usize>,
    load: Vec<u64>,
    /// The sum of `load`.
    total_load: u64,
    /// The static part of the tie-break: rank by (running requests, id bytes).
    order: Vec<u32>,
    /// Replicas under k for the current unit, by (load, order): the least-loaded is the first.
    under_k: BTreeSet<(u64, u32)>,
    /// Replica by `order`, to read `under_k`'s entries.
    by_order: Vec<u32>,
    /// Replicas that reached k in the current unit, out of `under_k` until the unit is placed.
    full: Vec<usize>,
    /// Placing members beyond k x replicas: every replica stays a candidate.
    overflowing: bool,
    /// Without memory: what this window placed where.
    held: HeldBlocks<'a>,
    /// With memory: the replicas this window placed each shared block on.
    window: WindowHolders,
    /// Scratch: the leading blocks of the current unit each replica holds.
    matches: Matches,
    /// Scratch, per replica: members of the current unit placed on it.
    members_here: Vec<usize>,
    /// Scratch: replicas the current unit touched, in placement order.
    touched: Vec<usize>,
    /// Scratch, per replica, with memory: a member of the current unit placed on it may use it
    /// (step 7), so its model records the unit.
    usable: Vec<bool>,
    /// Scratch for `UnitPlacer::earliest_finish`.
    price_from: Vec<f64>,
    /// In time mode: each replica's speed and what it is busy with, this window's placements
    /// included; `load` is then its cost of a cached request, in microseconds.
    paces: Vec<Pace>,
    /// In time mode: the replicas' ids, for the rank producers agree on (`crate::agree`).
    ids: Vec<&'a str>,
    /// In time mode: the lowest seconds per prefill token among the replicas.
    fastest_prefill: f64,
    /// In time mode: the highest.
    slowest_prefill: f64,
    /// When units walk (with memory, and in time mode when every replica's prefill is a
    /// finite, non-negative rate, so that the bounds along load hold): units that share a
    /// prefix keep its holders (`PrefixHolders`).
    keeps_prefixes: bool,
}

impl<'a> UnitPlacer<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        replicas: &'a [Replica<'a>],
        params: &'a PlanParams,
        balance: Balance,
        prefer_from: Option<usize>,
        load: Vec<u64>,
        recall: Option<Recall<'a>>,
        (shared_blocks, walked_pairs): (usize, usize),
        held: HeldBlocks<'a>,
    ) -> Self {
        let paces: Vec<Pace> = match balance {
            Balance::Seconds => replicas.iter().map(|replica| replica.pace).collect(),
            _ => Vec::new(),
        };
        let ids: Vec<&'a str> = match balance {
            Balance::Seconds => replicas.iter().map(|replica| replica.id).collect(),
            _ => Vec::new(),
        };
        let fastest_prefill = paces
            .iter()
            .map(|pace| pace.speed.prefill_seconds_per_token)
            .fold(f64::INFINITY, f64::min);
        let slowest_prefill = paces
            .iter()
            .map(|pace| pace.speed.prefill_seconds_per_token)
            .fold(0.0, f64::max);
        let keeps_prefixes = match balance {
            Balance::Seconds => paces.iter().all(|pace| {
                let rate = pace.speed.prefill_seconds_per_token;
                rate.is_finite() && rate >= 0.0
            }),
            // Units walk with memory only.
            _ => recall.is_some(),
        };
        let load = match balance {
            Balance::Seconds => paces
                .iter()
                .map(|pace| micros(pace.seconds(0.0, 0.0, params.answer_tokens(None, None))))
                .collect(),
            _ => load,
        };
        let mut by_order: Vec<u32> = (0..replicas.len() as u32).collect();
        // Stable: equal ids (never in practice) keep index order.
        by_order.sort_by(|&a, &b| {
            let key = |r: u32| {
                let replica = &replicas[r as usize];
                (replica.running_requests, replica.id.as_bytes())
            };
            key(a).cmp(&key(b))
        });
        let mut order = vec![0; replicas.len()];
        for (rank, &replica) in by_order.iter().enumerate() {
            order[replica as usize] = rank as u32;
        }
        UnitPlacer {
            params,
            k: params.max_per_replica.unwrap_or(usize::MAX),
            balance,
            prefer_from,
            under_k: (0..replicas.len()).map(|r| (load[r], order[r])).collect(),
            total_load: load.iter().sum(),
            load,
            order,
            by_order,
            full: Vec::new(),
            overflowing: false,
            held,
            window: WindowHolders::with_capacity(shared_blocks, walked_pairs),
            matches: Matches::new(replicas.len()),
            members_here: vec![0; replicas.len()],
            touched: Vec::new(),
            usable: vec![false; if recall.is_some() { replicas.len() } else { 0 }],
            price_from: Vec::new(),
            paces,
            ids,
            fastest_prefill,
            slowest_prefill,
            keeps_prefixes,
            recall,
        }
    }

    /// Whether units walk the holders of their blocks (with memory, and in time mode), rather
    /// than look up what the replicas they land on hold.
    fn walks(&self) -> bool {
        self.recall.is_some() || matches!(self.balance, Balance::Seconds)
    }

    /// With memory (the models are read; this window's touches wait for `Memory::settle`).
    pub(super) fn remembers(&self) -> bool {
        self.recall.is_some()
    }

    /// The final load per replica.
    pub(super) fn into_loads(self) -> Vec<u64> {
        self.load
    }

    pub(super) fn place(&mut self, unit: &Unit<'a>, plan: &mut Plan) {
        // Every unit that records shared blocks goes this way while a prefix is kept, so what it
        // holds changes only where such a unit lands (`PrefixHolders`).
        let past_prefix = self.keeps_prefixes && unit.shared() > 0;
        if past_prefix {
            if !self
                .matches
                .kept_prefix()
                .starts(unit.blocks, unit.shared())
            {
                self.keep_prefix(unit, plan);
            }
            self.matches.walk_past_prefix(
                &self.window,
                self.recall.as_mut(),
                unit.blocks,
                unit.shared(),
            );
            #[cfg(debug_assertions)]
            self.check_walk_past_prefix(unit);
        } else if self.walks() {
            self.matches.walk(
                &self.window,
                self.recall.as_mut(),
                unit.blocks,
                unit.shared(),
            );
        } else {
            self.held.start_unit(unit.blocks);
        }
        if self.recall.is_some() {
            self.matches
                .keep_as_held_list(&unit.members, &mut plan.held);
            #[cfg(debug_assertions)]
            self.check_held_list(unit, plan);
        }
        if matches!(self.balance, Balance::Seconds) {
            self.place_members_by_seconds(unit, plan);
        } else {
            self.fill_and_spill(unit, plan);
        }
        self.restore_full();
        if let Some(recall) = &mut self.recall {
            // The unit is recorded where a member may stay (step 7 takes the others back).
            for &member in &unit.members {
                if let Some(replica) = plan.assignments[member] {
                    if recall.may_use(member, replica) {
                        self.usable[replica] = true;
                    }
                }
            }
            for &replica in &self.touched {
                if std::mem::take(&mut self.usable[replica]) {
                    recall.memory.touch(recall.slots[replica], unit.blocks);
                }
            }
        }
        // In time mode each replica was recorded when the unit first landed there.
        let recorded = !matches!(self.balance, Balance::Seconds);
        for i in 0..self.touched.len() {
            let replica = self.touched[i];
            if recorded {
                self.record(self.recorded_blocks(unit), replica);
            }
            self.members_here[replica] = 0;
        }
        if past_prefix {
            // Each holds the unit's shared blocks now (recorded above, or as it first landed
            // in time mode), the prefix among them.
            for i in 0..self.touched.len() {
                let replica = self.touched[i];
                let key = self.key(replica);
                if self.matches.kept_prefix().join(replica, key) {
                    self.log_whole_holder(replica, plan);
                }
            }
        }
        self.touched.clear();
        self.matches.clear();
    }

    /// Walks the prefix `unit` starts with, that as many units share as its first block, and
    /// keeps its holders for the units after it that start with it too.
    fn keep_prefix(&mut self, unit: &Unit<'a>, plan: &mut Plan) {
        let prefix = &unit.blocks[..unit.widest_shared()];
        let logged_in = match self.remembers() {
            true => {
                plan.held
                    .whole_holders
                    .push(WholeHolders::new(prefix.len()));
                (plan.held.whole_holders.len() - 1) as u32
            }
            false => NO_HOLDERS,
        };
        self.matches
            .walk(&self.window, self.recall.as_mut(), prefix, unit.shared());
        let (load, order) = (&self.load, &self.order);
        let whole = self
            .matches
            .keep_as_prefix(prefix, |r| (load[r], order[r]), logged_in);
        for replica in whole {
            self.log_whole_holder(replica, plan);
        }
    }

    /// With memory, logs that `replica` came to hold the kept prefix whole, for the answer.
    fn log_whole_holder(&mut self, replica: usize, plan: &mut Plan) {
        let logged_in = self.matches.kept_prefix().logged_in();
        if logged_in != NO_HOLDERS {
            plan.held.whole_holders[logged_in as usize]
                .joined
                .push(replica);
        }
    }

    /// Debug builds check the walk past a kept prefix against the whole walk.
    #[cfg(debug_assertions)]
    fn check_walk_past_prefix(&mut self, unit: &Unit<'_>) {
        let mut every = Matches::new(self.load.len());
        every.walk(
            &self.window,
            self.recall.as_mut(),
            unit.blocks,
            unit.shared(),
        );
        for replica in 0..self.load.len() {
            debug_assert_eq!(
                self.matches.of(replica),
                every.of(replica),
                "the walk past the kept prefix found otherwise than the whole walk"
            );
        }
    }

    /// Debug builds check that the unit's held list, its whole holders counted, names what
    /// the walk found.
    #[cfg(debug_assertions)]
    fn check_held_list(&self, unit: &Unit<'_>, plan: &Plan) {
        let found: Vec<(usize, usize)> = (0..self.load.len())
            .map(|replica| (replica, self.matches.of(replica)))
            .filter(|&(_, blocks)| blocks > 0)
            .collect();
        debug_assert_eq!(
            plan.held.of(unit.members[0]),
            found,
            "the held list counted otherwise than the walk found"
        );
    }

    /// The blocks of `unit` the window's own index needs: with memory (and in time mode), only
    /// those its other units walk; a unit's blocks past the prefix it shares with another unit
    /// go to the memory alone.
    fn recorded_blocks<'u>(&self, unit: &Unit<'u>) -> &'u [BlockHash] {
        match self.walks() {
            true => &unit.blocks[..unit.shared()],
            false => unit.blocks,
        }
    }

    /// Steps 5-6: the unit's first replica filled up to k, then spilled to the next
    /// least-loaded replica under k; members beyond k x replicas one at a time.
    fn fill_and_spill(&mut self, unit: &Unit<'a>, plan: &mut Plan) {
        let k = self.k;
        let members = &unit.members;
        let mut next = 0;
        let (mut target, mut reason) = self.first_replica(unit);
        // Fill one replica up to k, then spill to the next least-loaded replica under k.
        loop {
            let take = k.min(members.len() - next);
            self.put(unit, &members[next..next + take], target, reason, plan);
            next += take;
            if next == members.len() {
                break;
            }
            reason = PlacementReason::LeastLoaded;
            match self.least_loaded() {
                Some(replica) => target = replica,
                None => break,
            }
        }
        // Members beyond k x replicas: one at a time on the least-loaded replica, all of them
        // candidates again.
        if next < members.len() {
            self.restore_full();
            self.overflowing = true;
            for member in next..members.len() {
                let replica = self.least_loaded().expect("at least one replica");
                let one = &members[member..=member];
                self.put(unit, one, replica, PlacementReason::LeastLoaded, plan);
            }
            self.overflowing = false;
        }
    }

    /// Time mode: each member where it is answered first (`crate::cost`), among the replicas
    /// holding a prefix of the unit (the members placed before it included) and the others;
    /// at most k members on one replica while any replica is under k.
    fn place_members_by_seconds(&mut self, unit: &Unit<'a>, plan: &mut Plan) {
        let need = self.prefer_from.unwrap_or(1);
        // Why the unit is on each replica it landed on (its first member there).
        let mut landed: Vec<(usize, PlacementReason)> = Vec::new();
        for &member in &unit.members {
            let replica = match self.cheapest(unit) {
                Some(replica) => replica,
                None => {
                    // Every replica holds k members of the unit: all are candidates again.
                    self.restore_full();
                    self.overflowing = true;
                    self.cheapest(unit).expect("at least one replica")
                }
            };
            let reason = match landed.iter().find(|(r, _)| *r == replica) {
                Some(&(_, reason)) => reason,
                None => {
                    let held = self.matches.of(replica);
                    let reason = if held < need {
                        PlacementReason::LeastLoaded
                    } else if self.recall.is_some()
                        && !self.window.holds(unit.blocks, replica, need)
                    {
                        PlacementReason::Memory
                    } else {
                        PlacementReason::Window
                    };
                    landed.push((replica, reason));
                    reason
                }
            };
            let first_here = self.members_here[replica] == 0;
            self.put(unit, &[member], replica, reason, plan);
            if first_here {
                self.record(self.recorded_blocks(unit), replica);
            }
            // Its next members find the whole unit there.
            self.matches.raise(replica, unit.blocks.len());
        }
        self.overflowing = false;
    }

    /// Time mode: the replica where one more member of `unit` is answered first, among those
    /// under k for the unit (all of them while overflowing); ties by step 6's order. Beside
    /// other producers, while no replica holds the whole unit, the one they all would choose
    /// among those within the slack of the cheapest (`crate::agree`). The replicas holding a
    /// kept prefix whole and those holding none of the unit are read by key, stopping once no
    /// further one can win; the others are priced each.
    fn cheapest(&self, unit: &Unit<'_>) -> Option<usize> {
        let blocks = unit.blocks.len();
        let block_tokens = f64::from(self.params.block_tokens);
        let prompt_tokens = blocks as f64 * block_tokens;
        let n = self.params.min_colocate_blocks;
        // `load` is the cost of a request holding nothing and prefilling nothing; a member
        // prefills what the replica lacks, and waits for no queued prefill it shares.
        let cost = |replica: usize| {
            let pace = &self.paces[replica];
            // A prefix shorter than N blocks is not followed.
            let held = match self.matches.of(replica) {
                held if held < n => 0.0,
                held => held as f64 * block_tokens,
            };
            let uncached = prompt_tokens - held;
            let shared = held.min(pace.busy.prefill_tokens);
            seconds(self.load[replica]) + (uncached - shared) * pace.speed.prefill_seconds_per_token
        };
        let eligible = |replica: usize| self.overflowing || self.members_here[replica] < self.k;
        let replica_of = |&(_, rank): &(u64, u32)| self.by_order[rank as usize] as usize;
        // Along step 6's key the replicas holding none of the unit cost their load plus at
        // least `cold`, and those holding the prefix whole their load plus at least
        // `whole_floor` (its tokens held, and as many of queued prefill shared at most).
        let cold = prompt_tokens * self.fastest_prefill;
        let prefix = self.matches.prefix();
        let whole_floor = prefix.map_or(0.0, |prefix| {
            let held = match prefix.len() {
                len if len < n => 0.0,
                len => len as f64 * block_tokens,
            };
            let least = prompt_tokens - 2.0 * held;
            least
                * match least >= 0.0 {
                    true => self.fastest_prefill,
                    false => self.slowest_prefill,
                }
        });
        let cold_within = |at_most: f64| {
            self.under_k
                .iter()
                .take_while(move |&&(load, _)| seconds(load) + cold <= at_most)
                .map(replica_of)
        };
        let whole_within = |at_most: f64| {
            prefix
                .into_iter()
                .flat_map(|prefix| prefix.whole().iter())
                .take_while(move |&&(load, _)| seconds(load) + whole_floor <= at_most)
                .map(replica_of)
                .filter(|&r| !self.matches.is_matched(r))
        };
        // The replicas priced each: those the walk matched, and those holding part of the
        // prefix.
        let each = || {
            let partial = prefix.into_iter().flat_map(|prefix| prefix.partial());
            (self.matches.matched().iter().copied())
                .chain(partial.filter(|&r| !self.matches.is_matched(r)))
                .filter(|&r| eligible(r))
        };
        type Best = Option<(f64, (u64, u32), usize)>;
        let mut best: Best = None;
        let consider = |replica: usize, best: &mut Best| {
            let rank = (cost(replica), self.key(replica), replica);
            let lower = best.as_ref().is_none_or(|b| (rank.0, rank.1) < (b.0, b.1));
            if lower {
                *best = Some(rank);
            }
        };
        // Along a key order, no later replica can win once one's bound passes the best, or
        // meets it with a key no lower (with equal loads, not all of them are priced).
        let beaten = |bound: f64, key: (u64, u32), best: &Best| {
            best.as_ref()
                .is_some_and(|b| bound > b.0 || (bound == b.0 && key >= b.1))
        };
        for replica in each() {
            consider(replica, &mut best);
        }
        for &(load, rank) in prefix.into_iter().flat_map(|prefix| prefix.whole().iter()) {
            if beaten(seconds(load) + whole_floor, (load, rank), &best) {
                break;
            }
            let replica = replica_of(&(load, rank));
            // Matched: priced above, and maybe at k.
            if !self.matches.is_matched(replica) {
                consider(replica, &mut best);
            }
        }
        for &(load, rank) in &self.under_k {
            if beaten(seconds(load) + cold, (load, rank), &best) {
                break;
            }
            consider(replica_of(&(load, rank)), &mut best);
        }
        // Tests and debug builds check the few priced choose as pricing every replica would.
        #[cfg(debug_assertions)]
        if self.keeps_prefixes {
            let every = (0..self.load.len())
                .filter(|&r| eligible(r))
                .map(|r| (cost(r), self.key(r), r))
                .min_by(|a, b| (a.0, a.1).partial_cmp(&(b.0, b.1)).expect("finite costs"));
            debug_assert_eq!(
                every.map(|(.., r)| r),
                best.map(|(.., r)| r),
                "pricing the few that can win chose otherwise than pricing every replica"
            );
        }
        let (cheapest, _, replica) = best?;
        let held_whole = self
            .matches
            .matched()
            .iter()
            .any(|&r| self.matches.of(r) >= blocks)
            || prefix.is_some_and(|prefix| prefix.len() >= blocks && !prefix.whole().is_empty());
        let agree = self.params.agree_with_peers && !held_whole;
        let Some(&prompt) = unit.blocks.last().filter(|_| agree) else {
            return Some(replica);
        };
        let slack = agree::slack(&self.paces[replica].speed, prompt_tokens);
        let priced = |replica: usize| Priced {
            replica,
            id: self.ids[replica],
            seconds: cost(replica),
        };
        let within: Vec<Priced<'_>> = each()
            .chain(whole_within(cheapest + slack))
            .chain(cold_within(cheapest + slack))
            .map(priced)
            .filter(|p| p.seconds <= cheapest + slack)
            .collect();
        let chosen = agree::choose(&within, prompt, slack);
        #[cfg(debug_assertions)]
        if self.keeps_prefixes {
            let every: Vec<Priced<'_>> = (0..self.load.len())
                .filter(|&r| eligible(r))
                .map(priced)
                .filter(|p| p.seconds <= cheapest + slack)
                .collect();
            debug_assert_eq!(
                agree::choose(&every, prompt, slack),
                chosen,
                "agreeing among the few within the slack chose otherwise than among all"
            );
        }
        chosen
    }

    /// With memory, for a request outside every unit (entry `entry` of the batch): what the
    /// replicas held of it, for its answer.
    pub(super) fn keep_held_list_of(
        &mut self,
        blocks: &[BlockHash],
        entry: usize,
        held: &mut HeldPrefixes,
    ) {
        self.matches
            .walk(&self.window, self.recall.as_mut(), blocks, 0);
        self.matches.keep_as_held_list(&[entry], held);
        self.matches.clear();
    }

    /// Records `blocks` as held by `replica` in this window; its leading matched blocks
    /// already are.
    fn record(&mut self, blocks: &[BlockHash], replica: usize) {
        let from = self.matches.of(replica);
        if !self.walks() {
            let key = self.key(replica);
            self.held.record(from, replica as u32, key);
        } else {
            self.window
                .record(blocks.get(from..).unwrap_or_default(), replica as u32);
        }
    }

    /// The replica a unit starts on, and why: the longest held prefix (at least the
    /// preference's blocks) among replicas under the fair share, else the least-loaded replica
    /// (every replica is under k when a unit starts).
    fn first_replica(&mut self, unit: &Unit<'_>) -> (usize, PlacementReason) {
        let preferred = match &self.balance {
            Balance::FairShare { max_share } if self.recall.is_none() => {
                let max_share = *max_share;
                let (load, order, by_order) = (&self.load, &self.order, &self.by_order);
                self.prefer_from.and_then(|need| {
                    self.held.longest_prefix_under_share(
                        need,
                        max_share,
                        |replica| (load[replica], order[replica]),
                        |rank| by_order[rank as usize] as usize,
                    )
                })
            }
            Balance::FairShare { max_share } => self.prefer_from.and_then(|need| {
                let by_match = |&a: &usize, &b: &usize| {
                    self.matches
                        .of(a)
                        .cmp(&self.matches.of(b))
                        .then_with(|| self.key(b).cmp(&self.key(a)))
                };
                let under_share =
                    |&r: &usize| self.matches.of(r) >= need && self.load[r] < *max_share;
                let preferred = self.holders().filter(under_share).max_by(by_match);
                // Tests and debug builds check the few read choose as reading every replica.
                debug_assert_eq!(
                    (0..self.load.len()).filter(under_share).max_by(by_match),
                    preferred,
                    "reading the few that can win chose otherwise than reading every replica"
                );
                preferred
            }),
            Balance::EarliestFinish => self.earliest_finish(unit),
            Balance::Seconds => unreachable!("time mode places member by member"),
        };
        match preferred {
            Some(best) => {
                let need = self.prefer_from.unwrap_or(1);
                // From memory when this window's placements alone would not have preferred it.
                let reason = if self.recall.is_some() && !self.window.holds(unit.blocks, best, need)
                {
                    PlacementReason::Memory
                } else {
                    PlacementReason::Window
                };
                (best, reason)
            }
            None => {
                let replica = self.least_loaded().expect("at least one replica");
                (replica, PlacementReason::LeastLoaded)
            }
        }
    }

    /// Places `members` (of one unit) on `replica`.
    fn put(
        &mut self,
        unit: &Unit<'_>,
        members: &[usize],
        replica: usize,
        reason: PlacementReason,
        plan: &mut Plan,
    ) {
        let key_before = self.key(replica);
        let indexed = self.under_k.remove(&key_before);
        if self.members_here[replica] == 0 {
            self.touched.push(replica);
            if !self.walks() {
                // Not walked: look up only what this replica holds.
                self.matches.set(replica, self.held.held_prefix(replica));
            }
            if self.params.balance_by == BalanceBy::Tokens {
                // A prefix already held on this replica is not prefilled again.
                let prefill = (unit.blocks.len() - self.matches.of(replica)) as u64;
                self.load[replica] += prefill;
                self.total_load += prefill;
            }
        }
        if self.params.balance_by == BalanceBy::Requests {
            self.load[replica] += members.len() as u64;
            self.total_load += members.len() as u64;
        }
        if let Some(pace) = self.paces.get_mut(replica) {
            let uncached = (unit.blocks.len() - self.matches.of(replica)) as f64
                * f64::from(self.params.block_tokens);
            for _ in members {
                pace.add(uncached);
            }
            let load = micros(pace.seconds(0.0, 0.0, self.params.answer_tokens(None, None)));
            self.total_load = self.total_load - self.load[replica] + load;
            self.load[replica] = load;
        }
        self.members_here[replica] += members.len();
        for &member in members {
            plan.assignments[member] = Some(replica);
            plan.reasons[member] = Some(reason);
        }
        if self.matches.kept_prefix().holds_whole(replica) {
            let key = self.key(replica);
            self.matches.kept_prefix().rekey(key_before, key);
        }
        if indexed {
            if self.overflowing || self.members_here[replica] < self.k {
                self.under_k.insert(self.key(replica));
            } else {
                self.full.push(replica);
            }
        }
    }

    /// Puts the replicas that reached k in this unit back among the candidates.
    fn restore_full(&mut self) {
        for i in 0..self.full.len() {
            let replica = self.full[i];
            self.under_k.insert(self.key(replica));
        }
        self.full.clear();
    }

    /// Step 6's order: lower window load, then fewer running requests, then the lower id.
    fn key(&self, replica: usize) -> (u64, u32) {
        (self.load[replica], self.order[replica])
    }

    /// The least-loaded replica under k for the current unit.
    fn least_loaded(&self) -> Option<usize> {
        self.under_k
            .first()
            .map(|&(_, rank)| self.by_order[rank as usize] as usize)
    }

    /// The replica holding a prefix (at least the preference's blocks) where the unit's first
    /// member finishes first, if it beats the least-loaded replica (`earliest_finish`, with the
    /// window's units as the users of each block).
    fn earliest_finish(&mut self, unit: &Unit<'_>) -> Option<usize> {
        // One buffer for every unit's prices: allocating one per unit showed in the profile.
        let mut price_from = std::mem::take(&mut self.price_from);
        let need = self.prefer_from.unwrap_or(1);
        let held = |r: usize| Some(self.matches.of(r)).filter(|&m| m >= need).unwrap_or(0);
        let candidate = |r: usize| Candidate {
            replica: r,
            held: held(r),
            load: self.load[r] as f64,
            key: self.key(r),
        };
        let coldest = self.least_loaded().expect("at least one replica");
        let best = earliest_finish(
            unit.blocks.len(),
            self.holders().map(candidate),
            candidate(coldest),
            |depth| unit.shared_by(depth),
            (self.total_load as f64, self.load.len()),
            &mut price_from,
        );
        // Tests and debug builds check the few ranked choose as ranking every holder.
        #[cfg(debug_assertions)]
        {
            let every = (0..self.load.len()).filter(|&r| self.matches.of(r) > 0);
            let chosen = earliest_finish(
                unit.blocks.len(),
                every.map(candidate),
                candidate(coldest),
                |depth| unit.shared_by(depth),
                (self.total_load as f64, self.load.len()),
                &mut price_from,
            );
            debug_assert_eq!(
                chosen, best,
                "ranking the few that can win chose otherwise than ranking every holder"
            );
        }
        self.price_from = price_from;
        best
    }

    /// The replicas holding a prefix of the current unit that can be the one it starts on
    /// by the fair share or where it finishes first: past a kept prefix, of its whole holders
    /// (alike but for their key, which orders both) only the first the walk did not match.
    fn holders(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        let prefix = self.matches.prefix();
        let unmatched = |&r: &usize| !self.matches.is_matched(r);
        let partial = prefix
            .into_iter()
            .flat_map(|prefix| prefix.partial())
            .filter(unmatched);
        let first_whole = prefix.and_then(|prefix| {
            (prefix.whole().iter())
                .map(|&(_, rank)| self.by_order[rank as usize] as usize)
                .find(unmatched)
        });
        (self.matches.matched().iter().copied())
            .chain(partial)
            .chain(first_whole)
    }
}

/// Seconds as the whole microseconds `UnitPlacer::load` holds in time mode.
fn micros(seconds: f64) -> u64 {
    // A cost that is not a number is the worst, never free.
    if seconds.is_nan() {
        return u64::MAX;
    }
    (seconds * 1e6).round() as u64
}

/// Microseconds of `UnitPlacer::load` as seconds.
fn seconds(micros: u64) -> f64 {
    micros as f64 * 1e-6
}
