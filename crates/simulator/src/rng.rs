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

    /// A value in the open interval (0, 1).
    pub fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A draw of the log-normal distribution whose logarithm has mean `mu` and deviation
    /// `sigma` (Box-Muller).
    pub fn lognormal(&mut self, mu: f64, sigma: f64) -> f64 {
        let normal = (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos();
        (mu + sigma * normal).exp()
    }

    /// A draw of the exponential distribution with mean `mean` (Poisson arrivals' gaps).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
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
    fn continuous_draws_have_their_distributions_median_and_mean() {
        let mut rng = SplitMix64::new(7);
        let n = 20_000;
        let mut draws: Vec<f64> = (0..n).map(|_| rng.lognormal(5.0, 0.8)).collect();
        draws.sort_by(f64::total_cmp);
        let median = draws[n / 2];
        assert!((median / 5f64.exp() - 1.0).abs() < 0.05, "median {median}");
        let mean = (0..n).map(|_| rng.exponential(2.0)).sum::<f64>() / n as f64;
        assert!((mean - 2.0).abs() < 0.1, "mean {mean}");
        assert!((0..n).all(|_| (0.0..1.0).contains(&rng.unit())));
    }

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
