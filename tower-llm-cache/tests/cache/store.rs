//! The stores: one that cannot answer, and the bounded `MemoryCache`.

use std::sync::atomic::AtomicUsize;

use tower::Layer;
use tower_llm_cache::{CacheEntry, CacheStore, MemoryCache, StoreError};
use tower_llm_idempotency::{BoxFuture, Stored};

use super::*;

/// A store whose server is down: every get and put fails.
#[derive(Debug, Default)]
struct DownStore {
    gets: AtomicUsize,
    puts: AtomicUsize,
}

impl CacheStore for DownStore {
    fn get(&self, _key: Arc<str>) -> BoxFuture<Result<Option<CacheEntry>, StoreError>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(Err(StoreError(
            "connection refused".into(),
        ))))
    }

    fn put(
        &self,
        _key: Arc<str>,
        _stored: Arc<Stored>,
        _bytes: usize,
        _keep: Duration,
    ) -> BoxFuture<Result<(), StoreError>> {
        self.puts.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(Err(StoreError(
            "connection refused".into(),
        ))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_fails_makes_every_call_a_miss_served_by_the_provider() {
    let provider = Provider::scripted(|n| {
        if n < 3 {
            Reply::Answer
        } else {
            Reply::Fail(FailureClass::Transient)
        }
    });
    let store = Arc::new(DownStore::default());
    let svc = cache(config(60_000, 60_000))
        .with_store(store.clone())
        .layer(provider.service());
    for n in 0..3 {
        let res = call(&svc, ask()).await.expect("served by the provider");
        assert_eq!(seen(&res), (format!("answer {n}").as_str(), MISS));
    }
    advance(secs(61)).await;
    // Nothing held: the provider's failure is the call's.
    let failed = call(&svc, ask()).await.expect_err("fails");
    assert_eq!(failed.class(), FailureClass::Transient);
    assert_eq!(provider.calls(), 4);
    assert_eq!(store.gets.load(Ordering::SeqCst), 4);
    assert_eq!(store.puts.load(Ordering::SeqCst), 3);
}

/// The question numbered `i`.
fn question(i: usize) -> ChatRequest {
    ChatRequest::new("m", vec![Message::user(format!("question {i}"))])
}

#[tokio::test(start_paused = true)]
async fn a_small_memory_cache_keeps_the_latest_answers_within_its_bytes() {
    // Room for exactly three answers: each is its stored bytes plus its
    // 64-character key.
    let one = Stored::Response(answer(0)).held_bytes() + 64;
    let max = 3 * one;
    let store = Arc::new(MemoryCache::new(max));
    let provider = Provider::answering();
    let svc = cache(config(60_000, 0))
        .with_store(store.clone())
        .layer(provider.service());
    for i in 0..5 {
        let res = call(&svc, question(i)).await.expect("answers");
        assert_eq!(seen(&res), (format!("answer {i}").as_str(), MISS));
        assert!(store.bytes() <= max, "{} > {max}", store.bytes());
    }
    assert_eq!(store.len(), 3);
    assert_eq!(store.bytes(), max);
    // The three latest are held; looking them up stores nothing.
    for i in 2..5 {
        let res = call(&svc, question(i)).await.expect("hit");
        assert_eq!(seen(&res), (format!("answer {i}").as_str(), hit(ms(0))));
    }
    assert_eq!(provider.calls(), 5);
    // The two oldest went first.
    for i in 0..2 {
        let res = call(&svc, question(i)).await.expect("answers");
        assert_eq!(seen(&res), (format!("answer {}", 5 + i).as_str(), MISS));
    }
    assert_eq!(provider.calls(), 7);
    assert!(store.bytes() <= max);
}
