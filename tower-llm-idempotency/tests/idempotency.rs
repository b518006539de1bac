//! The idempotency layer on virtual time: replays, single flight, refusals,
//! tenants, expiry, streams and the memory bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_llm_core::{
    AttemptOutcome, ChatChunk, ChatRequest, ChatResponse, ChatStream, Failure, FailureClass,
    IdempotencyKey, Message,
};
use tower_llm_deadline::DeadlineLayer;
use tower_llm_idempotency::{Concurrent, IdempotencyConfig, IdempotencyLayer, MemoryStore};

/// A provider counting its calls; call `n` answers `"answer n"` after
/// `wait`, or fails when `fail(n)`.
#[derive(Clone)]
struct Provider {
    calls: Arc<AtomicUsize>,
    wait: Duration,
    fail: fn(usize) -> bool,
}

impl Provider {
    fn new(wait_ms: u64) -> Self {
        Provider {
            calls: Arc::default(),
            wait: Duration::from_millis(wait_ms),
            fail: |_| false,
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    fn unary(
        &self,
    ) -> impl tower::Service<
        ChatRequest,
        Response = ChatResponse,
        Error = Failure,
        Future = impl Send + 'static,
    > + Clone
    + Send
    + 'static {
        let this = self.clone();
        service_fn(move |_req: ChatRequest| {
            let n = this.calls.fetch_add(1, Ordering::SeqCst);
            let (wait, fail) = (this.wait, (this.fail)(n));
            async move {
                tokio::time::sleep(wait).await;
                if fail {
                    return Err(Failure::new(FailureClass::Transient));
                }
                Ok(ChatResponse {
                    id: format!("answer {n}"),
                    model: "m".into(),
                    provider: "mock".into(),
                    ..ChatResponse::default()
                })
            }
        })
    }
}

fn keyed(key: &str, prompt: &str) -> ChatRequest {
    let mut req = ChatRequest::new("m", vec![Message::user(prompt)]);
    IdempotencyKey::new(key).store(&mut req);
    req
}

fn layer() -> IdempotencyLayer {
    IdempotencyLayer::new(IdempotencyConfig::default()).expect("valid")
}

#[tokio::test(start_paused = true)]
async fn a_repeated_request_gets_the_stored_answer_and_its_records() {
    let provider = Provider::new(10);
    let svc = ServiceBuilder::new()
        .layer(DeadlineLayer::new(Duration::from_secs(30)))
        .layer(layer())
        .layer(tower_llm_retry::RetryLayer::new())
        .service(provider.unary());
    let first = svc
        .clone()
        .oneshot(keyed("k", "hi"))
        .await
        .expect("answers");
    assert!(!first.idempotent_replayed);
    assert_eq!(first.attempts.len(), 1);
    let start = tokio::time::Instant::now();
    let again = svc.oneshot(keyed("k", "hi")).await.expect("replayed");
    assert_eq!(start.elapsed(), Duration::ZERO, "no upstream wait");
    assert_eq!(provider.calls(), 1, "zero upstream calls for the replay");
    assert!(again.idempotent_replayed);
    assert_eq!(again.id, first.id);
    assert_eq!(again.attempts, first.attempts, "the original records");
    assert_eq!(again.attempts[0].outcome, AttemptOutcome::Succeeded);
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_duplicates_make_one_upstream_call() {
    let provider = Provider::new(500);
    let svc = ServiceBuilder::new()
        .layer(layer())
        .service(provider.unary());
    let calls: Vec<_> = (0..100)
        .map(|_| tokio::spawn(svc.clone().oneshot(keyed("k", "hi"))))
        .collect();
    let mut replayed = 0;
    for c in calls {
        let res = c.await.expect("joined").expect("answers");
        assert_eq!(res.id, "answer 0");
        replayed += usize::from(res.idempotent_replayed);
    }
    assert_eq!(provider.calls(), 1);
    assert_eq!(replayed, 99);
}

#[tokio::test(start_paused = true)]
async fn when_the_leader_is_dropped_one_waiter_goes_ahead_and_the_others_get_its_answer() {
    let provider = Provider::new(1_000);
    let svc = ServiceBuilder::new()
        .layer(layer())
        .service(provider.unary());
    let leader = tokio::spawn(svc.clone().oneshot(keyed("k", "hi")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let waiters: Vec<_> = (0..5)
        .map(|_| tokio::spawn(svc.clone().oneshot(keyed("k", "hi"))))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    leader.abort();
    for w in waiters {
        let res = w.await.expect("joined").expect("answers");
        assert_eq!(res.id, "answer 1", "the second upstream call's answer");
    }
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failure_is_never_stored_and_a_waiter_goes_ahead() {
    let mut provider = Provider::new(100);
    provider.fail = |n| n == 0;
    let svc = ServiceBuilder::new()
        .layer(layer())
        .service(provider.unary());
    let first = tokio::spawn(svc.clone().oneshot(keyed("k", "hi")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let second = tokio::spawn(svc.clone().oneshot(keyed("k", "hi")));
    assert!(
        first
            .await
            .expect("joined")
            .expect_err("fails")
            .is_transient()
    );
    let res = second
        .await
        .expect("joined")
        .expect("the waiter's own call");
    assert_eq!(res.id, "answer 1");
    assert!(!res.idempotent_replayed);
    let third = svc.oneshot(keyed("k", "hi")).await.expect("replayed");
    assert_eq!(third.id, "answer 1");
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_same_key_with_another_request_is_refused() {
    let provider = Provider::new(100);
    let svc = ServiceBuilder::new()
        .layer(layer())
        .service(provider.unary());
    // While the first is running, and after it is stored.
    let first = tokio::spawn(svc.clone().oneshot(keyed("k", "hi")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let err = svc
        .clone()
        .oneshot(keyed("k", "other"))
        .await
        .expect_err("refused");
    assert!(err.is_bad_request());
    assert_eq!(
        err.http_status(),
        Some(http::StatusCode::UNPROCESSABLE_ENTITY)
    );
    assert!(err.to_string().contains("idempotency_key_reused"), "{err}");
    first.await.expect("joined").expect("answers");
    let err = svc.oneshot(keyed("k", "other")).await.expect_err("refused");
    assert_eq!(
        err.http_status(),
        Some(http::StatusCode::UNPROCESSABLE_ENTITY)
    );
    assert_eq!(provider.calls(), 1);
}

#[derive(Clone)]
struct Tenant(&'static str);

#[tokio::test(start_paused = true)]
async fn two_tenants_with_the_same_key_never_share() {
    let provider = Provider::new(10);
    let svc = ServiceBuilder::new()
        .layer(layer().with_tenant(|req: &ChatRequest| {
            req.extensions.get::<Tenant>().map(|t| t.0.to_owned())
        }))
        .service(provider.unary());
    let as_tenant = |t| {
        let mut req = keyed("k", "hi");
        req.extensions.insert(Tenant(t));
        req
    };
    let a = svc.clone().oneshot(as_tenant("a")).await.expect("answers");
    let b = svc.clone().oneshot(as_tenant("b")).await.expect("answers");
    assert_eq!((a.id.as_str(), b.id.as_str()), ("answer 0", "answer 1"));
    let a2 = svc.oneshot(as_tenant("a")).await.expect("replayed");
    assert_eq!(a2.id, "answer 0");
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn answers_expire_after_their_time_to_live() {
    let provider = Provider::new(10);
    let svc = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(IdempotencyConfig {
                ttl_ms: 3_600_000,
                ..IdempotencyConfig::default()
            })
            .expect("valid"),
        )
        .service(provider.unary());
    svc.clone()
        .oneshot(keyed("k", "hi"))
        .await
        .expect("answers");
    tokio::time::advance(Duration::from_secs(3_599)).await;
    assert!(
        svc.clone()
            .oneshot(keyed("k", "hi"))
            .await
            .expect("ok")
            .idempotent_replayed
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    let fresh = svc
        .clone()
        .oneshot(keyed("k", "hi"))
        .await
        .expect("a new call");
    assert_eq!(fresh.id, "answer 1");
    // A call's own time to live.
    let mut short = keyed("s", "hi");
    IdempotencyKey::new("s")
        .with_ttl(Duration::from_secs(5))
        .store(&mut short);
    svc.clone().oneshot(short.clone()).await.expect("answers");
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(!svc.oneshot(short).await.expect("ok").idempotent_replayed);
    assert_eq!(provider.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn concurrent_duplicates_can_be_refused_instead() {
    let provider = Provider::new(100);
    let svc = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(IdempotencyConfig {
                concurrent: Concurrent::Reject,
                ..IdempotencyConfig::default()
            })
            .expect("valid"),
        )
        .service(provider.unary());
    let first = tokio::spawn(svc.clone().oneshot(keyed("k", "hi")));
    tokio::time::sleep(Duration::from_millis(10)).await;
    let err = svc
        .clone()
        .oneshot(keyed("k", "hi"))
        .await
        .expect_err("refused");
    assert!(err.is_conflict());
    assert_eq!(err.http_status(), Some(http::StatusCode::CONFLICT));
    first.await.expect("joined").expect("answers");
    assert!(
        svc.oneshot(keyed("k", "hi"))
            .await
            .expect("ok")
            .idempotent_replayed
    );
}

#[tokio::test(start_paused = true)]
async fn a_malformed_key_is_refused_and_no_key_costs_nothing() {
    let provider = Provider::new(10);
    let svc = ServiceBuilder::new()
        .layer(layer())
        .service(provider.unary());
    for bad in ["", "with\nnewline", &"x".repeat(256)] {
        let err = svc
            .clone()
            .oneshot(keyed(bad, "hi"))
            .await
            .expect_err("refused");
        assert!(err.is_bad_request(), "{bad:?}");
    }
    let plain = || ChatRequest::new("m", vec![Message::user("hi")]);
    svc.clone().oneshot(plain()).await.expect("answers");
    svc.oneshot(plain()).await.expect("answers");
    assert_eq!(provider.calls(), 2);
}

#[tokio::test(start_paused = true)]
async fn the_memory_bound_evicts_the_oldest_answer() {
    let provider = Provider::new(10);
    let store = Arc::new(MemoryStore::new(1_200));
    let svc = ServiceBuilder::new()
        .layer(
            IdempotencyLayer::new(IdempotencyConfig {
                max_bytes: 1_200,
                max_entry_bytes: 1_200,
                ..IdempotencyConfig::default()
            })
            .expect("valid")
            .with_store(store.clone()),
        )
        .service(provider.unary());
    for key in ["a", "b", "c", "d"] {
        svc.clone()
            .oneshot(keyed(key, "hi"))
            .await
            .expect("answers");
    }
    assert!(store.bytes() <= 1_200, "{}", store.bytes());
    assert!(store.len() < 4, "{} held", store.len());
    // The oldest went first: "a" is asked upstream again, "d" is replayed.
    assert!(
        svc.clone()
            .oneshot(keyed("d", "hi"))
            .await
            .expect("ok")
            .idempotent_replayed
    );
    assert!(
        !svc.oneshot(keyed("a", "hi"))
            .await
            .expect("ok")
            .idempotent_replayed
    );
    assert_eq!(provider.calls(), 5);
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

#[tokio::test(start_paused = true)]
async fn a_stream_is_stored_once_complete_and_replayed_chunk_for_chunk() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let provider = service_fn(move |_req: ChatRequest| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        async move {
            let items = if n == 0 {
                // The first stream breaks off: not stored.
                vec![chunk("par"), Err(Failure::new(FailureClass::Transient))]
            } else {
                vec![chunk("Hel"), chunk("lo"), chunk("!")]
            };
            Ok::<_, Failure>(ChatStream::from_chunks("mock", "m", items))
        }
    });
    let svc = ServiceBuilder::new().layer(layer()).service(provider);
    let (texts, end) = drain(
        svc.clone()
            .oneshot(keyed("k", "hi"))
            .await
            .expect("streams"),
    )
    .await;
    assert_eq!(texts, ["par"]);
    assert!(end.is_some());
    let stream = svc
        .clone()
        .oneshot(keyed("k", "hi"))
        .await
        .expect("streams");
    assert!(!stream.is_idempotent_replay());
    // Not stored until it ends: a duplicate now would wait.
    let (texts, end) = drain(stream).await;
    assert_eq!(texts, ["Hel", "lo", "!"]);
    assert!(end.is_none());
    let replay = svc.oneshot(keyed("k", "hi")).await.expect("replayed");
    assert!(replay.is_idempotent_replay());
    let (texts, end) = drain(replay).await;
    assert_eq!(texts, ["Hel", "lo", "!"]);
    assert!(end.is_none());
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn a_degraded_answer_is_never_stored() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    // Every link failed and the fallback built a degraded answer.
    let provider = service_fn(move |_req: ChatRequest| {
        counted.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok::<_, Failure>(ChatResponse {
            degraded: true,
            ..ChatResponse::default()
        }))
    });
    let svc = ServiceBuilder::new().layer(layer()).service(provider);
    for _ in 0..2 {
        let res = svc
            .clone()
            .oneshot(keyed("k", "hi"))
            .await
            .expect("answers");
        assert!(res.degraded && !res.idempotent_replayed);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
