//! Placement of one window of requests on replicas (SPEC §4), and with memory across windows
//! (SPEC §7).
//!
//! Requests with identical prompts form groups; with `min_colocate_blocks` (N) > 0, single requests
//! that share their first N blocks with another request become units too. Units are placed one by
//! one, largest first, preferring the replica that already holds the longest prefix of the unit
//! (bounded by a fair share), and filling one replica up to `max_per_replica` (k) members before
//! spilling to the next least-loaded one.
//!
//! With [`Memory`], a replica also holds what its cache model remembers from earlier windows,
//! singles whose prefix a model holds are placed too (warm singles), N counts as at least 1
//! (for single units and the prefix preference), and each replica starts the window with the
//! load it carries over. In tokens mode the fair share then gives way to a cost: each unit starts
//! where it finishes first, paying a price for every block it would prefill again although
//! another replica holds it (`Balance::EarliestFinish`).

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::memory::Memory;
use crate::prefixhash::BlockHash;

/// What the window load of a replica counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BalanceBy {
    /// Requests placed on the replica.
    #[default]
    Requests,
    /// Blocks to prefill on the replica: a unit's blocks minus the prefix it already holds there.
    Tokens,
}

/// The placement knobs of SPEC §2, already validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanParams {
    /// k: at most this many members of one unit on one replica; `None` is unlimited (-1).
    pub max_per_replica: Option<usize>,
    /// N: blocks a single request must share with another request to be co-located with it;
    /// 0 co-locates identical prompts only.
    pub min_colocate_blocks: usize,
    pub balance_by: BalanceBy,
}

/// A candidate replica (one inference endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica<'a> {
    /// Endpoint id; the last tie-break compares these byte-wise, and memory is keyed by it.
    pub id: &'a str,
    /// Live running-request count, when known (else 0); a tie-break only.
    pub running_requests: u64,
}

/// One request of the window, in arrival order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRequest<'a> {
    /// All its block hashes (its prompts' chains, concatenated).
    pub blocks: &'a [BlockHash],
    /// Indices of the replicas it may use; `None` means all of them.
    pub allowed_replicas: Option<&'a [usize]>,
}

/// Why a request landed on its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Its unit started on a replica whose cache model held the unit's prefix from earlier
    /// windows (with memory only).
    Memory,
    /// Its unit started on a replica that this window's placements had given the prefix.
    Window,
    /// No usable prefix (a cold unit, a spill beyond k, or the fair share was reached): the
    /// least-loaded replica.
    LeastLoaded,
}

impl Source {
    pub const ALL: [Source; 3] = [Source::Memory, Source::Window, Source::LeastLoaded];

    /// A stable lower-case name (metric labels).
    pub fn label(self) -> &'static str {
        match self {
            Source::Memory => "memory",
            Source::Window => "window",
            Source::LeastLoaded => "least_loaded",
        }
    }
}

/// With memory: per request, the replicas holding a leading run of its blocks when it was
/// placed (in this window's placements or their cache models), as `(replica, blocks)` sorted by
/// replica. Requests of one unit share one list. Empty without memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldPrefixes {
    lists: Vec<Vec<(usize, usize)>>,
    /// Per request, its list in `lists` (`NO_LIST`: none).
    list_of: Vec<u32>,
}

impl HeldPrefixes {
    /// `(replica, leading blocks held)` for every replica holding any of request `request`'s.
    pub fn of(&self, request: usize) -> &[(usize, usize)] {
        match self.list_of.get(request) {
            Some(&list) if list != NO_LIST => &self.lists[list as usize],
            _ => &[],
        }
    }

    /// The list request `request` shares with the rest of its unit, if any: an index into
    /// [`HeldPrefixes::lists`].
    pub fn list_of(&self, request: usize) -> Option<usize> {
        match self.list_of.get(request) {
            Some(&list) if list != NO_LIST => Some(list as usize),
            _ => None,
        }
    }

    /// Every distinct list.
    pub fn lists(&self) -> &[Vec<(usize, usize)>] {
        &self.lists
    }

    /// The leading blocks of request `request` that `replica` held.
    pub fn blocks(&self, request: usize, replica: usize) -> usize {
        let list = self.of(request);
        list.binary_search_by_key(&replica, |&(r, _)| r)
            .map_or(0, |i| list[i].1)
    }
}

const NO_LIST: u32 = u32::MAX;

/// The planner's answer for one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Per request (batch order), the index of its replica, or `None` for no affinity.
    pub assignments: Vec<Option<usize>>,
    /// Per request, why it landed where it did (`None` when not assigned).
    pub sources: Vec<Option<Source>>,
    /// Final window load per replica, in the unit of `balance_by` (with memory, including the
    /// load carried over).
    pub loads: Vec<u64>,
    /// Units formed from groups of identical prompts.
    pub group_units: usize,
    /// Units formed from single requests sharing N blocks with another request.
    pub single_units: usize,
    /// Singles placed because a replica's cache model held their prefix (with memory only).
    pub warm_singles: usize,
    /// What each replica held of each request (with memory only).
    pub held: HeldPrefixes,
}

