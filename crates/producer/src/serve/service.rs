//! The listeners of one producer: one list of roles, each with what it serves, bound and served
//! together, and shut down in one order.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use burst_prefix_runtime::flags;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::core::Producer;
use crate::listen::{self, ConnectionLimits};
use crate::proxy::{self, ProxyConfig};
use crate::{admin, epp, scoring};

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The scoring API and the OpenAI-compatible proxy.
    Api,
    /// The endpoint picker (gRPC).
    Epp,
    /// `/healthz`, `/readyz`, `/metrics`.
    Admin,
}

impl Role {
    /// Every listener of a producer, in the order they are bound.
    pub const ALL: [Role; 3] = [Role::Api, Role::Epp, Role::Admin];

    /// The flag that sets its address (named in bind errors).
    pub fn flag(self) -> &'static str {
        match self {
            Role::Api => flags::LISTEN,
            Role::Epp => flags::EPP_LISTEN,
            Role::Admin => flags::ADMIN_LISTEN,
        }
    }

    fn router(self, producer: &Producer, proxy: ProxyConfig) -> Router {
        match self {
            Role::Api => {
                scoring::router(producer.clone()).merge(proxy::router(producer.clone(), proxy))
            }
            Role::Epp => epp::router(producer.clone()),
            Role::Admin => admin::router(producer.clone()),
        }
    }
}

/// Where a listener binds, and under which limits.
#[derive(Clone, Copy, Debug)]
pub struct Binding {
    pub addr: SocketAddr,
    pub limits: ConnectionLimits,
}

impl Binding {
    /// An ephemeral loopback port with default limits: for the demo, benches and tests.
    pub fn loopback() -> Self {
        Binding {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            limits: ConnectionLimits::default(),
        }
    }
}

/// The listeners of one producer, running on the current runtime.
pub struct Service {
    pub producer: Producer,
    addrs: Vec<(Role, SocketAddr)>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

impl Service {
    /// Binds every role where `binding` says and serves `producer` on them until
    /// [`Service::shutdown`]. A bind error names the role's flag.
    pub async fn start(
        producer: Producer,
        proxy: ProxyConfig,
        binding: impl Fn(Role) -> Binding,
    ) -> Result<Service, String> {
        let (stop, stopped) = watch::channel(false);
        let mut addrs = Vec::new();
        let mut servers = Vec::new();
        for role in Role::ALL {
            let Binding { addr, limits } = binding(role);
            let tcp = TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on --{} {addr}: {e}", role.flag()))?;
            addrs.push((role, tcp.local_addr().map_err(|e| e.to_string())?));
            servers.push(tokio::spawn(listen::serve(
                tcp,
                role.router(&producer, proxy),
                limits,
                stopped.clone(),
            )));
        }
        Ok(Service {
            producer,
            addrs,
            stop,
            servers,
        })
    }

    /// Every listener on an ephemeral loopback port, default limits: for the demo, benches and
    /// tests.
    pub async fn on_loopback(producer: Producer, proxy: ProxyConfig) -> Result<Service, String> {
        Service::start(producer, proxy, |_| Binding::loopback()).await
    }

    /// The address the listener of `role` is bound to.
    pub fn addr(&self, role: Role) -> Option<SocketAddr> {
        self.addrs.iter().find(|(r, _)| *r == role).map(|(_, a)| *a)
    }

    /// Stops accepting, answers the open window, closes idle connections and waits for the
    /// responses in flight, for at most `timeout` in all.
    pub async fn shutdown(self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let _ = self.stop.send(true);
        let closed = async {
            self.producer.close().await;
            futures::future::join_all(self.servers).await
        };
        match tokio::time::timeout_at(deadline, closed).await {
            Ok(results) => {
                for error in results.into_iter().filter_map(Result::err) {
                    tracing::warn!(%error, "a listener task failed");
                }
            }
            Err(_) => tracing::warn!(
                timeout_ms = timeout.as_millis() as u64,
                "connections still open at the shutdown timeout; exiting anyway"
            ),
        }
    }
}
