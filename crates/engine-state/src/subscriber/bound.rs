//! The bind topology: the producer binds one SUB endpoint and every engine connects its
//! publisher to it. A message's topic names its engine: the endpoint's id, or, as llm-d's guides
//! configure vLLM and llm-d-inference-sim publishes, `kv@<pod-ip>:<port>@<model>`, the endpoint
//! at that address ([`EndpointTopics`]). A topic that names no current endpoint is dropped and
//! counted.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::sync::watch;
use zeromq::SocketRecv;

use super::publisher::{frames, handle, Ctx, Publisher};
use crate::endpoints::EngineEndpoint;

/// The prefix of llm-d's topics (`kv@<pod-ip>:<port>@<model>`).
const LLM_D_PREFIX: &str = "kv@";

/// The current endpoints, by id and by address, to find the one a topic names.
#[derive(Debug, Default)]
pub(super) struct EndpointTopics {
    by_id: HashMap<String, EngineEndpoint>,
    /// Endpoint ids by `ip:port` (the host as a normalized IP address when it is one).
    by_address: HashMap<String, String>,
}

impl EndpointTopics {
    pub(super) fn new(endpoints: &[EngineEndpoint]) -> Self {
        EndpointTopics {
            by_id: endpoints
                .iter()
                .map(|e| (e.id.clone(), e.clone()))
                .collect(),
            by_address: endpoints
                .iter()
                .map(|e| (address_key(&e.host, e.http_port), e.id.clone()))
                .collect(),
        }
    }

    /// The endpoint `topic` names: the endpoint with that id, else, for a topic of llm-d's
    /// convention, the endpoint at its address.
    pub(super) fn endpoint(&self, topic: &str) -> Option<&EngineEndpoint> {
        if let Some(endpoint) = self.by_id.get(topic) {
            return Some(endpoint);
        }
        let (host, port) = llm_d_address(topic)?;
        let id = self.by_address.get(&address_key(&host, port))?;
        self.by_id.get(id)
    }

    pub(super) fn get(&self, id: &str) -> Option<&EngineEndpoint> {
        self.by_id.get(id)
    }
}

/// The address of a topic of llm-d's convention, `kv@<pod-ip>:<port>@<model>` (the model is
/// optional here): `10.0.0.7:8000`, `[fd00::7]:8000`, or an unbracketed IPv6 address whose last
/// `:` part is the port.
fn llm_d_address(topic: &str) -> Option<(String, u16)> {
    let rest = topic.strip_prefix(LLM_D_PREFIX)?;
    let address = rest
        .split_once('@')
        .map_or(rest, |(address, _model)| address);
    if let Ok(socket) = address.parse::<SocketAddr>() {
        return Some((socket.ip().to_string(), socket.port()));
    }
    let (host, port) = address.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
}

/// `host:port`, the host normalized when it is an IP address (so `fd00::0:7` and `fd00::7` are
/// one).
fn address_key(host: &str, port: u16) -> String {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    }
}

/// Receives every engine's messages on the bound socket, each publisher's in its order.
pub(super) async fn run_bound(
    mut socket: zeromq::SubSocket,
    mut endpoints: watch::Receiver<Vec<EngineEndpoint>>,
    ctx: Ctx,
) {
    let mut publishers: HashMap<String, Publisher> = HashMap::new();
    let mut current = EndpointTopics::default();
    let refresh = |current: &mut EndpointTopics,
                   publishers: &mut HashMap<String, Publisher>,
                   list: &[EngineEndpoint]| {
        *current = EndpointTopics::new(list);
        publishers.retain(|id, publisher| match current.get(id) {
            Some(endpoint) => {
                publisher.follow(endpoint, &ctx.config);
                true
            }
            None => false,
        });
    };
    refresh(
        &mut current,
        &mut publishers,
        &endpoints.borrow_and_update(),
    );
    loop {
        let msg = tokio::select! {
            changed = endpoints.changed() => {
                if changed.is_err() {
                    return;
                }
                let list = endpoints.borrow_and_update().clone();
                refresh(&mut current, &mut publishers, &list);
                continue;
            }
            msg = socket.recv() => msg,
        };
        let frames = match msg {
            Ok(m) => frames(m),
            Err(e) => {
                // A peer went away mid-message; the socket stays usable.
                tracing::debug!(error = %e, "kv events: receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Some(topic) = frames.first() else {
            continue;
        };
        let Some(endpoint) = current.endpoint(&String::from_utf8_lossy(topic)) else {
            ctx.metrics.unknown_topic();
            continue;
        };
        let publisher = publishers
            .entry(endpoint.id.clone())
            .or_insert_with(|| Publisher::new(endpoint, &ctx.config));
        if handle(&ctx, publisher, &frames).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(id: &str, host: &str, http_port: u16) -> EngineEndpoint {
        EngineEndpoint {
            id: id.into(),
            host: host.into(),
            http_port,
        }
    }

    #[test]
    fn a_topic_names_an_endpoint_by_its_id_or_by_llm_ds_address_convention() {
        let topics = EndpointTopics::new(&[
            endpoint("ns/a-rank-0", "10.0.0.7", 8000),
            endpoint("ns/b-rank-0", "fd00::7", 8000),
        ]);
        let id = |topic: &str| topics.endpoint(topic).map(|e| e.id.as_str());
        assert_eq!(id("ns/a-rank-0"), Some("ns/a-rank-0"));
        assert_eq!(id("kv@10.0.0.7:8000@Qwen/Qwen3-0.6B"), Some("ns/a-rank-0"));
        assert_eq!(id("kv@10.0.0.7:8000"), Some("ns/a-rank-0"), "no model");
        assert_eq!(id("kv@[fd00::7]:8000@m"), Some("ns/b-rank-0"));
        assert_eq!(
            id("kv@fd00::0:7:8000@m"),
            Some("ns/b-rank-0"),
            "unbracketed"
        );
        for unknown in [
            "kv@10.0.0.7:8001@m",
            "kv@10.0.0.8:8000@m",
            "kv@",
            "kv@x@m",
            "other",
        ] {
            assert_eq!(id(unknown), None, "{unknown}");
        }
    }
}
