//! Deployments' buckets shared through a real Redis: two replicas (two
//! `RedisPacing`s, each with its own connections) on one server. Each
//! test starts (and may kill, freeze and restart) its own `redis-server`;
//! see `tower_llm_test_support::RedisServer` for when a test skips. Real
//! time: Redis's clock cannot be paused; waits are polls against short
//! deadlines.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tower_llm_pool::{PaceLimits, Pacer, SharedPacing, SharedTicket};
use tower_llm_pool_redis::RedisPacing;
use tower_llm_test_support::{RedisServer, poll};

const OP_TIMEOUT: Duration = Duration::from_millis(200);

const RPM_60: PaceLimits = PaceLimits {
    rpm: Some(60),
    tpm: None,
    burst_ms: None,
};

/// A replica: keys under `test:pace:`, a local share of `share`.
fn replica(server: &RedisServer, share: f64, op_timeout: Duration) -> Arc<RedisPacing> {
    Arc::new(
        RedisPacing::builder(&server.url())
            .expect("url")
            .with_prefix("test:pace:")
            .with_op_timeout(op_timeout)
            .with_max_backoff(Duration::from_millis(50))
            .with_local_share(share)
            .build()
            .expect("store"),
    )
}

/// A replica whose commands never count as late on a loaded machine.
fn patient(server: &RedisServer) -> Arc<RedisPacing> {
    replica(server, 1.0, Duration::from_secs(2))
}

/// Takes one request (no tokens) from `deployment`: the ticket, or
/// `None` without room.
async fn took(store: &RedisPacing, deployment: &str, limits: PaceLimits) -> Option<SharedTicket> {
    store.take(deployment, limits, 0).await.ok()
}

