//! The liveness task: tells a slow Redis from a dead one, and brings the
//! store back when Redis answers again.
//!
//! While the store is shared it sleeps until a take's reply is late (or
//! a command failed), then sends `PING` on a connection of its own (never
//! behind this replica's takes), at most one every quarter of the op
//! timeout: no `PONG` within the op timeout declares Redis down. While
//! down, it pings with backoff (25 ms doubling to the maximum) and shares
//! again at the first `PONG`.

use std::sync::Arc;

use redis::aio::ConnectionManager;
use tokio::time::Instant;
use tower_llm_redis::ShutdownSignal;

use crate::inner::Inner;

/// Pings at most every op timeout / `PACE` while Redis counts as up.
const PACE: u32 = 4;

pub(crate) async fn run(
    inner: Arc<Inner>,
    mut conn: ConnectionManager,
    mut shutdown: ShutdownSignal,
) {
    let op_timeout = inner.redis.op_timeout();
    let mut backoff = inner.redis.backoff();
    let mut last_ping: Option<Instant> = None;
    loop {
        if inner.is_up() {
            tokio::select! {
                () = shutdown.stopped() => return,
                () = inner.probe.notified() => {}
            }
            let next = last_ping.map_or_else(Instant::now, |t| t + op_timeout / PACE);
            tokio::select! {
                () = shutdown.stopped() => return,
                () = tokio::time::sleep_until(next) => {}
            }
            if !inner.is_up() {
                continue;
            }
            last_ping = Some(Instant::now());
            if !tower_llm_redis::ping(&mut conn, op_timeout).await {
                inner.set_down("no PONG within the op timeout");
            }
        } else {
            tokio::select! {
                () = shutdown.stopped() => return,
                () = tokio::time::sleep(backoff.next_wait()) => {}
            }
            // On the takes' connection: the one that must answer.
            let mut commands = inner.conn.clone();
            if tower_llm_redis::ping(&mut commands, op_timeout).await {
                backoff.reset();
                inner.set_up();
            }
        }
    }
}
