//! Signals: the first SIGTERM or SIGINT starts a graceful drain, a second one aborts.

use tokio::sync::watch;

/// Sets `tx` to true on the first signal; exits the process on the second.
pub fn spawn_signal_handler(tx: watch::Sender<bool>) {
    tokio::spawn(async move {
        crate::signal::terminated().await;
        tracing::info!("shutdown signal received; draining (send it again to abort)");
        let _ = tx.send(true);
        crate::signal::terminated().await;
        tracing::warn!("second shutdown signal; aborting");
        std::process::exit(130);
    });
}
