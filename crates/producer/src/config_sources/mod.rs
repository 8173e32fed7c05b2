//! Where the config comes from: a file polled for changes, or a ConfigMap watched through the
//! Kubernetes API. Each source hands every text it sees to the core's config store.

pub mod configmap;
pub mod file;

use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use burst_prefix_core::config_store::{ConfigOrigin, ConfigStore};

/// A config source, as the command line names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigSource {
    /// `--config FILE`, polled every `poll`.
    File {
        path: PathBuf,
        poll: Duration,
        max_bytes: u64,
    },
    /// `--configmap NAMESPACE/NAME`.
    ConfigMap {
        namespace: String,
        name: String,
        max_bytes: u64,
    },
}

impl ConfigSource {
    /// What `GET /v1/endpoints` and the logs call it.
    pub fn origin(&self) -> ConfigOrigin {
        match self {
            ConfigSource::File { path, .. } => ConfigOrigin::File {
                path: path.display().to_string(),
            },
            ConfigSource::ConfigMap {
                namespace, name, ..
            } => ConfigOrigin::ConfigMap {
                namespace: namespace.clone(),
                name: name.clone(),
                key: configmap::CONFIG_KEY.to_string(),
            },
        }
    }

    /// Loads what must be there at start (a file must hold a valid config) and starts watching
    /// for changes on the current runtime.
    pub async fn start(&self, store: Arc<ConfigStore>) -> Result<(), String> {
        match self {
            ConfigSource::File {
                path,
                poll,
                max_bytes,
            } => {
                let applied = file::load(&store, path, *max_bytes)?;
                tokio::spawn(file::watch(store, path.clone(), *poll, *max_bytes, applied));
            }
            ConfigSource::ConfigMap {
                namespace,
                name,
                max_bytes,
            } => {
                let client = kube::Client::try_default()
                    .await
                    .map_err(|e| format!("cannot reach the Kubernetes API for --configmap: {e}"))?;
                tokio::spawn(configmap::watch(
                    store,
                    client,
                    namespace.clone(),
                    name.clone(),
                    *max_bytes,
                ));
            }
        }
        Ok(())
    }
}
