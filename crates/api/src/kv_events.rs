//! `engines.kvEvents.bind` as a policy may say it (docs/behaviour.md §7, the operator's side):
//! the port the producer listens on for the engines' KV events, which the operator exposes on the
//! producer's container, Service and NetworkPolicy. The same rule in Rust ([`bind_port`], the
//! operator's validation) and in CEL ([`BIND_CEL`], the CRD), with one message.
//!
//! A policy's producer runs in a pod whose address is not known in advance, and the engines reach
//! it through the producer Service: so it binds every interface, on a fixed port. `*` is not
//! taken: libzmq reads it as every interface, but the producer's ZeroMQ (the `zeromq` crate)
//! resolves it as a host name, which binds nothing useful (on the machine this was written on,
//! `::1`).

use std::fmt;

/// The hosts that mean every interface.
pub const BIND_HOSTS: &[&str] = &["0.0.0.0", "::", "[::]"];

/// What a policy's `engines.kvEvents.bind` must be.
pub const BIND_REQUIREMENT: &str = "engines.kvEvents.bind must be tcp://HOST:PORT with HOST \
    0.0.0.0, :: or [::] (every interface: the engines connect through the producer Service) and \
    PORT 1 to 65535, e.g. tcp://0.0.0.0:5557";

/// The rule on the `kvEvents` object of the CRD (`self` is `spec.engines.kvEvents`).
pub const BIND_CEL: &str = r"!has(self.bind) || (self.bind.matches('^tcp://(0\\.0\\.0\\.0|::|\\[::\\]):[1-9][0-9]{0,4}$') && int(self.bind.substring(self.bind.lastIndexOf(':') + 1)) <= 65535)";

/// The longest `bind` the CRD takes (`tcp://[::]:65535` is 16 characters), which also bounds
/// the cost the API server estimates for the rules that read it.
pub const BIND_MAX_LENGTH: i64 = 64;

/// What a policy's bind port must not be.
pub const BIND_PORT_CLASH: &str = "the port of engines.kvEvents.bind must differ from \
    producer.port, producer.metricsPort and producer.eppPort";

/// The rule on `spec` that the bind port is none of the producer's other ports (a well-formed
/// bind only: the rule above speaks for a malformed one).
pub const BIND_PORT_CLASH_CEL: &str = r"!has(self.engines) || !has(self.engines.kvEvents) || !has(self.engines.kvEvents.bind) || !has(self.producer) || !self.engines.kvEvents.bind.matches('^tcp://(0\\.0\\.0\\.0|::|\\[::\\]):[1-9][0-9]{0,4}$') || !(int(self.engines.kvEvents.bind.substring(self.engines.kvEvents.bind.lastIndexOf(':') + 1)) in [self.producer.port, self.producer.metricsPort, self.producer.eppPort])";

/// A `bind` that breaks [`BIND_REQUIREMENT`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidBind(pub String);

impl fmt::Display for InvalidBind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "engines.kvEvents.bind is {:?}, but {}",
            self.0,
            BIND_REQUIREMENT
                .strip_prefix("engines.kvEvents.bind ")
                .unwrap_or(BIND_REQUIREMENT)
        )
    }
}

impl std::error::Error for InvalidBind {}

/// The port of a policy's `engines.kvEvents.bind`, exactly when [`BIND_CEL`] holds for it.
pub fn bind_port(bind: &str) -> Result<u16, InvalidBind> {
    let invalid = || InvalidBind(bind.to_string());
    let (host, port) = bind
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .ok_or_else(invalid)?;
    let digits = port.len() <= 5
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.bytes().next().is_some_and(|b| b != b'0');
    if !BIND_HOSTS.contains(&host) || !digits {
        return Err(invalid());
    }
    port.parse::<u16>().map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bind_on_every_interface_with_a_port_gives_the_port() {
        for (bind, port) in [
            ("tcp://0.0.0.0:5557", 5557),
            ("tcp://0.0.0.0:1", 1),
            ("tcp://[::]:65535", 65535),
            ("tcp://:::5557", 5557),
        ] {
            assert_eq!(bind_port(bind), Ok(port), "{bind}");
        }
    }

    #[test]
    fn anything_else_is_refused_with_the_value_and_the_rule() {
        for bind in [
            "",
            "0.0.0.0:5557",
            "tcp://0.0.0.0",
            "tcp://0.0.0.0:",
            "tcp://0.0.0.0:0",
            "tcp://0.0.0.0:05557",
            "tcp://0.0.0.0:65536",
            "tcp://0.0.0.0:99999",
            "tcp://0.0.0.0:123456",
            "tcp://0.0.0.0:+5557",
            "tcp://0.0.0.0:5557 ",
            "tcp://127.0.0.1:5557",
            "tcp://*:5557",
            "tcp://producer:5557",
            "tcp://eth0:5557",
            "ipc:///tmp/kv",
            "udp://0.0.0.0:5557",
            "TCP://0.0.0.0:5557",
        ] {
            assert_eq!(bind_port(bind), Err(InvalidBind(bind.into())), "{bind:?}");
        }
        assert_eq!(
            bind_port("tcp://127.0.0.1:5557").unwrap_err().to_string(),
            "engines.kvEvents.bind is \"tcp://127.0.0.1:5557\", but must be tcp://HOST:PORT with \
             HOST 0.0.0.0, :: or [::] (every interface: the engines connect through the producer \
             Service) and PORT 1 to 65535, e.g. tcp://0.0.0.0:5557"
        );
    }

    /// The CEL rules spell the hosts of [`BIND_HOSTS`], escaped for RE2 in a CEL string, and the
    /// same pattern twice.
    #[test]
    fn the_cel_rules_name_the_same_hosts() {
        let pattern = r"'^tcp://(0\\.0\\.0\\.0|::|\\[::\\]):[1-9][0-9]{0,4}$'";
        assert!(BIND_CEL.contains(pattern));
        assert!(BIND_PORT_CLASH_CEL.contains(pattern));
        let hosts: Vec<String> = BIND_HOSTS
            .iter()
            .map(|h| {
                h.replace('.', r"\\.")
                    .replace('[', r"\\[")
                    .replace(']', r"\\]")
            })
            .collect();
        assert!(pattern.contains(&format!("({})", hosts.join("|"))));
    }
}
