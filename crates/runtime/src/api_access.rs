//! Whether the API server still lets this process in. A deleted ServiceAccount (401) or a
//! removed RoleBinding (403) otherwise leaves a process that looks healthy and does nothing:
//! every watch and request records here what it was told, and readiness fails once any of them
//! has been refused for longer than a grace period, so that `kubectl get pods` shows it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Refusals (401 Unauthorized, 403 Forbidden) by source (a watch or a request kind), since when.
#[derive(Debug)]
pub struct ApiAccess {
    grace: Duration,
    refused: Mutex<BTreeMap<String, Refusal>>,
}

#[derive(Clone, Debug)]
struct Refusal {
    since: Instant,
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
        if let Some(code) = refusal_code(error) {
            self.lock()
                .entry(source.to_string())
                .or_insert_with(|| Refusal {
                    since: Instant::now(),
                    code,
                    message: match error {
                        kube::Error::Api(status) => status.message.clone(),
                        other => other.to_string(),
                    },
                });
        }
    }

    /// Records one result of `source`.
    pub fn record<T>(&self, source: &str, result: &Result<T, kube::Error>) {
        match result {
            Ok(_) => self.allowed(source),
            Err(error) => self.failed(source, error),
        }
    }

    /// Records one item of a watch stream.
    pub fn record_watch<T>(&self, source: &str, item: &Result<T, kube::runtime::watcher::Error>) {
        match item {
            Ok(_) => self.allowed(source),
            Err(error) => {
                if let Some(error) = watcher_kube_error(error) {
                    self.failed(source, error);
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
