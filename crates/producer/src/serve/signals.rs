//! The process's signals and limits: SIGTERM and SIGINT start a graceful shutdown; the open-file
//! limit is raised so that the connection caps, not the fd limit, bound the service.

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

/// Waits for SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
}
