//! The probe: tells a slow Redis from a dead one. While commands are in
//! flight (or late) and the store is shared, it sends `PING` on a
//! connection of its own, one at a time and at most one every
//! [`PACE`] of the op timeout; no `PONG` within the op timeout declares
//! Redis down. It never brings the store back: the worker does.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tower_llm_redis::ShutdownSignal;

use crate::inner::Inner;

/// A `PING` at most every op timeout / `PACE`: a server frozen while a
/// reserve waits is found within about 1 + 1/`PACE` op timeouts of its
/// sending, and a busy replica sends `PACE` pings per op timeout at most.
pub(crate) const PACE: u32 = 4;

/// The pause before a `PING` that failed on the connection is sent again.
const RETRY: Duration = Duration::from_millis(10);

pub(crate) async fn run(
    inner: Arc<Inner>,
    mut conn: ConnectionManager,
    mut shutdown: ShutdownSignal,
) {
    let op_timeout = inner.redis.op_timeout();
    let gap = op_timeout / PACE;
    let mut last: Option<Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.stopped() => return,
            () = inner.probe.notified() => {}
        }
        if let Some(last) = last {
            tokio::select! {
                () = shutdown.stopped() => return,
                () = tokio::time::sleep_until(last + gap) => {}
            }
        }
        // While down the worker watches for Redis.
        if !inner.is_up() {
            continue;
        }
        last = Some(Instant::now());
        if !answers(&mut conn, op_timeout).await {
            inner.set_down("no PONG within the op timeout");
        }
    }
}

/// `true` if Redis answers `PING` within `op_timeout`. A connection error
/// is tried again within it (the probe's connection may be stale, from
/// before a restart: the first command after one fails and reconnects).
async fn answers(conn: &mut ConnectionManager, op_timeout: Duration) -> bool {
    let deadline = Instant::now() + op_timeout;
    loop {
        let ping = redis::cmd("PING");
        match tokio::time::timeout_at(deadline, ping.query_async::<String>(conn)).await {
            Ok(Ok(_)) => return true,
            Err(_) => return false,
            Ok(Err(_)) => {
                if Instant::now() + RETRY >= deadline {
                    return false;
                }
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}
