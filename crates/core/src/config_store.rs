//! The config in force: the last good [`ProducerConfig`], its generation and where it came from.
//!
//! Every source (a file, a ConfigMap, the built-in demo config) hands its text to
//! [`ConfigStore::apply_text`]: a valid, changed config becomes the next generation; an invalid
//! one is rejected, logged and counted, and the last good config stays. The window snapshots
//! [`ConfigStore::current`] when it opens, so a change applies from the next window.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use burst_prefix_api::producer_config::ProducerConfigError;
use burst_prefix_api::{Placement, PlannerConfig, ProducerConfig};
use burst_prefix_planner::{BlockSpec, PlanParams};
use serde::Serialize;

use crate::metrics::Metrics;

/// Where the config in force came from (shown by `GET /v1/endpoints` and in logs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ConfigOrigin {
    /// `--config FILE`, polled for changes.
    File { path: String },
    /// `--configmap NAMESPACE/NAME`, key `config.yaml`, watched through the Kubernetes API.
    #[serde(rename = "configMap")]
    ConfigMap {
        namespace: String,
        name: String,
        key: String,
    },
    /// The built-in demo config of `burst-prefix-producer demo`.
    Demo,
}

impl std::fmt::Display for ConfigOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigOrigin::File { path } => write!(f, "file {path}"),
            ConfigOrigin::ConfigMap {
                namespace,
                name,
                key,
            } => write!(f, "configmap {namespace}/{name} key {key}"),
            ConfigOrigin::Demo => write!(f, "built-in demo config"),
        }
    }
}

/// One accepted config. Immutable: a window holds its snapshot while it is open.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub config: ProducerConfig,
    /// 1 for the first accepted config, +1 for each accepted change.
    pub generation: u64,
    /// The config's planner fields, converted once for the window and the planner.
    pub settings: Settings,
}

impl Snapshot {
    /// `config` must be valid.
    pub fn new(config: ProducerConfig, generation: u64) -> Self {
        Snapshot {
            settings: Settings::of(&config.planner),
            config,
            generation,
        }
    }

    /// The index of the endpoint with this id.
    pub fn endpoint_index(&self, id: &str) -> Option<usize> {
        self.config.endpoints.iter().position(|e| e.id == id)
    }
}

/// A validated planner config in the types its users need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `placement: onArrival` (or `windowDurationMs: 0`): each request placed on arrival.
    pub on_arrival: bool,
    /// `windowDurationMs`, in window mode.
    pub window: Duration,
    pub block_spec: BlockSpec,
    pub plan: PlanParams,
    /// The window's capacity, `None` when unlimited.
    pub max_batch_size: Option<usize>,
    /// Seal a window this long after its last arrival; `None`: off.
    pub idle_seal: Option<Duration>,
    pub seal_on_hints: bool,
}

impl Settings {
    fn of(planner: &PlannerConfig) -> Self {
        Settings {
            on_arrival: planner.placement() == Placement::OnArrival,
            window: Duration::from_millis(u64::try_from(planner.window_ms()).unwrap_or(0)),
            block_spec: planner.block_spec(),
            plan: planner.plan_params(),
            max_batch_size: planner.max_batch_size(),
            idle_seal: planner.idle_seal(),
            seal_on_hints: planner.seal_on_hints,
        }
    }
}

/// What [`ConfigStore::apply_text`] did with a valid config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// In force now, as this generation.
    Accepted(u64),
    /// Equal to the config in force (this generation): nothing changed, nothing counted.
    Unchanged(u64),
}

pub struct ConfigStore {
    origin: ConfigOrigin,
    current: RwLock<Option<Arc<Snapshot>>>,
    metrics: Arc<Metrics>,
    /// Other producers share this one's traffic (`serve --active-active`): every config's
    /// plan then agrees with theirs (`PlanParams::agree_with_peers`).
    beside_peers: AtomicBool,
}

impl ConfigStore {
    /// A store with no config yet (not ready until a source delivers one).
    pub fn new(origin: ConfigOrigin, metrics: Arc<Metrics>) -> Self {
        ConfigStore {
            origin,
            current: RwLock::new(None),
            metrics,
            beside_peers: AtomicBool::new(false),
        }
    }

    /// Says that other producers share this one's traffic (active-active, docs/behaviour.md
    /// §10): the config in force and every later one plan so as to agree with theirs.
    pub fn set_beside_peers(&self, beside_peers: bool) {
        self.beside_peers.store(beside_peers, Ordering::Relaxed);
        let mut current = self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(snapshot) = current.as_ref() {
            let mut settings = snapshot.settings;
            settings.plan.agree_with_peers = beside_peers;
            *current = Some(Arc::new(Snapshot {
                config: snapshot.config.clone(),
                generation: snapshot.generation,
                settings,
            }));
        }
    }

    /// Where the config comes from.
    pub fn origin(&self) -> &ConfigOrigin {
        &self.origin
    }

