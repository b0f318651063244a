//! Signals: the first SIGTERM or SIGINT starts a graceful drain, a second one aborts.

use tokio::sync::watch;

/// Waits for SIGTERM or SIGINT (Ctrl-C).
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Sets `tx` to true on the first signal; exits the process on the second.
pub fn spawn_signal_handler(tx: watch::Sender<bool>) {
    tokio::spawn(async move {
        signal().await;
        tracing::info!("shutdown signal received; draining (send it again to abort)");
        let _ = tx.send(true);
        signal().await;
        tracing::warn!("second shutdown signal; aborting");
        std::process::exit(130);
    });
}
