//! What every reconcile shares: the client, the operator's settings, its metrics and Event
//! recorder, the retry backoff per policy, and what was learned of each policy last time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use burst_prefix_runtime::api_access::ApiAccess;
use kube::core::Selector;
use kube::runtime::events::Recorder;
use kube::{Client, Resource};

use crate::apply::Accepted;
use crate::backoff::RetryBackoff;
use crate::desired::ProducerDefaults;
use crate::metrics::Metrics;
use crate::pool_api::PoolApi;
use crate::validate::ImagePolicy;

/// What the operator's flags say about reconciling.
#[derive(Clone, Debug)]
pub struct Settings {
    pub producer: ProducerDefaults,
    pub images: ImagePolicy,
    /// `--pod-selector`: only pods with these labels are watched (and can be endpoints).
    pub pod_selector: Option<String>,
    /// How long a healthy policy waits before it is reconciled again anyway.
    pub resync: Duration,
}

/// State shared by reconciliations.
pub struct Context {
    pub client: Client,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub settings: Settings,
    pub backoff: RetryBackoff,
    pub pool_api: Arc<PoolApi>,
    pub access: Arc<ApiAccess>,
    /// The selector each policy resolved to last time (`namespace/name`), for the pod mapper.
    selectors: RwLock<HashMap<String, Selector>>,
    /// What the API server last accepted of each policy's children.
    accepted: Mutex<HashMap<String, Accepted>>,
}

impl Context {
    pub fn new(
        client: Client,
        metrics: Metrics,
        recorder: Recorder,
        settings: Settings,
        backoff: RetryBackoff,
        pool_api: Arc<PoolApi>,
        access: Arc<ApiAccess>,
    ) -> Self {
        Context {
            client,
            metrics,
            recorder,
            settings,
            backoff,
            pool_api,
            access,
            selectors: RwLock::new(HashMap::new()),
            accepted: Mutex::new(HashMap::new()),
        }
    }

    /// Taken out for one reconcile (kube-runtime never runs two for one policy at once).
    pub(crate) fn take_accepted(&self, key: &str) -> Accepted {
        self.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
            .unwrap_or_default()
    }

    pub(crate) fn keep_accepted(&self, key: String, accepted: Accepted) {
        self.accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, accepted);
    }

    pub(crate) fn remember_selector(&self, key: &str, selector: &Selector) {
        self.selectors
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_string(), selector.clone());
    }

    pub(crate) fn selector_of(&self, key: &str) -> Option<Selector> {
        self.selectors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }
}

/// `namespace/name` of an object: the key of a policy in the operator's maps.
pub fn key_of<K: Resource>(object: &K) -> String {
    format!(
        "{}/{}",
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
}
