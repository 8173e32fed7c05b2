//! `--config FILE`: the config read from a file (YAML or JSON) and polled for changes.
//!
//! Polling the content every interval (1 s by default) is simple and robust: it sees in-place
//! writes, renames, and the symlink swaps of a mounted ConfigMap alike.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use burst_prefix_core::config_store::ConfigStore;

/// Reads the file, refusing one larger than `max_bytes` before reading it.
fn read(path: &Path, max_bytes: u64) -> std::io::Result<String> {
    let size = std::fs::metadata(path)?.len();
    if size > max_bytes {
        return Err(std::io::Error::other(format!(
            "the file has {size} bytes, more than --max-config-bytes {max_bytes}"
        )));
    }
    std::fs::read_to_string(path)
}

/// Reads and applies the file once, at startup: a missing or invalid file is an error.
pub fn load(store: &ConfigStore, path: &Path, max_bytes: u64) -> Result<String, String> {
    let text = read(path, max_bytes)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    store
        .apply_text(&text)
        .map_err(|e| format!("config file {}: {e}", path.display()))?;
    Ok(text)
}

/// What one poll saw, remembered so that each change is applied (or rejected) once.
#[derive(Debug, Default)]
pub struct FileWatch {
    last_text: Option<String>,
    last_error: Option<String>,
}

impl FileWatch {
    /// Starts from the text [`load`] applied.
    pub fn new(applied: String) -> Self {
        FileWatch {
            last_text: Some(applied),
            last_error: None,
        }
    }

    /// Handles one read of the file.
    pub fn observe(&mut self, store: &ConfigStore, read: std::io::Result<String>) {
        match read {
            Ok(text) => {
                self.last_error = None;
                if self.last_text.as_deref() != Some(text.as_str()) {
                    // Errors are logged and counted by the store; the last good config stays.
                    let _ = store.apply_text(&text);
                    self.last_text = Some(text);
                }
            }
            Err(error) => {
                let error = format!("cannot read the config file: {error}");
                if self.last_error.as_deref() != Some(error.as_str()) {
                    store.reject(&error);
                    self.last_error = Some(error);
                }
            }
        }
    }
}

/// Polls `path` forever; a file is parsed only when its bytes changed.
pub async fn watch(
    store: Arc<ConfigStore>,
    path: PathBuf,
    interval: Duration,
    max_bytes: u64,
    applied: String,
) {
    let mut state = FileWatch::new(applied);
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let reading = path.clone();
        let read = tokio::task::spawn_blocking(move || read(&reading, max_bytes))
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)));
        state.observe(&store, read);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burst_prefix_core::config_store::ConfigOrigin;
    use burst_prefix_core::metrics::Metrics;

    const GOOD: &str = "endpoints:\n  - {id: a, address: '10.0.0.1:8000'}\n";

    #[test]
    fn each_change_is_applied_or_rejected_once() {
        let metrics = Arc::new(Metrics::new());
        let store = ConfigStore::new(
            ConfigOrigin::File {
                path: "x.yaml".into(),
            },
            metrics.clone(),
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, GOOD).unwrap();
        let mut watch = FileWatch::new(load(&store, &path, 1 << 20).unwrap());
        let rejected = |n: u32| {
            metrics.render().contains(&format!(
                "burst_prefix_config_reloads_total{{result=\"rejected\"}} {n}"
            ))
        };

        watch.observe(&store, Ok(GOOD.into()));
        assert_eq!(store.current().unwrap().generation, 1);
        watch.observe(&store, Ok(GOOD.replace("a,", "b,")));
        assert_eq!(store.current().unwrap().generation, 2);
        for _ in 0..3 {
            watch.observe(&store, Ok("maxPerReplica: 0\n".into()));
        }
        assert!(rejected(1));
        for _ in 0..3 {
            watch.observe(&store, Err(std::io::ErrorKind::NotFound.into()));
        }
        assert!(rejected(2));
        assert_eq!(store.current().unwrap().config.endpoints[0].id, "b");

        std::fs::write(dir.path().join("big.yaml"), "#".repeat(100)).unwrap();
        assert!(load(&store, &dir.path().join("big.yaml"), 99)
            .unwrap_err()
            .contains("more than --max-config-bytes 99"));
        assert!(load(&store, &dir.path().join("missing.yaml"), 1 << 20)
            .unwrap_err()
            .contains("cannot read config file"));
    }
}
