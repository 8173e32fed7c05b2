//! The process's signals and limits: SIGTERM and SIGINT start a graceful shutdown; the open-file
//! limit is raised so that the connection caps, not the fd limit, bound the service.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// Every connection is an fd: raise the soft limit to the hard one, so that the connection
/// caps, not the fd limit, are what bounds the service.
pub fn raise_fd_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::info!(
            open_files = limit,
            "raised the open-file limit to its hard limit"
        ),
        Err(error) => tracing::warn!(%error, "cannot raise the open-file limit"),
    }
}

/// SIGTERM and SIGINT, caught from the moment this is made: made before the listeners are
/// announced, so that a signal sent as soon as the service answers is never the default (an
/// abrupt exit).
pub struct ShutdownSignals {
    terminate: Signal,
    interrupt: Signal,
}

impl ShutdownSignals {
    pub fn install() -> Result<Self, String> {
        let catch = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| format!("cannot catch {name}: {e}"))
        };
        Ok(ShutdownSignals {
            terminate: catch(SignalKind::terminate(), "SIGTERM")?,
            interrupt: catch(SignalKind::interrupt(), "SIGINT")?,
        })
    }

    /// Waits for either.
    pub async fn received(mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}
