//! Tenant quotas shared through a real Redis: two replicas (two
//! `RedisQuota`s, each with its own connection) on one server. Each test
//! starts (and may kill, freeze and restart) its own `redis-server`; see
//! `tower_llm_test_support::RedisServer` for when a test skips. Real
//! time: Redis's clock cannot be paused; every wait is a poll against a
//! short deadline.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tower_llm_core::{Cost, Tenant};
use tower_llm_cost::{Ask, Exhausted, Limits, OVERFLOW_TENANT, QuotaConfig, QuotaHold, QuotaStore};
use tower_llm_cost_redis::{RedisQuota, Usage};
use tower_llm_test_support::{RedisServer, poll};

const OP_TIMEOUT: Duration = Duration::from_millis(200);

fn usd(dollars: f64) -> Cost {
    Cost::from_dollars(dollars).expect("an amount")
}

fn dollars(d: f64) -> Ask {
    Ask {
        cost: usd(d),
        tokens: 0,
    }
}

/// `max_cost` dollars per tenant per window of `window_secs`.
fn config(window_secs: u64, max_cost: f64) -> QuotaConfig {
    QuotaConfig::new(
        Duration::from_secs(window_secs),
        Limits {
            max_cost: Some(usd(max_cost)),
            max_tokens: None,
        },
    )
}

/// The longest window: a test never straddles two.
const LONG: u64 = 366 * 86_400;

/// A replica with a command timeout generous enough for a loaded test
/// machine: Redis never counts as down unless the test makes it so.
fn replica(server: &RedisServer, config: QuotaConfig, share: f64) -> RedisQuota {
    replica_timing_out(server, config, share, Duration::from_secs(2))
}

/// A replica whose commands time out after `op_timeout`.
fn replica_timing_out(
    server: &RedisServer,
    config: QuotaConfig,
    share: f64,
    op_timeout: Duration,
) -> RedisQuota {
    RedisQuota::builder(&server.url(), config)
        .expect("url")
        .with_prefix("test:quota:")
        .with_op_timeout(op_timeout)
        .with_max_backoff(Duration::from_millis(50))
        .with_local_share(share)
        .build()
        .expect("store")
}

/// A replica whose liveness probe gives up after `op_timeout` and whose
/// reserves wait `reserve_timeout` at most.
fn replica_waiting(
    server: &RedisServer,
    config: QuotaConfig,
    share: f64,
    op_timeout: Duration,
    reserve_timeout: Duration,
) -> RedisQuota {
    RedisQuota::builder(&server.url(), config)
        .expect("url")
        .with_prefix("test:quota:")
        .with_op_timeout(op_timeout)
        .with_reserve_timeout(reserve_timeout)
        .with_max_backoff(Duration::from_millis(50))
        .with_local_share(share)
        .build()
        .expect("store")
}

