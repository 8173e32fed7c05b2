//! The engines' own state, for the producer: what each replica's engine really holds (vLLM's KV
//! events, decoded and indexed), how loaded it is (its `/metrics`), and the model's tokenizer so
//! that text and chat requests can be matched against engine blocks keyed by token ids.
//!
//! Each module is one idea with its own tests:
//! - [`decode`](mod@decode): vLLM's `[topic, seq, msgpack KVEventBatch]` messages from arbitrary bytes.
//! - [`index`]: per replica, the engine blocks it holds; a request's longest held run. Pure.
//! - [`sequence`]: gaps and restarts in a publisher's sequence numbers. Pure.
//! - [`vllm_hash`]: vLLM's `sha256_cbor` block hash, to check our tokenization against the engine.
//! - [`tokenizer`]: the model's tokenizer and chat template, tokenizing as vLLM does.
//! - [`subscriber`]: the ZMQ subscriber (bind one endpoint, or connect to each engine), with
//!   replay after a gap and metrics.
//! - [`load`]: vLLM's `/metrics` load signals, parsed and scraped.
#![deny(missing_docs)]

pub mod decode;
pub mod endpoints;
pub mod exposition;
pub mod index;
pub mod load;
pub mod sequence;
pub mod speed;
pub mod subscriber;
pub mod tokenizer;
pub mod vllm_hash;

pub use decode::{decode, decode_message, Batch, BlockHash, DecodeError, Event, Message};
pub use endpoints::EngineEndpoint;
pub use index::{chain_keys, ApplyReport, EngineIndex, Held, IndexConfig};
pub use load::{
    parse_load, scrape_load, spawn_load_scraper, EngineLoad, LoadReport, LoadScraperConfig,
};
pub use sequence::{SeqStatus, SeqTracker};
pub use speed::{parse_counters, Counters, SpeedLearner};
pub use subscriber::{
    ClearReason, EngineUpdate, KvEventsMetrics, KvEventsSubscriber, SubscriberConfig, Topology,
};
pub use tokenizer::{ChatOptions, Tokenizer, TokenizerError};
