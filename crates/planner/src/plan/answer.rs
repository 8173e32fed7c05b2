//! What a window's placement gives back: a replica and a reason per request, the loads, and
//! with memory what each replica held of each request.

/// Why a request landed on its replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PlacementReason {
    /// Its unit started on a replica whose cache model held the unit's prefix from earlier
    /// windows (with memory only).
    Memory,
    /// Its unit started on a replica that this window's placements had given the prefix.
    Window,
    /// No usable prefix (a cold unit, a spill beyond k, or the fair share was reached): the
    /// least-loaded replica.
    LeastLoaded,
}

impl PlacementReason {
    pub const ALL: [PlacementReason; 3] = [
        PlacementReason::Memory,
        PlacementReason::Window,
        PlacementReason::LeastLoaded,
    ];

    /// A stable lower-case name (metric labels).
    pub fn label(self) -> &'static str {
        match self {
            PlacementReason::Memory => "memory",
            PlacementReason::Window => "window",
            PlacementReason::LeastLoaded => "least_loaded",
        }
    }
}

/// With memory: per request, the replicas holding a leading run of its blocks when it was
/// placed (in this window's placements or their cache models), as `(replica, blocks)` sorted by
/// replica. Requests of one unit share one list. Empty without memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldPrefixes {
    pub(super) lists: Vec<HeldList>,
    /// Per request, its list in `lists` (`NO_LIST`: none).
    pub(super) list_of: Vec<u32>,
    /// In time mode, the replicas that came to hold a prefix the units placed in a row share,
    /// in the order they did (`PrefixHolders`): a list counts the first of them rather than
    /// naming each, so that a window's lists are not units x replicas long.
    pub(super) whole_holders: Vec<WholeHolders>,
}

/// One list of [`HeldPrefixes`]: the pairs it names, and the replicas it counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldList {
    /// `(replica, blocks)`, sorted by replica.
    pub(super) named: Vec<(usize, usize)>,
    /// (an index into `whole_holders`, how many of its first replicas): each holds its
    /// `blocks`, unless `named` says otherwise.
    pub(super) counted: Option<(u32, u32)>,
}

/// Replicas holding a prefix whole, in the order they came to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct WholeHolders {
    pub(super) blocks: usize,
    pub(super) joined: Vec<usize>,
    /// (replica, its place in `joined`) sorted by replica, for lookups (`HeldPrefixes::index`).
    by_replica: Vec<(usize, u32)>,
}

impl WholeHolders {
    pub(super) fn new(blocks: usize) -> Self {
        WholeHolders {
            blocks,
            ..WholeHolders::default()
        }
    }
}

impl HeldPrefixes {
    /// `(replica, leading blocks held)` for every replica holding any of request `request`'s,
    /// sorted by replica.
    pub fn of(&self, request: usize) -> Vec<(usize, usize)> {
        let Some(list) = self.list_of(request).map(|list| &self.lists[list]) else {
            return Vec::new();
        };
        let mut pairs = list.named.clone();
        if let Some((holders, count)) = list.counted {
            let holders = &self.whole_holders[holders as usize];
            let named = |replica: usize| {
                list.named
                    .binary_search_by_key(&replica, |&(r, _)| r)
                    .is_ok()
            };
            pairs.extend(
                holders.joined[..count as usize]
                    .iter()
                    .filter(|&&replica| !named(replica))
                    .map(|&replica| (replica, holders.blocks)),
            );
            pairs.sort_unstable();
        }
        pairs
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
    pub fn lists(&self) -> &[HeldList] {
        &self.lists
    }

    /// The leading blocks of request `request` that `replica` held.
    pub fn blocks(&self, request: usize, replica: usize) -> usize {
        let Some(list) = self.list_of(request).map(|list| &self.lists[list]) else {
            return 0;
        };
        if let Ok(at) = list.named.binary_search_by_key(&replica, |&(r, _)| r) {
            return list.named[at].1;
        }
        let Some((holders, count)) = list.counted else {
            return 0;
        };
        let holders = &self.whole_holders[holders as usize];
        match holders
            .by_replica
            .binary_search_by_key(&replica, |&(r, _)| r)
        {
            Ok(at) if holders.by_replica[at].1 < count => holders.blocks,
            _ => 0,
        }
    }

    /// Indexes the whole holders by replica, once the window is placed (for `blocks`).
    pub(super) fn index(&mut self) {
        for holders in &mut self.whole_holders {
            holders.by_replica = (holders.joined.iter().copied()).zip(0..).collect();
            holders.by_replica.sort_unstable();
        }
    }
}

pub(super) const NO_LIST: u32 = u32::MAX;

/// The planner's answer for one window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Per request (batch order), the index of its replica, or `None` for no affinity.
    pub assignments: Vec<Option<usize>>,
    /// Per request, why it landed where it did (`None` when not assigned).
    pub reasons: Vec<Option<PlacementReason>>,
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