/// Places one window of requests (SPEC §4, exactly llm-d's behaviour). Pure and deterministic:
/// the result depends only on the arguments, never on hash iteration order; the order of
/// `replicas` only matters through the indices it gives them.
pub fn assign(batch: &[BatchRequest<'_>], replicas: &[Replica<'_>], params: &PlanParams) -> Plan {
    plan(batch, replicas, params, None)
}

/// Places one window remembering earlier ones (SPEC §7), then records this window in `memory`:
/// every placed request's blocks are touched in its replica's cache model, and each replica's
/// load is carried over, decaying with the memory's half-life. `now_ms` is the caller's clock
/// (any monotonic origin, the same for every call on one memory). Replicas the memory does not
/// know start cold; the ones it knows that are not candidates now keep their models untouched
/// (drop them with [`Memory::retain_replicas`] when they leave for good).
///
/// The touches are merged into the models by [`Memory::settle`], which this function runs first
/// for the window before, unless the caller already has: the plan does not wait for its own
/// window's merge, and a caller with time between windows (after answering this one) settles
/// then.
pub fn assign_with_memory(
    batch: &[BatchRequest<'_>],
    replicas: &[Replica<'_>],
    params: &PlanParams,
    memory: &mut Memory,
    now_ms: u64,
) -> Plan {
    memory.settle();
    let slots: Vec<u32> = replicas.iter().map(|r| memory.slot(r.id)).collect();
    let carried: Vec<f64> = slots
        .iter()
        .map(|&slot| memory.carried_load(slot, now_ms))
        .collect();
    let mut replica_of_slot = vec![NO_REPLICA; memory.slot_count()];
    for (replica, &slot) in slots.iter().enumerate() {
        replica_of_slot[slot as usize] = replica as u32;
    }
    let recall = Recall {
        memory,
        batch,
        slots: &slots,
        replica_of_slot,
        carried: carried.iter().map(|&load| load.round() as u64).collect(),
        looked_up: HashMap::with_capacity_and_hasher(batch.len(), BuildBlockHasher::default()),
        found: Vec::new(),
        once: Vec::new(),
        restricted: batch
            .iter()
            .any(|request| request.allowed_replicas.is_some()),
    };
    let plan = plan(batch, replicas, params, Some(recall));
    for (replica, &slot) in slots.iter().enumerate() {
        let start = carried[replica].round() as u64;
        let added = plan.loads[replica].saturating_sub(start);
        memory.set_load(slot, carried[replica] + added as f64, now_ms);
    }
    plan
}

/// The memory: planning reads the models as the window found them, and touches the blocks of
/// each placed unit (merged into the models by `Memory::settle` after the window).
struct Recall<'m> {
    memory: &'m mut Memory,
    batch: &'m [BatchRequest<'m>],
    /// Per replica, its memory slot (endpoint ids are unique: callers refuse duplicates).
    slots: &'m [u32],
    /// Per memory slot, the replica index in this call (`NO_REPLICA`: not a candidate now).
    replica_of_slot: Vec<u32>,
    /// Per replica, the load it starts this window with.
    carried: Vec<u64>,
    /// The candidates holding each block looked up so far, as a range of `found` (the models
    /// do not change during the window): the warm-single check, the unit order and the walk
    /// would otherwise look up a shared prefix again for every unit, each lookup a cache miss or
    /// two in the memory.
    looked_up: HashMap<BlockHash, (u32, u32), BuildBlockHasher>,
    found: Vec<u32>,
    /// The last lookup not kept.
    once: Vec<u32>,
    /// Some request of the window may use only some replicas (step 7).
    restricted: bool,
}

const NO_REPLICA: u32 = u32::MAX;

