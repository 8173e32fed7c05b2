//! Whether the API server still lets this process in. A deleted ServiceAccount (401) or a
//! removed RoleBinding (403) otherwise leaves a process that looks healthy and does nothing:
//! every watch and request records here what it was told, and readiness fails once any of them
//! has been refused for longer than a grace period, so that `kubectl get pods` shows it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::backoff::WATCH_RETRY_MAX;

/// A watch's refusal lapses this long after its last one. A watch that comes back by resuming
/// from its last resource version (kube's watcher does after its stream ends) delivers nothing
/// until an object changes, so for a watch whose objects stay still, its refusals stopping is
/// the only sign that it is back; a refused watch retries at least every [`WATCH_RETRY_MAX`].
const WATCH_REFUSAL_LAPSE: Duration = WATCH_RETRY_MAX
    .saturating_mul(2)
    .saturating_add(Duration::from_secs(2));

/// Refusals (401 Unauthorized, 403 Forbidden) by source (a watch or a request kind), since when.
#[derive(Debug)]
pub struct ApiAccess {
    grace: Duration,
    refused: Mutex<BTreeMap<String, Refusal>>,
}

#[derive(Clone, Debug)]
struct Refusal {
    since: Instant,
    /// The latest refusal.
    last: Instant,
    /// Watches: the refusal lapses this long after `last`. Requests: `None`, it lasts until the
    /// source is allowed (a request is retried only by its caller, maybe minutes later).
    lapses_after: Option<Duration>,
    code: u16,
    message: String,
}

/// The HTTP status of a refusal (401 or 403), if `error` is one.
pub fn refusal_code(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => Some(status.code),
        _ => None,
    }
}

/// The kube error inside a watcher error, if any.
pub fn watcher_kube_error(error: &kube::runtime::watcher::Error) -> Option<&kube::Error> {
    use kube::runtime::watcher::Error;
    match error {
        Error::InitialListFailed(e) | Error::WatchStartFailed(e) | Error::WatchFailed(e) => Some(e),
        Error::WatchError(_) | Error::NoResourceVersion => None,
    }
}

impl ApiAccess {
    pub fn new(grace: Duration) -> Self {
        ApiAccess {
            grace,
            refused: Mutex::new(BTreeMap::new()),
        }
    }

    /// `source` got an answer that was not a refusal.
    pub fn allowed(&self, source: &str) {
        self.lock().remove(source);
    }

    /// `source` failed with `error`: a refusal is remembered (from its first occurrence), any
    /// other error says nothing about access and changes nothing.
    pub fn failed(&self, source: &str, error: &kube::Error) {
        self.refused_at(source, error, Instant::now(), None);
    }

    fn refused_at(
        &self,
        source: &str,
        error: &kube::Error,
        now: Instant,
        lapses_after: Option<Duration>,
    ) {
        let Some(code) = refusal_code(error) else {
            return;
        };
        let mut refused = self.lock();
        let refusal = refused
            .entry(source.to_string())
            .or_insert_with(|| Refusal {
                since: now,
                last: now,
                lapses_after,
                code,
                message: match error {
                    kube::Error::Api(status) => status.message.clone(),
                    other => other.to_string(),
                },
            });
        refusal.last = now;
    }

    /// Records one result of `source`.
    pub fn record<T>(&self, source: &str, result: &Result<T, kube::Error>) {
        match result {
            Ok(_) => self.allowed(source),
            Err(error) => self.failed(source, error),
        }
    }

    /// Records one item of a watch stream (its refusals lapse, see [`WATCH_REFUSAL_LAPSE`]).
    pub fn record_watch<T>(&self, source: &str, item: &Result<T, kube::runtime::watcher::Error>) {
        self.record_watch_at(source, item, Instant::now());
    }

    fn record_watch_at<T>(
        &self,
        source: &str,
        item: &Result<T, kube::runtime::watcher::Error>,
        now: Instant,
    ) {
        match item {
            Ok(_) => self.allowed(source),
            Err(error) => {
                if let Some(error) = watcher_kube_error(error) {
                    self.refused_at(source, error, now, Some(WATCH_REFUSAL_LAPSE));
                }
            }
        }
    }

