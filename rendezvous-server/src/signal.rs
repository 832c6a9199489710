//! Shutdown signals of the daemon. systemd and Kubernetes stop a service with
//! SIGTERM; a terminal sends SIGINT. Either starts a graceful shutdown.

/// Resolves on the first SIGTERM or SIGINT.
pub async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without handlers the default action (exit) applies; never resolve.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
