//! Idempotency shared through a real Redis (issue 20): two replicas (two
//! `IdempotencyLayer`s, each with its own `RedisIdempotencyStore` and connections)
//! in front of one provider. Each test starts (and may kill and restart)
//! its own `redis-server`; see `tower_llm_test_support::RedisServer` for when a test skips.
//! Real time: Redis's TTLs and pub/sub cannot be paused; every wait is a
//! poll against a short deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm_core::{
    ChatChunk, ChatRequest, ChatResponse, ChatStream, Failure, IdempotencyKey, Message, Usage,
};
use tower_llm_idempotency::{
    Begin, BoxFuture, Fingerprint, IdempotencyConfig, IdempotencyLayer, IdempotencyStore, Lease,
    StoreError, Stored,
};
use tower_llm_idempotency_redis::RedisIdempotencyStore;
use tower_llm_test_support::{RedisServer, within};

type Svc<R> = BoxCloneSyncService<ChatRequest, R, Failure>;

/// Counts the `Busy` answers of a store: a test can tell that its
/// duplicates are really waiting.
#[derive(Debug)]
struct Counting {
    store: Arc<RedisIdempotencyStore>,
    busy: Arc<AtomicUsize>,
}

impl IdempotencyStore for Counting {
    fn begin(
        &self,
        key: Arc<str>,
        fingerprint: Fingerprint,
    ) -> BoxFuture<Result<Begin, StoreError>> {
        let begin = self.store.begin(key, fingerprint);
        let busy = self.busy.clone();
        Box::pin(async move {
            let begun = begin.await;
            if matches!(begun, Ok(Begin::Busy(_))) {
                busy.fetch_add(1, Ordering::SeqCst);
            }
            begun
        })
    }

    fn complete(
        &self,
        key: Arc<str>,
        lease: Lease,
        stored: Arc<Stored>,
        bytes: usize,
        ttl: Duration,
    ) -> BoxFuture<()> {
        self.store.complete(key, lease, stored, bytes, ttl)
    }

    fn release(&self, key: Arc<str>, lease: Lease) {
        self.store.release(key, lease);
    }
}

/// One replica: its own store (its own connections), its own layer.
struct Replica {
    store: Arc<RedisIdempotencyStore>,
    busy: Arc<AtomicUsize>,
    layer: IdempotencyLayer,
}

impl Replica {
    fn new(url: &str) -> Replica {
        Replica::with_poll(url, Duration::from_millis(50))
    }

    fn with_poll(url: &str, poll: Duration) -> Replica {
        let store = Arc::new(
            RedisIdempotencyStore::builder(url)
                .expect("url")
                .with_prefix("test:idem:")
                .with_poll_interval(poll)
                .with_max_backoff(Duration::from_millis(100))
                .build()
                .expect("store"),
        );
        let busy = Arc::new(AtomicUsize::new(0));
        let counting = Counting {
            store: store.clone(),
            busy: busy.clone(),
        };
        let layer = IdempotencyLayer::new(IdempotencyConfig::default())
            .expect("config")
            .with_store(Arc::new(counting));
        Replica { store, busy, layer }
    }

    fn over<R, S>(&self, provider: S) -> Svc<R>
    where
        S: tower::Service<ChatRequest, Response = R, Error = Failure>
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
        R: tower_llm_idempotency::IdempotentAnswer
            + tower_llm_core::RecordsAttempts
            + Send
            + 'static,
    {
        BoxCloneSyncService::new(
            ServiceBuilder::new()
                .layer(self.layer.clone())
                .service(provider),
        )
    }
}

fn keyed(key: &str, text: &str) -> ChatRequest {
    let mut req = ChatRequest::new("m", vec![Message::user(text)]);
    IdempotencyKey::new(key).store(&mut req);
    req
}

fn answer(n: usize) -> ChatResponse {
    ChatResponse {
        id: format!("answer {n}"),
        model: "m".into(),
        provider: "mock".into(),
        fallback_position: 0,
        degraded: false,
        idempotent_replayed: false,
        cache: None,
        choices: vec![],
        usage: Usage::default(),
        latency: Duration::from_millis(7),
        attempts: vec![],
    }
}

/// The provider: counts its calls and answers `answer <n>` after `delay`
/// (the call numbered `hang`, if any, never answers).
fn provider(
    calls: Arc<AtomicUsize>,
    delay: Duration,
    hang: Option<usize>,
) -> impl tower::Service<
    ChatRequest,
    Response = ChatResponse,
    Error = Failure,
    Future = impl Future<Output = Result<ChatResponse, Failure>> + Send,
> + Clone
+ Send
+ Sync
+ 'static {
    service_fn(move |_req: ChatRequest| {
        let n = calls.fetch_add(1, Ordering::SeqCst);
        async move {
            if Some(n) == hang {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(delay).await;
            Ok::<_, Failure>(answer(n))
        }
    })
}

