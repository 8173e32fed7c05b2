//! The connect topology: each engine binds its own publisher (`tcp://*:PORT`); the producer
//! connects one SUB socket to each endpoint's port, following the endpoint set as it changes (a
//! new endpoint is connected, a gone one disconnected). Every producer replica can do this (HA).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use zeromq::{Socket, SocketRecv};

use super::publisher::{frames, handle, Ctx, Publisher};
use super::replay;
use crate::endpoints::EngineEndpoint;

/// Follows every listed endpoint's publisher, one task each, as the endpoint set changes.
pub(super) async fn run_connecting(
    address: String,
    mut endpoints: watch::Receiver<Vec<EngineEndpoint>>,
    ctx: Ctx,
) {
    let ctx = Arc::new(ctx);
    let mut tasks: HashMap<String, (EngineEndpoint, JoinHandle<()>)> = HashMap::new();
    // Abort every per-endpoint task when this task ends or is aborted.
    struct AbortAll<'a>(&'a mut HashMap<String, (EngineEndpoint, JoinHandle<()>)>);
    impl Drop for AbortAll<'_> {
        fn drop(&mut self) {
            for (_, (_, t)) in self.0.drain() {
                t.abort();
            }
        }
    }
    let tasks = AbortAll(&mut tasks);
    loop {
        let list = endpoints.borrow_and_update().clone();
        // Gone or changed endpoints: disconnect (the socket is dropped with its task).
        tasks.0.retain(|id, (ep, t)| {
            let keep = list.iter().any(|e| &e.id == id && e == ep) && !t.is_finished();
            if !keep {
                t.abort();
            }
            keep
        });
        for ep in list {
            if tasks.0.contains_key(&ep.id) {
                continue;
            }
            let ctx = ctx.clone();
            let task = tokio::spawn(follow_endpoint(ep.clone(), address.clone(), ctx));
            tasks.0.insert(ep.id.clone(), (ep, task));
        }
        if endpoints.changed().await.is_err() || ctx.sink.is_closed() {
            return;
        }
    }
}

/// How long one attempt to reach an engine's publisher lasts (the zeromq crate retries inside
/// it, from 50 ms up). Attempts repeat for as long as the endpoint is listed: an engine can take
/// minutes to load its model, and the crate's own default gives up after 30 s for good.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(2);

/// One endpoint's publisher, followed until its task is aborted or the sink closes.
async fn follow_endpoint(ep: EngineEndpoint, template: String, ctx: Arc<Ctx>) {
    let address = ep.address(&template);
    let mut options = zeromq::SocketOptions::default();
    options.connect_timeout(CONNECT_ATTEMPT);
    let mut socket = zeromq::SubSocket::with_options(options);
    // Subscribed first, so every connection (and reconnection) is sent the subscription when its
    // handshake ends (see the bind topology).
    if let Err(e) = socket.subscribe("").await {
        tracing::warn!(endpoint = %ep.id, error = %e, "kv events: cannot subscribe");
        return;
    }
    // Retries until the engine's publisher is up (the socket reconnects by itself after that).
    // One connection per data-parallel rank.
    for rank in 0..i64::from(ctx.config.data_parallel_size.max(1)) {
        let address = replay::rank_address(&address, rank);
        let mut attempts = 0u64;
        while let Err(e) = socket.connect(&address).await {
            if attempts == 0 {
                tracing::warn!(endpoint = %ep.id, %address, error = %e, "kv events: cannot connect yet; retrying until the engine's publisher is up");
            } else {
                tracing::debug!(endpoint = %ep.id, %address, error = %e, "kv events: cannot connect yet");
            }
            attempts += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if attempts > 0 {
            tracing::info!(endpoint = %ep.id, %address, attempts, "kv events: connected");
        }
    }
    let mut publisher = Publisher::new(&ep, &ctx.config);
    loop {
        let frames = match socket.recv().await {
            Ok(m) => frames(m),
            Err(e) => {
                tracing::debug!(endpoint = %ep.id, error = %e, "kv events: receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if handle(&ctx, &mut publisher, &frames).await.is_err() {
            return;
        }
    }
}