impl Recall<'_> {
    /// The candidate replicas whose models hold `block`, kept for the next lookup when other
    /// units of the window share the block (`shared`); a block of one unit's own is looked up
    /// again rather than kept (keeping costs about a lookup, and most blocks are one unit's).
    fn holders(&mut self, block: BlockHash, shared: bool) -> &[u32] {
        let Recall {
            memory,
            replica_of_slot,
            looked_up,
            found,
            once,
            ..
        } = self;
        let candidates = |memory: &Memory, found: &mut Vec<u32>| {
            found.extend(
                memory
                    .holders(block)
                    .map(|slot| replica_of_slot[slot as usize])
                    .filter(|&replica| replica != NO_REPLICA),
            )
        };
        if !shared {
            if let Some(&(from, to)) = looked_up.get(&block) {
                return &found[from as usize..to as usize];
            }
            once.clear();
            candidates(memory, once);
            return once;
        }
        let (from, to) = *looked_up.entry(block).or_insert_with(|| {
            let from = found.len() as u32;
            candidates(memory, found);
            (from, found.len() as u32)
        });
        &found[from as usize..to as usize]
    }

    /// Whether some candidate's model holds the first `need` blocks of `blocks`. A holder of
    /// block `need - 1` nearly always holds its prefix too, so the first one checked decides.
    fn holds_leading(&mut self, blocks: &[BlockHash], need: usize) -> bool {
        if blocks.len() < need {
            return false;
        }
        let holders = self.holders(blocks[need - 1], true).to_vec();
        holders.into_iter().any(|replica| {
            let slot = self.slots[replica as usize];
            blocks[..need - 1]
                .iter()
                .all(|&block| self.memory.holds(slot, block))
        })
    }

    /// Whether request `request` may use `replica` (step 7).
    fn may_use(&self, request: usize, replica: usize) -> bool {
        !self.restricted
            || self.batch[request]
                .allowed_replicas
                .is_none_or(|allowed| allowed.contains(&replica))
    }
}

