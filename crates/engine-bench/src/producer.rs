//! The producer's proxy, run in this process on a loopback port: the only place the bench and its
//! tests use the producer library (start a service with a config, read its metrics, stop it).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::anyhow;
use burst_prefix_core::{Limits, Producer};
use burst_prefix_producer::proxy::ProxyConfig;
use burst_prefix_producer::serve::{Role, Service};

/// Response header of the proxy: the id of the endpoint that served a request.
pub use burst_prefix_producer::proxy::ENDPOINT_HEADER;

/// A running proxy.
pub struct Proxy {
    service: Service,
}

impl Proxy {
    /// Starts the proxy with `planner_yaml` (the planner config of docs/behaviour.md §2, without endpoints)
    /// and one endpoint per address, named by [`endpoint_id`] after its index.
    pub async fn start(planner_yaml: &str, endpoints: &[SocketAddr]) -> anyhow::Result<Proxy> {
        Self::start_with(planner_yaml, endpoints, ProxyConfig::default()).await
    }

    /// The same, its client to the replicas configured as `config` says.
    pub async fn start_with(
        planner_yaml: &str,
        endpoints: &[SocketAddr],
        config: ProxyConfig,
    ) -> anyhow::Result<Proxy> {
        let mut yaml = planner_yaml.trim_end().to_string();
        yaml.push_str("\nendpoints:\n");
        for (index, addr) in endpoints.iter().enumerate() {
            yaml.push_str(&format!(
                "  - {{id: {}, address: '{addr}'}}\n",
                endpoint_id(index)
            ));
        }
        let producer = Producer::with_config(&yaml, Limits::default())
            .map_err(|e| anyhow!("the proxy's config is refused: {e}\n{yaml}"))?;
        let service = Service::on_loopback(producer, config)
            .await
            .map_err(|e| anyhow!("the proxy does not start: {e}"))?;
        Ok(Proxy { service })
    }

    pub fn url(&self) -> String {
        format!(
            "http://{}",
            self.service.addr(Role::Api).expect("an API listener")
        )
    }

    /// How many leading engine blocks of `token_ids` the replica at `index` holds, as the
    /// proxy's index of the engines' KV events says (docs/behaviour.md §7); 0 without events.
    pub fn engine_blocks_held(&self, index: usize, token_ids: &[u32]) -> usize {
        let id = endpoint_id(index);
        self.service
            .producer
            .engines()
            .index()
            .held(token_ids)
            .iter()
            .filter(|held| held.replica == id)
            .map(|held| held.blocks)
            .max()
            .unwrap_or(0)
    }

    /// The producer's metrics, as its admin port would serve them.
    pub fn metrics(&self) -> String {
        self.service.producer.metrics().render()
    }

    pub async fn shutdown(self) {
        self.service.shutdown(Duration::from_secs(5)).await;
    }
}

/// The endpoint id of the replica at `index`.
pub fn endpoint_id(index: usize) -> String {
    format!("bench/r{index}")
}

/// The replica index an endpoint id names (the proxy's [`ENDPOINT_HEADER`]).
pub fn replica_of_endpoint(id: &str) -> Option<usize> {
    id.strip_prefix("bench/r")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_ids_round_trip() {
        assert_eq!(replica_of_endpoint(&endpoint_id(12)), Some(12));
        assert_eq!(replica_of_endpoint("other/r1"), None);
    }
}
