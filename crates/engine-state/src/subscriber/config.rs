//! How the subscriber runs: where the events come from, and replay.

use std::time::Duration;

/// Where the events come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// Bind one SUB socket here (e.g. `tcp://0.0.0.0:5557`); engines connect and publish with
    /// their endpoint id as the topic, or llm-d's `kv@<pod-ip>:<port>@<model>`.
    Bind {
        /// The ZMQ endpoint to bind.
        endpoint: String,
    },
    /// Connect to each endpoint's own publisher at this address template (see
    /// [`crate::endpoints::EngineEndpoint::address`]), e.g. `tcp://{host}:5557` ([`Topology::connect_port`]).
    Connect {
        /// The publisher's address, `{host}` and `{id}` filled in per endpoint.
        address: String,
    },
}

impl Topology {
    /// Connect to each endpoint's publisher on `port` of its host (`tcp://{host}:PORT`).
    pub fn connect_port(port: u16) -> Self {
        Topology::Connect {
            address: format!("tcp://{{host}}:{port}"),
        }
    }
}

/// How the subscriber runs.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// Bind one endpoint, or connect to each engine.
    pub topology: Topology,
    /// The engines' replay socket (vLLM's `replay_endpoint`, which it binds, e.g. `tcp://*:5558`)
    /// as an address template (see [`crate::endpoints::EngineEndpoint::address`]), e.g. `tcp://{host}:5558`;
    /// `None`: no replay, a gap clears the replica.
    pub replay_address: Option<String>,
    /// The most one replay may take, connection included.
    pub replay_timeout: Duration,
    /// The most batches one replay takes (vLLM buffers 10,000 by default).
    pub max_replay_batches: usize,
    /// On first hearing a publisher whose sequence is past 0, replay what it sent before (a
    /// producer that starts, or a follower that fails over, starts warm).
    pub replay_on_join: bool,
    /// The engines' data-parallel size: in the connect topology, rank r's publisher is followed
    /// at the address's TCP port plus r, as vLLM offsets it (in the bind topology every rank
    /// connects by itself).
    pub data_parallel_size: u16,
}

impl SubscriberConfig {
    /// The given topology with a 2 s replay timeout, up to 10,000 replayed batches, replay on
    /// join, and no replay socket.
    pub fn new(topology: Topology) -> Self {
        SubscriberConfig {
            topology,
            replay_address: None,
            replay_timeout: Duration::from_secs(2),
            max_replay_batches: 10_000,
            replay_on_join: true,
            data_parallel_size: 1,
        }
    }
}
