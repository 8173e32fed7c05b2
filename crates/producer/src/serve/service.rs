//! The listeners of one producer: one list of roles, each with what it serves, bound and served
//! together, and shut down in one order.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use burst_prefix_runtime::flags;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;

use crate::listen::{self, ConnectionLimits};
use crate::proxy::{self, ProxyConfig};
use crate::{admin, engine_feeds, epp, scoring};
use burst_prefix_core::Producer;

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

/// Where a listener binds, under which limits, and with TLS or not.
#[derive(Clone)]
pub struct Binding {
    pub addr: SocketAddr,
    pub limits: ConnectionLimits,
    pub tls: Option<TlsAcceptor>,
}

impl Binding {
    /// An ephemeral loopback port with default limits: for the demo, benches and tests.
    pub fn loopback() -> Self {
        Binding {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            limits: ConnectionLimits::default(),
            tls: None,
        }
    }
}

/// The listeners of one producer, running on the current runtime.
pub struct Service {
    pub producer: Producer,
    addrs: Vec<(Role, SocketAddr)>,
    /// Per listener: what stops it accepting, and the task that serves it until its
    /// connections are closed.
    servers: Vec<(Role, watch::Sender<bool>, JoinHandle<()>)>,
    /// The feeds of what the engines say (docs/behaviour.md §7), followed until shutdown: a
    /// producer stopped in a process that goes on (the engine bench, tests) releases its KV-events
    /// endpoint and stops scraping.
    feeds: JoinHandle<()>,
}

impl Service {
    /// Binds every role where `binding` says and serves `producer` on them until
    /// [`Service::shutdown`]. A bind error names the role's flag.
    pub async fn start(
        producer: Producer,
        proxy: ProxyConfig,
        binding: impl Fn(Role) -> Binding,
    ) -> Result<Service, String> {
        let mut addrs = Vec::new();
        let mut servers = Vec::new();
        for role in Role::ALL {
            let Binding { addr, limits, tls } = binding(role);
            let tcp = listen::bind(addr, &limits)
                .map_err(|e| format!("cannot listen on --{} {addr}: {e}", role.flag()))?;
            addrs.push((role, tcp.local_addr().map_err(|e| e.to_string())?));
            let (stop, stopped) = watch::channel(false);
            let server = tokio::spawn(listen::serve(
                tcp,
                role.router(&producer, proxy),
                limits,
                tls,
                stopped,
            ));
            servers.push((role, stop, server));
        }
        let feeds = tokio::spawn(engine_feeds::follow(producer.clone()));
        Ok(Service {
            producer,
            addrs,
            servers,
            feeds,
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

    /// Drains: not ready from now on (new requests are refused with `shutting_down`), the open
    /// window is answered, the API and the endpoint picker stop accepting, idle connections
    /// close, and the requests and streams in flight run to completion for at most `drain`;
    /// what is still open then is cut. The admin port answers (`/readyz` 503) until the end.
    pub async fn shutdown(self, drain: Duration) {
        let started = tokio::time::Instant::now();
        self.producer.close().await;
        let (admin, serving): (Vec<_>, Vec<_>) = self
            .servers
            .into_iter()
            .partition(|(role, _, _)| *role == Role::Admin);
        for (_, stop, _) in &serving {
            let _ = stop.send(true);
        }
        let in_flight = |producer: &Producer| {
            producer.config().map_or(0, |s| {
                s.config
                    .endpoints
                    .iter()
                    .map(|e| producer.in_flight(&e.id))
                    .sum::<u64>()
            })
        };
        tracing::info!(
            in_flight = in_flight(&self.producer),
            drain_timeout_ms = drain.as_millis() as u64,
            "draining: no new requests; the ones in flight run to completion"
        );
        let mut handles: Vec<_> = serving
            .into_iter()
            .map(|(_, stop, server)| (stop, server))
            .collect();
        let drained = tokio::time::timeout_at(
            started + drain,
            futures::future::join_all(handles.iter_mut().map(|(_, server)| server)),
        )
        .await;
        match drained {
            Ok(_) => tracing::info!(
                seconds = started.elapsed().as_secs_f64(),
                "drained: every request in flight completed"
            ),
            Err(_) => tracing::warn!(
                in_flight = in_flight(&self.producer),
                drain_timeout_ms = drain.as_millis() as u64,
                "requests still in flight at the drain timeout; cut"
            ),
        }
        for (_, server) in handles {
            server.abort();
        }
        for (_, stop, server) in admin {
            let _ = stop.send(true);
            // Health and metrics answer at once: nothing to wait for but idle connections.
            let _ = tokio::time::timeout(Duration::from_secs(1), server).await;
        }
        // Dropping the feeds drops the KV-events subscriber (its socket) and ends the scraper.
        self.feeds.abort();
        let _ = self.feeds.await;
    }
}
