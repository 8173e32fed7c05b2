//! Exponential backoff per policy: a policy that keeps failing is retried after 1 s, 2 s, 4 s,
//! ... up to a cap, and after its first success from the start again. (kube-runtime requeues
//! with whatever `error_policy` returns; this is what it returns.)

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The delay before retry number `failures` (1 for the first retry).
pub fn retry_delay(failures: u32, base: Duration, max: Duration) -> Duration {
    let exponent = failures.saturating_sub(1).min(31);
    base.saturating_mul(1u32 << exponent).min(max)
}

/// Consecutive failures per policy (`namespace/name`).
#[derive(Debug)]
pub struct RetryBackoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl RetryBackoff {
    pub fn new(base: Duration, max: Duration) -> Self {
        RetryBackoff {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one more failure of `key` and returns how long to wait before retrying.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let count = failures.entry(key.to_string()).or_insert(0);
        *count = count.saturating_add(1);
        retry_delay(*count, self.base, self.max)
    }

    /// `key` succeeded: its next failure waits `base` again.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_resets_on_success() {
        let backoff = RetryBackoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let delays: Vec<u64> = (0..6).map(|_| backoff.failed("ml/rl").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(backoff.failed("ml/other").as_secs(), 1);
        backoff.succeeded("ml/rl");
        assert_eq!(backoff.failed("ml/rl").as_secs(), 1);
        assert_eq!(
            retry_delay(u32::MAX, Duration::from_secs(1), Duration::from_secs(300)),
            Duration::from_secs(300)
        );
    }
}
