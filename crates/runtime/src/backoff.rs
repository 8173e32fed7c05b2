//! The backoff of every Kubernetes watch, one per watch stream.
//!
//! kube-runtime's default (client-go's: up to 30 s plus jitter, reset only after 120 s without
//! errors) is too slow to come back from an API server restart. And a backoff must wrap each
//! watch on its own: kube-runtime's `Controller::trigger_backoff` wraps the merged stream of all
//! of a controller's watches, so while one watch backs off, every other watch is paused too, and
//! after a restart the watches fail and sleep one after the other (eight watches x up to 5 s
//! each was a ~45 s recovery after an API server restart).

use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The longest a failing watch waits before its next attempt: the cap of [`watch_backoff`]
/// with its jitter, which adds up to as much again.
pub const WATCH_RETRY_MAX: Duration = Duration::from_secs(4);

/// Exponential from 200 ms, doubling, capped at 2 s, with jitter; never gives up, and resets on
/// the first event the watch delivers.
pub fn watch_backoff() -> impl Backoff + 'static {
    kube::runtime::watcher::ExponentialBackoff::from(
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(200))
            .with_max_delay(WATCH_RETRY_MAX / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times(),
    )
}