    /// The config in force, if one was accepted.
    pub fn current(&self) -> Option<Arc<Snapshot>> {
        self.current
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Ready to serve: a valid config with at least one endpoint is in force.
    pub fn ready(&self) -> bool {
        self.current()
            .is_some_and(|snapshot| !snapshot.config.endpoints.is_empty())
    }

    /// Parses, validates and applies one config text (YAML or JSON).
    pub fn apply_text(&self, text: &str) -> Result<Applied, ProducerConfigError> {
        match ProducerConfig::from_yaml(text) {
            Ok(config) => Ok(self.apply_valid(config)),
            Err(error) => {
                self.reject(&error.to_string());
                Err(error)
            }
        }
    }

    /// Applies a config object (validated here too).
    pub fn apply(&self, config: ProducerConfig) -> Result<Applied, ProducerConfigError> {
        match config.validate() {
            Ok(()) => Ok(self.apply_valid(config)),
            Err(error) => {
                let error = ProducerConfigError::from(error);
                self.reject(&error.to_string());
                Err(error)
            }
        }
    }

    /// Counts and logs an update that could not even be read as a config text (e.g. a
    /// ConfigMap without the key); the last good config stays in force.
    pub fn reject(&self, reason: &str) {
        self.metrics.config_reload(false);
        let generation = self.current().map_or(0, |snapshot| snapshot.generation);
        tracing::warn!(
            source = %self.origin,
            in_force = generation,
            error = reason,
            "config update rejected; the last good config stays in force"
        );
    }

    fn apply_valid(&self, config: ProducerConfig) -> Applied {
        let mut current = self
            .current
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(snapshot) = current.as_ref() {
            if snapshot.config == config {
                return Applied::Unchanged(snapshot.generation);
            }
        }
        let generation = current.as_ref().map_or(0, |s| s.generation) + 1;
        let endpoints = config.endpoints.len();
        let ids: std::collections::HashSet<String> =
            config.endpoints.iter().map(|e| e.id.clone()).collect();
        let mut snapshot = Snapshot::new(config, generation);
        snapshot.settings.plan.agree_with_peers = self.beside_peers.load(Ordering::Relaxed);
        *current = Some(Arc::new(snapshot));
        drop(current);
        self.metrics.config_reload(true);
        self.metrics.retain_endpoints(&|id| ids.contains(id));
        self.metrics
            .endpoints
            .set(i64::try_from(endpoints).unwrap_or(i64::MAX));
        tracing::info!(
            source = %self.origin,
            generation,
            endpoints,
            "config accepted; it applies from the next window"
        );
        Applied::Accepted(generation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (ConfigStore, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        (
            ConfigStore::new(ConfigOrigin::Demo, metrics.clone()),
            metrics,
        )
    }

    fn reloads(metrics: &Metrics, result: &str) -> bool {
        let text = metrics.render();
        text.lines().any(|line| {
            line == format!("burst_prefix_config_reloads_total{{result=\"{result}\"}} 1")
        })
    }

    #[test]
    fn beside_peers_every_config_plans_to_agree_with_them() {
        let (store, _) = store();
        let agrees = |store: &ConfigStore| store.current().unwrap().settings.plan.agree_with_peers;
        store.apply_text("endpoints: []\n").unwrap();
        assert!(!agrees(&store), "alone by default");
        store.set_beside_peers(true);
        assert!(agrees(&store), "the config in force");
        assert_eq!(store.current().unwrap().generation, 1, "not a new config");
        store
            .apply_text("endpoints:\n  - {id: a, address: '10.0.0.1:8000'}\n")
            .unwrap();
        assert!(agrees(&store), "and the next");
    }

    #[test]
    fn good_configs_become_generations_and_bad_ones_are_counted() {
        let (store, metrics) = store();
        assert!(!store.ready());
        assert_eq!(
            store.apply_text("endpoints: []\n").unwrap(),
            Applied::Accepted(1)
        );
        assert!(!store.ready(), "no endpoints: not ready");
        let good = "endpoints:\n  - {id: a, address: '10.0.0.1:8000'}\n";
        assert_eq!(store.apply_text(good).unwrap(), Applied::Accepted(2));
        assert!(store.ready());
        assert_eq!(store.apply_text(good).unwrap(), Applied::Unchanged(2));

        let err = store.apply_text("maxPerReplica: 0\n").unwrap_err();
        assert!(err.to_string().contains("maxPerReplica is 0"), "{err}");
        assert!(reloads(&metrics, "rejected"));
        let current = store.current().unwrap();
        assert_eq!(current.generation, 2);
        assert_eq!(current.config.endpoints[0].id, "a");
        assert!(metrics.render().contains("burst_prefix_endpoints 1"));
    }

    #[test]
    fn a_block_larger_than_any_prompt_is_valid_and_hashes_one_block_per_prompt() {
        // The fuzz target producer_config's input (fuzz/seeds/producer_config/huge_block.yaml):
        // hashing under it overflowed (docs/behaviour.md §2 allows any blockSizeTokens >= 1).
        let (store, _) = store();
        let text = "blockSizeTokens: 4611686018427387904\nmemory: {cacheTokensPerReplica: 4611686018427387904}\nendpoints: []\n";
        assert_eq!(store.apply_text(text).unwrap(), Applied::Accepted(1));
        let spec = store.current().unwrap().settings.block_spec;
        let body = br#"{"model": "m", "prompt": ["You are a helpful assistant.", "x"]}"#;
        let request = crate::read::InferenceRequest::parse(body).unwrap();
        let hashed = crate::read::HashedRequest::new(&request, spec);
        assert_eq!(hashed.blocks.len(), 2);
    }

    #[test]
    fn the_origin_serializes_with_its_kind() {
        let origin = ConfigOrigin::ConfigMap {
            namespace: "ns".into(),
            name: "cm".into(),
            key: "config.yaml".into(),
        };
        assert_eq!(
            serde_json::to_value(&origin).unwrap(),
            serde_json::json!({"kind": "configMap", "namespace": "ns", "name": "cm", "key": "config.yaml"})
        );
        assert_eq!(
            serde_json::to_value(ConfigOrigin::Demo).unwrap(),
            serde_json::json!({"kind": "demo"})
        );
    }
}