/// Joins a spawned call, bounded: a call that hangs fails the test
/// instead of waiting for a reservation to expire.
async fn join<R>(task: tokio::task::JoinHandle<Result<R, Failure>>) -> R {
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("answered within 5 s")
        .expect("joins")
        .expect("answered")
}

macro_rules! redis_or_skip {
    ($name:expr) => {
        match RedisServer::start($name) {
            Some(server) => server,
            None => return,
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_duplicates_over_two_replicas_make_one_upstream_call() {
    let server = redis_or_skip!("fifty_duplicates_over_two_replicas_make_one_upstream_call");
    let calls = Arc::new(AtomicUsize::new(0));
    let up = provider(calls.clone(), Duration::from_millis(200), None);
    let (a, b) = (Replica::new(&server.url()), Replica::new(&server.url()));
    let (sa, sb) = (a.over(up.clone()), b.over(up));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let svc = if i % 2 == 0 { sa.clone() } else { sb.clone() };
            tokio::spawn(svc.oneshot(keyed("order-42", "charge the card")))
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(join(task).await);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one upstream call");
    assert!(answers.iter().all(|r| r.id == "answer 0"));
    let replayed = answers.iter().filter(|r| r.idempotent_replayed).count();
    assert_eq!(replayed, 49);
    // Both replicas had duplicates waiting on the other's (or their own)
    // leader, and both served replays.
    assert!(a.busy.load(Ordering::SeqCst) > 0 && b.busy.load(Ordering::SeqCst) > 0);
    assert!(a.store.is_up() && b.store.is_up());
    assert!(a.store.local().is_empty() && b.store.local().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_from_one_replica_is_replayed_by_the_other() {
    let server = redis_or_skip!("an_answer_from_one_replica_is_replayed_by_the_other");
    let calls = Arc::new(AtomicUsize::new(0));
    let up = provider(calls.clone(), Duration::ZERO, None);
    let (a, b) = (Replica::new(&server.url()), Replica::new(&server.url()));
    let first = a
        .over(up.clone())
        .oneshot(keyed("k", "hi"))
        .await
        .expect("answered");
    assert!(!first.idempotent_replayed);
    let again = b
        .over(up)
        .oneshot(keyed("k", "hi"))
        .await
        .expect("replayed");
    assert!(again.idempotent_replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(again.latency, first.latency);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no second upstream call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_key_with_another_request_is_refused_on_the_other_replica() {
    let server =
        redis_or_skip!("the_same_key_with_another_request_is_refused_on_the_other_replica");
    let calls = Arc::new(AtomicUsize::new(0));
    let up = provider(calls.clone(), Duration::from_millis(300), None);
    let (a, b) = (Replica::new(&server.url()), Replica::new(&server.url()));
    let (sa, sb) = (a.over(up.clone()), b.over(up));
    // While the first call runs (its reservation)...
    let leader = tokio::spawn(sa.oneshot(keyed("k", "pay 10")));
    within(Duration::from_secs(2), || calls.load(Ordering::SeqCst) == 1)
        .await
        .expect("the leader calls");
    let err = sb
        .clone()
        .oneshot(keyed("k", "pay 1000"))
        .await
        .expect_err("refused while running");
    assert_eq!(err.http_status().map(|s| s.as_u16()), Some(422));
    // ...and once it is stored.
    join(leader).await;
    let err = sb
        .oneshot(keyed("k", "pay 1000"))
        .await
        .expect_err("refused once stored");
    assert_eq!(err.http_status().map(|s| s.as_u16()), Some(422));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_leader_lets_one_waiter_go_ahead_and_the_others_get_its_answer() {
    let server =
        redis_or_skip!("a_dropped_leader_lets_one_waiter_go_ahead_and_the_others_get_its_answer");
    let calls = Arc::new(AtomicUsize::new(0));
    // The first call never answers; the next takes 100 ms.
    let up = provider(calls.clone(), Duration::from_millis(100), Some(0));
    let (a, b) = (Replica::new(&server.url()), Replica::new(&server.url()));
    let (sa, sb) = (a.over(up.clone()), b.over(up));
    let leader = tokio::spawn(sa.clone().oneshot(keyed("k", "hi")));
    within(Duration::from_secs(2), || calls.load(Ordering::SeqCst) == 1)
        .await
        .expect("the leader calls");
    let waiters: Vec<_> = (0..6)
        .map(|i| {
            let svc = if i % 2 == 0 { sa.clone() } else { sb.clone() };
            tokio::spawn(svc.oneshot(keyed("k", "hi")))
        })
        .collect();
    within(Duration::from_secs(2), || {
        a.busy.load(Ordering::SeqCst) >= 3 && b.busy.load(Ordering::SeqCst) >= 3
    })
    .await
    .expect("the duplicates wait on both replicas");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "nobody else led");
    leader.abort();
    assert!(leader.await.expect_err("aborted").is_cancelled());
    let mut answers = Vec::new();
    for w in waiters {
        answers.push(join(w).await);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one waiter went ahead");
    assert!(answers.iter().all(|r| r.id == "answer 1"));
    assert_eq!(answers.iter().filter(|r| r.idempotent_replayed).count(), 5);
}

fn chunk(text: &str) -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        text: Some(text.into()),
        ..ChatChunk::default()
    })
}

async fn drain(mut stream: ChatStream) -> (Vec<String>, Option<Failure>) {
    use futures_core::Stream;
    let mut texts = Vec::new();
    while let Some(item) =
        std::future::poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_next(cx)).await
    {
        match item {
            Ok(c) => texts.push(c.text.unwrap_or_default()),
            Err(e) => return (texts, Some(e)),
        }
    }
    (texts, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_stored_by_one_replica_is_replayed_chunk_for_chunk_by_the_other() {
    let server =
        redis_or_skip!("a_stream_stored_by_one_replica_is_replayed_chunk_for_chunk_by_the_other");
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let up = service_fn(move |_req: ChatRequest| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let items = vec![chunk("Hel"), chunk("lo"), chunk(" wor"), chunk("ld")];
            Ok::<_, Failure>(ChatStream::from_chunks("mock", "m", items))
        }
    });
    let (a, b) = (Replica::new(&server.url()), Replica::new(&server.url()));
    let mut req = keyed("s", "stream it");
    req.stream = true;
    let live = a
        .over(up.clone())
        .oneshot(req.clone())
        .await
        .expect("streams");
    assert!(!live.is_idempotent_replay());
    let (texts, end) = drain(live).await;
    assert_eq!(texts, ["Hel", "lo", " wor", "ld"]);
    assert!(end.is_none());
    let replay = b.over(up).oneshot(req).await.expect("replayed");
    assert!(replay.is_idempotent_replay());
    assert_eq!((replay.provider(), replay.model()), ("mock", "m"));
    let (texts, end) = drain(replay).await;
    assert_eq!(texts, ["Hel", "lo", " wor", "ld"]);
    assert!(end.is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// `n` concurrent calls with one key on `svc`: every one answered, and
/// the set of answer ids.
async fn burst(svc: &Svc<ChatResponse>, key: &str, n: usize) -> Vec<String> {
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(svc.clone().oneshot(keyed(key, "hi"))))
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(
            t.await
                .expect("joins")
                .expect("no call fails because of Redis")
                .id,
        );
    }
    ids.sort();
    ids.dedup();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_keeps_every_call_answered_and_dedupes_in_process_until_it_is_back() {
    let mut server = redis_or_skip!(
        "redis_down_keeps_every_call_answered_and_dedupes_in_process_until_it_is_back"
    );
    let calls = Arc::new(AtomicUsize::new(0));
    let up = provider(calls.clone(), Duration::from_millis(100), None);
    let (a, b) = (Replica::new(&server.url()), Replica::new(&server.url()));
    let (sa, sb) = (a.over(up.clone()), b.over(up));
    // Shared first.
    assert_eq!(burst(&sa, "before", 4).await, ["answer 0"]);
    assert_eq!(burst(&sb, "before", 4).await, ["answer 0"]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    server.kill();
    // Every call answered; duplicates within a replica still make one
    // call each (in-process), not across replicas.
    let started = std::time::Instant::now();
    assert_eq!(burst(&sa, "during", 10).await.len(), 1);
    assert_eq!(burst(&sb, "during", 10).await.len(), 1);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(!a.store.is_up() && !b.store.is_up());
    assert!(a.store.local().len() == 1 && b.store.local().len() == 1);
    // Bounded: two bursts of a 100 ms call, plus at most a command timeout
    // each for finding Redis down.
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    // A replay from the in-process store.
    let again = sa
        .clone()
        .oneshot(keyed("during", "hi"))
        .await
        .expect("answered");
    assert!(again.idempotent_replayed);
    assert_eq!(calls.load(Ordering::SeqCst), 3);

    server.restart();
    within(Duration::from_secs(3), || {
        a.store.is_up() && b.store.is_up()
    })
    .await
    .expect("both stores see Redis back");
    assert_eq!(burst(&sa, "after", 4).await, ["answer 3"]);
    let replay = sb.oneshot(keyed("after", "hi")).await.expect("replayed");
    assert!(replay.idempotent_replayed);
    assert_eq!(replay.id, "answer 3");
    assert_eq!(calls.load(Ordering::SeqCst), 4, "shared again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_a_call_at_most_the_command_timeout() {
    let server = redis_or_skip!("a_frozen_redis_costs_a_call_at_most_the_command_timeout");
    let calls = Arc::new(AtomicUsize::new(0));
    let up = provider(calls.clone(), Duration::ZERO, None);
    let a = Replica::new(&server.url());
    let sa = a.over(up);
    sa.clone()
        .oneshot(keyed("warm", "hi"))
        .await
        .expect("answered");
    server.freeze(true);
    let started = std::time::Instant::now();
    let res = sa
        .clone()
        .oneshot(keyed("k", "hi"))
        .await
        .expect("answered anyway");
    let took = started.elapsed();
    server.freeze(false);
    assert!(!res.idempotent_replayed);
    assert!(
        took >= Duration::from_millis(200),
        "it waited on Redis: {took:?}"
    );
    // The 250 ms command timeout, plus slack for a machine busy with
    // other builds.
    assert!(
        took < Duration::from_secs(1),
        "bounded by the timeout: {took:?}"
    );
    // Already marked down: the next call does not wait on Redis at all.
    let started = std::time::Instant::now();
    let again = sa
        .oneshot(keyed("k", "hi"))
        .await
        .expect("replayed in-process");
    assert!(again.idempotent_replayed);
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(200),
        "no command timeout paid: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_the_other_replica_is_woken_by_the_notice_not_the_poll() {
    let server =
        redis_or_skip!("a_waiter_on_the_other_replica_is_woken_by_the_notice_not_the_poll");
    let calls = Arc::new(AtomicUsize::new(0));
    let up = provider(calls.clone(), Duration::from_millis(100), None);
    // A poll interval far above the test's bound: only the notice can
    // wake the waiter in time.
    let poll = Duration::from_secs(30);
    let (a, b) = (
        Replica::with_poll(&server.url(), poll),
        Replica::with_poll(&server.url(), poll),
    );
    within(Duration::from_secs(2), || b.store.is_listening())
        .await
        .expect("B subscribes");
    let leader = tokio::spawn(a.over(up.clone()).oneshot(keyed("k", "hi")));
    within(Duration::from_secs(2), || calls.load(Ordering::SeqCst) == 1)
        .await
        .expect("the leader calls");
    let waiter = tokio::spawn(b.over(up).oneshot(keyed("k", "hi")));
    within(Duration::from_secs(2), || {
        b.busy.load(Ordering::SeqCst) == 1
    })
    .await
    .expect("the duplicate waits");
    let led = join(leader).await;
    let led_at = std::time::Instant::now();
    let replayed = join(waiter).await;
    let woken = led_at.elapsed();
    assert!(replayed.idempotent_replayed);
    assert_eq!(replayed.id, led.id);
    assert!(woken < Duration::from_secs(2), "woken after {woken:?}");
    eprintln!("waiter answered {woken:?} after the leader");
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_outlives_its_reservation_cannot_store_over_the_next_one() {
    let server =
        redis_or_skip!("a_leader_that_outlives_its_reservation_cannot_store_over_the_next_one");
    let store = |url: &str| {
        RedisIdempotencyStore::builder(url)
            .expect("url")
            .with_prefix("test:idem:")
            .with_lease_ttl(Duration::from_millis(100))
            .build()
            .expect("store")
    };
    let (a, b) = (store(&server.url()), store(&server.url()));
    let key: Arc<str> = Arc::from("0".repeat(64));
    let fp = Fingerprint([7; 32]);
    let ttl = Duration::from_secs(60);
    let Ok(Begin::Lead(lease_a)) = a.begin(key.clone(), fp).await else {
        panic!("A leads");
    };
    assert!(matches!(b.begin(key.clone(), fp).await, Ok(Begin::Busy(_))));
    // A's reservation expires (its replica is slow, or gone): B leads.
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let lease_b = loop {
        match b.begin(key.clone(), fp).await {
            Ok(Begin::Lead(lease)) => break lease,
            Ok(Begin::Busy(wait)) => wait.await,
            other => panic!("unexpected {other:?}"),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reservation expires"
        );
    };
    assert_ne!(lease_a, lease_b);
    // A's late answer is not stored, nor does its release free B's key.
    let late = Arc::new(Stored::Response(answer(0)));
    a.complete(key.clone(), lease_a, late, 100, ttl).await;
    a.release(key.clone(), lease_a);
    assert!(matches!(a.begin(key.clone(), fp).await, Ok(Begin::Busy(_))));
    let stored = Arc::new(Stored::Response(answer(1)));
    b.complete(key.clone(), lease_b, stored.clone(), 100, ttl)
        .await;
    match a.begin(key.clone(), fp).await {
        Ok(Begin::Replay(got)) => assert_eq!(got, stored),
        other => panic!("expected B's answer, got {other:?}"),
    }
    assert!(matches!(
        a.begin(key, Fingerprint([8; 32])).await,
        Ok(Begin::Mismatch)
    ));
    assert!(a.is_up() && b.is_up());
}