    /// `Err` naming the source refused the longest, once that exceeds the grace period.
    pub fn check(&self) -> Result<(), String> {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Result<(), String> {
        let refused = self.lock();
        let longest = refused
            .iter()
            .filter(|(_, r)| {
                r.lapses_after
                    .is_none_or(|lapse| now.saturating_duration_since(r.last) <= lapse)
            })
            .filter(|(_, r)| now.saturating_duration_since(r.since) > self.grace)
            .max_by_key(|(_, r)| now.saturating_duration_since(r.since));
        match longest {
            None => Ok(()),
            Some((source, refusal)) => Err(format!(
                "the API server has refused {source} ({}) for {}s (more than the {}s grace): {}",
                refusal.code,
                now.saturating_duration_since(refusal.since).as_secs(),
                self.grace.as_secs(),
                refusal.message
            )),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Refusal>> {
        self.refused.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("denied", "Forbidden").with_code(code),
        ))
    }

    #[test]
    fn a_refusal_fails_only_after_the_grace_and_clears_on_success() {
        let access = ApiAccess::new(Duration::from_secs(10));
        let start = Instant::now();
        access.failed("pods", &refused(403));
        assert!(access.check_at(start + Duration::from_secs(5)).is_ok());
        let error = access
            .check_at(start + Duration::from_secs(11))
            .unwrap_err();
        assert!(error.contains("refused pods (403)"), "{error}");
        // A later refusal keeps the first time; a success clears it.
        access.failed("pods", &refused(403));
        assert!(access.check_at(start + Duration::from_secs(11)).is_err());
        access.allowed("pods");
        assert!(access.check_at(start + Duration::from_secs(60)).is_ok());
    }

    fn refused_watch(code: u16) -> Result<(), kube::runtime::watcher::Error> {
        Err(kube::runtime::watcher::Error::WatchStartFailed(refused(
            code,
        )))
    }

    #[test]
    fn a_watch_refusal_lasts_while_its_retries_are_refused_and_lapses_when_they_stop() {
        let access = ApiAccess::new(Duration::from_secs(2));
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        // Refused at every retry (at most WATCH_RETRY_MAX apart) for 20 s: not ready from 2 s on.
        let mut t = 0;
        while t <= 20 {
            access.record_watch_at("watch pods", &refused_watch(403), at(t));
            if t > 2 {
                let error = access.check_at(at(t)).unwrap_err();
                assert!(error.contains("refused watch pods (403)"), "{error}");
            }
            t += WATCH_RETRY_MAX.as_secs();
        }
        // The retries stop failing, and the watch resumed delivers nothing (its objects stay
        // still): the refusal lapses, but not before a retry could have come and failed.
        let last = t - WATCH_RETRY_MAX.as_secs();
        assert!(access.check_at(at(last) + WATCH_RETRY_MAX * 2).is_err());
        assert!(access
            .check_at(at(last) + WATCH_REFUSAL_LAPSE + Duration::from_millis(1))
            .is_ok());
        // A request's refusal does not lapse: only an allowed answer clears it.
        access.failed("list pods", &refused(403));
        let much_later = Instant::now() + Duration::from_secs(600);
        assert!(access
            .check_at(much_later)
            .unwrap_err()
            .contains("list pods"));
    }

    #[test]
    fn other_errors_and_other_sources_do_not_clear_or_set_a_refusal() {
        let access = ApiAccess::new(Duration::ZERO);
        access.failed("pods", &refused(401));
        access.allowed("configmaps");
        access.failed("pods", &refused(500));
        let later = Instant::now() + Duration::from_secs(1);
        assert!(access.check_at(later).unwrap_err().contains("(401)"));
        access.failed("services", &refused(500));
        access.allowed("pods");
        assert!(access.check_at(later).is_ok());
    }
}
