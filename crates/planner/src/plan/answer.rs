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
    pub(super) lists: Vec<Vec<(usize, usize)>>,
    /// Per request, its list in `lists` (`NO_LIST`: none).
    pub(super) list_of: Vec<u32>,
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
