//! The engines the producer routes to, as the subscriber and the load scraper see them.

/// One replica's engine: its endpoint id (the producer's key for the replica), its host (an IP
/// address or a name), and its HTTP port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineEndpoint {
    /// The endpoint id.
    pub id: String,
    /// An IPv4/IPv6 address or a host name.
    pub host: String,
    /// The engine's HTTP port (OpenAI API and `/metrics`).
    pub http_port: u16,
}

impl EngineEndpoint {
    /// The host as it goes into a URL (IPv6 addresses in brackets).
    fn url_host(&self) -> String {
        if self.host.contains(':') && !self.host.starts_with('[') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }

    /// `http://host:port{path}`.
    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}:{}{}", self.url_host(), self.http_port, path)
    }

    /// `tcp://host:port`, for a ZMQ socket on another port of the same host.
    pub fn zmq_tcp(&self, port: u16) -> String {
        format!("tcp://{}:{}", self.url_host(), port)
    }

    /// An address from a template: `{host}` becomes the host (IPv6 in brackets), `{id}` the
    /// endpoint id; e.g. `tcp://{host}:5557`, or `ipc:///run/kv/{id}.sock` for an engine beside
    /// the producer.
    pub fn address(&self, template: &str) -> String {
        template
            .replace("{host}", &self.url_host())
            .replace("{id}", &self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_are_bracketed_in_addresses() {
        let v4 = EngineEndpoint {
            id: "a".into(),
            host: "10.0.0.1".into(),
            http_port: 8000,
        };
        assert_eq!(v4.http_url("/metrics"), "http://10.0.0.1:8000/metrics");
        assert_eq!(v4.zmq_tcp(5557), "tcp://10.0.0.1:5557");
        let v6 = EngineEndpoint {
            host: "fd00::1".into(),
            ..v4
        };
        assert_eq!(v6.zmq_tcp(5557), "tcp://[fd00::1]:5557");
        assert_eq!(v6.address("tcp://{host}:5558"), "tcp://[fd00::1]:5558");
        assert_eq!(v6.address("ipc:///run/{id}.sock"), "ipc:///run/a.sock");
    }
}