/// Pauses every client's writes (scripts that write included) on
/// `server` for `pause`, from a connection of the test's own: `PING`
/// still answers at once; a reserve's script waits until the pause ends.
async fn pause_writes(server: &RedisServer, pause: Duration) {
    let client = redis::Client::open(server.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    let millis = pause.as_millis().to_string();
    let _: String = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(&millis)
        .arg("WRITE")
        .query_async(&mut conn)
        .await
        .expect("CLIENT PAUSE");
}

fn tenant(id: &[u8]) -> Tenant {
    Tenant::new(id)
}

/// Polls until Redis counts `want` for `tenant` (5 s at most); the last
/// count seen.
async fn wait_usage(q: &RedisQuota, t: &Tenant, want: impl Fn(&Usage) -> bool) -> Option<Usage> {
    let seen = Arc::new(Mutex::new(None));
    let want = &want;
    let ok = poll(Duration::from_secs(5), || {
        let seen = seen.clone();
        async move {
            let usage = q.shared_usage(t).await;
            let done = usage.as_ref().is_some_and(want);
            *seen.lock().expect("lock") = usage;
            done
        }
    })
    .await;
    let last = *seen.lock().expect("lock");
    assert!(
        ok,
        "Redis never counted what was expected; last seen {last:?}"
    );
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reserves_from_two_replicas_never_hold_or_spend_past_the_limit() {
    let Some(server) = RedisServer::start("concurrent_reserves") else {
        return;
    };
    let limit = usd(1.0);
    let a = Arc::new(replica(&server, config(LONG, 1.0), 1.0));
    let b = Arc::new(replica(&server, config(LONG, 1.0), 1.0));
    let t = tenant(b"acme");
    let mut tasks = Vec::new();
    for i in 0..300_u64 {
        let q = if i % 2 == 0 { a.clone() } else { b.clone() };
        let t = t.clone();
        // 1 to 97 thousandths of a dollar, in a scrambled order.
        let ask = Ask {
            cost: Cost::from_nanos((i * 7_919 % 97 + 1) * 1_000_000),
            tokens: i,
        };
        tasks.push(tokio::spawn(async move {
            q.reserve(&t, ask).await.map(|hold| (q, hold))
        }));
    }
    let mut granted: Vec<(Arc<RedisQuota>, QuotaHold)> = Vec::new();
    let mut refused = 0;
    for task in tasks {
        match task.await.expect("task") {
            Ok(held) => granted.push(held),
            Err(refusal) => {
                assert_eq!(refusal.exhausted, Exhausted::Cost);
                refused += 1;
            }
        }
    }
    assert!(a.is_shared() && b.is_shared(), "Redis answered throughout");
    assert!(refused > 0, "the asks add up to far more than the limit");
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    for (_, hold) in &granted {
        *per_window.entry(hold.window()).or_default() += hold.held().cost.nanos();
    }
    for (window, held) in &per_window {
        assert!(
            *held <= limit.nanos(),
            "window {window}: {held} nanos held, over the limit"
        );
    }
    // Nearly all of it was handed out: the biggest ask is 0.097.
    assert!(per_window.values().sum::<u64>() > limit.nanos() - 97_000_000);
    // Settle everything in full, from the replica that held it.
    let total: u64 = per_window.values().sum();
    for (q, hold) in granted {
        let held = hold.held();
        q.settle(hold, held);
    }
    let usage = wait_usage(&a, &t, |u| {
        u.held == Ask::default() && u.spent.cost.nanos() == total
    })
    .await
    .expect("counted");
    assert!(usage.spent.cost <= limit, "{usage:?}");
    assert!(a.reserve(&t, dollars(0.1)).await.is_err() || total <= limit.nanos() - 100_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_never_settled_stops_counting_after_hold_secs() {
    let Some(server) = RedisServer::start("hold_expires") else {
        return;
    };
    let mut c = config(LONG, 1.0);
    c.hold_secs = 1;
    let q = replica(&server, c, 1.0);
    let t = tenant(b"crashy");
    let start = Instant::now();
    let lost = q.reserve(&t, dollars(1.0)).await.expect("fits");
    assert!(q.reserve(&t, dollars(0.5)).await.is_err(), "all of it held");
    wait_usage(&q, &t, |u| u.held == Ask::default()).await;
    assert!(
        start.elapsed() >= Duration::from_millis(900),
        "expired after {:?}, before hold_secs",
        start.elapsed()
    );
    let again = q.reserve(&t, dollars(1.0)).await.expect("whole again");
    // The late settle still counts its spend, once.
    q.settle(lost, dollars(0.25));
    q.settle(again, dollars(0.5));
    let usage = wait_usage(&q, &t, |u| u.spent.cost == usd(0.75)).await;
    assert_eq!(usage.map(|u| u.held), Some(Ask::default()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_dropped_before_its_reply_leaves_nothing_held() {
    let Some(server) = RedisServer::start("dropped_reserve") else {
        return;
    };
    let q = replica(&server, config(LONG, 1.0), 1.0);
    let t = tenant(b"impatient");
    // Connected, and the script loaded: the dropped reserves below are
    // the only thing in flight.
    let warm = q.reserve(&t, Ask::default()).await.expect("fits");
    assert!(q.is_shared());
    q.settle(warm, Ask::default());
    for _ in 0..20 {
        let mut reserve = q.reserve(&t, dollars(0.5));
        // Polled once (the script is sent), then dropped unresolved.
        tokio::select! {
            biased;
            _ = &mut reserve => panic!("a reply from Redis without waiting"),
            () = std::future::ready(()) => {}
        }
        drop(reserve);
    }
    // Every release lands (the dropped reserves' scripts may still be
    // running when the first lands): the whole dollar is free again.
    let taken = Arc::new(Mutex::new(None));
    let whole = poll(Duration::from_secs(5), || {
        let (q, t, taken) = (&q, &t, taken.clone());
        async move {
            let hold = q.reserve(t, dollars(1.0)).await.ok();
            let done = hold.is_some();
            *taken.lock().expect("lock") = hold;
            done
        }
    })
    .await;
    assert!(whole, "a dropped reserve leaked its hold");
    let hold = taken.lock().unwrap().take().expect("held");
    let usage = q.shared_usage(&t).await.expect("Redis answers");
    assert_eq!((usage.held.cost, usage.spent), (usd(1.0), Ask::default()));
    assert!(q.is_shared());
    q.settle(hold, Ask::default());
}

/// Events seen by the test's subscriber: (level, message).
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl Events {
    fn count(&self, level: tracing::Level, text: &str) -> usize {
        let events = self.0.lock().expect("lock");
        events
            .iter()
            .filter(|(l, m)| *l == level && m.contains(text))
            .count()
    }
}

impl tracing::Subscriber for Events {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }

    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}

    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}

    fn event(&self, event: &tracing::Event<'_>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        self.0
            .lock()
            .expect("lock")
            .push((*event.metadata().level(), message.0));
    }

    fn enter(&self, _: &tracing::span::Id) {}

    fn exit(&self, _: &tracing::span::Id) {}
}

const WENT_DOWN: &str = "quota store: Redis unavailable";
const CAME_BACK: &str = "quota store: Redis answers again";
const LATE: &str = "quota store: a reserve got no reply within the reserve timeout";

// One thread: the test's subscriber sees the store's tasks' events too.
#[tokio::test(flavor = "current_thread")]
async fn redis_killed_each_replica_enforces_its_share_then_pushes_its_spend_back() {
    let Some(mut server) = RedisServer::start("redis_killed") else {
        return;
    };
    let events = Events::default();
    let _guard = tracing::subscriber::set_default(events.clone());
    let q = replica_timing_out(&server, config(LONG, 1.0), 0.5, OP_TIMEOUT);
    let t = tenant(b"acme");
    let in_redis = q.reserve(&t, dollars(0.2)).await.expect("fits");
    assert!(q.is_shared());

    server.kill();
    let start = Instant::now();
    let local = q.reserve(&t, dollars(0.4)).await.expect("fits the share");
    assert!(start.elapsed() < OP_TIMEOUT + Duration::from_millis(150));
    assert!(!q.is_shared(), "the gauge reads 0");
    // The share is exact: half of the dollar, 0.4 of it held.
    let refused = q
        .reserve(&t, dollars(0.2))
        .await
        .expect_err("past the share");
    assert_eq!(
        (refused.exhausted, refused.left.cost),
        (Exhausted::Cost, usd(0.1))
    );
    assert!(q.reserve(&t, dollars(0.1)).await.is_ok_and(|h| {
        q.settle(h, Ask::default());
        true
    }));
    q.settle(local, dollars(0.3));
    // Settled while down: waits in the queue (lost with the server's data).
    q.settle(in_redis, dollars(0.1));
    assert!(q.reserve(&t, dollars(0.2)).await.is_ok_and(|h| {
        q.settle(h, Ask::default());
        true
    }));
    assert!(
        q.reserve(&t, dollars(0.3)).await.is_err(),
        "0.3 spent of 0.5"
    );
    assert_eq!(events.count(tracing::Level::WARN, WENT_DOWN), 1, "once");

    server.restart();
    assert!(
        poll(Duration::from_secs(5), || async { q.is_shared() }).await,
        "shared again"
    );
    assert_eq!(events.count(tracing::Level::INFO, CAME_BACK), 1);
    // The restarted server is empty: what it counts is the spend pushed.
    let usage = wait_usage(&q, &t, |u| u.spent.cost == usd(0.3)).await;
    assert_eq!(usage.map(|u| u.held), Some(Ask::default()));
    assert!(q.reserve(&t, dollars(0.8)).await.is_err(), "0.7 left");
    let hold = q.reserve(&t, dollars(0.7)).await.expect("0.7 left");
    q.settle(hold, Ask::default());
    assert_eq!(events.count(tracing::Level::WARN, WENT_DOWN), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_a_reserve_one_op_timeout_at_most_then_the_local_share() {
    let Some(server) = RedisServer::start("redis_frozen") else {
        return;
    };
    let q = replica_timing_out(&server, config(LONG, 1.0), 0.5, OP_TIMEOUT);
    let t = tenant(b"acme");
    let in_redis = q.reserve(&t, dollars(0.2)).await.expect("fits");

    server.freeze(true);
    let start = Instant::now();
    let local = q.reserve(&t, dollars(0.3)).await.expect("the local share");
    let took = start.elapsed();
    eprintln!(
        "frozen: the first reserve answered from the local share in {took:?} (op timeout {OP_TIMEOUT:?})"
    );
    assert!(
        took < OP_TIMEOUT + Duration::from_millis(150),
        "reserve took {took:?}"
    );
    assert!(!q.is_shared());
    let start = Instant::now();
    assert!(
        q.reserve(&t, dollars(0.3)).await.is_err(),
        "0.3 of 0.5 held"
    );
    assert!(start.elapsed() < Duration::from_millis(50), "no more waits");
    q.settle(in_redis, dollars(0.1));
    q.settle(local, dollars(0.05));
    // Frozen a while: pings time out, nothing hangs.
    tokio::time::sleep(OP_TIMEOUT * 2).await;
    assert!(!q.is_shared());

    server.freeze(false);
    assert!(
        poll(Duration::from_secs(5), || async { q.is_shared() }).await,
        "shared again"
    );
    // The queued settle landed; the reserve that timed out (run when the
    // server woke) was released; the local spend was pushed.
    let usage = wait_usage(&q, &t, |u| {
        u.held == Ask::default() && u.spent.cost == usd(0.15)
    })
    .await;
    assert!(usage.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_holds_past_the_limit_and_marks_the_refusal() {
    let Some(server) = RedisServer::start("shadow") else {
        return;
    };
    let q = replica(&server, config(LONG, 1.0).shadow(true), 1.0);
    let t = tenant(b"acme");
    let a = q.reserve(&t, dollars(0.9)).await.expect("holds");
    assert!(a.shadow_refusal().is_none());
    let b = q.reserve(&t, dollars(0.9)).await.expect("holds anyway");
    let refusal = b.shadow_refusal().expect("marked");
    assert_eq!(
        (refusal.exhausted, refusal.left.cost),
        (Exhausted::Cost, usd(0.1))
    );
    let usage = q.shared_usage(&t).await.expect("Redis answers");
    assert_eq!(usage.held.cost, usd(1.8));
    q.settle(a, dollars(0.9));
    q.settle(b, dollars(0.9));
    wait_usage(&q, &t, |u| u.spent.cost == usd(1.8)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_limit_refuses_and_says_what_is_left_and_when_it_resets() {
    let Some(server) = RedisServer::start("tokens") else {
        return;
    };
    let c = QuotaConfig::new(
        Duration::from_secs(60),
        Limits {
            max_cost: None,
            max_tokens: Some(1_000),
        },
    );
    let q = replica(&server, c, 1.0);
    let t = tenant(b"acme");
    let ask = |tokens| Ask {
        cost: usd(50.0),
        tokens,
    };
    let hold = q.reserve(&t, ask(900)).await.expect("no cost limit");
    let refused = q.reserve(&t, ask(101)).await.expect_err("101 > 100");
    assert_eq!(
        (refused.exhausted, refused.left.tokens),
        (Exhausted::Tokens, 100)
    );
    assert_eq!(
        refused.left.cost,
        Cost::from_nanos(u64::MAX),
        "no cost limit"
    );
    assert!(refused.resets_in <= Duration::from_secs(60));
    q.settle(hold, ask(10));
    wait_usage(&q, &t, |u| u.spent.tokens == 10 && u.held.tokens == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_ids_with_non_utf8_bytes_are_counted_apart() {
    let Some(server) = RedisServer::start("tenants") else {
        return;
    };
    let c = config(LONG, 1.0).with_tenant(
        "big",
        Limits {
            max_cost: Some(usd(10.0)),
            max_tokens: None,
        },
    );
    let q = replica(&server, c, 1.0);
    let ids: [&[u8]; 6] = [
        b"\xff",
        b"\xfe",
        b"\xff\x00",
        b"",
        b"caf\xe9",
        b"caf\xc3\xa9",
    ];
    for id in ids {
        let t = tenant(id);
        q.reserve(&t, dollars(1.0))
            .await
            .expect("a quota of its own");
        assert!(q.reserve(&t, dollars(0.01)).await.is_err(), "{t:?} full");
    }
    for id in ids {
        let usage = q.shared_usage(&tenant(id)).await.expect("Redis answers");
        assert_eq!(usage.held.cost, usd(1.0), "{:?}", tenant(id));
    }
    let big = tenant(b"big");
    q.reserve(&big, dollars(9.0)).await.expect("its own limits");
    assert!(q.reserve(&big, dollars(1.5)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_window_makes_the_quota_whole_again_and_a_late_settle_lands_in_its_own() {
    let Some(server) = RedisServer::start("rollover") else {
        return;
    };
    let q = replica(&server, config(1, 1.0), 1.0);
    let t = tenant(b"acme");
    // Start just after a second begins (the server runs on this machine's
    // clock): the first two reserves share a window.
    let into_second = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .subsec_millis();
    tokio::time::sleep(Duration::from_millis(u64::from(1_020 - into_second))).await;
    let first = q.reserve(&t, dollars(1.0)).await.expect("fits");
    let window = first.window();
    let refused = q.reserve(&t, dollars(0.5)).await.expect_err("full");
    assert!(refused.resets_in <= Duration::from_secs(1));
    let next = Arc::new(Mutex::new(None));
    assert!(
        poll(Duration::from_secs(3), || {
            let next = next.clone();
            let q = &q;
            let t = &t;
            async move {
                match q.reserve(t, dollars(1.0)).await {
                    Ok(hold) => {
                        *next.lock().expect("lock") = Some(hold);
                        true
                    }
                    Err(_) => false,
                }
            }
        })
        .await,
        "whole again in the next window"
    );
    let second = next.lock().expect("lock").take().expect("held");
    assert!(second.window() > window);
    // Settled late: counts in the first window, not the current one.
    q.settle(first, dollars(1.0));
    q.settle(second, Ask::default());
    let usage = wait_usage(&q, &t, |u| u.held == Ask::default()).await;
    assert_eq!(usage.map(|u| u.spent), Some(Ask::default()));
}

// One thread: the test's subscriber sees the store's tasks' events too.
#[tokio::test(flavor = "current_thread")]
async fn a_slow_redis_that_answers_ping_keeps_the_store_shared_and_exact() {
    let Some(server) = RedisServer::start("slow_but_alive") else {
        return;
    };
    let events = Events::default();
    let _guard = tracing::subscriber::set_default(events.clone());
    // A local share of 1: a replica counting in-process would admit the
    // whole dollar on its own, twice the quota between the two.
    let a = Arc::new(replica_timing_out(
        &server,
        config(LONG, 1.0),
        1.0,
        OP_TIMEOUT,
    ));
    let b = Arc::new(replica_timing_out(
        &server,
        config(LONG, 1.0),
        1.0,
        OP_TIMEOUT,
    ));
    let t = tenant(b"acme");
    for q in [&a, &b] {
        let warm = q.reserve(&t, Ask::default()).await.expect("fits");
        q.settle(warm, Ask::default());
    }

    // Writes paused twice the op timeout: every reply comes late, PING
    // answers at once.
    let pause = OP_TIMEOUT * 2;
    pause_writes(&server, pause).await;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..30 {
        let q = if i % 2 == 0 { a.clone() } else { b.clone() };
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            let took = Instant::now();
            let held = q.reserve(&t, dollars(0.1)).await.ok();
            (held, took.elapsed())
        }));
    }
    let (mut granted, mut slowest, mut fastest) = (0, Duration::ZERO, Duration::MAX);
    for task in tasks {
        let (held, took) = task.await.expect("task");
        granted += usize::from(held.is_some());
        slowest = slowest.max(took);
        fastest = fastest.min(took);
    }
    eprintln!(
        "slow but alive: {granted} of 30 reserves granted in {:?} (fastest {fastest:?}, slowest {slowest:?}; writes paused {pause:?}, op timeout {OP_TIMEOUT:?})",
        start.elapsed()
    );
    assert!(
        fastest >= pause - Duration::from_millis(50),
        "a reply came before the pause ended: {fastest:?}"
    );
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    assert_eq!(granted, 10, "exact: ten dimes in the dollar");
    assert!(a.is_shared() && b.is_shared(), "slow is not down");
    assert_eq!(events.count(tracing::Level::WARN, WENT_DOWN), 0);
    assert_eq!(a.late_reserves() + b.late_reserves(), 0);
    let usage = a.shared_usage(&t).await.expect("Redis answers");
    assert_eq!(usage.held.cost, usd(1.0), "{usage:?}");
}

// One thread: the test's subscriber sees the store's tasks' events too.
#[tokio::test(flavor = "current_thread")]
async fn a_reserve_past_the_reserve_timeout_counts_that_call_locally_and_the_store_stays_shared() {
    let Some(server) = RedisServer::start("reserve_timeout") else {
        return;
    };
    let events = Events::default();
    let _guard = tracing::subscriber::set_default(events.clone());
    let reserve_timeout = Duration::from_millis(500);
    let q = replica_waiting(&server, config(LONG, 1.0), 0.5, OP_TIMEOUT, reserve_timeout);
    let t = tenant(b"acme");
    let in_redis = q.reserve(&t, dollars(0.2)).await.expect("fits");

    // Writes paused well past the reserve timeout; PING answers.
    pause_writes(&server, Duration::from_millis(1_500)).await;
    let start = Instant::now();
    let local = q.reserve(&t, dollars(0.3)).await.expect("the local share");
    let took = start.elapsed();
    eprintln!("reserve timeout {reserve_timeout:?}: the late reserve answered in {took:?}");
    assert!(
        took >= reserve_timeout && took < reserve_timeout + Duration::from_millis(150),
        "{took:?}"
    );
    assert!(q.is_shared(), "one late call does not make Redis down");
    assert_eq!(q.late_reserves(), 1);
    assert_eq!(q.local().held(&t).cost, usd(0.3), "counted in-process");
    // The next one waits again, and is counted at the share too: 0.2 of
    // the local half is left.
    let refused = q
        .reserve(&t, dollars(0.3))
        .await
        .expect_err("past the share");
    assert_eq!(
        (refused.exhausted, refused.left.cost),
        (Exhausted::Cost, usd(0.2))
    );
    assert_eq!(q.late_reserves(), 2);
    assert!(q.is_shared());
    assert_eq!(
        events.count(tracing::Level::WARN, LATE),
        2,
        "logged at 1 and 2"
    );
    assert_eq!(events.count(tracing::Level::WARN, WENT_DOWN), 0);
    q.settle(local, dollars(0.25));
    q.settle(in_redis, dollars(0.1));

    // The pause ends: the late holds Redis gave are released, the
    // in-process spend is pushed, the settle lands.
    let usage = wait_usage(&q, &t, |u| {
        u.held == Ask::default() && u.spent.cost == usd(0.35)
    })
    .await;
    assert!(usage.is_some());
    let hold = q
        .reserve(&t, dollars(0.65))
        .await
        .expect("0.65 left, on Redis");
    assert_eq!(q.local().held(&t), Ask::default(), "on Redis again");
    assert!(
        q.reserve(&t, dollars(0.01)).await.is_err(),
        "all of it used"
    );
    q.settle(hold, Ask::default());
    assert!(q.is_shared());
    assert_eq!(events.count(tracing::Level::WARN, WENT_DOWN), 0);
    assert_eq!(events.count(tracing::Level::WARN, LATE), 2);
}

/// The keys under `prefix` on `server` (`SCAN`, never `KEYS`).
async fn keys_under(server: &RedisServer, prefix: &str) -> Vec<String> {
    let client = redis::Client::open(server.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    let mut keys = Vec::new();
    let mut cursor = 0_u64;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1_000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_past_max_tenants_share_one_quota_across_replicas_in_bounded_keys() {
    let Some(server) = RedisServer::start("max_tenants") else {
        return;
    };
    let mut c = config(LONG, 1.0).with_tenant(
        "vip",
        Limits {
            max_cost: Some(usd(5.0)),
            max_tokens: None,
        },
    );
    c.max_tenants = 3;
    let a = replica(&server, c.clone(), 1.0);
    let b = replica(&server, c, 1.0);
    let overflow = tenant(OVERFLOW_TENANT);
    let id = |i: u32| format!("client-{i}").into_bytes();
    // The first three tenants, from either replica, are counted apart.
    let mut first = Vec::new();
    for i in 0..3 {
        let q = if i % 2 == 0 { &a } else { &b };
        let hold = q
            .reserve(&tenant(&id(i)), dollars(0.6))
            .await
            .expect("fits");
        assert_eq!(hold.tenant(), &tenant(&id(i)), "counted apart");
        first.push(hold);
    }
    // The 47 next share one quota, whichever replica they come through:
    // each spends 0.01 of the shared dollar.
    for i in 3..50 {
        let q = if i % 2 == 0 { &a } else { &b };
        let hold = q
            .reserve(&tenant(&id(i)), dollars(0.01))
            .await
            .expect("fits the shared quota");
        assert_eq!(hold.tenant(), &overflow, "client-{i} is counted together");
        q.settle(hold, dollars(0.01));
    }
    let usage = wait_usage(&a, &overflow, |u| {
        u.held == Ask::default() && u.spent.cost == usd(0.47)
    })
    .await;
    assert!(usage.is_some());
    // One quota: what one of them spent, another one (new or not) cannot.
    assert!(b.reserve(&tenant(b"newcomer"), dollars(0.6)).await.is_err());
    let refused = a
        .reserve(&tenant(&id(7)), dollars(0.6))
        .await
        .expect_err("0.53 left of the shared dollar");
    assert_eq!(refused.left.cost, usd(0.53));
    // A tenant counted together has no keys of its own.
    let own = b.shared_usage(&tenant(&id(7))).await.expect("answers");
    assert_eq!((own.spent, own.held), (Ask::default(), Ask::default()));
    // Those counted apart stay apart, on either replica.
    for (i, q) in [(0, &b), (1, &a), (2, &b)] {
        let hold = q
            .reserve(&tenant(&id(i)), dollars(0.4))
            .await
            .expect("its own 0.4 left");
        assert_eq!(hold.tenant(), &tenant(&id(i)));
        assert!(
            q.reserve(&tenant(&id(i)), dollars(0.01)).await.is_err(),
            "client-{i} full"
        );
        q.settle(hold, Ask::default());
    }
    // A named tenant is always counted apart, under its own limits.
    let vip = tenant(b"vip");
    let hold = b.reserve(&vip, dollars(4.0)).await.expect("its own limits");
    assert_eq!(hold.tenant(), &vip);
    assert_eq!(
        a.shared_usage(&vip).await.map(|u| u.held.cost),
        Some(usd(4.0))
    );
    b.settle(hold, dollars(1.0));
    for hold in first {
        a.settle(hold, dollars(0.1));
    }
    wait_usage(&a, &tenant(&id(2)), |u| u.held == Ask::default()).await;
    wait_usage(&a, &vip, |u| u.held == Ask::default()).await;
    // Bounded keys: the window's set of tenants, and two keys at most for
    // each of the three, the named one and the overflow tenant; never
    // one for the 47 others.
    let keys = keys_under(&server, "test:quota:").await;
    assert!(
        keys.len() <= 1 + 2 * (3 + 1 + 1),
        "{} keys: {keys:?}",
        keys.len()
    );
    let hex = |id: &[u8]| id.iter().map(|b| format!("{b:02x}")).collect::<String>();
    for i in 3..50 {
        assert!(
            !keys.iter().any(|k| k.contains(&hex(&id(i)))),
            "client-{i} has keys: {keys:?}"
        );
    }
    assert!(keys.iter().any(|k| k.contains(&hex(OVERFLOW_TENANT))));
    assert!(keys.iter().any(|k| k.contains(&hex(b"vip"))));
    // Every key expires (one window after its window ends).
    let client = redis::Client::open(server.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    for k in &keys {
        let ttl: i64 = redis::cmd("PTTL")
            .arg(k)
            .query_async(&mut conn)
            .await
            .expect("PTTL");
        assert!(ttl > 0, "{k}: no expiry ({ttl})");
    }
    assert!(a.is_shared() && b.is_shared());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spend_counted_in_process_is_pushed_where_a_reserve_would_count_it() {
    let Some(server) = RedisServer::start("max_tenants_push") else {
        return;
    };
    let mut c = config(LONG, 1.0);
    c.max_tenants = 1;
    let q = replica_timing_out(&server, c, 1.0, OP_TIMEOUT);
    let first = tenant(b"first");
    let hold = q.reserve(&first, dollars(0.1)).await.expect("fits");
    assert_eq!(hold.tenant(), &first);
    q.settle(hold, dollars(0.1));
    wait_usage(&q, &first, |u| u.spent.cost == usd(0.1)).await;

    // Redis frozen: the in-process store counts `second` apart (it has
    // room of its own); Redis's window has none left.
    server.freeze(true);
    let second = tenant(b"second");
    let hold = q
        .reserve(&second, dollars(0.5))
        .await
        .expect("the local share");
    assert!(!q.is_shared());
    assert_eq!(hold.tenant(), &second);
    q.settle(hold, dollars(0.3));
    server.freeze(false);
    assert!(
        poll(Duration::from_secs(5), || async { q.is_shared() }).await,
        "shared again"
    );
    // Pushed to the overflow tenant's keys, where `second`'s reserves
    // count from now on; `second` gets no keys of its own. The reserve
    // sent to the frozen server ran when it woke, in the overflow
    // tenant's keys too: released there.
    let overflow = tenant(OVERFLOW_TENANT);
    wait_usage(&q, &overflow, |u| {
        u.held == Ask::default() && u.spent.cost == usd(0.3)
    })
    .await;
    let own = q.shared_usage(&second).await.expect("answers");
    assert_eq!(own.spent, Ask::default());
    let hold = q.reserve(&second, dollars(0.7)).await.expect("0.7 left");
    assert_eq!(hold.tenant(), &overflow);
    assert!(q.reserve(&tenant(b"third"), dollars(0.01)).await.is_err());
    q.settle(hold, Ask::default());
    let hold = q.reserve(&first, dollars(0.9)).await.expect("its own 0.9");
    assert_eq!(hold.tenant(), &first);
    q.settle(hold, Ask::default());
}