/// The plan; with memory, each unit's blocks are touched in the models of the replicas it was
/// placed on (those its members may use) as it is placed.
fn plan(
    batch: &[BatchRequest<'_>],
    replicas: &[Replica<'_>],
    params: &PlanParams,
    mut recall: Option<Recall<'_>>,
) -> Plan {
    let n = params.min_colocate_blocks;
    // With memory the prefix preference applies from one block on (SPEC §7).
    let prefer_from = match recall {
        Some(_) => Some(n.max(1)),
        None => (n > 0).then_some(n),
    };
    // With memory, N counts as at least 1 for single units too: requests sharing their first
    // block (a system prompt) are placed, so that their next turns find them remembered.
    let unit_n = if recall.is_some() { n.max(1) } else { n };
    let mut units = form_units(batch, unit_n, |blocks| {
        recall
            .as_mut()
            .is_some_and(|recall| recall.holds_leading(blocks, n.max(1)))
    });
    let count = |kind| units.iter().filter(|u| u.kind == kind).count();
    let mut plan = Plan {
        assignments: vec![None; batch.len()],
        sources: vec![None; batch.len()],
        loads: vec![0; replicas.len()],
        group_units: count(UnitKind::Group),
        single_units: count(UnitKind::Single),
        warm_singles: count(UnitKind::Warm),
        held: HeldPrefixes::default(),
    };
    if replicas.is_empty() {
        return plan;
    }
    if recall.is_some() {
        count_sharers(&mut units);
    }
    // (block, replica) pairs the window can record: each unit on at most ceil(members / k)
    // replicas (with memory, only the prefix it shares: `Placer::place`).
    let k = params.max_per_replica.unwrap_or(usize::MAX);
    let total_blocks = units
        .iter()
        .map(|unit| {
            let recorded = if recall.is_some() {
                unit.shared()
            } else {
                unit.blocks.len()
            };
            recorded * unit.members.len().div_ceil(k).min(replicas.len())
        })
        .sum();
    let carried = recall
        .as_ref()
        .map_or_else(|| vec![0; replicas.len()], |r| r.carried.clone());
    let balance = match (&mut recall, params.balance_by) {
        (Some(recall), BalanceBy::Tokens) => {
            most_constrained_first(&mut units, recall);
            Balance::EarliestFinish
        }
        _ => Balance::FairShare {
            max_share: max_share(&units, &carried, params),
        },
    };
    let mut placer = Placer::new(
        replicas,
        params,
        balance,
        prefer_from,
        carried,
        recall,
        total_blocks,
    );
    if placer.recall.is_some() {
        plan.held.list_of = vec![NO_LIST; batch.len()];
    }
    for unit in &units {
        placer.place(unit, &mut plan);
    }
    if placer.recall.is_some() {
        // Requests outside every unit: what the replicas hold of them, for their answers.
        for (request, entry) in batch.iter().zip(0..) {
            if plan.held.list_of[entry] == NO_LIST && !request.blocks.is_empty() {
                placer.walk_holders(request.blocks, 0);
                placer.keep_held_list(&[entry], &mut plan.held);
                placer.clear_matches();
            }
        }
    }
    plan.loads = std::mem::take(&mut placer.load);
    // A request that may not use its assigned replica gets zero everywhere (step 7).
    for (request, entry) in batch.iter().zip(0..) {
        if let (Some(replica), Some(allowed)) = (plan.assignments[entry], request.allowed_replicas)
        {
            if !allowed.contains(&replica) {
                plan.assignments[entry] = None;
                plan.sources[entry] = None;
                if let Some(list) = plan.held.list_of.get_mut(entry) {
                    *list = NO_LIST;
                }
            }
        }
    }
    plan
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum UnitKind {
    Group,
    Single,
    /// A single whose prefix a replica's cache model holds (with memory only).
    Warm,
}

/// Requests placed together: a group of identical prompts, or one prefix-sharing single.
#[derive(Debug)]
struct Unit<'a> {
    blocks: &'a [BlockHash],
    /// Batch indices, in arrival order.
    members: Vec<usize>,
    kind: UnitKind,
    /// A replica's cache model holds its leading blocks (with memory only).
    remembered: bool,
    /// With memory, per leading block that other units of the window share, how many units
    /// share it, themselves included (`count_sharers`): its shared prefix.
    shared_by: Vec<u32>,
}

impl Unit<'_> {
    /// Its leading blocks that another unit of the window shares (with memory only).
    fn shared(&self) -> usize {
        self.shared_by.len()
    }

    /// The units of the window sharing its block at `depth` (1: its own).
    fn shared_by(&self, depth: usize) -> u32 {
        self.shared_by.get(depth).copied().unwrap_or(1)
    }
}

/// Steps 1-3: group identical block sequences, keep the units, order them. A single that is no
/// unit by §4 becomes a warm one if `is_warm` says so.
fn form_units<'a>(
    batch: &[BatchRequest<'a>],
    min_colocate_blocks: usize,
    mut is_warm: impl FnMut(&[BlockHash]) -> bool,
) -> Vec<Unit<'a>> {
    let mut group_of: HashMap<Chain<'a>, usize, BuildBlockHasher> =
        HashMap::with_capacity_and_hasher(batch.len(), BuildBlockHasher::default());
    let mut groups: Vec<Unit<'a>> = Vec::new();
    for (index, request) in batch.iter().enumerate() {
        if request.blocks.is_empty() {
            continue;
        }
        let next = groups.len();
        let group = *group_of.entry(Chain(request.blocks)).or_insert(next);
        if group == next {
            groups.push(Unit {
                blocks: request.blocks,
                members: Vec::new(),
                kind: UnitKind::Single,
                remembered: false,
                shared_by: Vec::new(),
            });
        }
        groups[group].members.push(index);
    }

    let n = min_colocate_blocks;
    let mut sharing_prefix: HashMap<Chain<'a>, usize, BuildBlockHasher> = HashMap::default();
    if n > 0 {
        for group in groups.iter().filter(|g| g.blocks.len() >= n) {
            *sharing_prefix.entry(Chain(&group.blocks[..n])).or_default() += group.members.len();
        }
    }
    let mut units: Vec<Unit<'a>> = groups
        .into_iter()
        .filter_map(|mut unit| {
            unit.remembered = is_warm(unit.blocks);
            if unit.members.len() >= 2 {
                unit.kind = UnitKind::Group;
                Some(unit)
            } else if n > 0
                && unit.blocks.len() >= n
                && sharing_prefix[&Chain(&unit.blocks[..n])] >= 2
            {
                Some(unit)
            } else if unit.remembered {
                unit.kind = UnitKind::Warm;
                Some(unit)
            } else {
                None
            }
        })
        .collect();
    // Remembered units first (with memory: they have a replica to go back to, and the cold ones
    // balance around them), then groups, singles, warm singles; more blocks first; the stable
    // sort keeps arrival order on ties.
    units.sort_by_key(|unit| (!unit.remembered, unit.kind, Reverse(unit.blocks.len())));
    units
}

