//! Circuits shared through a real Redis (issue 19): three replicas, each
//! its own tokio runtime, its own `RedisBreakerStore` (its own connections) and
//! its own breaker stack, in front of one loopback OpenAI-style server.
//! Each test starts (and may kill and restart) its own `redis-server`; see
//! `tower_llm_test_support::RedisServer` for when a test skips. Real time: Redis's clock and
//! TTLs cannot be paused; every wait is a poll against a short deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt};
use tower_llm::breaker::{BreakerConfig, BreakerHandle, BreakerKey, CircuitState, RatioTrigger};
use tower_llm::prelude::*;
use tower_llm::providers::https::client_with_connect_timeout;
use tower_llm::providers::{ApiKey, OpenAi, OpenAiConfig};
use tower_llm_breaker_redis::RedisBreakerStore;
use tower_llm_providers::mock::{MockServer, Reply};
use tower_llm_test_support::{RedisServer, within};

type Stack = tower::util::BoxCloneSyncService<ChatRequest, ChatResponse, Failure>;

fn req() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

fn key() -> BreakerKey {
    BreakerKey::new("openai", "m")
}

fn config(probes: u32, cooldown: Duration) -> BreakerConfig {
    BreakerConfig {
        consecutive_failures: 5,
        cooldown,
        half_open_probes: probes,
        ..BreakerConfig::default()
    }
}

/// One replica: a runtime of its own, its store, its stack.
struct Replica {
    name: String,
    rt: Option<tokio::runtime::Runtime>,
    store: Arc<RedisBreakerStore>,
    handle: BreakerHandle,
    svc: Stack,
    /// Opens adopted from the shared store.
    adopted_opens: Arc<AtomicUsize>,
}

impl Replica {
    fn new(name: &str, redis: &str, server: &MockServer, cfg: BreakerConfig) -> Replica {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let _entered = rt.enter();
        let adopted_opens = Arc::new(AtomicUsize::new(0));
        let opens = adopted_opens.clone();
        let store = Arc::new(
            RedisBreakerStore::builder(redis)
                .expect("url")
                .on_adopted(move |t| {
                    if t.to == CircuitState::Open {
                        opens.fetch_add(1, Ordering::SeqCst);
                    }
                })
                .with_breaker_config(cfg)
                .with_prefix("test:")
                .with_max_backoff(Duration::from_millis(100))
                .with_resync_every(Duration::from_millis(200))
                .build()
                .expect("store"),
        );
        let breaker = BreakerLayer::new()
            .with_config(cfg)
            .expect("config")
            .with_link(tower_llm::Link::new("openai", "m"))
            .with_store(store.clone());
        let handle = breaker.handle();
        let provider = OpenAi::new(
            client_with_connect_timeout(Duration::from_secs(5)),
            OpenAiConfig::new(ApiKey::new(name)).with_base_url(&server.url()),
        );
        let svc = ServiceBuilder::new()
            .llm_deadline(Duration::from_secs(60))
            .llm_breaker(breaker)
            .service(provider);
        Replica {
            name: name.to_owned(),
            rt: Some(rt),
            store,
            handle,
            svc: tower::util::BoxCloneSyncService::new(svc),
            adopted_opens,
        }
    }

    fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("running")
    }

    async fn call(&self) -> Result<ChatResponse, Failure> {
        let call = self.svc.clone().oneshot(req());
        self.rt().spawn(call).await.expect("call task")
    }

    fn state(&self) -> Option<CircuitState> {
        self.handle.get(&key()).map(|s| s.state)
    }

    /// The replica dies: its runtime stops at once, tasks and all, so
    /// nothing it held is released in Redis.
    fn crash(mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

async fn fleet(redis: &RedisServer, server: &MockServer, cfg: BreakerConfig) -> Vec<Replica> {
    let replicas: Vec<_> = ["replica-0", "replica-1", "replica-2"]
        .iter()
        .map(|n| Replica::new(n, &redis.url(), server, cfg))
        .collect();
    let up = within(Duration::from_secs(5), || {
        replicas.iter().all(|r| r.store.is_up())
    })
    .await;
    assert!(up.is_some(), "every store connects to the test's Redis");
    replicas
}

/// Five failures, one at a time, spread over the three replicas (2, 2, 1).
async fn trip(replicas: &[Replica]) {
    for i in 0..5 {
        let err = replicas[i % 3]
            .call()
            .await
            .expect_err("the provider fails");
        assert!(err.is_transient(), "call {i}: {err}");
    }
}

fn who(server: &MockServer, index: usize) -> String {
    let received = server.received();
    let auth = received[index]
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    auth.trim_start_matches("Bearer ").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_failures_over_three_replicas_open_all_three_within_100_ms() {
    let Some(redis) = RedisServer::start("five_failures_over_three_replicas") else {
        return;
    };
    let server = MockServer::start(Reply::openai_error(503, "server_error", "down"))
        .await
        .expect("server");
    let replicas = fleet(&redis, &server, config(1, Duration::from_secs(5))).await;

    trip(&replicas).await;
    // No replica counted 5 on its own (2, 2, 1): the shared count did it.
    let took = within(Duration::from_millis(100), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Open))
    })
    .await;
    assert!(
        took.is_some(),
        "every replica adopts the open within 100 ms"
    );
    let adopted = within(Duration::from_millis(100), || {
        replicas
            .iter()
            .map(|r| r.adopted_opens.load(Ordering::SeqCst))
            .sum::<usize>()
            == 3
    })
    .await;
    assert!(adopted.is_some(), "each replica's on_adopted saw one open");

    // Nobody calls the provider until the cooldown ends.
    for r in &replicas {
        for _ in 0..10 {
            let err = r.call().await.expect_err("refused");
            assert!(err.is_circuit_open(), "{}: {err}", r.name);
        }
    }
    assert_eq!(server.received().len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_cooldown_exactly_k_of_30_concurrent_calls_reach_the_provider() {
    let Some(redis) = RedisServer::start("exactly_k_of_30") else {
        return;
    };
    // Five 503s, then slow successes (the probes are still out while the
    // other calls arrive).
    let server = MockServer::start(Reply::openai_text("ok").after(Duration::from_millis(300)))
        .await
        .expect("server");
    for _ in 0..5 {
        server.push(Reply::openai_error(503, "server_error", "down"));
    }
    let cooldown = Duration::from_millis(400);
    let replicas = fleet(&redis, &server, config(2, cooldown)).await;
    trip(&replicas).await;
    let open = within(Duration::from_millis(100), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Open))
    })
    .await;
    assert!(open.is_some(), "every replica adopts the open");

    // The cooldown ends; the replicas reserve their probe tokens then.
    tokio::time::sleep(cooldown + Duration::from_millis(100)).await;
    let mut calls = Vec::new();
    for i in 0..30 {
        let r = &replicas[i % 3];
        calls.push(r.rt().spawn(r.svc.clone().oneshot(req())));
    }
    let mut served = 0;
    let mut refused = 0;
    for call in calls {
        match call.await.expect("call task") {
            Ok(answer) => {
                assert_eq!(answer.text(), "ok");
                served += 1;
            }
            Err(e) => {
                assert!(e.is_circuit_open(), "{e}");
                refused += 1;
            }
        }
    }
    assert_eq!((served, refused), (2, 28), "exactly K = 2 probes went out");
    assert_eq!(server.received().len(), 5 + 2);
    // Two probe successes close the circuit everywhere.
    let closed = within(Duration::from_millis(500), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Closed))
    })
    .await;
    assert!(closed.is_some(), "the fleet closes after K successes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_lost_with_its_replica_frees_its_slot_after_the_cooldown() {
    let Some(redis) = RedisServer::start("probe_lost_with_its_replica") else {
        return;
    };
    let server = MockServer::start(Reply::openai_text("ok"))
        .await
        .expect("server");
    for _ in 0..5 {
        server.push(Reply::openai_error(503, "server_error", "down"));
    }
    // The first probe hangs (its replica dies while it waits).
    server.push(Reply::openai_text("late").after(Duration::from_secs(30)));
    let cooldown = Duration::from_millis(500);
    let mut replicas = fleet(&redis, &server, config(1, cooldown)).await;
    trip(&replicas).await;
    let open = within(Duration::from_millis(100), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Open))
    })
    .await;
    assert!(open.is_some(), "every replica adopts the open");
    tokio::time::sleep(cooldown + Duration::from_millis(100)).await;

    // One call on each replica at once: exactly one is the probe.
    let pending: Vec<_> = replicas
        .iter()
        .map(|r| r.rt().spawn(r.svc.clone().oneshot(req())))
        .collect();
    let reached = within(Duration::from_millis(500), || server.received().len() == 6).await;
    assert!(reached.is_some(), "one probe reaches the provider");
    let holder = who(&server, 5);
    let index = replicas
        .iter()
        .position(|r| r.name == holder)
        .expect("a replica sent it");
    // The other two were refused at once.
    for (i, call) in pending.into_iter().enumerate() {
        if i != index {
            let err = call.await.expect("task").expect_err("refused");
            assert!(err.is_circuit_open(), "{err}");
        }
    }
    let crashed_at = std::time::Instant::now();
    replicas.remove(index).crash();

    // While the lost probe's slot is held, nobody probes; once it expires
    // (a cooldown after its reservation) one survivor does, and the fleet
    // closes: it cannot wedge.
    let mut served_after = None;
    let deadline = std::time::Instant::now() + 4 * cooldown;
    while std::time::Instant::now() < deadline {
        for r in &replicas {
            match r.call().await {
                Ok(answer) => {
                    assert_eq!(answer.text(), "ok");
                    served_after.get_or_insert(crashed_at.elapsed());
                }
                Err(e) => assert!(e.is_circuit_open(), "{e}"),
            }
        }
        if served_after.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let served_after = served_after.expect("a survivor probes once the slot expires");
    assert!(
        served_after < 3 * cooldown,
        "the slot freed after about a cooldown, not later: {served_after:?}"
    );
    assert_eq!(server.received().len(), 7, "exactly one new probe");
    let closed = within(Duration::from_millis(500), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Closed))
    })
    .await;
    assert!(closed.is_some(), "the survivors close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_test_replicas_break_locally_then_resync_when_it_is_back() {
    let Some(mut redis) = RedisServer::start("redis_killed_mid_test") else {
        return;
    };
    let server = MockServer::start(Reply::openai_text("ok"))
        .await
        .expect("server");
    let replicas = fleet(&redis, &server, config(1, Duration::from_secs(5))).await;
    for r in &replicas {
        assert_eq!(r.call().await.expect("served").text(), "ok");
    }

    redis.kill();
    // No call fails or waits because of Redis, before or after the
    // replicas notice.
    let started = std::time::Instant::now();
    for i in 0..30 {
        let answer = replicas[i % 3].call().await.expect("served without Redis");
        assert_eq!(answer.text(), "ok");
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let down = within(Duration::from_secs(2), || {
        replicas.iter().all(|r| !r.store.is_up())
    })
    .await;
    assert!(down.is_some(), "every replica notices Redis is gone");

    // Local breaking: replica 0 alone sees five failures and opens; the
    // others know nothing of it.
    for _ in 0..5 {
        server.push(Reply::openai_error(503, "server_error", "down"));
    }
    for _ in 0..5 {
        assert!(replicas[0].call().await.expect_err("fails").is_transient());
    }
    assert_eq!(replicas[0].state(), Some(CircuitState::Open));
    assert!(
        replicas[0]
            .call()
            .await
            .expect_err("refused")
            .is_circuit_open()
    );
    assert_eq!(replicas[1].state(), Some(CircuitState::Closed));
    assert_eq!(replicas[2].state(), Some(CircuitState::Closed));
    assert_eq!(server.received().len(), 3 + 30 + 5);

    // Redis is back (empty): they reconnect, replica 0 pushes its open,
    // and the others adopt it.
    redis.restart();
    let up = within(Duration::from_secs(5), || {
        replicas.iter().all(|r| r.store.is_up())
    })
    .await;
    assert!(up.is_some(), "every replica reconnects");
    let shared = within(Duration::from_secs(2), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Open))
    })
    .await;
    assert!(
        shared.is_some(),
        "the open is shared again after the resync"
    );
    assert!(
        replicas[1]
            .call()
            .await
            .expect_err("refused")
            .is_circuit_open()
    );
    assert_eq!(server.received().len(), 3 + 30 + 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn isolate_and_close_by_hand_on_one_replica_apply_to_all() {
    let Some(redis) = RedisServer::start("isolate_and_close_by_hand") else {
        return;
    };
    let server = MockServer::start(Reply::openai_text("ok"))
        .await
        .expect("server");
    let replicas = fleet(&redis, &server, config(1, Duration::from_secs(5))).await;
    for r in &replicas {
        r.call().await.expect("served");
    }
    assert!(replicas[0].handle.isolate(&key()));
    let isolated = within(Duration::from_millis(100), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Isolated))
    })
    .await;
    assert!(isolated.is_some(), "isolated everywhere within 100 ms");
    assert!(
        replicas[2]
            .call()
            .await
            .expect_err("refused")
            .is_circuit_open()
    );

    replicas[1].handle.close(&key());
    let closed = within(Duration::from_millis(100), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Closed))
    })
    .await;
    assert!(closed.is_some(), "closed everywhere within 100 ms");
    assert_eq!(replicas[2].call().await.expect("served").text(), "ok");
    assert_eq!(server.received().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_a_replica_breaks_on_its_own_and_no_call_waits() {
    // A port nobody listens on: the store never comes up.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let server = MockServer::start(Reply::openai_error(503, "server_error", "down"))
        .await
        .expect("server");
    let replica = Replica::new(
        "alone",
        &format!("redis://127.0.0.1:{port}"),
        &server,
        config(1, Duration::from_secs(5)),
    );
    let started = std::time::Instant::now();
    for _ in 0..5 {
        assert!(replica.call().await.expect_err("fails").is_transient());
    }
    assert!(replica.call().await.expect_err("refused").is_circuit_open());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(!replica.store.is_up());
    assert_eq!(server.received().len(), 5);
    // Its Debug names the address, never a URL with a password.
    let with_password =
        RedisBreakerStore::open("redis://:hunter2@127.0.0.1:1", BreakerConfig::default())
            .expect("store");
    let shown = format!("{with_password:?}");
    assert!(
        shown.contains("127.0.0.1:1") && !shown.contains("hunter2"),
        "{shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successes_and_failures_from_every_replica_fill_one_ratio_window() {
    let Some(redis) = RedisServer::start("one_ratio_window") else {
        return;
    };
    let server = MockServer::start(Reply::openai_text("ok"))
        .await
        .expect("server");
    let cfg = BreakerConfig {
        consecutive_failures: 0,
        failure_ratio: Some(RatioTrigger {
            ratio: 0.5,
            min_calls: 10,
            window: Duration::from_secs(10),
        }),
        ..config(1, Duration::from_secs(5))
    };
    let replicas = fleet(&redis, &server, cfg).await;
    // Replica 0 serves five calls; replicas 1 and 2 see four failures.
    for _ in 0..5 {
        replicas[0].call().await.expect("served");
    }
    for _ in 0..4 {
        server.push(Reply::openai_error(503, "server_error", "down"));
    }
    for i in 0..4 {
        assert!(
            replicas[1 + i % 2]
                .call()
                .await
                .expect_err("fails")
                .is_transient()
        );
    }
    // Nine calls in the shared window (the successes arrive in a batch,
    // within a resync period): under the minimum of ten, nothing opens.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Closed)),
        "nine calls do not open it"
    );
    // The tenth, a failure: 5 of 10 failed, and no replica saw more than
    // 3 calls of its own.
    server.push(Reply::openai_error(503, "server_error", "down"));
    assert!(replicas[2].call().await.expect_err("fails").is_transient());
    let open = within(Duration::from_millis(100), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Open))
    })
    .await;
    assert!(open.is_some(), "the shared ratio opens every replica");
    assert!(
        replicas[0]
            .call()
            .await
            .expect_err("refused")
            .is_circuit_open()
    );
    assert_eq!(server.received().len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_slows_no_call_and_replicas_come_back_when_it_thaws() {
    let Some(redis) = RedisServer::start("frozen_redis") else {
        return;
    };
    let server = MockServer::start(Reply::openai_text("ok"))
        .await
        .expect("server");
    let replicas = fleet(&redis, &server, config(1, Duration::from_secs(5))).await;
    for r in &replicas {
        r.call().await.expect("served");
    }
    // Nothing answers, connections stay open: only timeouts tell. Calls go
    // on meanwhile, before and after the replicas notice: none waits.
    redis.freeze(true);
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut slowest = Duration::ZERO;
    let mut calls = 0;
    while std::time::Instant::now() < deadline && replicas.iter().any(|r| r.store.is_up()) {
        for r in &replicas {
            let started = std::time::Instant::now();
            assert_eq!(r.call().await.expect("served").text(), "ok");
            slowest = slowest.max(started.elapsed());
            calls += 1;
        }
    }
    assert!(
        replicas.iter().all(|r| !r.store.is_up()),
        "every replica notices within 2 s"
    );
    assert!(calls > 0);
    assert!(
        slowest < Duration::from_millis(100),
        "slowest call {slowest:?}"
    );

    // Local breaking while frozen: replica 0 trips alone.
    for _ in 0..5 {
        server.push(Reply::openai_error(503, "server_error", "down"));
    }
    for _ in 0..5 {
        assert!(replicas[0].call().await.expect_err("fails").is_transient());
    }
    assert_eq!(replicas[0].state(), Some(CircuitState::Open));
    assert_eq!(replicas[1].state(), Some(CircuitState::Closed));

    // Thawed: back up, and replica 0's open reaches the others.
    redis.freeze(false);
    let up = within(Duration::from_secs(5), || {
        replicas.iter().all(|r| r.store.is_up())
    })
    .await;
    assert!(up.is_some(), "every replica is back");
    let shared = within(Duration::from_secs(2), || {
        replicas
            .iter()
            .all(|r| r.state() == Some(CircuitState::Open))
    })
    .await;
    assert!(shared.is_some(), "the open is shared after the thaw");
    assert_eq!(server.received().len(), 3 + calls + 5);
}
