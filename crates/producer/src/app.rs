//! The parts of one running producer that every handler shares.

use std::sync::Arc;

use crate::config_store::{ConfigSource, ConfigStore};
use crate::metrics::Metrics;
use crate::window::Window;

/// Default limit of a request body: 8 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

#[derive(Clone)]
pub struct App {
    pub store: Arc<ConfigStore>,
    pub window: Arc<Window>,
    pub metrics: Arc<Metrics>,
    pub max_body_bytes: usize,
}

impl App {
    /// A producer with no config yet; a source fills `store`.
    pub fn new(source: ConfigSource, max_body_bytes: usize) -> Self {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(ConfigStore::new(source, metrics.clone()));
        let window = Window::new(store.clone(), metrics.clone());
        App {
            store,
            window,
            metrics,
            max_body_bytes,
        }
    }

    /// Ready: a valid config with at least one endpoint is in force, and not shutting down.
    pub fn ready(&self) -> bool {
        self.store.ready() && !self.window.is_closed()
    }
}
