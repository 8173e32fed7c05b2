//! Placement without a window (zero-wait mode, `windowDurationMs: 0`): each request is placed
//! the moment it arrives, from what is known then: the placements still in flight, and with
//! [`Memory`] what each replica probably still caches.
//!
//! The rules are the window's, applied one request at a time:
//! - A request whose identical prompt (its group) is in flight follows it: onto the seats its
//!   group booked (below), else onto the replica its group is filling while the group has fewer
//!   than k members there, else onto the least-loaded replica where it has fewer than k (all at
//!   k: the least-loaded replica).
//! - Otherwise it starts where the longest prefix of its blocks is held (at least N blocks; with
//!   memory at least one), among the replicas whose load is under the fair share of the work in
//!   flight (the spec's step 4, over in-flight work instead of the window), else on the
//!   least-loaded replica. Ties as in the spec's step 6: lower load, fewer running requests,
//!   lower id.
//! - A group's first member that says how many members its group has (`group_size`) books the
//!   whole group's seats at once, as the window places a unit: k on its first replica, then k on
//!   the next least-loaded one, and so on. So a burst of hinted groups splits as the window
//!   would split it.
//!
//! Load is in the unit of `balance_by`: requests, or blocks to prefill (blocks held on the
//! replica, in flight or in its memory model, are not prefilled again). A caller that learns
//! completions (the proxy) calls [`InFlight::finish`]; one that does not (the endpoint picker,
//! `/v1/produce`) sets a half-life, and each placement's load then decays and expires.
//!
//! In time mode ([`BalanceBy::Time`]) the rules give way to one cost (`crate::cost`): each
//! request goes where it is answered first, from each replica's pace (set with
//! [`InFlight::set_replicas`] and [`InFlight::set_pace`]: its speed, and what its engine says it
//! runs) and this producer's own placements in flight: their count, and the prompt tokens they
//! have yet to prefill (each counted until its predicted first token). Beside other producers
//! (`PlanParams::agree_with_peers`), a prompt no replica holds whole goes, among the replicas
//! within a slack of the cheapest, to the first of its own rendezvous ranking (`crate::agree`),
//! so that producers placing the same burst side by side agree; its later copies follow it by
//! the cost alone. `group_size` books no seats.
//!
//! Cost per request: the holders of the blocks walked (each visited once, as in the spec's walk)
//! and an ordered index of the replicas by load, never a scan of every replica; in time mode,
//! while every replica has one pace, the holders priced and the cheapest others found along
//! orders by load and by queued prefill (`orders`); otherwise a pass over the replicas' costs.

use std::cmp::Reverse;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use crate::agree::{self, Priced};
use crate::cost::{Busy, Pace};
use crate::memory::Memory;
use crate::plan::{
    earliest_finish, BalanceBy, BuildBlockHasher, Candidate, PlacementReason, PlanParams, Replica,
};
use crate::prefixhash::BlockHash;

mod orders;
use orders::{Orders, Standing};

/// A replica of `pace` (its speed, and what its engine says it runs) with this producer's
/// `load` and `queued` prompt tokens as of the frame, at the frame's `decay` to now.
fn paced(pace: Pace, load: f64, queued: f64, decay: f64) -> Pace {
    Pace {
        speed: pace.speed,
        busy: Busy {
            requests: (load * decay).max(pace.busy.requests),
            prefill_tokens: queued * decay + pace.busy.prefill_tokens,
        },
    }
}

/// The knobs of the in-flight estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InFlightSettings {
    /// 0: a placement counts until [`InFlight::finish`]. Otherwise its load halves every this
    /// many ms, and it is dropped after `EXPIRY_HALF_LIVES` half-lives (callers that see no
    /// completions).
    pub load_half_life_ms: u64,
}

/// A placement counts for this many half-lives at most (its load is then under a millionth).
const EXPIRY_HALF_LIVES: u64 = 20;

/// One request as it arrives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival<'a> {
    /// All its block hashes (its prompts' chains, concatenated).
    pub blocks: &'a [BlockHash],
    /// Indices of the replicas it may use; `None` means all of them.
    pub allowed_replicas: Option<&'a [usize]>,
    /// How many requests its group (identical prompts) has, when the client says (n samples).
    pub group_size: Option<usize>,
    /// The longest answer it asks for (`max_tokens`), when it says; the time cost prices its
    /// decode at no more ([`PlanParams::answer_tokens`]).
    pub max_answer_tokens: Option<u32>,
    /// The answer expected of it from what its prompt's earlier answers took
    /// ([`crate::AnswerBook`]); the time cost prices its decode at that.
    pub expected_answer_tokens: Option<f64>,
}

/// A placement's handle, for [`InFlight::finish`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PlacementId(u64);

/// Where one request went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArrivalPlacement {
    pub id: PlacementId,
    /// The replica (an index into the last [`InFlight::set_replicas`] list); `None` when no
    /// replica may take it (no replicas, or none of its allowed ones).
    pub replica: Option<usize>,
    pub reason: Option<PlacementReason>,
    /// `(replica, leading blocks held)` for every replica holding a leading run of its blocks
    /// (in flight or in its memory model) when it was placed, sorted by replica.
    pub held: Vec<(usize, usize)>,
}

