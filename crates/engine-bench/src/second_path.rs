//! Prompts that also arrive by a second path (`--direct-fraction`): a share of each step's
//! requests goes straight to a replica instead of through the route's front, as when some clients
//! bypass the router. The route never sees them; the replicas cache them all the same, so only a
//! front that hears what the engines hold (KV events, docs/behaviour.md §7) knows where they went.
//!
//! Which requests go straight is decided by a seeded hash of (seed, step, request), so every
//! route of a run sends the same requests by the second path.

/// Which of a step's `requests` go straight to a replica: exactly `round(fraction x requests)`
/// of them, those with the lowest hash of (`seed`, `step`, index); ties by index.
pub fn sent_direct(fraction: f64, seed: u64, step: usize, requests: usize) -> Vec<bool> {
    let count = ((fraction.clamp(0.0, 1.0) * requests as f64).round() as usize).min(requests);
    let step_seed = mix(mix(seed) ^ step as u64);
    let mut order: Vec<(u64, usize)> = (0..requests)
        .map(|i| (mix(step_seed ^ i as u64), i))
        .collect();
    order.sort_unstable();
    let mut direct = vec![false; requests];
    for &(_, i) in &order[..count] {
        direct[i] = true;
    }
    direct
}

/// Checks a `--direct-fraction` value: a number in 0..=1.
pub fn parse_fraction(text: &str) -> Result<f64, String> {
    let fraction: f64 = text
        .parse()
        .map_err(|e| format!("{text:?} is not a number: {e}"))?;
    if (0.0..=1.0).contains(&fraction) {
        Ok(fraction)
    } else {
        Err(format!("{fraction} is not in 0..=1"))
    }
}

/// SplitMix64's finalizer: a fixed, well-spread 64-bit hash (no dependency, the same on every
/// machine and release).
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_and_step_send_the_same_requests_straight() {
        for step in 0..20 {
            assert_eq!(
                sent_direct(0.25, 7, step, 13),
                sent_direct(0.25, 7, step, 13)
            );
        }
    }

    #[test]
    fn the_fraction_is_honoured_within_rounding_on_every_step() {
        for requests in 0..=40 {
            for fraction in [0.0, 0.1, 0.25, 0.5, 0.75, 1.0] {
                for step in 0..5 {
                    let direct = sent_direct(fraction, 3, step, requests);
                    assert_eq!(direct.len(), requests);
                    let sent = direct.iter().filter(|&&d| d).count() as f64;
                    assert!(
                        (sent - fraction * requests as f64).abs() <= 0.5,
                        "{sent} of {requests} at {fraction}"
                    );
                }
            }
        }
    }

    #[test]
    fn seeds_and_steps_choose_different_requests() {
        let choices: std::collections::HashSet<Vec<bool>> = (0..10)
            .flat_map(|seed| (0..10).map(move |step| sent_direct(0.25, seed, step, 16)))
            .collect();
        assert!(
            choices.len() > 50,
            "only {} distinct choices",
            choices.len()
        );
        // Every request of a step is sometimes chosen: no position is favoured.
        for i in 0..16 {
            assert!((0..100).any(|step| sent_direct(0.25, 1, step, 16)[i]));
        }
    }

    #[test]
    fn a_fraction_outside_0_to_1_is_refused() {
        assert_eq!(parse_fraction("0.25"), Ok(0.25));
        assert_eq!(parse_fraction("0"), Ok(0.0));
        assert_eq!(parse_fraction("1"), Ok(1.0));
        assert!(parse_fraction("1.5").is_err());
        assert!(parse_fraction("-0.1").is_err());
        assert!(parse_fraction("NaN").is_err());
        assert!(parse_fraction("a").is_err());
    }
}
