//! The count that seals a window early on hints: a window whose hinted groups are all complete
//! need not wait for its timer.

use std::collections::HashMap;
use std::num::NonZeroU32;

use burst_prefix_planner::BlockHash;

/// A group of identical prompts: chained hashes make the last block and the length enough.
pub type GroupKey = (usize, BlockHash);

/// Per group of identical prompts in a window: how many are here, and the size a client hinted.
#[derive(Default)]
pub struct HintedGroups {
    groups: HashMap<GroupKey, GroupCount>,
    /// Groups with a hinted size.
    hinted: usize,
    /// Hinted groups with fewer members here than hinted.
    incomplete: usize,
}

#[derive(Clone, Copy, Default)]
struct GroupCount {
    /// The largest size hinted by a member; 0 when none hinted.
    hinted: u32,
    present: u32,
}

impl GroupCount {
    fn incomplete(self) -> bool {
        self.hinted > 0 && self.present < self.hinted
    }
}

impl HintedGroups {
    /// Counts a member into (`+1`) or out of (`-1`) its group, with the size it hinted.
    pub fn count(&mut self, key: GroupKey, hint: Option<NonZeroU32>, delta: i32) {
        let group = self.groups.entry(key).or_default();
        let (was_hinted, was_incomplete) = (group.hinted > 0, group.incomplete());
        if let Some(size) = hint {
            group.hinted = group.hinted.max(size.get());
        }
        group.present = group.present.saturating_add_signed(delta);
        let (is_hinted, is_incomplete) = (group.hinted > 0, group.incomplete());
        self.hinted += usize::from(is_hinted && !was_hinted);
        match (was_incomplete, is_incomplete) {
            (false, true) => self.incomplete += 1,
            (true, false) => self.incomplete -= 1,
            _ => {}
        }
    }

    /// Some group was hinted, and every hinted group is complete.
    pub fn all_complete(&self) -> bool {
        self.hinted > 0 && self.incomplete == 0
    }
}
