//! Two `tower-llm-gateway` processes (the built binary) with one policy
//! file sharing their response cache through a real Redis: an answer
//! stored by one is a hit on the other, with the same age; with Redis
//! killed or frozen, both keep answering (each from its own process).
//! Real processes and real time: bounded waits, never a sleep.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_llm_providers::mock::{MockServer, Reply};
use tower_llm_test_support::RedisServer;

use crate::support::Pair;

fn question(n: u32) -> String {
    format!(r#"{{"model": "smart", "messages": [{{"role": "user", "content": "Question {n}"}}]}}"#)
}

/// Asks `body` of `base`: the status, `x-llm-cache` and the answer's text.
async fn ask(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    body: String,
) -> (u16, String, String) {
    let req = http::Request::post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let res = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .expect("an answer within 10 s")
        .expect("an answer");
    let status = res.status().as_u16();
    let cache = res
        .headers()
        .get("x-llm-cache")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let text = json["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    (status, cache, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_share_cached_answers_and_keep_serving_without_redis() {
    let Some(mut redis) = RedisServer::start("shared_cache") else {
        return;
    };
    let upstream = MockServer::start(Reply::openai_text("from the provider"))
        .await
        .expect("upstream");
    let dir = std::env::temp_dir().join(format!("tower-llm-gw-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            [deadline]
            total_ms = 5000
            [retry]
            max_attempts = 1
            [cache_shared]
            redis = "{}"
            [[providers]]
            name = "primary"
            kind = "openai"
            base_url = "{}/v1"
            api_key_env = "UPSTREAM_KEY"
            [[routes]]
            model = "smart"
            chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
            cache = {{ ttl_ms = 600000 }}
            "#,
            redis.url(),
            upstream.url()
        ),
    )
    .expect("write the policy");
    let pair = Pair::start(
        "shared-cache",
        &config,
        &[("UPSTREAM_KEY", "sk-test")],
        "cache store: Redis unavailable",
    )
    .await;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let (a, b) = (pair.a.url.clone(), pair.b.url.clone());

    // Ten questions asked of A (misses), then of B: every one a hit,
    // served by Redis, with no further provider call.
    for n in 0..10 {
        assert_eq!(
            ask(&client, &a, question(n)).await,
            (200, "miss".to_owned(), "from the provider".to_owned())
        );
    }
    assert_eq!(upstream.received().len(), 10);
    for n in 0..10 {
        let (status, cache, _) = ask(&client, &b, question(n)).await;
        assert_eq!((status, cache.as_str()), (200, "hit"), "question {n} on B");
    }
    assert_eq!(upstream.received().len(), 10);

    // Redis killed: every call is still answered, each process from the
    // provider or its own memory (a miss on B for what A stores now).
    redis.kill();
    let started = Instant::now();
    assert_eq!(ask(&client, &a, question(100)).await.0, 200);
    assert_eq!(
        ask(&client, &a, question(100)).await.1,
        "hit",
        "A's own memory"
    );
    let (status, cache, _) = ask(&client, &b, question(100)).await;
    assert_eq!((status, cache.as_str()), (200, "miss"));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "three calls with Redis down took {:?}",
        started.elapsed()
    );

    // Back: shared again.
    redis.restart();
    // A fresh question each try, until one stored through A is a hit on B.
    let next = std::sync::atomic::AtomicU32::new(200);
    let shared = tower_llm_test_support::poll(Duration::from_secs(10), || async {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = ask(&client, &a, question(n)).await;
        ask(&client, &b, question(n)).await.1 == "hit"
    })
    .await;
    assert!(
        shared,
        "the pair did not share again within 10 s of Redis's return"
    );

    // Frozen: calls are answered within the store's operation timeout.
    redis.freeze(true);
    let started = Instant::now();
    let (status, _, text) = ask(&client, &b, question(300)).await;
    assert_eq!((status, text.as_str()), (200, "from the provider"));
    let took = started.elapsed();
    redis.freeze(false);
    assert!(
        took < Duration::from_secs(2),
        "a call with Redis frozen took {took:?}"
    );
    // Each outage (killed, frozen) was logged once per process at most,
    // never once per call.
    let [la, lb] = pair.outages();
    assert!(
        (1..=2).contains(&la) && (1..=2).contains(&lb),
        "outage lines: {la}, {lb}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
