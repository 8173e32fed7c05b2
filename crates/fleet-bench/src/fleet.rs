//! The simulated fleet (bench/fleet/fleet.yaml): replica classes with BLIS's calibrated
//! coefficients of a named model on a named GPU, and the llm-d-inference-sim flags each replica
//! gets from them.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// bench/fleet/fleet.yaml.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FleetConfig {
    /// `--max-num-seqs`: requests a replica runs at once; more wait in its queue.
    pub max_num_seqs: u32,
    /// `--max-waiting-queue-length`.
    pub max_waiting_queue_length: u32,
    /// `--kv-cache-size`, in blocks.
    pub kv_cache_blocks: u64,
    /// `--block-size`, in tokens.
    pub block_size: u32,
    pub classes: Vec<ReplicaClass>,
}

/// Replicas of one model on one GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaClass {
    pub name: String,
    /// Of the fleet's replicas.
    pub share: f64,
    pub model: String,
    pub gpu: String,
    /// BLIS's step time coefficients, microseconds: fixed, per uncached prefill token, per
    /// decode token.
    pub beta_us: [f64; 3],
    /// BLIS's time outside the GPU, microseconds: fixed, per input token, per output token.
    pub alpha_us: [f64; 3],
}

/// The latency flags of one class, in microseconds, at time scale 1.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SimLatencies {
    pub prefill_overhead_us: f64,
    pub prefill_per_token_us: f64,
    pub inter_token_latency_us: f64,
    pub time_factor_under_load: f64,
}

impl ReplicaClass {
    /// The simulator's flags for this class (see fleet.yaml's header): its inter-token latency
    /// with n sequences running is BLIS's decode step with n sequences, beta0 + beta2 * n.
    pub fn latencies(&self, max_num_seqs: u32) -> SimLatencies {
        let [b0, b1, b2] = self.beta_us;
        let [a0, a1, _] = self.alpha_us;
        let one = b0 + b2;
        SimLatencies {
            prefill_overhead_us: b0 + a0,
            prefill_per_token_us: b1 + a1,
            inter_token_latency_us: one,
            time_factor_under_load: (b0 + b2 * f64::from(max_num_seqs)) / one,
        }
    }
}

impl FleetConfig {
    pub fn parse(text: &str) -> anyhow::Result<FleetConfig> {
        let config: FleetConfig = serde_yaml::from_str(text).context("fleet config")?;
        if config.classes.is_empty() {
            bail!("fleet config: no replica class");
        }
        let total: f64 = config.classes.iter().map(|c| c.share).sum();
        if (total - 1.0).abs() > 1e-6 || config.classes.iter().any(|c| c.share <= 0.0) {
            bail!("fleet config: the classes' shares must be positive and sum to 1 (they sum to {total})");
        }
        if config.max_num_seqs < 2 {
            bail!("fleet config: maxNumSeqs must be at least 2");
        }
        Ok(config)
    }

    /// The class of each of `replicas` replicas: each class gets its share (rounded, the
    /// remainder to the first class), the later classes spread evenly among the first's.
    pub fn assign(&self, replicas: usize) -> Vec<usize> {
        let mut counts: Vec<usize> = self
            .classes
            .iter()
            .map(|c| (c.share * replicas as f64).round() as usize)
            .collect();
        let later: usize = counts[1..].iter().sum::<usize>().min(replicas);
        counts[0] = replicas - later;
        let mut classes = vec![0; replicas];
        let mut free: Vec<usize> = (0..replicas).collect();
        for (class, &count) in counts.iter().enumerate().skip(1) {
            let n = free.len();
            // Every (n / count)-th free replica, from the middle of each stride.
            let chosen: Vec<usize> = (0..count)
                .map(|k| free[((2 * k + 1) * n) / (2 * count)])
                .collect();
            for &replica in &chosen {
                classes[replica] = class;
            }
            free.retain(|r| !chosen.contains(r));
        }
        classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> FleetConfig {
        FleetConfig::parse(include_str!("../../../bench/fleet/fleet.yaml")).unwrap()
    }

    #[test]
    fn the_simulators_inter_token_latency_is_blis_decode_step() {
        let config = shipped();
        for class in &config.classes {
            let l = class.latencies(config.max_num_seqs);
            let [b0, _, b2] = class.beta_us;
            // The simulator: itl * (1 + (factor - 1) * (n - 1) / (maxNumSeqs - 1)).
            let simulated = |n: f64| {
                l.inter_token_latency_us
                    * (1.0
                        + (l.time_factor_under_load - 1.0) * (n - 1.0)
                            / (f64::from(config.max_num_seqs) - 1.0))
            };
            for n in [1.0, 17.0, 256.0] {
                assert!(
                    (simulated(n) - (b0 + b2 * n)).abs() < 1e-6,
                    "{} at {n}",
                    class.name
                );
            }
        }
        // H100: 5.99 ms fixed, 19.0 us per uncached prompt token, 5.76 ms per output token alone.
        let fast = config.classes[0].latencies(config.max_num_seqs);
        assert_eq!(fast.prefill_overhead_us.round(), 5985.0);
        assert_eq!((fast.prefill_per_token_us * 10.0).round(), 190.0);
        assert_eq!(fast.inter_token_latency_us.round(), 5759.0);
    }

    #[test]
    fn classes_are_spread_by_share() {
        let config = shipped();
        assert_eq!(
            config.assign(16),
            vec![0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0]
        );
        let classes = config.assign(64);
        assert_eq!(classes.iter().filter(|&&c| c == 1).count(), 16);
        assert_eq!(config.assign(1), vec![0]);
    }

    #[test]
    fn shares_must_sum_to_one() {
        let text =
            include_str!("../../../bench/fleet/fleet.yaml").replace("share: 0.25", "share: 0.5");
        assert!(FleetConfig::parse(&text).is_err());
    }
}
