//! An engine's `/metrics` text (docs/behaviour.md §7, "What the engines say"): whatever it says,
//! the load parser and the speed learner leave every learned figure finite and within
//! `BOUND` times the prior's, through any sequence of scrapes of it.

use burst_prefix_engine_state::load::parse_load;
use burst_prefix_engine_state::speed::{parse_counters, SpeedLearner, BOUND};
use burst_prefix_planner::Speed;

/// The input is scrapes separated by a line `---`: each one is fed to a learner in turn, a
/// second apart, then the speed is checked.
pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let prior = Speed::default();
    let mut learner = SpeedLearner::new();
    for (i, scrape) in text.split("\n---\n").enumerate() {
        for load in parse_load(scrape) {
            assert!(
                load.running.is_finite() && load.waiting.is_finite(),
                "{load:?}"
            );
        }
        learner.observe(parse_counters(scrape), i as f64);
        let speed = learner.speed(prior);
        let bounded = |learned: f64, prior: f64| {
            learned.is_finite()
                && learned >= prior / BOUND * 0.999
                && learned <= prior * BOUND * 1.001
        };
        assert!(
            bounded(
                speed.prefill_seconds_per_token,
                prior.prefill_seconds_per_token
            ) && bounded(
                speed.prefill_overhead_seconds,
                prior.prefill_overhead_seconds
            ) && bounded(speed.decode_seconds_per_step, prior.decode_seconds_per_step)
                && bounded(
                    speed.decode_seconds_per_step_per_sequence,
                    prior.decode_seconds_per_step_per_sequence
                ),
            "{speed:?} after scrape {i}"
        );
        assert_eq!(speed.max_running, prior.max_running);
        if let Some(tokens) = learner.output_tokens() {
            assert!(tokens.is_finite() && tokens >= 1.0, "{tokens}");
        }
    }
}
