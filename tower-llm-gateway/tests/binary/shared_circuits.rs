//! Two `tower-llm-gateway` processes (the built binary) with one policy
//! file sharing their circuits through a real Redis, in front of one
//! failing loopback upstream.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower_llm_providers::mock::{MockServer, Reply};

use tower_llm_test_support::{RedisServer, poll};

use crate::support::{Binary, send, spawn};

const HELLO: &str = r#"{"model": "smart", "messages": [{"role": "user", "content": "Hello"}]}"#;

/// The state of the only circuit `GET /health/circuits` lists.
async fn circuit_state(client: &Client<HttpConnector, Full<Bytes>>, gw: &Binary) -> String {
    let (status, body) = send(client, "GET", &format!("{}/health/circuits", gw.url), "").await;
    assert_eq!(status, 200, "{body}");
    let list: serde_json::Value = serde_json::from_str(&body).expect("json");
    let list = list.as_array().expect("a list");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["provider"], "primary");
    list[0]["state"].as_str().expect("a state").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateway_processes_share_a_circuit_through_redis() {
    let Some(redis) = RedisServer::start("two_gateway_processes") else {
        return;
    };
    let upstream = MockServer::start(Reply::openai_error(503, "server_error", "overloaded"))
        .await
        .expect("upstream");
    let dir = std::env::temp_dir().join(format!("tower-llm-gw-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            r#"
            [deadline]
            total_ms = 2000
            [retry]
            max_attempts = 1
            [breaker]
            consecutive_failures = 3
            cooldown_ms = 30000
            [breaker_shared]
            redis = "{}"
            [[providers]]
            name = "primary"
            kind = "openai"
            base_url = "{}/v1"
            api_key_env = "UPSTREAM_KEY"
            [[routes]]
            model = "smart"
            chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
            "#,
            redis.url(),
            upstream.url()
        ),
    )
    .expect("write the policy");
    let a = spawn(&config, &[]).await;
    let b = spawn(&config, &[]).await;
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();

    // Both processes are connected to Redis.
    for gw in [&a, &b] {
        let url = format!("{}/metrics", gw.url);
        let up = poll(Duration::from_secs(5), || async {
            let (_, metrics) = send(&client, "GET", &url, "").await;
            metrics
                .lines()
                .any(|l| l.starts_with("llm_breaker_shared_store_up{") && l.ends_with(" 1"))
        })
        .await;
        assert!(up, "{} is not connected to Redis", gw.url);
    }
    assert_eq!(circuit_state(&client, &b).await, "closed");

    // Three failures through A open the circuit.
    let chat_a = format!("{}/v1/chat/completions", a.url);
    for n in 1..=3 {
        let (status, body) = send(&client, "POST", &chat_a, HELLO).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(upstream.received().len(), n);
    }
    assert_eq!(circuit_state(&client, &a).await, "open");

    // B follows within a second, and refuses without calling the upstream.
    let opened = poll(Duration::from_secs(1), || async {
        circuit_state(&client, &b).await == "open"
    })
    .await;
    assert!(opened, "B did not see the circuit open within 1 s");
    let (status, body) = send(
        &client,
        "POST",
        &format!("{}/v1/chat/completions", b.url),
        HELLO,
    )
    .await;
    assert_eq!(status, 503, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(json["error"]["code"], "circuit_open");
    assert_eq!(upstream.received().len(), 3);
    let _ = std::fs::remove_dir_all(&dir);
}
