//! Serving one listener: accepting connections under a cap, and serving each with HTTP/1 and
//! HTTP/2 (h2c, for gRPC) under timeouts that a slow or silent client cannot outlast.
//!
//! - A client must send a request's headers within `header_read_timeout`; for HTTP/1 the same
//!   limit closes a kept-alive connection idle between requests (hyper arms it whenever it waits
//!   for a request head).
//! - HTTP/2 connections are pinged every `http2_keepalive` and closed when a ping goes unanswered;
//!   a connection carries at most `http2_max_streams` streams at once (a gateway opens more
//!   connections beyond), and a stream whose request does not arrive within the body timeout
//!   is answered and closed by the endpoint picker, so idle streams cannot fill a connection.
//! - At most `max_connections` connections are open at once; beyond, new ones wait in the
//!   kernel's accept queue (as long as `max_connections`, up to `net.core.somaxconn`) until one
//!   closes.
//! - On shutdown, the listener stops accepting and every connection is closed gracefully: idle
//!   ones at once, busy ones after their response (HTTP/2: GOAWAY).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::{Extension, Router};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

/// The connection limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    pub header_read_timeout: Duration,
    pub http2_keepalive: Duration,
    pub http2_max_streams: u32,
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(5),
            http2_keepalive: Duration::from_secs(20),
            http2_max_streams: 256,
            max_connections: 10_000,
        }
    }
}

/// Listens on `addr` with an accept queue as long as `limits.max_connections` (the kernel caps it
/// at `net.core.somaxconn`): a burst of thousands of connections at once (an RL step sent all
/// together) waits there to be accepted. With the usual 1,024, the connections beyond it lose
/// their handshake's last packet and retry it after 1, 3, 7, 15, 31 s, or fail.
pub fn bind(addr: SocketAddr, limits: &ConnectionLimits) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As TcpListener::bind does: a restarted producer takes its port back at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(u32::try_from(limits.max_connections).unwrap_or(u32::MAX))
}

/// Serves `router` on `tcp` until `stop` turns true; then closes every connection gracefully
/// and returns once they are all closed.
pub async fn serve(
    tcp: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(limits.http2_keepalive)
        .keep_alive_timeout(limits.http2_keepalive)
        .max_concurrent_streams(limits.http2_max_streams);
    let builder = Arc::new(builder);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            () = stopped(&mut stop) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = tcp.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of fds, or the peer left before accept: back off a little, go on.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        // Small responses go out at once (no Nagle delay).
        let _ = stream.set_nodelay(true);
        // The client's address, for the proxy's `x-forwarded-for`.
        let service = TowerToHyperService::new(router.clone().layer(Extension(ConnectInfo(peer))));
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let timeout = limits.header_read_timeout;
        let tls = tls.clone();
        tokio::spawn(async move {
            let result = match tls {
                // The handshake must end within the header-read timeout, as headers must.
                Some(tls) => match tokio::time::timeout(timeout, tls.accept(stream)).await {
                    Ok(Ok(stream)) => {
                        let connection = builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service)
                            .into_owned();
                        watcher.watch(connection).await
                    }
                    Ok(Err(error)) => {
                        tracing::debug!(%peer, %error, "TLS handshake failed");
                        Ok(())
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "closed: no TLS handshake within the header-read timeout");
                        Ok(())
                    }
                },
                None => {
                    // hyper's header timer starts once the protocol is known: a client that
                    // sends nothing (or half an HTTP/2 preface) must not hold the connection
                    // before that.
                    if !protocol_known(&stream, timeout).await {
                        tracing::debug!(%peer, "closed: nothing readable within the header-read timeout");
                        drop(permit);
                        return;
                    }
                    let connection = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .into_owned();
                    watcher.watch(connection).await
                }
            };
            if let Err(error) = result {
                tracing::debug!(%peer, %error, "connection closed with an error");
            }
            drop(permit);
        });
    }
    drop(tcp);
    graceful.shutdown().await;
}

/// The HTTP/2 connection preface; anything else that starts differently is HTTP/1.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Waits, at most `timeout`, until enough of the first bytes arrived to tell HTTP/1 from
/// HTTP/2 (what hyper's auto-detection reads before any of its own timers run). False when the
/// client sent nothing in time or closed.
async fn protocol_known(stream: &tokio::net::TcpStream, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut first = [0u8; 24];
    loop {
        let peeked = tokio::time::timeout_at(deadline, stream.peek(&mut first)).await;
        let n = match peeked {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 {
            return false;
        }
        if n >= H2_PREFACE.len() || first[..n] != H2_PREFACE[..n] {
            return true;
        }
        // Part of an HTTP/2 preface: peek returns at once while bytes wait, so poll gently.
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
