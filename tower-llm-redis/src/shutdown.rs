//! Stopping a store's background tasks when the store is dropped.

use tokio::sync::watch;

/// Held by a store: dropping it stops every task holding one of its
/// [`ShutdownSignal`]s (the next time the task waits on it).
#[derive(Debug)]
pub struct Shutdown {
    tx: watch::Sender<bool>,
}

impl Shutdown {
    /// A shutdown no task listens to yet.
    pub fn new() -> Self {
        Shutdown {
            tx: watch::Sender::new(false),
        }
    }

    /// A signal for one background task.
    pub fn signal(&self) -> ShutdownSignal {
        ShutdownSignal {
            rx: self.tx.subscribe(),
        }
    }
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

impl Drop for Shutdown {
    fn drop(&mut self) {
        let _ = self.tx.send(true);
    }
}

/// Held by a background task: [`stopped`](ShutdownSignal::stopped) ends
/// when its [`Shutdown`] is dropped.
#[derive(Debug, Clone)]
pub struct ShutdownSignal {
    rx: watch::Receiver<bool>,
}

impl ShutdownSignal {
    /// Waits until the [`Shutdown`] is dropped (at once if it already
    /// is). Cancel-safe: use it as a `tokio::select!` branch.
    pub async fn stopped(&mut self) {
        // `Err`: the sender is gone, which is a shutdown too.
        let _ = self.rx.wait_for(|stop| *stop).await;
    }
}

#[cfg(test)]
mod tests {
    use super::Shutdown;

    #[tokio::test(flavor = "current_thread")]
    async fn dropping_the_shutdown_stops_every_signal() {
        let shutdown = Shutdown::new();
        let (mut a, mut b) = (shutdown.signal(), shutdown.signal());
        let pending = tokio::time::timeout(std::time::Duration::from_millis(5), a.stopped()).await;
        assert!(pending.is_err(), "not stopped before the drop");
        drop(shutdown);
        a.stopped().await;
        b.stopped().await;
        a.stopped().await;
    }
}