/// What is placed and not yet finished.
#[derive(Debug)]
pub struct InFlight {
    settings: InFlightSettings,
    replicas: Vec<ReplicaState>,
    /// Replica by rank (step 6's static order: running requests, then id bytes).
    by_rank: Vec<u32>,
    /// Replicas by load (the least-loaded first), and the orders time mode searches.
    orders: Orders,
    /// Loads are kept as of `frame_ms` (decaying ones are scaled up instead of every load
    /// decayed at each call: a common factor keeps their order).
    frame_ms: u64,
    last_ms: u64,
    /// The sum of the loads, as of `frame_ms`.
    total: f64,
    flights: HashMap<u64, Flight, BuildBlockHasher>,
    next_id: u64,
    /// With a half-life: placements by the time they were placed, to expire.
    placed: VecDeque<(u64, u64)>,
    /// The replicas holding each block of the flights, and per (block, replica) how many flights
    /// hold it and where the replica is on the block's list.
    holders: HashMap<BlockHash, Holders, BuildBlockHasher>,
    holding: HashMap<(BlockHash, u32), (u32, u32), BuildBlockHasher>,
    groups: HashMap<Arc<[BlockHash]>, Group, BuildHasherDefault<DefaultHasher>>,
    /// With memory: its slot per replica, and the replica per slot (`NONE` for none), made at
    /// the first call with memory after `set_replicas`.
    slots: Vec<u32>,
    replica_of_slot: Vec<u32>,
    /// The memory's departures when `slots` were mapped (a dropped replica frees its slot).
    slot_departures: u64,
    /// Scratch for the walk, per replica.
    matches: Vec<u32>,
    matched: Vec<u32>,
    /// Scratch for `earliest_finish`.
    price_from: Vec<f64>,
    /// In time mode: when each flight's prefill is predicted done (its prompt tokens then
    /// leave its replica's queued prefill), earliest first.
    prefilled_at: BinaryHeap<Reverse<(u64, u64)>>,
    /// The pace every replica had when the replicas were set (speed, nothing busy), and how
    /// many differ from it now: while none does, a replica that holds none of a prompt costs
    /// more the more it runs, so only the least-loaded of those need be priced.
    common_pace: Pace,
    odd_paces: usize,
}

/// The replicas holding a block in flight, and how many flights hold it in all.
#[derive(Clone, Debug, Default)]
struct Holders {
    replicas: Vec<u32>,
    flights: u32,
}

#[derive(Clone, Debug)]
struct ReplicaState {
    id: String,
    rank: u32,
    /// As of `InFlight::frame_ms`.
    load: f64,
    /// In time mode: its speed and what its engine runs (`Pace::busy`).
    pace: Pace,
    /// In time mode: prompt tokens of its flights not yet prefilled, as of `frame_ms`.
    prefill_tokens: f64,
    /// In time mode: what was placed on it lately (each placement's weight, halving every
    /// [`RECENT_HALF_LIFE_MS`]), as of `recent_ms`: its load in the long run, conversations and
    /// agents between their turns included.
    recent: f64,
    recent_ms: u64,
}

impl ReplicaState {
    /// [`ReplicaState::recent`] at `now_ms`.
    fn recent_at(&self, now_ms: u64) -> f64 {
        let elapsed = now_ms.saturating_sub(self.recent_ms) as f64;
        self.recent * 0.5f64.powf(elapsed / RECENT_HALF_LIFE_MS as f64)
    }
}

#[derive(Clone, Debug)]
struct Flight {
    replica: u32,
    /// Its load when placed, and when.
    weight: f64,
    placed_ms: u64,
    blocks: Arc<[BlockHash]>,
    /// Booked for a hinted group member that has not arrived yet.
    seat: bool,
    /// In time mode: its prompt tokens not yet prefilled (0 once predicted done).
    prefill_tokens: f64,
}

#[derive(Clone, Debug, Default)]
struct Group {
    /// Flights (members and seats) per replica.
    on: Vec<(u32, u32)>,
    /// The replica the group is filling.
    filling: Option<u32>,
    /// Booked seats not yet taken, in the order members take them.
    seats: VecDeque<u64>,
    /// Members in flight (seats not counted).
    members: u32,
}

const NONE: u32 = u32::MAX;

/// Time mode: what a request weighs in its replica's load: its expected answer over the
/// config's `time.outputTokens` (1 when nothing is learned of it), within [1/16, 16].
fn answer_weight(arrival: &Arrival<'_>, params: &PlanParams) -> f64 {
    let expected = params.answer_tokens(arrival.max_answer_tokens, arrival.expected_answer_tokens);
    (expected / f64::from(params.output_tokens.max(1))).clamp(1.0 / 16.0, 16.0)
}

/// In time mode, a shared prefix is followed onto a replica only while its load in the long run
/// is within this share of the mean above the least loaded replica's (bench/blis/README.md).
const PILE_SLACK: f64 = 0.1;

/// In time mode, what was placed on a replica counts in its load in the long run halving every
/// this many ms: about an agent's turn and its pause, so that conversations between their turns
/// still count where they live.
const RECENT_HALF_LIFE_MS: u64 = 5_000;

impl InFlight {
    pub fn new(settings: InFlightSettings) -> Self {
        InFlight {
            settings,
            replicas: Vec::new(),
            by_rank: Vec::new(),
            orders: Orders::default(),
            frame_ms: 0,
            last_ms: 0,
            total: 0.0,
            flights: HashMap::default(),
            next_id: 0,
            placed: VecDeque::new(),
            holders: HashMap::default(),
            holding: HashMap::default(),
            groups: HashMap::default(),
            slots: Vec::new(),
            replica_of_slot: Vec::new(),
            slot_departures: 0,
            matches: Vec::new(),
            matched: Vec::new(),
            price_from: Vec::new(),
            prefilled_at: BinaryHeap::new(),
            common_pace: Pace::default(),
            odd_paces: 0,
        }
    }

