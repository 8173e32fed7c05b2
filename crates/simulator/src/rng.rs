//! A seeded SplitMix64 generator: tiny, fast, and its output is fixed forever by its definition,
//! so a `--seed` gives the same workload on every machine and every build.

/// SplitMix64 (Steele, Lea and Flood, 2014), as in `java.util.SplittableRandom`.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (`bound` >= 1), by the multiply-shift reduction (bias < bound / 2^64).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound >= 1, "bound must be >= 1");
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A value in `low..=high`.
    pub fn between(&mut self, low: usize, high: usize) -> usize {
        assert!(low <= high, "empty range {low}..={high}");
        low + self.below((high - low) as u64 + 1) as usize
    }

    /// `count` token IDs, uniform over `0..vocabulary`.
    pub fn tokens(&mut self, count: usize, vocabulary: u32) -> Vec<u32> {
        (0..count)
            .map(|_| self.below(u64::from(vocabulary)) as u32)
            .collect()
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_sequence() {
        // The first outputs of SplitMix64 seeded with 0.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut rng = SplitMix64::new(7);
        for _ in 0..1000 {
            assert!((3..=5).contains(&rng.between(3, 5)));
            assert!(rng.below(2) < 2);
        }
        assert_eq!(rng.between(4, 4), 4);
        let mut items: Vec<u32> = (0..10).collect();
        rng.shuffle(&mut items);
        items.sort_unstable();
        assert_eq!(items, (0..10).collect::<Vec<_>>());
    }
}
