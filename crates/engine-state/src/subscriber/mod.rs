//! The ZMQ subscriber: vLLM's KV events in, decoded batches (and clears) out, with replay after a
//! gap.
//!
//! Two topologies ([`Topology`]):
//! - **Bind** ([`bound`]): the producer binds one SUB endpoint; each engine connects its
//!   publisher to it (vLLM connects when its endpoint has no `*`) and publishes with its endpoint
//!   id as the topic, or with llm-d's `kv@<pod-ip>:<port>@<model>`, which names the endpoint at
//!   that address. Messages whose topic names no current endpoint are dropped and counted.
//! - **Connect** ([`connecting`]): each engine binds its own publisher (`tcp://*:PORT`); the
//!   producer connects one SUB socket to each endpoint's port, following the endpoint set as it
//!   changes (a new endpoint is connected, a gone one disconnected). Every producer replica can
//!   do this (HA).
//!
//! Per publisher ([`publisher`]), sequence numbers are tracked ([`crate::sequence`]). After a
//! gap, the missing batches are asked from the engine's replay socket ([`replay`]), applied in
//! order, then the live batch. A gap that cannot be filled (no replay port, no answer, or batches
//! no longer buffered) makes the replica's state unknowable, so the subscriber sends a
//! [`EngineUpdate::Clear`] for it first: the index under-predicts until new events arrive, never
//! over-predicts. A sequence number going backwards is a restarted engine: cleared too. A
//! message that does not decode is a lost batch.
//!
//! Each publisher's messages are handled in order in one task (a replay holds that task up for
//! at most the replay timeout; ZMQ queues what arrives meanwhile). The subscriber's settings are
//! [`config`], what it sends [`update`], its counters [`metrics`].

mod bound;
pub mod config;
mod connecting;
pub mod metrics;
mod publisher;
pub mod replay;
pub mod update;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use zeromq::Socket;

pub use config::{SubscriberConfig, Topology};
pub use metrics::KvEventsMetrics;
pub use replay::rank_address;
pub use update::{ClearReason, EngineUpdate};

use crate::endpoints::EngineEndpoint;
use publisher::Ctx;

/// Why the subscriber could not start.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// The bind endpoint could not be bound.
    #[error("binding {endpoint}: {source}")]
    Bind {
        /// The endpoint.
        endpoint: String,
        /// Why.
        source: zeromq::ZmqError,
    },
    /// The SUB socket refused the subscription.
    #[error("subscribing: {0}")]
    Subscribe(zeromq::ZmqError),
}

/// A running subscriber; dropping it stops every task it started.
#[derive(Debug)]
pub struct KvEventsSubscriber {
    task: JoinHandle<()>,
    bound: Option<String>,
}

impl Drop for KvEventsSubscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl KvEventsSubscriber {
    /// Starts the subscriber: binds now (errors are returned) or connects to each endpoint of
    /// `endpoints` as it changes, and sends every update to `sink` in each replica's order. The
    /// tasks end when this value is dropped, when `sink` is, or when the endpoints' sender is.
    /// In the bind topology only topics that name a current endpoint are heard.
    pub async fn spawn(
        config: SubscriberConfig,
        endpoints: watch::Receiver<Vec<EngineEndpoint>>,
        sink: mpsc::Sender<EngineUpdate>,
        metrics: KvEventsMetrics,
    ) -> Result<Self, SubscribeError> {
        let topology = config.topology.clone();
        let ctx = Ctx {
            config,
            sink,
            metrics,
        };
        match topology {
            Topology::Bind { endpoint } => {
                let mut socket = zeromq::SubSocket::new();
                // Subscribed before binding: the zeromq crate sends a new peer the
                // subscriptions it remembers when the peer's handshake ends, and a later
                // subscribe() only to peers already listed, so an engine whose connection is
                // accepted between the two would never be subscribed, and a PUB socket sends
                // nothing to a peer that never subscribed. Engines retry their connection
                // every 100 ms while the producer starts, so one lands right after the bind.
                socket
                    .subscribe("")
                    .await
                    .map_err(SubscribeError::Subscribe)?;
                let bound =
                    socket
                        .bind(&endpoint)
                        .await
                        .map_err(|source| SubscribeError::Bind {
                            endpoint: endpoint.clone(),
                            source,
                        })?;
                let task = tokio::spawn(bound::run_bound(socket, endpoints, ctx));
                Ok(KvEventsSubscriber {
                    task,
                    bound: Some(bound.to_string()),
                })
            }
            Topology::Connect { address } => {
                let task = tokio::spawn(connecting::run_connecting(address, endpoints, ctx));
                Ok(KvEventsSubscriber { task, bound: None })
            }
        }
    }

    /// The endpoint bound (bind topology), with the port the system chose for port 0.
    pub fn bound_endpoint(&self) -> Option<&str> {
        self.bound.as_deref()
    }
}
