//! Reloading the policy file on SIGHUP and when it changes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::Gateway;

/// What the reload watcher compares: a file's modification time and size.
type Seen = Option<(SystemTime, u64)>;

fn seen(path: &std::path::Path) -> Seen {
    std::fs::metadata(path)
        .ok()
        .and_then(|m| Some((m.modified().ok()?, m.len())))
}

/// Reloads the policy on SIGHUP and when the file changes (checked every
/// second). A changed file is read once it has stayed unchanged for
/// `server.reload_settle_ms` (so a writer that truncates and then rewrites
/// is never caught half-way); a file that does not parse or validate (an
/// empty one, one without routes) is logged and refused, and the running
/// policy stays. Calls in flight are never dropped: each keeps the routes
/// it started with.
pub async fn reload_on_change(gateway: Arc<Gateway>, path: std::path::PathBuf) {
    let settle = gateway.server.reload_settle();
    let mut last = seen(&path);
    #[cfg(unix)]
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        #[cfg(unix)]
        let signalled = async {
            match hup.as_mut() {
                Some(h) => h.recv().await.is_some(),
                None => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let signalled = std::future::pending::<bool>();
        let forced = tokio::select! {
            _ = tick.tick() => false,
            s = signalled => s,
        };
        let mut now = seen(&path);
        if !forced && now == last {
            continue;
        }
        // Wait for the writer to finish: unchanged for a whole settle time.
        loop {
            tokio::time::sleep(settle).await;
            let again = seen(&path);
            if again == now {
                break;
            }
            now = again;
        }
        last = now;
        // Logged and shown on `GET /status` by `reload_from_file`.
        let _ = gateway.reload_from_file(&path);
    }
}
