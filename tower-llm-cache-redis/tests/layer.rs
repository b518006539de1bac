//! The store behind the real `CacheLayer`: two replicas (two layers, each
//! with its own `RedisCache`) in front of one provider, on a
//! `redis-server` of the test's own (see
//! `tower_llm_test_support::RedisServer` for when it skips).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tower::{Layer, ServiceExt, service_fn};
use tower_llm_cache::{CacheConfig, CacheLayer, CacheStore};
use tower_llm_cache_redis::RedisCache;
use tower_llm_core::{CacheStatus, ChatRequest, ChatResponse, Failure, Message};
use tower_llm_test_support::{RedisServer, poll};

fn replica(url: &str) -> Arc<RedisCache> {
    Arc::new(
        RedisCache::builder(url)
            .expect("url")
            .with_prefix("test:cache:")
            .build()
            .expect("store"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cached_through_one_replicas_layer_is_a_hit_on_the_other() {
    let Some(server) =
        RedisServer::start("an_answer_cached_through_one_replicas_layer_is_a_hit_on_the_other")
    else {
        return;
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let provider = service_fn(move |_req: ChatRequest| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Failure>(ChatResponse::builder("m").text("Paris").build()) }
    });
    let (store_a, store_b) = (replica(&server.url()), replica(&server.url()));
    let layer = |store: &Arc<RedisCache>| {
        CacheLayer::new(CacheConfig::default())
            .expect("config")
            .with_store(store.clone())
    };
    let (a, b) = (
        layer(&store_a).layer(provider.clone()),
        layer(&store_b).layer(provider),
    );
    let ask = || ChatRequest::new("m", vec![Message::user("Capital of France?")]);

    let first = a.oneshot(ask()).await.expect("answered");
    assert_eq!(first.cache.expect("marked").status, CacheStatus::Miss);
    // The layer writes a shared store in the background: wait for the
    // key (one per answer) to reach Redis.
    let mut conn = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connects");
    let stored = poll(Duration::from_secs(2), || {
        let mut conn = conn.clone();
        async move {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("test:cache:*")
                .query_async(&mut conn)
                .await
                .expect("KEYS");
            keys.len() == 1
        }
    })
    .await;
    assert!(stored, "the answer reaches Redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let key = keys[0].strip_prefix("test:cache:").expect("prefixed");
    assert_eq!(key.len(), 64, "{key}");
    assert!(store_b.get(Arc::from(key)).await.expect("up").is_some());

    let again = b.oneshot(ask()).await.expect("answered");
    let outcome = again.cache.expect("marked");
    assert_eq!(outcome.status, CacheStatus::Hit);
    assert!(outcome.age < Duration::from_secs(1), "{:?}", outcome.age);
    assert_eq!(again.text(), "Paris");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no second provider call");
}
