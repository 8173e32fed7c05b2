//! `--configmap NAMESPACE/NAME`: the config read from key `config.yaml` of a ConfigMap (the
//! operator renders it there) and watched through the Kubernetes API.
//!
//! [`ConfigMapWatch::handle`] decides what each watch event means, and is unit-tested; [`watch`]
//! is only the kube-runtime glue around it. The producer needs `get`, `list` and `watch` on
//! `configmaps` in that namespace.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::Api;

use burst_prefix_core::config_store::ConfigStore;

/// The key of the ConfigMap that holds the producer config (the operator writes it).
pub use burst_prefix_runtime::producer::CONFIG_KEY;

/// `NAMESPACE/NAME`, as `--configmap` takes it.
pub fn parse_reference(reference: &str) -> Result<(String, String), String> {
    match reference.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok((namespace.to_string(), name.to_string()))
        }
        _ => Err(format!("expected NAMESPACE/NAME, got {reference:?}")),
    }
}

/// The config text of the ConfigMap, or why there is none.
pub fn config_text(configmap: &ConfigMap, max_bytes: u64) -> Result<&str, String> {
    let text = configmap
        .data
        .as_ref()
        .and_then(|data| data.get(CONFIG_KEY))
        .map(String::as_str)
        .ok_or_else(|| format!("the ConfigMap has no data key {CONFIG_KEY:?}"))?;
    if text.len() as u64 > max_bytes {
        return Err(format!(
            "key {CONFIG_KEY:?} has {} bytes, more than --max-config-bytes {max_bytes}",
            text.len()
        ));
    }
    Ok(text)
}

/// What the watch has seen, so that each change is applied (or rejected) once, even when a
/// restarted watch lists the same object again.
pub struct ConfigMapWatch {
    store: Arc<ConfigStore>,
    max_bytes: u64,
    last: Option<Result<String, String>>,
    seen_in_listing: bool,
}

impl ConfigMapWatch {
    pub fn new(store: Arc<ConfigStore>, max_bytes: u64) -> Self {
        ConfigMapWatch {
            store,
            max_bytes,
            last: None,
            seen_in_listing: false,
        }
    }

    pub fn handle(&mut self, event: Event<ConfigMap>) {
        match event {
            Event::Init => self.seen_in_listing = false,
            Event::InitApply(configmap) => {
                self.seen_in_listing = true;
                self.update(&configmap);
            }
            Event::Apply(configmap) => self.update(&configmap),
            Event::InitDone => {
                if !self.seen_in_listing && self.store.current().is_none() {
                    tracing::warn!(
                        source = %self.store.origin(),
                        "the ConfigMap does not exist yet; not ready until it does"
                    );
                }
            }
            Event::Delete(_) => {
                self.last = None;
                tracing::warn!(
                    source = %self.store.origin(),
                    "the ConfigMap was deleted; the last good config stays in force"
                );
            }
        }
    }

    fn update(&mut self, configmap: &ConfigMap) {
        let text = config_text(configmap, self.max_bytes).map(str::to_string);
        if self.last.as_ref() == Some(&text) {
            return;
        }
        match &text {
            // Errors are logged and counted by the store; the last good config stays.
            Ok(text) => {
                let _ = self.store.apply_text(text);
            }
            Err(reason) => self.store.reject(reason),
        }
        self.last = Some(text);
    }
}

/// Watches the ConfigMap forever; errors are logged and the watch retries with backoff.
pub async fn watch(
    store: Arc<ConfigStore>,
    client: kube::Client,
    namespace: String,
    name: String,
    max_bytes: u64,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api, config)
        .backoff(burst_prefix_runtime::backoff::watch_backoff())
        .boxed();
    let mut state = ConfigMapWatch::new(store, max_bytes);
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => state.handle(event),
            Err(error) => tracing::warn!(
                namespace = %namespace,
                name = %name,
                %error,
                "watching the ConfigMap failed; retrying"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_core::config_store::ConfigOrigin;
    use burst_prefix_core::metrics::Metrics;
    use std::collections::BTreeMap;

    fn configmap(data: Option<&str>) -> ConfigMap {
        ConfigMap {
            data: data.map(|text| BTreeMap::from([(CONFIG_KEY.to_string(), text.to_string())])),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn references_are_namespace_slash_name() {
        assert_eq!(
            parse_reference("ns/cm").unwrap(),
            ("ns".to_string(), "cm".to_string())
        );
        for bad in ["cm", "/cm", "ns/", "a/b/c"] {
            assert!(parse_reference(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn events_apply_good_configs_and_reject_bad_ones_once() {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(
            ConfigOrigin::ConfigMap {
                namespace: "ns".into(),
                name: "cm".into(),
                key: CONFIG_KEY.into(),
            },
            metrics.clone(),
        ));
        let mut watch = ConfigMapWatch::new(store.clone(), 1 << 20);
        let good = "endpoints:\n  - {id: ns/a-rank-0, address: '10.0.0.1:8000'}\n";
        let count = |result: &str, n: u32| {
            metrics.render().contains(&format!(
                "burst_prefix_config_reloads_total{{result=\"{result}\"}} {n}"
            ))
        };

        watch.handle(Event::Init);
        watch.handle(Event::InitDone);
        assert!(store.current().is_none());
        watch.handle(Event::Apply(configmap(Some(good))));
        assert!(store.ready());
        // A restarted watch lists the same object again: nothing changes.
        watch.handle(Event::Init);
        watch.handle(Event::InitApply(configmap(Some(good))));
        watch.handle(Event::InitDone);
        assert!(count("accepted", 1));

        watch.handle(Event::Apply(configmap(Some("blockSizeTokens: 0\n"))));
        watch.handle(Event::Apply(configmap(Some("blockSizeTokens: 0\n"))));
        watch.handle(Event::Apply(configmap(None)));
        assert!(count("rejected", 2));
        watch.handle(Event::Delete(configmap(None)));
        assert_eq!(store.current().unwrap().generation, 1);

        watch.handle(Event::Apply(configmap(Some(&format!(
            "maxPerReplica: 2\n{good}"
        )))));
        assert_eq!(store.current().unwrap().generation, 2);
        assert_eq!(store.current().unwrap().config.planner.max_per_replica, 2);
    }
}
