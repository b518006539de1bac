//! The pub/sub listener every store runs: subscribe, hand each message
//! over, resubscribe with backoff.

use std::ops::ControlFlow;

use futures_util::StreamExt;

use crate::settings::RedisSettings;
use crate::shutdown::ShutdownSignal;

/// What a store does with its channel: told when the subscription is
/// live and when it ends, and given every message in between.
///
/// Called from the listener's task, one call at a time; none may wait.
pub trait Subscriber: Send + 'static {
    /// The subscription is live (again): messages sent while it was not
    /// were missed.
    fn on_subscribed(&mut self) {}

    /// One message's payload. [`ControlFlow::Break`] stops the listener
    /// for good (the store is gone).
    fn on_message(&mut self, payload: &[u8]) -> ControlFlow<()>;

    /// The subscription ended (the connection dropped); the listener
    /// resubscribes after a [`Backoff`](crate::Backoff) wait.
    fn on_unsubscribed(&mut self) {}
}

/// Subscribes to `channel` on `redis` and hands every message to
/// `subscriber`, until `shutdown` stops or the subscriber breaks.
///
/// Connecting and subscribing are bounded by the command timeout; when
/// either fails, or the subscription ends, it tries again after a
/// [`Backoff`](crate::Backoff) wait (25 ms doubling up to the maximum,
/// from 25 ms again once subscribed). Spawn it: it never returns while
/// the store lives.
pub async fn listen<S: Subscriber>(
    redis: RedisSettings,
    channel: String,
    mut subscriber: S,
    mut shutdown: ShutdownSignal,
) {
    let mut backoff = redis.backoff();
    loop {
        let connect = async {
            let mut pubsub = redis.client().get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let pubsub = tokio::select! {
            () = shutdown.stopped() => return,
            r = tokio::time::timeout(redis.op_timeout(), connect) => r,
        };
        if let Ok(Ok(pubsub)) = pubsub {
            backoff.reset();
            subscriber.on_subscribed();
            let mut messages = pubsub.into_on_message();
            loop {
                let msg = tokio::select! {
                    () = shutdown.stopped() => return,
                    msg = messages.next() => msg,
                };
                let Some(msg) = msg else { break };
                if subscriber.on_message(msg.get_payload_bytes()).is_break() {
                    return;
                }
            }
            subscriber.on_unsubscribed();
        }
        tokio::select! {
            () = shutdown.stopped() => return,
            () = tokio::time::sleep(backoff.next_wait()) => {}
        }
    }
}