/// Step 4: the fair share that bounds the prefix-preference path (with memory it shares the
/// carried-over load too).
fn max_share(units: &[Unit<'_>], carried: &[u64], params: &PlanParams) -> u64 {
    let total = match params.balance_by {
        BalanceBy::Requests => units.iter().map(|unit| unit.members.len()).sum::<usize>(),
        BalanceBy::Tokens => units.iter().map(|unit| unit.blocks.len()).sum(),
    } as u64;
    (total + carried.iter().sum::<u64>()).div_ceil(carried.len() as u64)
}

/// How a unit's first replica is balanced against its prefix.
enum Balance {
    /// §4: the longest prefix among replicas under the fair share, else the least-loaded.
    FairShare { max_share: u64 },
    /// With memory in tokens mode, where load and prefill are both blocks: where the unit
    /// finishes first, pricing the blocks it would prefill again (`Placer::earliest_finish`).
    EarliestFinish,
}

/// Sets each unit's `shared_by`: at each depth, how many units' chains agree with its own up
/// to that block, while two or more do. Found depth by depth among the units that agreed so
/// far, so a unit costs the blocks it shares, not all of its blocks.
fn count_sharers(units: &mut [Unit<'_>]) {
    let mut order: Vec<u32> = (0..units.len() as u32).collect();
    // (unit, sharers) at each depth a unit shares, each unit's in depth order.
    let mut found: Vec<(u32, u32)> = Vec::new();
    let mut shared = vec![0; units.len()];
    // Runs of `order` whose units agree on their blocks before `depth`: (depth, start, end).
    let mut runs = vec![(0, 0, order.len())];
    while let Some((depth, start, end)) = runs.pop() {
        let block_at = |unit: u32| units[unit as usize].blocks.get(depth).copied();
        let run = &mut order[start..end];
        run.sort_unstable_by_key(|&unit| block_at(unit));
        let mut from = 0;
        while from < run.len() {
            let block = block_at(run[from]);
            let to = from + run[from..].partition_point(|&unit| block_at(unit) == block);
            if block.is_some() && to - from >= 2 {
                runs.push((depth + 1, start + from, start + to));
                // A unit's runs are found in depth order.
                for &unit in &run[from..to] {
                    found.push((unit, (to - from) as u32));
                    shared[unit as usize] += 1;
                }
            }
            from = to;
        }
    }
    // One allocation per unit, not one per doubling.
    for (unit, shared) in units.iter_mut().zip(shared) {
        unit.shared_by = Vec::with_capacity(shared);
    }
    for (unit, sharers) in found {
        units[unit as usize].shared_by.push(sharers);
    }
}

/// Orders the remembered units by how few units of the window share the prefix the models
/// remember (a conversation's own history first, a fan-out on a remembered system prompt
/// later), keeping `form_units`' order otherwise: the units with one good replica take it
/// before the flexible ones fill in around them. Measured with the simulator (BENCHMARKS.md):
/// with fan-outs placed first, conversations stayed on the replicas around them and the
/// chat-only windows of `mixed` ran at 1.3-1.4x the mean.
fn most_constrained_first(units: &mut [Unit<'_>], recall: &mut Recall<'_>) {
    units.sort_by_cached_key(|unit| {
        // The remembered prefix: the first unheld block ends it. From the first block on (not
        // a binary search): the walk looks up these blocks again, and finds the shared ones
        // kept.
        let remembered = (0..unit.blocks.len())
            .take_while(|&depth| {
                let shared = depth < unit.shared();
                !recall.holders(unit.blocks[depth], shared).is_empty()
            })
            .count();
        let shared_by = match remembered {
            0 => u32::MAX,
            depth => unit.shared_by(depth - 1),
        };
        (!unit.remembered, shared_by)
    });
}

/// Step 5: the state of one window's placement.
///
/// Cost: with the prefix preference on (N > 0, or memory), each unit walks the holders of its
/// leading blocks once (a per-replica marker, never a scan of a holder list per replica);
/// without it, only the replicas a unit lands on look up what they hold. The least-loaded
/// replica comes from an ordered index, not a scan of the replicas.
struct Placer<'a> {
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
    /// Every (block, replica) recorded in this window, when not walked (without the
    /// preference).
    held: HashSet<(BlockHash, u32), BuildBlockHasher>,
    /// The replicas this window placed each block on (kept when the preference walks them; with
    /// memory, only the blocks another unit of the window shares).
    /// As the head of a list in `holder_nodes` (one arena per window, not a `Vec` per block:
    /// allocating one per block was most of the time of a 10,000-request window).
    holders: HashMap<BlockHash, u32, BuildBlockHasher>,
    /// Singly linked lists of the replicas holding a block: (replica, next node or `NO_NODE`).
    holder_nodes: Vec<(u32, u32)>,
    /// Scratch, per replica: leading blocks of the current unit it holds; nonzero only for the
    /// replicas in `matched`.
    matches: Vec<usize>,
    matched: Vec<usize>,
    /// Scratch, per replica: members of the current unit placed on it.
    members_here: Vec<usize>,
    /// Scratch: replicas the current unit touched, in placement order.
    touched: Vec<usize>,
    /// Scratch, per replica, with memory: a member of the current unit placed on it may use it
    /// (step 7), so its model records the unit.
    usable: Vec<bool>,
    /// Scratch for `Placer::earliest_finish`.
    price_from: Vec<f64>,
}

impl<'a> Placer<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        replicas: &'a [Replica<'a>],
        params: &'a PlanParams,
        balance: Balance,
        prefer_from: Option<usize>,
        load: Vec<u64>,
        recall: Option<Recall<'a>>,
        total_blocks: usize,
    ) -> Self {
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
        // The window's own index, walked by the preference.
        let walked_blocks = if prefer_from.is_some() {
            total_blocks
        } else {
            0
        };
        Placer {
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
            held: HashSet::with_capacity_and_hasher(
                if prefer_from.is_none() {
                    total_blocks
                } else {
                    0
                },
                BuildBlockHasher::default(),
            ),
            holders: HashMap::with_capacity_and_hasher(walked_blocks, BuildBlockHasher::default()),
            holder_nodes: Vec::with_capacity(walked_blocks),
            matches: vec![0; replicas.len()],
            matched: Vec::new(),
            members_here: vec![0; replicas.len()],
            touched: Vec::new(),
            usable: vec![false; if recall.is_some() { replicas.len() } else { 0 }],
            price_from: Vec::new(),
            recall,
        }
    }

    fn place(&mut self, unit: &Unit<'_>, plan: &mut Plan) {
        if self.prefer_from.is_some() {
            self.walk_holders(unit.blocks, unit.shared());
        }
        if self.recall.is_some() {
            self.keep_held_list(&unit.members, &mut plan.held);
        }
        let k = self.k;
        let members = &unit.members;
        let mut next = 0;
        let (mut target, mut source) = self.first_replica(unit);
        // Fill one replica up to k, then spill to the next least-loaded replica under k.
        loop {
            let take = k.min(members.len() - next);
            self.put(unit, &members[next..next + take], target, source, plan);
            next += take;
            if next == members.len() {
                break;
            }
            source = Source::LeastLoaded;
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
                self.put(unit, one, replica, Source::LeastLoaded, plan);
            }
            self.overflowing = false;
        }
        self.restore_full();
        if let Some(recall) = &mut self.recall {
            // The unit is recorded where a member may stay (step 7 takes the others back).
            for &member in members {
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
        // The window's own index needs only the blocks its other units walk: with memory, a
        // unit's blocks past the prefix it shares with another unit go to the memory alone.
        let recorded = match self.recall {
            Some(_) => &unit.blocks[..unit.shared()],
            None => unit.blocks,
        };
        for i in 0..self.touched.len() {
            let replica = self.touched[i];
            self.record(recorded, replica);
            self.members_here[replica] = 0;
        }
        self.touched.clear();
        self.clear_matches();
    }

    /// Records `blocks` as held by `replica` in this window; its leading `matches` blocks
    /// already are.
    fn record(&mut self, blocks: &[BlockHash], replica: usize) {
        let r = replica as u32;
        for &block in blocks.get(self.matches[replica]..).unwrap_or_default() {
            if self.prefer_from.is_none() {
                self.held.insert((block, r));
                continue;
            }
            // Walked, not looked up: a replica may appear twice on a list (a later prompt's
            // chain held without the earlier one), which the walk's marker ignores; the same
            // replica twice in a row is skipped here.
            let node = self.holder_nodes.len() as u32;
            let head = self.holders.get(&block).copied().unwrap_or(NO_NODE);
            if self
                .holder_nodes
                .get(head as usize)
                .is_some_and(|&(h, _)| h == r)
            {
                continue;
            }
            self.holders.insert(block, node);
            self.holder_nodes.push((r, head));
        }
    }

    /// The replica a unit starts on, and why: the longest held prefix (at least the
    /// preference's blocks) among replicas under the fair share, else the least-loaded replica
    /// (every replica is under k when a unit starts).
    fn first_replica(&mut self, unit: &Unit<'_>) -> (usize, Source) {
        let preferred = match &self.balance {
            Balance::FairShare { max_share } => self.prefer_from.and_then(|need| {
                let by_match = |&a: &usize, &b: &usize| {
                    self.matches[a]
                        .cmp(&self.matches[b])
                        .then_with(|| self.key(b).cmp(&self.key(a)))
                };
                self.matched
                    .iter()
                    .copied()
                    .filter(|&r| self.matches[r] >= need && self.load[r] < *max_share)
                    .max_by(by_match)
            }),
            Balance::EarliestFinish => self.earliest_finish(unit),
        };
        match preferred {
            Some(best) => {
                let need = self.prefer_from.unwrap_or(1);
                // From memory when this window's placements alone would not have preferred it.
                let source = if self.recall.is_some() && !self.window_holds(unit.blocks, best, need)
                {
                    Source::Memory
                } else {
                    Source::Window
                };
                (best, source)
            }
            None => {
                let replica = self.least_loaded().expect("at least one replica");
                (replica, Source::LeastLoaded)
            }
        }
    }

    /// The replica holding a prefix (at least the preference's blocks) where the unit's first
    /// member finishes first, if it beats the least-loaded replica. Finishing is the replica's
    /// load plus the blocks prefilled there, plus a price for each block it would prefill although
    /// another replica holds it: `COPY_PRICE_PER_BLOCK`, and `SPLIT_PRICE_PER_BLOCK` divided among
    /// the window's units that use the block. So a conversation (its history used by one unit)
    /// moves only to a replica lighter by many times its history, while a system prompt that a
    /// fan-out of many units shares is copied to another replica once the holders run ahead by
    /// about the prompt's own length. Ties go to the longer prefix, then to step 6's order.
    ///
    /// A prefix that other units of the window share is followed only to a replica that stays
    /// under `PILE_CAP` (`Placer::within_pile_cap`): with few units to the window, the price alone
    /// would pile them all onto the first replica given their prompt.
    fn earliest_finish(&mut self, unit: &Unit<'_>) -> Option<usize> {
        // One buffer for every unit's prices: allocating one per unit showed in the profile.
        let mut price_from = std::mem::take(&mut self.price_from);
        let best = self.earliest_finish_priced(unit, &mut price_from);
        self.price_from = price_from;
        best
    }

    /// `Placer::earliest_finish`, pricing in `price_from`.
    fn earliest_finish_priced(&self, unit: &Unit<'_>, price_from: &mut Vec<f64>) -> Option<usize> {
        let need = self.prefer_from.unwrap_or(1);
        let held = |r: usize| Some(self.matches[r]).filter(|&m| m >= need).unwrap_or(0);
        let longest = self.matched.iter().map(|&r| held(r)).max()?;
        // price_from[i]: the price of blocks i..longest, which a replica holding i lacks.
        price_from.clear();
        price_from.resize(longest + 1, 0.0);
        for i in (0..longest).rev() {
            price_from[i] = price_from[i + 1]
                + COPY_PRICE_PER_BLOCK
                + SPLIT_PRICE_PER_BLOCK / f64::from(unit.shared_by(i));
        }
        let finish = |r: usize| {
            let held = held(r);
            self.load[r] as f64 + (unit.blocks.len() - held) as f64 + price_from[held]
        };
        // Ordered by finish, then the longer prefix, then step 6's order.
        let rank = |r: usize| (finish(r), Reverse(held(r)), self.key(r));
        // The first of the lowest rank (each ranked once).
        let mut best: Option<(usize, _)> = None;
        let candidates = self.matched.iter().copied().filter(|&r| {
            let held = held(r);
            held > 0 && (unit.shared_by(held - 1) == 1 || self.within_pile_cap(unit, held, r))
        });
        for r in candidates {
            let rank_r = rank(r);
            let lower = |(_, best_rank): &(usize, _)| {
                rank_r.partial_cmp(best_rank).expect("finite") == Ordering::Less
            };
            if best.as_ref().is_none_or(lower) {
                best = Some((r, rank_r));
            }
        }
        let (best, best_rank) = best?;
        let coldest = self.least_loaded().expect("at least one replica");
        (best_rank <= rank(coldest)).then_some(best)
    }

    /// Whether `replica`, holding `held` leading blocks of `unit`, would stay under `PILE_CAP`
    /// with it: its load, plus the blocks it would prefill, within `PILE_CAP` times the mean
    /// load after them, or times the unit's own blocks when those are more (in a window of a few
    /// units, the mean is a fraction of one unit).
    fn within_pile_cap(&self, unit: &Unit<'_>, held: usize, replica: usize) -> bool {
        let prefill = (unit.blocks.len() - held) as f64;
        let mean = (self.total_load as f64 + prefill) / self.load.len() as f64;
        self.load[replica] as f64 + prefill <= PILE_CAP * mean.max(unit.blocks.len() as f64)
    }

    /// Places `members` (of one unit) on `replica`.
    fn put(
        &mut self,
        unit: &Unit<'_>,
        members: &[usize],
        replica: usize,
        source: Source,
        plan: &mut Plan,
    ) {
        let indexed = self.under_k.remove(&self.key(replica));
        if self.members_here[replica] == 0 {
            self.touched.push(replica);
            if self.prefer_from.is_none() {
                // Not walked: look up only what this replica holds.
                let held = self.held_prefix(unit.blocks, replica);
                if held > 0 {
                    self.matches[replica] = held;
                    self.matched.push(replica);
                }
            }
            if self.params.balance_by == BalanceBy::Tokens {
                // A prefix already held on this replica is not prefilled again.
                let prefill = (unit.blocks.len() - self.matches[replica]) as u64;
                self.load[replica] += prefill;
                self.total_load += prefill;
            }
        }
        if self.params.balance_by == BalanceBy::Requests {
            self.load[replica] += members.len() as u64;
            self.total_load += members.len() as u64;
        }
        self.members_here[replica] += members.len();
        for &member in members {
            plan.assignments[member] = Some(replica);
            plan.sources[member] = Some(source);
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

    /// Whether this window placed the first `need` blocks of `blocks` on `replica` (walked:
    /// their holder lists are short).
    fn window_holds(&self, blocks: &[BlockHash], replica: usize, need: usize) -> bool {
        let r = replica as u32;
        blocks.len() >= need
            && blocks[..need].iter().all(|block| {
                window_holders(&self.holders, &self.holder_nodes, block).any(|h| h == r)
            })
    }

    /// Leading blocks of `blocks` that this window placed on `replica` (not walked).
    fn held_prefix(&self, blocks: &[BlockHash], replica: usize) -> usize {
        let r = replica as u32;
        blocks
            .iter()
            .take_while(|&&block| self.held.contains(&(block, r)))
            .count()
    }

    /// `matches[r]` = leading blocks of `blocks` held by r (in this window or, with memory, in
    /// its model), for every replica holding any: a holder of block i advances only if it held
    /// blocks 0..i, so each holder of each walked block is visited once; the walk stops at the
    /// first block on which no holder advanced. The memory's lookups of the first `shared`
    /// blocks (those other units of the window share) are kept for their walks.
    fn walk_holders(&mut self, blocks: &[BlockHash], shared: usize) {
        let (matches, matched) = (&mut self.matches, &mut self.matched);
        let mut advance = |holder: usize, depth: usize| {
            if matches[holder] == depth {
                matches[holder] = depth + 1;
                if depth == 0 {
                    matched.push(holder);
                }
                true
            } else {
                false
            }
        };
        for (depth, block) in blocks.iter().enumerate() {
            let mut advanced = false;
            for holder in window_holders(&self.holders, &self.holder_nodes, block) {
                advanced |= advance(holder as usize, depth);
            }
            if let Some(recall) = &mut self.recall {
                for &holder in recall.holders(*block, depth < shared) {
                    advanced |= advance(holder as usize, depth);
                }
            }
            if !advanced {
                break;
            }
        }
    }

    /// Keeps the walk's matches as the held list of `members`.
    fn keep_held_list(&self, members: &[usize], held: &mut HeldPrefixes) {
        if self.matched.is_empty() {
            return;
        }
        let mut list: Vec<(usize, usize)> =
            self.matched.iter().map(|&r| (r, self.matches[r])).collect();
        list.sort_unstable();
        let index = held.lists.len() as u32;
        held.lists.push(list);
        for &member in members {
            held.list_of[member] = index;
        }
    }

    fn clear_matches(&mut self) {
        for &replica in &self.matched {
            self.matches[replica] = 0;
        }
        self.matched.clear();
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
}

/// The replicas the window placed `block` on: its list in `Placer::holder_nodes`, from its head
/// in `Placer::holders`.
fn window_holders<'a>(
    heads: &'a HashMap<BlockHash, u32, BuildBlockHasher>,
    nodes: &'a [(u32, u32)],
    block: &BlockHash,
) -> impl Iterator<Item = u32> + 'a {
    let mut node = heads.get(block).copied().unwrap_or(NO_NODE);
    std::iter::from_fn(move || {
        let &(holder, next) = nodes.get(node as usize)?;
        node = next;
        Some(holder)
    })
}

/// `Placer::earliest_finish`'s price, in blocks of load, of prefilling a block again that another
/// replica holds: this much always, plus `SPLIT_PRICE_PER_BLOCK` shared among the window's units
/// that use the block. Chosen with the simulator (BENCHMARKS.md, "Memory across windows"): the
/// only pair found that met the targets of multiturn and mixed on three seeds, with thin margins.
const COPY_PRICE_PER_BLOCK: f64 = 0.7;
const SPLIT_PRICE_PER_BLOCK: f64 = 12.0;

/// `Placer::within_pile_cap`'s bound on a replica that a unit follows a shared prefix to, in
/// times the mean load. Without it, at the engine bench's sizes (8 sessions or a fan-out of 16 on
/// 4 replicas) all the units of a window went to the first replica given their system prompt
/// (imbalance 2.0-3.2, on the engine and in the simulator). Chosen with the simulator
/// (BENCHMARKS.md, "A cap on piling"): 1.3 misses the mixed workload's prefill target at the
/// default sizes, 1.4 lets fan-outs pile again at the engine's.
const PILE_CAP: f64 = 1.35;

/// The end of a holder list.
const NO_NODE: u32 = u32::MAX;

/// A block-hash sequence as a map key. Chained hashes make the last block stand for the whole
/// sequence, so only it (and the length) is hashed; equality still compares every block.
#[derive(PartialEq, Eq)]
struct Chain<'a>(&'a [BlockHash]);

impl Hash for Chain<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.last().copied().unwrap_or(0) ^ self.0.len() as u64);
    }
}

/// Block hashes are already XXH64 outputs: spread them with one multiply instead of SipHash.
#[derive(Default)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

pub(crate) type BuildBlockHasher = BuildHasherDefault<BlockHasher>;

#[cfg(test)]
mod tests;
