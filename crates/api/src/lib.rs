//! The contract shared by the CRD, the operator and the producer: the planner configuration
//! (SPEC §2) with its one validation function, and the config file the producer reads.

pub mod config;
pub mod policy;
pub mod producer_config;

pub use config::{BalanceBy, ConfigError, MemoryConfig, PlannerConfig, Violation};
pub use producer_config::{Endpoint, ProducerConfig};
