//! `burst-prefix-producer serve`: the command line ([`args`]), the wiring of config source, core
//! and listeners ([`service`]), leader election, and graceful shutdown ([`signals`]).
//!
//! On SIGTERM or SIGINT the producer drains (docs/behaviour.md §11): not ready at once, the
//! Lease released, the open window answered, no new connections, and the requests and streams
//! in flight run to completion within `--drain-timeout-ms`; then it exits 0.

pub mod args;
pub mod service;
pub mod signals;

use std::process::ExitCode;
use std::time::Duration;

use burst_prefix_runtime::flags;
use burst_prefix_runtime::leader::{LeaderArgs, Leadership};
pub use burst_prefix_runtime::logging::{LogArgs, LogFormat};

pub use args::ServeArgs;
pub use service::{Binding, Role, Service};

use burst_prefix_core::Producer;

/// Runs `serve` to the end: exit 0 after a graceful shutdown, 2 when it cannot start.
pub fn run(args: ServeArgs) -> ExitCode {
    if let Err(message) = burst_prefix_runtime::logging::init(&args.log) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| format!("cannot start the runtime: {e}"))
        .and_then(|runtime| runtime.block_on(serve(args)));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!(error = %message, "cannot serve");
            ExitCode::from(2)
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    signals::raise_fd_limit();
    let shutdown = signals::ShutdownSignals::install()?;
    let source = args.source();
    let producer = Producer::new(source.origin(), args.limits());
    producer.config_store().set_beside_peers(args.active_active);
    source.start(producer.config_store().clone()).await?;
    // Held to the end: dropping it releases the Lease, so a follower takes over at once.
    let leadership = match args.leader.leader_elect {
        true => Some(elect(&producer, &args.leader).await?),
        false => None,
    };
    let tls = args.tls.acceptors()?;
    let service = Service::start(producer, args.proxy.config(), |role| Binding {
        addr: args.addr(role),
        limits: args.connections.of(role),
        tls: match role {
            Role::Api => tls.api.clone(),
            Role::Epp => tls.epp.clone(),
            Role::Admin => None,
        },
    })
    .await?;
    tracing::info!(
        api = %service.addr(Role::Api).expect("bound"),
        api_tls = tls.api.is_some(),
        epp = %service.addr(Role::Epp).expect("bound"),
        epp_tls = %args.tls.epp_description(),
        admin = %service.addr(Role::Admin).expect("bound"),
        source = %service.producer.config_store().origin(),
        "listening"
    );
    shutdown.received().await;
    tracing::info!("shutting down: answering the open window, then draining");
    // The Lease first: a follower leads (and is ready) while this replica drains.
    drop(leadership);
    service
        .shutdown(Duration::from_millis(args.drain_timeout_ms))
        .await;
    tracing::info!("stopped");
    Ok(())
}

/// Starts competing for the Lease; the producer follows until it leads, and leads until it
/// loses the Lease.
async fn elect(producer: &Producer, args: &LeaderArgs) -> Result<Leadership, String> {
    let client = kube::Client::try_default().await.map_err(|e| {
        format!(
            "cannot reach the Kubernetes API for --{}: {e}",
            flags::LEADER_ELECT
        )
    })?;
    let name = args
        .lease_name
        .clone()
        .unwrap_or_else(|| "burst-prefix-producer".to_string());
    let identity = args.identity_or("burst-prefix-producer");
    producer.set_leading(false);
    let leadership = Leadership::start(
        client,
        &name,
        &args.lease_namespace,
        &identity,
        Duration::from_secs(args.lease_duration_seconds),
    )
    .await?;
    let mut leading = leadership.subscribe();
    let producer = producer.clone();
    let lease = leadership.lease.clone();
    tokio::spawn(async move {
        loop {
            let now = *leading.borrow_and_update();
            if now != producer.leading() {
                producer.set_leading(now);
                if now {
                    tracing::info!(%lease, %identity, "leading: ready, planning windows");
                } else {
                    tracing::warn!(%lease, %identity, "following: not ready, refusing requests");
                }
            }
            if leading.changed().await.is_err() {
                producer.set_leading(false);
                tracing::error!(%lease, "the Lease manager stopped; following from now on");
                return;
            }
        }
    });
    tracing::info!(lease = %leadership.lease, identity = %leadership.identity, "competing for the Lease");
    Ok(leadership)
}