async fn redis_conn(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_together_get_exactly_the_bucket_then_one_request_a_second() {
    let Some(server) = RedisServer::start("exact_bucket") else {
        return;
    };
    let (a, b) = (patient(&server), patient(&server));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            took(&store, "gpt-4o@key-1", RPM_60).await.is_some()
        }));
    }
    let mut granted = 0;
    for task in tasks {
        granted += u64::from(task.await.expect("task"));
    }
    let burst = start.elapsed();
    // 60 at once (one more per second the burst took, at most).
    assert!(
        (60..=60 + burst.as_secs() + 1).contains(&granted),
        "{granted} granted in {burst:?}"
    );
    assert!(a.is_shared() && b.is_shared(), "Redis answered throughout");
    assert_eq!(a.late_takes() + b.late_takes(), 0);

    // Empty: room in a second at most.
    let now = tokio::time::Instant::now();
    let room_at = a
        .take("gpt-4o@key-1", RPM_60, 0)
        .await
        .expect_err("the bucket is empty");
    assert!(room_at <= now + Duration::from_millis(1_000), "{room_at:?}");

    // Then one a second, whichever replica asks.
    let from = Instant::now();
    let mut more = 0_u64;
    let mut i = 0;
    while from.elapsed() < Duration::from_millis(3_000) {
        let store = if i % 2 == 0 { &a } else { &b };
        i += 1;
        more += u64::from(took(store, "gpt-4o@key-1", RPM_60).await.is_some());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let spent = from.elapsed().as_secs_f64();
    assert!(
        (2..=4).contains(&more) && (more as f64) <= spent + 1.0,
        "{more} granted in {spent:.2} s"
    );
    // Another deployment has buckets of its own.
    assert!(took(&b, "gpt-4o@key-2", RPM_60).await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_taken_by_one_replica_and_given_back_are_there_for_the_other() {
    let Some(server) = RedisServer::start("give_back") else {
        return;
    };
    let (a, b) = (patient(&server), patient(&server));
    let limits = PaceLimits {
        rpm: None,
        tpm: Some(600),
        burst_ms: None,
    };
    // A pacer shared through `a` takes 500 of the 600 (10 a second).
    let store: Arc<dyn SharedPacing> = a.clone();
    let pacer = Pacer::new(limits).with_shared(store, "claude@eu");
    let ticket = pacer.take(500).await.expect("room");
    assert!(ticket.is_shared());
    // `b` wants 400: about 30 s away (from the reply, in whole ms).
    let now = tokio::time::Instant::now();
    let room_at = b
        .take("claude@eu", limits, 400)
        .await
        .expect_err("100 left");
    let wait = room_at - now;
    assert!(
        wait > Duration::from_secs(25) && wait <= Duration::from_millis(30_200),
        "{wait:?}"
    );
    // The request used 100: 400 go back to the fleet's bucket.
    ticket.settle(100);
    let given = Arc::new(Mutex::new(None));
    let back = poll(Duration::from_secs(2), || {
        let (b, given) = (b.clone(), given.clone());
        async move {
            let t = b.take("claude@eu", limits, 400).await.ok();
            let done = t.is_some();
            *given.lock().expect("lock") = t;
            done
        }
    })
    .await;
    assert!(back, "the 400 given back were never there");
    let ticket = given.lock().expect("lock").take().expect("taken");
    assert_eq!((ticket.tokens(), ticket.is_local()), (400, false));

    // A request larger than the bucket goes when it is full, taking it all.
    let big = a
        .take("claude@us", limits, 10_000)
        .await
        .expect("a full bucket");
    assert_eq!(big.tokens(), 600);
    assert!(a.take("claude@us", limits, 1).await.is_err());

    // One hash per deployment, under the prefix, expiring.
    let mut conn = redis_conn(&server).await;
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("test:pace:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    keys.sort();
    assert_eq!(keys, ["test:pace:claude@eu", "test:pace:claude@us"]);
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(ttl > 0 && ttl <= 60_000, "{key}: {ttl}");
    }
}

/// Events seen by the test's subscriber: (level, message).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl Seen {
    fn count(&self, level: tracing::Level, start: &str) -> usize {
        let seen = self.0.lock().expect("lock");
        seen.iter()
            .filter(|(l, m)| *l == level && m.starts_with(start))
            .count()
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Seen {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let level = *event.metadata().level();
        self.0.lock().expect("lock").push((level, message.0));
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

const WENT_DOWN: &str = "pool pacing store: Redis unavailable";
const CAME_BACK: &str = "pool pacing store: Redis answers again";

/// Takes `n` requests from `store`, one after the other: how many were
/// granted, and how many of those in-process.
async fn burst(store: &RedisPacing, n: usize) -> (usize, usize) {
    let mut granted = 0;
    let mut local = 0;
    for _ in 0..n {
        if let Some(ticket) = took(store, "gpt-4o@key-1", RPM_60).await {
            granted += 1;
            local += usize::from(ticket.is_local());
        }
    }
    (granted, local)
}

// One thread: the test's subscriber sees the stores' tasks' events too.
#[tokio::test(flavor = "current_thread")]
async fn redis_killed_each_replica_paces_at_its_share_then_shares_again() {
    let Some(mut server) = RedisServer::start("redis_killed") else {
        return;
    };
    let seen = Seen::default();
    let _guard = tracing::subscriber::set_default(seen.clone());
    let (a, b) = (
        replica(&server, 0.5, OP_TIMEOUT),
        replica(&server, 0.5, OP_TIMEOUT),
    );
    let warm = took(&a, "gpt-4o@key-1", RPM_60).await.expect("room");
    assert!(!warm.is_local() && a.is_shared());

    server.kill();
    let start = Instant::now();
    // Each replica: its half of the 60, exactly, at once.
    let (granted_a, local_a) = burst(&a, 40).await;
    let (granted_b, local_b) = burst(&b, 40).await;
    assert!(start.elapsed() < OP_TIMEOUT + Duration::from_millis(500));
    assert_eq!((granted_a, granted_b), (30, 30));
    assert_eq!((local_a, local_b), (30, 30), "taken in-process");
    assert!(!a.is_shared() && !b.is_shared(), "the gauge reads 0");
    assert_eq!(a.local("gpt-4o@key-1", RPM_60).limits().rpm, Some(30));
    // Logged once per replica, however many takes.
    assert_eq!(seen.count(tracing::Level::WARN, WENT_DOWN), 2);

    server.restart();
    assert!(
        poll(Duration::from_secs(5), || async {
            a.is_shared() && b.is_shared()
        })
        .await,
        "shared again"
    );
    assert_eq!(seen.count(tracing::Level::INFO, CAME_BACK), 2);
    // The restarted server is empty: a full bucket of 60, shared.
    let (granted_a, local_a) = burst(&a, 35).await;
    let (granted_b, local_b) = burst(&b, 35).await;
    assert_eq!(local_a + local_b, 0, "taken in Redis");
    assert!(
        (60..=61).contains(&(granted_a + granted_b)),
        "{granted_a} + {granted_b}"
    );
    assert_eq!(seen.count(tracing::Level::WARN, WENT_DOWN), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_a_take_one_op_timeout_at_most_then_the_local_share() {
    let Some(server) = RedisServer::start("redis_frozen") else {
        return;
    };
    let a = replica(&server, 0.5, OP_TIMEOUT);
    assert!(
        took(&a, "gpt-4o@key-1", RPM_60)
            .await
            .is_some_and(|t| !t.is_local())
    );

    server.freeze(true);
    let start = Instant::now();
    let first = took(&a, "gpt-4o@key-1", RPM_60).await.expect("the share");
    let first_took = start.elapsed();
    assert!(first.is_local());
    assert!(
        first_took < OP_TIMEOUT + Duration::from_millis(150),
        "the take took {first_took:?}"
    );
    // The liveness task finds Redis down; takes then wait for nothing.
    assert!(
        poll(Duration::from_secs(2), || async { !a.is_shared() }).await,
        "declared down"
    );
    let start = Instant::now();
    let (granted, local) = burst(&a, 40).await;
    assert!(start.elapsed() < Duration::from_millis(50), "no more waits");
    // 30 of the local share, one of them taken by the first.
    assert_eq!((granted, local), (29, 29));
    assert!(a.late_takes() >= 1);

    server.freeze(false);
    assert!(
        poll(Duration::from_secs(5), || async { a.is_shared() }).await,
        "shared again"
    );
    assert!(
        took(&a, "gpt-4o@key-1", RPM_60)
            .await
            .is_some_and(|t| !t.is_local())
    );
}
