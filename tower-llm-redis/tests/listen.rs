//! The pub/sub listener against a real `redis-server` the test starts
//! (see `tower_llm_test_support::RedisServer` for when it skips): it hands
//! messages over, resubscribes after the server restarts, and stops when
//! its `Shutdown` is dropped. Real time: every wait is a poll against a
//! short deadline.

use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tower_llm_redis::{RedisSettings, Shutdown, Subscriber, listen, ping};
use tower_llm_test_support::{RedisServer, poll};

#[derive(Debug, Default)]
struct Seen {
    subscribed: usize,
    unsubscribed: usize,
    messages: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct Record(Arc<Mutex<Seen>>);

impl Record {
    fn seen<T>(&self, f: impl FnOnce(&Seen) -> T) -> T {
        f(&self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Subscriber for Record {
    fn on_subscribed(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .subscribed += 1;
    }

    fn on_message(&mut self, payload: &[u8]) -> ControlFlow<()> {
        let text = String::from_utf8_lossy(payload).into_owned();
        let stop = text == "stop";
        let mut seen = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        seen.messages.push(text);
        if stop {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    }

    fn on_unsubscribed(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unsubscribed += 1;
    }
}

/// Publishes `payload` on `channel`; `true` once a subscriber got it.
async fn publish(redis: &RedisSettings, channel: &str, payload: &str) -> bool {
    let Ok(mut conn) = redis.connection_manager() else {
        return false;
    };
    let receivers = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(payload)
        .query_async::<i64>(&mut conn)
        .await;
    matches!(receivers, Ok(n) if n > 0)
}

const LIMIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_arrive_and_the_listener_comes_back_after_a_restart() {
    let Some(mut server) = RedisServer::start("listen_restart") else {
        return;
    };
    let redis = RedisSettings::new("test store", &server.url(), "t:")
        .expect("url")
        .with_max_backoff(Duration::from_millis(50));
    let channel = redis.key("events");
    let record = Record::default();
    let shutdown = Shutdown::new();
    let task = tokio::spawn(listen(
        redis.clone(),
        channel.clone(),
        record.clone(),
        shutdown.signal(),
    ));

    assert!(poll(LIMIT, || publish(&redis, &channel, "one")).await);
    assert!(
        poll(LIMIT, || async {
            record.seen(|s| s.messages.contains(&"one".to_owned()))
        })
        .await
    );
    assert_eq!(record.seen(|s| s.subscribed), 1);

    server.restart();
    assert!(
        poll(LIMIT, || async {
            record.seen(|s| s.unsubscribed == 1 && s.subscribed == 2)
        })
        .await
    );
    let mut conn = redis.connection_manager().expect("manager");
    assert!(
        poll(LIMIT, || {
            let mut c = conn.clone();
            async move { ping(&mut c, LIMIT).await }
        })
        .await
    );
    assert!(poll(LIMIT, || publish(&redis, &channel, "two")).await);
    assert!(
        poll(LIMIT, || async {
            record.seen(|s| s.messages.contains(&"two".to_owned()))
        })
        .await
    );
    assert!(ping(&mut conn, LIMIT).await);

    drop(shutdown);
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("stops")
        .expect("no panic");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_breaks_stops_the_listener() {
    let Some(server) = RedisServer::start("listen_break") else {
        return;
    };
    let redis = RedisSettings::new("test store", &server.url(), "t:").expect("url");
    let channel = redis.key("events");
    let shutdown = Shutdown::new();
    let task = tokio::spawn(listen(
        redis.clone(),
        channel.clone(),
        Record::default(),
        shutdown.signal(),
    ));
    assert!(poll(LIMIT, || publish(&redis, &channel, "stop")).await);
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("stops")
        .expect("no panic");
    drop(shutdown);
}

#[tokio::test(flavor = "current_thread")]
async fn without_a_server_ping_says_no_in_time() {
    let redis = RedisSettings::new("test store", "redis://127.0.0.1:1", "t:")
        .expect("url")
        .with_op_timeout(Duration::from_millis(100));
    let mut conn = redis.connection_manager().expect("manager");
    let started = std::time::Instant::now();
    assert!(!ping(&mut conn, redis.op_timeout()).await);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
