//! The contract shared by the CRD, the operator and the producer: the planner configuration
//! (docs/behaviour.md §2) with its one validation function, and the config file the producer reads.

pub mod config;
pub mod kv_events;
pub mod policy;
pub mod producer_config;

/// The producer's default ports: its command line, the policy's defaults and the operator's
/// children all read them here.
pub mod ports {
    /// The API: the scoring endpoints and the OpenAI-compatible proxy.
    pub const API: u16 = 8080;
    /// The admin port: `/healthz`, `/readyz`, `/metrics`.
    pub const ADMIN: u16 = 9090;
    /// The gRPC endpoint picker (the Gateway API Inference Extension's convention).
    pub const EPP: u16 = 9002;
}

pub use config::{
    BalanceBy, ConfigError, EngineConfig, KvEventsConfig, MemoryConfig, Placement, PlannerConfig,
    TimeConfig, TokenizerConfig, Violation, DEFAULT_PLACEMENT,
};
pub use producer_config::{Endpoint, ProducerConfig};