    /// The candidate replicas, in the order later indices refer to. Flights on replicas that
    /// stay keep counting (by id); those on replicas that left are dropped. Running requests
    /// only break ties, as they stand now. Costs a pass over the replicas and the flights:
    /// call it when the endpoints change, not per request.
    pub fn set_replicas(&mut self, replicas: &[Replica<'_>]) {
        let index_of: HashMap<&str, u32> = replicas
            .iter()
            .enumerate()
            .map(|(index, replica)| (replica.id, index as u32))
            .collect();
        let old_ids: Vec<String> = self.replicas.iter().map(|r| r.id.clone()).collect();
        let mut by_rank: Vec<u32> = (0..replicas.len() as u32).collect();
        // Stable: equal ids (never in practice) keep index order.
        by_rank.sort_by_key(|&r| {
            let replica = &replicas[r as usize];
            (replica.running_requests, replica.id.as_bytes())
        });
        self.replicas = replicas
            .iter()
            .map(|replica| ReplicaState {
                id: replica.id.to_string(),
                rank: 0,
                load: 0.0,
                pace: replica.pace,
                prefill_tokens: 0.0,
                recent: 0.0,
                recent_ms: 0,
            })
            .collect();
        for (rank, &replica) in by_rank.iter().enumerate() {
            self.replicas[replica as usize].rank = rank as u32;
        }
        self.by_rank = by_rank;
        self.order_every_replica();
        self.common_pace = Pace {
            speed: replicas
                .first()
                .map_or(Pace::default().speed, |r| r.pace.speed),
            busy: Busy::default(),
        };
        self.odd_paces = replicas
            .iter()
            .filter(|r| r.pace != self.common_pace)
            .count();
        self.matches = vec![0; replicas.len()];
        self.slots.clear();
        self.replica_of_slot.clear();
        // Every flight again, on its replica's new index.
        let flights = std::mem::take(&mut self.flights);
        self.holders.clear();
        self.holding.clear();
        self.total = 0.0;
        for group in self.groups.values_mut() {
            group.on.clear();
            group.filling = None;
        }
        let mut released = Vec::new();
        for (id, mut flight) in flights {
            match index_of.get(old_ids[flight.replica as usize].as_str()) {
                Some(&replica) => {
                    flight.replica = replica;
                    self.add_flight(id, flight);
                }
                None => released.extend(self.forget_in_group(&flight)),
            }
        }
        for seat in released {
            self.remove(seat);
        }
        self.groups
            .retain(|_, group| group.members > 0 || !group.seats.is_empty());
    }

    /// Replica `replica`'s speed and what its engine says it runs now, for time mode (a cheap
    /// update between [`InFlight::set_replicas`] calls).
    pub fn set_pace(&mut self, replica: usize, pace: Pace) {
        if let Some(state) = self.replicas.get_mut(replica) {
            let was_odd = state.pace != self.common_pace;
            state.pace = pace;
            let is_odd = pace != self.common_pace;
            self.odd_paces = self.odd_paces + usize::from(is_odd) - usize::from(was_odd);
        }
    }

    /// Places one request arriving at `now_ms` (any monotonic clock, the same for every call).
    /// With `memory`, its models count as held blocks and the placement is touched in its
    /// replica's model; the touches show in the models from the next [`Memory::settle`], which
    /// the caller runs when it has time (the flights cover what is placed meanwhile).
    pub fn place(
        &mut self,
        arrival: &Arrival<'_>,
        params: &PlanParams,
        mut memory: Option<&mut Memory>,
        now_ms: u64,
    ) -> ArrivalPlacement {
        let now_ms = self.advance(now_ms);
        let id = self.next_id;
        self.next_id += 1;
        if let Some(memory) = memory.as_deref_mut() {
            self.map_slots(memory);
        }
        self.walk(arrival.blocks, memory.as_deref());
        let mut held: Vec<(usize, usize)> = self
            .matched
            .iter()
            .map(|&r| (r as usize, self.matches[r as usize] as usize))
            .collect();
        held.sort_unstable();
        let may_use = |replica: u32| {
            arrival
                .allowed_replicas
                .is_none_or(|allowed| allowed.contains(&(replica as usize)))
        };
        let k = params.max_per_replica.unwrap_or(usize::MAX) as u32;
        let chosen = if params.balance_by == BalanceBy::Time {
            self.cheapest(arrival, params, k, now_ms)
                .map(|(replica, reason)| (replica, reason, None))
        } else if arrival.blocks.is_empty() {
            self.least_loaded(arrival.allowed_replicas, |_| false)
                .map(|r| (r, PlacementReason::LeastLoaded, None))
        } else if let Some(taken) = self.follow_group(arrival, k, &may_use) {
            Some(taken)
        } else {
            self.start(arrival, params, memory.is_some(), k, now_ms)
        };
        let placement = match chosen {
            Some((replica, reason, seat)) => {
                let flight_id = match seat {
                    Some(seat) => {
                        self.flights.get_mut(&seat).expect("a booked seat").seat = false;
                        self.groups
                            .get_mut(arrival.blocks)
                            .expect("its group")
                            .members += 1;
                        seat
                    }
                    None => {
                        let weight = match params.balance_by {
                            // A request weighs as the answer it is expected to give, in
                            // answers of the config's length: a replica running long answers
                            // is busier than one running as many short ones.
                            BalanceBy::Time => answer_weight(arrival, params),
                            _ => self.weight(arrival.blocks, replica, params),
                        };
                        if params.balance_by == BalanceBy::Time {
                            let state = &mut self.replicas[replica as usize];
                            state.recent = state.recent_at(now_ms) + weight;
                            state.recent_ms = now_ms;
                        }
                        let blocks = self.group_blocks(arrival.blocks);
                        let prefill_tokens = match params.balance_by {
                            BalanceBy::Time => {
                                self.uncached_tokens(arrival.blocks, replica, params)
                            }
                            _ => 0.0,
                        };
                        if prefill_tokens > 0.0 {
                            let pace = self.pace_now(replica, now_ms);
                            let held = self.held_tokens(replica, params);
                            let seconds = pace.first_token_seconds(prefill_tokens, held);
                            let done_ms = now_ms + (seconds * 1e3).ceil() as u64;
                            self.prefilled_at.push(Reverse((done_ms, id)));
                        }
                        let flight = Flight {
                            replica,
                            weight,
                            placed_ms: now_ms,
                            blocks,
                            seat: false,
                            prefill_tokens,
                        };
                        self.add_flight(id, flight);
                        self.track(id, now_ms);
                        let group = self.groups.get_mut(arrival.blocks).expect("its group");
                        group.members += 1;
                        group.filling = Some(replica);
                        id
                    }
                };
                if let Some(memory) = memory {
                    memory.touch(self.slots[replica as usize], arrival.blocks);
                }
                ArrivalPlacement {
                    id: PlacementId(flight_id),
                    replica: Some(replica as usize),
                    reason: Some(reason),
                    held,
                }
            }
            None => ArrivalPlacement {
                id: PlacementId(id),
                replica: None,
                reason: None,
                held,
            },
        };
        self.clear_walk();
        placement
    }

    /// Takes a placement off the work in flight (its request completed, failed or was
    /// cancelled), and says which prompt it answered (its last block hash: what an answer's
    /// length is learned under, [`crate::AnswerBook`]). Unknown or expired handles are ignored.
    /// When the last member of a group in flight finishes, the seats it booked and no member
    /// took are released.
    pub fn finish(&mut self, placement: PlacementId, now_ms: u64) -> Option<BlockHash> {
        self.advance(now_ms);
        let prompt = self
            .flights
            .get(&placement.0)
            .and_then(|flight| flight.blocks.last().copied());
        self.remove(placement.0);
        prompt
    }

    /// A replica's load now, in the unit of `balance_by`.
    pub fn load(&self, replica: usize, now_ms: u64) -> f64 {
        self.replicas[replica].load * self.decay(now_ms.max(self.last_ms))
    }

    /// Placements in flight (booked seats included).
    pub fn len(&self) -> usize {
        self.flights.len()
    }

    pub fn is_empty(&self) -> bool {
        self.flights.is_empty()
    }

    /// A group member: onto its group's next seat, or its filling replica under k, or the
    /// least-loaded replica where the group is under k.
    fn follow_group(
        &mut self,
        arrival: &Arrival<'_>,
        k: u32,
        may_use: &impl Fn(u32) -> bool,
    ) -> Option<(u32, PlacementReason, Option<u64>)> {
        let group = self.groups.get_mut(arrival.blocks)?;
        if let Some(at) = group
            .seats
            .iter()
            .position(|seat| may_use(self.flights[seat].replica))
        {
            let seat = group.seats.remove(at).expect("a seat");
            return Some((
                self.flights[&seat].replica,
                PlacementReason::Window,
                Some(seat),
            ));
        }
        let count_on = |group: &Group, replica: u32| {
            group
                .on
                .iter()
                .find(|(r, _)| *r == replica)
                .map_or(0, |&(_, count)| count)
        };
        if let Some(filling) = group.filling {
            if count_on(group, filling) < k && may_use(filling) {
                return Some((filling, PlacementReason::Window, None));
            }
        }
        if group.members == 0 {
            // Only seats of others' allowed lists are left: start afresh.
            return None;
        }
        let group = &self.groups[arrival.blocks];
        let replica = self
            .least_loaded(arrival.allowed_replicas, |r| count_on(group, r) >= k)
            .or_else(|| self.least_loaded(arrival.allowed_replicas, |_| false))?;
        Some((replica, PlacementReason::LeastLoaded, None))
    }

    /// The first member of a group in flight (or a single): the replica holding its longest
    /// prefix under the fair share, else the least-loaded one; with a hinted group size, the
    /// whole group's seats booked from there.
    fn start(
        &mut self,
        arrival: &Arrival<'_>,
        params: &PlanParams,
        with_memory: bool,
        k: u32,
        now_ms: u64,
    ) -> Option<(u32, PlacementReason, Option<u64>)> {
        let n = params.min_colocate_blocks;
        let need = if with_memory { n.max(1) } else { n };
        let members = arrival.group_size.unwrap_or(1).max(1);
        let own = match params.balance_by {
            BalanceBy::Requests | BalanceBy::Time => members as f64,
            BalanceBy::Tokens => arrival.blocks.len() as f64,
        };
        let decay = self.decay(now_ms);
        let max_share = ((self.total * decay + own) / self.replicas.len() as f64).ceil();
        let allowed = arrival.allowed_replicas;
        let may_use = |r: u32| allowed.is_none_or(|allowed| allowed.contains(&(r as usize)));
        let priced = with_memory && params.balance_by == BalanceBy::Tokens;
        let preferred = if priced {
            self.earliest_finish(arrival.blocks, need, decay, allowed, &may_use)
        } else {
            (need > 0)
                .then(|| {
                    self.matched
                        .iter()
                        .copied()
                        .filter(|&r| {
                            self.matches[r as usize] as usize >= need
                                && self.replicas[r as usize].load * decay < max_share
                                && allowed.is_none_or(|allowed| allowed.contains(&(r as usize)))
                        })
                        .max_by(|&a, &b| {
                            self.matches[a as usize]
                                .cmp(&self.matches[b as usize])
                                .then_with(|| self.load_key(b).cmp(&self.load_key(a)))
                        })
                })
                .flatten()
        };
        let (first, reason) = match preferred {
            Some(replica) => (replica, PlacementReason::Window),
            None => (
                self.least_loaded(allowed, |_| false)?,
                PlacementReason::LeastLoaded,
            ),
        };
        self.groups
            .entry(self.group_blocks(arrival.blocks))
            .or_default();
        if members == 1 {
            return Some((first, reason, None));
        }
        // Book every member's seat, as the window places a unit: k on the first replica, k on
        // the next least-loaded one where the group has none, ..., then one at a time on the
        // least-loaded replica.
        let blocks = self.group_blocks(arrival.blocks);
        let mut target = Some(first);
        let mut seats = VecDeque::with_capacity(members);
        let mut used: Vec<u32> = Vec::new();
        while seats.len() < members {
            let replica = match target {
                Some(replica) => replica,
                None => self.least_loaded(allowed, |_| false)?,
            };
            let take = if target.is_some() {
                (k as usize).min(members - seats.len())
            } else {
                1
            };
            for _ in 0..take {
                let seat = self.next_id;
                self.next_id += 1;
                let weight = self.weight(arrival.blocks, replica, params);
                let flight = Flight {
                    replica,
                    weight,
                    placed_ms: now_ms,
                    blocks: blocks.clone(),
                    seat: true,
                    prefill_tokens: 0.0,
                };
                self.add_flight(seat, flight);
                self.track(seat, now_ms);
                seats.push_back(seat);
            }
            used.push(replica);
            if target.is_some() {
                target = self.least_loaded(allowed, |r| used.contains(&r));
            }
        }
        let group = self.groups.get_mut(arrival.blocks).expect("its group");
        group.filling = Some(first);
        let seat = seats.pop_front().expect("members >= 2");
        // After any seats left for other members' endpoint lists.
        group.seats.extend(seats);
        Some((first, reason, Some(seat)))
    }

    /// With memory in tokens mode, as the window prices a unit (`plan::earliest_finish`): the
    /// replica holding a prefix where the request finishes first, its copies priced, the users
    /// of each block being the flights holding it and the request itself.
    fn earliest_finish(
        &mut self,
        blocks: &[BlockHash],
        need: usize,
        decay: f64,
        allowed: Option<&[usize]>,
        may_use: &impl Fn(u32) -> bool,
    ) -> Option<u32> {
        let coldest = self.least_loaded(allowed, |_| false)?;
        let mut price_from = std::mem::take(&mut self.price_from);
        let candidate = |r: u32| {
            let held = self.matches[r as usize] as usize;
            Candidate {
                replica: r as usize,
                held: if held >= need { held } else { 0 },
                load: self.replicas[r as usize].load * decay,
                key: self.load_key(r),
            }
        };
        let holders = &self.holders;
        let shared_by = |depth: usize| {
            1 + holders
                .get(&blocks[depth])
                .map_or(0, |holders| holders.flights)
        };
        let best = earliest_finish(
            blocks.len(),
            self.matched
                .iter()
                .copied()
                .filter(|&r| may_use(r))
                .map(candidate),
            candidate(coldest),
            shared_by,
            (self.total * decay, self.replicas.len()),
            &mut price_from,
        );
        self.price_from = price_from;
        best.map(|r| r as u32)
    }

    /// The load one request adds on `replica`: itself (in time mode too, where load counts
    /// requests in flight), or the blocks it prefills there.
    fn weight(&self, blocks: &[BlockHash], replica: u32, params: &PlanParams) -> f64 {
        match params.balance_by {
            BalanceBy::Requests | BalanceBy::Time => 1.0,
            BalanceBy::Tokens => {
                // Walked blocks held there (a flight placed since the walk, a seat of the
                // same group, holds all of them).
                let held = if self
                    .holding
                    .contains_key(&(*blocks.last().unwrap_or(&0), replica))
                    && self.holds_all(blocks, replica)
                {
                    blocks.len()
                } else {
                    self.matches[replica as usize] as usize
                };
                (blocks.len() - held) as f64
            }
        }
    }

    fn holds_all(&self, blocks: &[BlockHash], replica: u32) -> bool {
        blocks
            .iter()
            .all(|&block| self.holding.contains_key(&(block, replica)))
    }

    /// The group key of `blocks`: the flights of one group share it.
    fn group_blocks(&self, blocks: &[BlockHash]) -> Arc<[BlockHash]> {
        match self.groups.get_key_value(blocks) {
            Some((key, _)) => key.clone(),
            None => Arc::from(blocks),
        }
    }

    /// `matches[r]` = leading blocks of `blocks` that r holds in flight or in its memory model,
    /// for every replica holding any (each holder of each walked block visited once).
    fn walk(&mut self, blocks: &[BlockHash], memory: Option<&Memory>) {
        for (depth, block) in blocks.iter().enumerate() {
            let depth = depth as u32;
            let mut advanced = false;
            let mut advance = |replica: u32, matches: &mut Vec<u32>, matched: &mut Vec<u32>| {
                if matches[replica as usize] == depth {
                    matches[replica as usize] = depth + 1;
                    if depth == 0 {
                        matched.push(replica);
                    }
                    advanced = true;
                }
            };
            if let Some(holders) = self.holders.get(block) {
                for &replica in &holders.replicas {
                    advance(replica, &mut self.matches, &mut self.matched);
                }
            }
            if let Some(memory) = memory {
                for slot in memory.holders(*block) {
                    let replica = self
                        .replica_of_slot
                        .get(slot as usize)
                        .copied()
                        .unwrap_or(NONE);
                    if replica != NONE {
                        advance(replica, &mut self.matches, &mut self.matched);
                    }
                }
            }
            if !advanced {
                break;
            }
        }
    }

    fn clear_walk(&mut self) {
        for &replica in &self.matched {
            self.matches[replica as usize] = 0;
        }
        self.matched.clear();
    }

    /// The least-loaded allowed replica that `skip` does not exclude, by step 6's order.
    fn least_loaded(&self, allowed: Option<&[usize]>, skip: impl Fn(u32) -> bool) -> Option<u32> {
        match allowed {
            Some(allowed) => allowed
                .iter()
                .map(|&r| r as u32)
                .filter(|&r| (r as usize) < self.replicas.len() && !skip(r))
                .min_by_key(|&r| self.load_key(r)),
            None => self
                .orders
                .ranks_by_load()
                .map(|rank| self.by_rank[rank as usize])
                .find(|&r| !skip(r)),
        }
    }

    /// Step 6's key, as the load order keeps it.
    fn load_key(&self, replica: u32) -> (u64, u32) {
        orders::load_key(self.standing(replica))
    }

    fn add_flight(&mut self, id: u64, flight: Flight) {
        let replica = flight.replica;
        let scale = self.decay(flight.placed_ms);
        let scaled = flight.weight / scale;
        self.set_load(replica, self.replicas[replica as usize].load + scaled);
        if flight.prefill_tokens > 0.0 {
            self.restand(replica, |state| {
                state.prefill_tokens += flight.prefill_tokens / scale;
            });
        }
        for &block in flight.blocks.iter() {
            let holders = self.holders.entry(block).or_default();
            holders.flights += 1;
            self.holding
                .entry((block, replica))
                .and_modify(|(count, _)| *count += 1)
                .or_insert_with(|| {
                    holders.replicas.push(replica);
                    (1, holders.replicas.len() as u32 - 1)
                });
        }
        let group = self.groups.entry(flight.blocks.clone()).or_default();
        match group.on.iter_mut().find(|(r, _)| *r == replica) {
            Some((_, count)) => *count += 1,
            None => group.on.push((replica, 1)),
        }
        self.flights.insert(id, flight);
    }

    fn track(&mut self, id: u64, now_ms: u64) {
        if self.settings.load_half_life_ms > 0 {
            self.placed.push_back((now_ms, id));
        }
    }

    fn remove(&mut self, id: u64) {
        let Some(flight) = self.flights.remove(&id) else {
            return;
        };
        let replica = flight.replica;
        let scale = self.decay(flight.placed_ms);
        let load = self.replicas[replica as usize].load - flight.weight / scale;
        // Rounding leaves a crumb when the last flight goes.
        self.set_load(replica, if load > 1e-9 { load } else { 0.0 });
        self.drop_prefill(replica, flight.prefill_tokens / scale);
        for &block in flight.blocks.iter() {
            let Some((count, at)) = self.holding.get_mut(&(block, replica)) else {
                continue;
            };
            *count -= 1;
            let (count, at) = (*count, *at as usize);
            let holders = self.holders.get_mut(&block).expect("listed");
            holders.flights -= 1;
            if count > 0 {
                continue;
            }
            self.holding.remove(&(block, replica));
            holders.replicas.swap_remove(at);
            if let Some(&moved) = holders.replicas.get(at) {
                self.holding.get_mut(&(block, moved)).expect("listed").1 = at as u32;
            }
            if holders.replicas.is_empty() {
                self.holders.remove(&block);
            }
        }
        let release = self.forget_in_group(&flight);
        for seat in release {
            self.remove(seat);
        }
    }

    /// Takes `flight` off its group's counts; when the group has no member in flight left, the
    /// seats nobody took are returned (to remove) and the group is forgotten.
    fn forget_in_group(&mut self, flight: &Flight) -> Vec<u64> {
        let Some(group) = self.groups.get_mut(&flight.blocks) else {
            return Vec::new();
        };
        if let Some(at) = group.on.iter().position(|(r, _)| *r == flight.replica) {
            group.on[at].1 -= 1;
            if group.on[at].1 == 0 {
                group.on.swap_remove(at);
            }
        }
        if !flight.seat {
            group.members = group.members.saturating_sub(1);
        }
        if group.members > 0 {
            return Vec::new();
        }
        let seats: Vec<u64> = group.seats.drain(..).collect();
        if group.on.is_empty() || seats.is_empty() {
            self.groups.remove(&flight.blocks);
        }
        seats
    }

    fn set_load(&mut self, replica: u32, load: f64) {
        self.total += load - self.replicas[replica as usize].load;
        self.restand(replica, |state| state.load = load);
    }

    /// Changes where `replica` stands, keeping the orders.
    fn restand(&mut self, replica: u32, change: impl FnOnce(&mut ReplicaState)) {
        self.orders.remove(self.standing(replica));
        change(&mut self.replicas[replica as usize]);
        self.orders.insert(self.standing(replica));
    }

    fn standing(&self, replica: u32) -> Standing {
        let state = &self.replicas[replica as usize];
        Standing {
            load: state.load,
            queued: state.prefill_tokens,
            rank: state.rank,
        }
    }

    fn order_every_replica(&mut self) {
        self.orders.clear();
        for replica in 0..self.replicas.len() as u32 {
            self.orders.insert(self.standing(replica));
        }
    }

    /// The clock moves on: expired placements leave, and loads are rescaled to a new frame
    /// before their scale grows too large.
    fn advance(&mut self, now_ms: u64) -> u64 {
        let now_ms = now_ms.max(self.last_ms);
        self.last_ms = now_ms;
        while let Some(&Reverse((done_ms, id))) = self.prefilled_at.peek() {
            if done_ms > now_ms {
                break;
            }
            self.prefilled_at.pop();
            if let Some(flight) = self.flights.get_mut(&id) {
                let tokens = std::mem::take(&mut flight.prefill_tokens);
                let (replica, placed_ms) = (flight.replica, flight.placed_ms);
                let scaled = tokens / self.decay(placed_ms);
                self.drop_prefill(replica, scaled);
            }
        }
        let half_life = self.settings.load_half_life_ms;
        if half_life == 0 {
            return now_ms;
        }
        let horizon = half_life.saturating_mul(EXPIRY_HALF_LIVES);
        while let Some(&(placed_ms, id)) = self.placed.front() {
            if now_ms.saturating_sub(placed_ms) < horizon {
                break;
            }
            self.placed.pop_front();
            self.remove(id);
        }
        if now_ms - self.frame_ms > 64 * half_life {
            let factor = self.decay(now_ms);
            for state in &mut self.replicas {
                state.load *= factor;
                state.prefill_tokens *= factor;
            }
            self.total *= factor;
            self.frame_ms = now_ms;
            self.order_every_replica();
        }
        now_ms
    }

    /// What a load of the frame is worth at `at_ms` (1 without a half-life).
    fn decay(&self, at_ms: u64) -> f64 {
        let half_life = self.settings.load_half_life_ms;
        if half_life == 0 {
            return 1.0;
        }
        let elapsed = at_ms as f64 - self.frame_ms as f64;
        0.5f64.powf(elapsed / half_life as f64)
    }

    /// Takes `scaled` prompt tokens (as of the frame) off `replica`'s queued prefill.
    fn drop_prefill(&mut self, replica: u32, scaled: f64) {
        self.restand(replica, |state| {
            let left = state.prefill_tokens - scaled;
            // Rounding leaves a crumb when the last one goes.
            state.prefill_tokens = if left > 1e-6 { left } else { 0.0 };
        });
    }

    /// Time mode: `replica`'s pace now: its speed, and the larger of its engine's count and
    /// this producer's requests in flight, with the prompt tokens they have yet to prefill.
    fn pace_now(&self, replica: u32, now_ms: u64) -> Pace {
        self.pace_at(replica, self.decay(now_ms))
    }

    /// [`InFlight::pace_now`] with the frame's decay to now already worked out (one `powf` per
    /// placement, not per replica).
    fn pace_at(&self, replica: u32, decay: f64) -> Pace {
        let state = &self.replicas[replica as usize];
        paced(state.pace, state.load, state.prefill_tokens, decay)
    }

    /// Time mode: the prompt tokens of `blocks` that `replica` would prefill (what it holds,
    /// in flight or in its memory model, as walked).
    fn uncached_tokens(&self, blocks: &[BlockHash], replica: u32, params: &PlanParams) -> f64 {
        blocks.len() as f64 * f64::from(params.block_tokens) - self.held_tokens(replica, params)
    }

    /// Time mode: the prompt tokens of the walked request that `replica` holds (none when it
    /// holds fewer than N blocks: a shorter prefix is not followed).
    fn held_tokens(&self, replica: u32, params: &PlanParams) -> f64 {
        let held = self.matches.get(replica as usize).copied().unwrap_or(0);
        let held = if (held as usize) < params.min_colocate_blocks {
            0
        } else {
            held
        };
        f64::from(held) * f64::from(params.block_tokens)
    }

    /// Time mode: the load in the long run ([`ReplicaState::recent`]) from which a prefix a
    /// replica holds of a prompt (not the whole prompt) is no longer followed there: the least
    /// loaded allowed replica's, plus [`PILE_SLACK`] of the mean, and at least one placement.
    /// Relative to the least loaded, not the mean: a mean lets some replicas carry everything
    /// while others stay idle.
    fn pile_cap(&self, allowed: &impl Fn(u32) -> bool, now_ms: u64) -> f64 {
        let (sum, least, count) = (0..self.replicas.len() as u32)
            .filter(|&r| allowed(r))
            .map(|r| self.replicas[r as usize].recent_at(now_ms))
            .fold(
                (0.0, f64::INFINITY, 0usize),
                |(sum, least, count), recent| (sum + recent, least.min(recent), count + 1),
            );
        let mean = sum / count.max(1) as f64;
        least + (PILE_SLACK * mean).max(1.0)
    }

    /// Time mode: the allowed replica where the request is answered first (`crate::cost`), or,
    /// beside other producers, one the cost accepts that they would choose too
    /// (`crate::agree`), among those holding fewer than k of its group while any does.
    fn cheapest(
        &self,
        arrival: &Arrival<'_>,
        params: &PlanParams,
        k: u32,
        now_ms: u64,
    ) -> Option<(u32, PlacementReason)> {
        let output =
            params.answer_tokens(arrival.max_answer_tokens, arrival.expected_answer_tokens);
        let group = self.groups.get(arrival.blocks);
        let at_k = |replica: u32| {
            group.is_some_and(|group| {
                group
                    .on
                    .iter()
                    .any(|&(r, count)| r == replica && count >= k)
            })
        };
        let allowed = |replica: u32| {
            arrival
                .allowed_replicas
                .is_none_or(|allowed| allowed.contains(&(replica as usize)))
        };
        // Every allowed replica priced; beside other producers, a prompt no replica holds whole
        // goes to the one they all would choose (`crate::agree`); otherwise the cheapest.
        let prompt_tokens = arrival.blocks.len() as f64 * f64::from(params.block_tokens);
        let decay = self.decay(now_ms);
        // Only where some replica holds a part of the prompt (its mean load is a pass).
        let partly_held = self.matched.iter().any(|&r| {
            let held = self.held_tokens(r, params);
            held > 0.0 && held < prompt_tokens
        });
        let pile_cap = match partly_held {
            true => self.pile_cap(&allowed, now_ms),
            false => f64::INFINITY,
        };
        // A replica priced, and whether it holds the whole prompt.
        let price = |r: u32| {
            let mut uncached = self.uncached_tokens(arrival.blocks, r, params);
            let mut held = self.held_tokens(r, params);
            let pace = self.pace_at(r, decay);
            // A prefix shared with other prompts (a system prompt, a conversation so far) is
            // not followed onto a replica running more than its share: it would pile.
            if uncached > 0.0
                && held > 0.0
                && self.replicas[r as usize].recent_at(now_ms) > pile_cap
            {
                (uncached, held) = (prompt_tokens, 0.0);
            }
            let priced = Priced {
                replica: r as usize,
                id: &self.replicas[r as usize].id,
                seconds: pace.seconds(uncached, held, output),
            };
            (priced, uncached <= 0.0)
        };
        let tie = |r: usize| self.replicas[r].rank;
        // While every replica has the common pace, one that holds none of the prompt and has
        // none of its own prefill queued costs more the more it runs: of those only the
        // least-loaded can be the cheapest (ties by rank, as `by_load` orders them), so only
        // the holders, the prefilling and that one are priced, not every replica.
        let few = self.odd_paces == 0
            && arrival.allowed_replicas.is_none()
            && (!params.agree_with_peers || arrival.blocks.is_empty());
        let best = |skip_full: bool| {
            if few {
                // One that holds none of the prompt costs more the more it runs and the more
                // prefill it has queued, and with nothing else: beside the holders, only the
                // cheapest of those resting and of those prefilling can win, each found along
                // the orders (`orders`) without pricing every replica.
                let skip = |rank: u32| {
                    let r = self.by_rank[rank as usize];
                    skip_full && at_k(r) || self.matches[r as usize] > 0
                };
                let seconds = |rank: u32| price(self.by_rank[rank as usize]).0.seconds;
                let least = |load: f64, queued: f64| {
                    paced(self.common_pace, load, queued, decay).seconds(prompt_tokens, 0.0, output)
                };
                let cold = [
                    self.orders.cheapest_resting(skip, seconds),
                    self.orders.cheapest_prefilling(skip, seconds, least),
                ];
                let candidates = self
                    .matched
                    .iter()
                    .copied()
                    .filter(|&r| !(skip_full && at_k(r)))
                    .chain(
                        cold.into_iter()
                            .flatten()
                            .map(|rank| self.by_rank[rank as usize]),
                    );
                let chosen = agree::cheapest(candidates.map(|r| price(r).0), tie).map(|r| r as u32);
                // Tests and debug builds check the few priced choose as all would.
                debug_assert_eq!(
                    chosen,
                    agree::cheapest(
                        (0..self.replicas.len() as u32)
                            .filter(|&r| !(skip_full && at_k(r)))
                            .map(|r| price(r).0),
                        tie
                    )
                    .map(|r| r as u32),
                    "pricing the few that can win chose otherwise than pricing every replica"
                );
                return chosen;
            }
            let candidates =
                (0..self.replicas.len() as u32).filter(|&r| allowed(r) && !(skip_full && at_k(r)));
            let chosen = match arrival.blocks.last() {
                Some(&prompt) if params.agree_with_peers => {
                    let mut held_whole = false;
                    let priced: Vec<Priced<'_>> = candidates
                        .map(|r| {
                            let (priced, whole) = price(r);
                            held_whole |= whole;
                            priced
                        })
                        .collect();
                    let cheapest = agree::cheapest(priced.iter().copied(), tie)?;
                    if held_whole {
                        Some(cheapest)
                    } else {
                        let speed = self.replicas[cheapest].pace.speed;
                        agree::choose(&priced, prompt, agree::slack(&speed, prompt_tokens))
                    }
                }
                // Alone (or without blocks): the cheapest, with nothing collected.
                _ => agree::cheapest(candidates.map(|r| price(r).0), tie),
            };
            chosen.map(|r| r as u32)
        };
        let replica = best(true).or_else(|| best(false))?;
        let need = params.min_colocate_blocks.max(1);
        let reason = match self.matches.get(replica as usize) {
            Some(&held) if held as usize >= need && !arrival.blocks.is_empty() => {
                PlacementReason::Window
            }
            _ => PlacementReason::LeastLoaded,
        };
        Some((replica, reason))
    }

    fn map_slots(&mut self, memory: &mut Memory) {
        if self.slots.len() == self.replicas.len()
            && self.replica_of_slot.len() == memory.slot_count()
            && self.slot_departures == memory.departures()
        {
            return;
        }
        self.slot_departures = memory.departures();
        self.slots = self.replicas.iter().map(|r| memory.slot(&r.id)).collect();
        self.replica_of_slot = vec![NONE; memory.slot_count()];
        for (replica, &slot) in self.slots.iter().enumerate() {
            self.replica_of_slot[slot as usize] = replica as u32;
        }
    }
}
