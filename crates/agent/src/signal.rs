//! Waiting for the agent to be told to stop: SIGTERM (kubelet stopping the reservation pod) or
//! SIGINT.

/// A stop listened for from the moment it is made: a SIGTERM that arrives before (or between)
/// [`Stop::wait`]s is kept, not lost (a fresh [`terminated`] would miss it).
pub struct Stop {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
}

/// Starts listening for SIGTERM now.
pub fn listen() -> Stop {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate())
            .map_err(|e| tracing::error!(error = %e, "cannot listen for SIGTERM"))
            .ok();
        Stop { term }
    }
    #[cfg(not(unix))]
    {
        Stop {}
    }
}

impl Stop {
    /// Waits for SIGTERM (or SIGINT): returns at once for one that came since [`listen`].
    pub async fn wait(&mut self) {
        #[cfg(unix)]
        if let Some(term) = self.term.as_mut() {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}
