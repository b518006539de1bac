//! The gateway's policy-driven layers over loopback: circuits shared by
//! two gateways through a real Redis (`[breaker_shared]`), a route's
//! hedge (`hedge`), and idempotency (`[idempotency]`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower_llm::config::Policy;
use tower_llm_gateway::GatewayConfig;
use tower_llm_providers::mock::{MockServer, Reply};

use crate::support::*;
use tower_llm_test_support::{RedisServer, poll};

fn down() -> Reply {
    Reply::openai_error(503, "server_error", "overloaded")
}

/// One route, `smart`, over one OpenAI provider at `upstream`, with
/// `extra` tables; no retries, and a circuit that opens after three
/// failures.
fn one_link(upstream: &str, extra: &str) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 2000
        [retry]
        max_attempts = 1
        attempt_timeout_ms = 2000
        [breaker]
        consecutive_failures = 3
        cooldown_ms = 30000
        {extra}
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{upstream}/v1"
        api_key_env = "UNUSED"
        [[routes]]
        model = "smart"
        chain = [{{ provider = "primary", model = "gpt-4o-mini" }}]
        "#
    )
}

/// The state of the only circuit `GET /health/circuits` lists.
async fn circuit_state(h: &Harness) -> String {
    let a = h.send("GET", "/health/circuits", "", &[]).await;
    assert_eq!(a.status, 200, "{}", a.body);
    let list = a.json();
    let list = list.as_array().expect("a list");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["provider"], "primary");
    assert_eq!(list[0]["model"], "gpt-4o-mini");
    list[0]["state"].as_str().expect("a state").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_shared_a_circuit_tripped_through_one_gateway_opens_on_the_other() {
    let Some(redis) = RedisServer::start("breaker_shared") else {
        return;
    };
    let shared = format!("[breaker_shared]\nredis = \"{}\"", redis.url());
    let a = start_text(down(), down(), |p, _| one_link(&p.url(), &shared)).await;
    let upstream = a.primary.url();
    // B is in front of A's upstream (its own mocks are never called).
    let b = start_text(down(), down(), |_, _| one_link(&upstream, &shared)).await;
    for h in [&a, &b] {
        assert!(
            poll(Duration::from_secs(5), || async {
                h.gateway.breaker_shared_up()
            })
            .await,
            "the store connects to Redis"
        );
    }
    // Both know the route's circuit before any call.
    assert_eq!(circuit_state(&b).await, "closed");
    let metrics = b.send("GET", "/metrics", "", &[]).await.body;
    let up = metrics
        .lines()
        .find(|l| l.starts_with("llm_breaker_shared_store_up{"))
        .unwrap_or_else(|| panic!("no llm_breaker_shared_store_up in {metrics}"));
    assert!(up.ends_with(" 1"), "{up}");

    // Three failures through A open the circuit.
    for n in 1..=3 {
        let answer = a.chat(HELLO).await;
        assert_eq!(answer.status, 503, "{}", answer.body);
        assert_eq!(a.primary.received().len(), n);
    }
    assert_eq!(circuit_state(&a).await, "open");

    // B follows within a second.
    let opened = poll(Duration::from_secs(1), || async {
        circuit_state(&b).await == "open"
    })
    .await;
    assert!(opened, "B did not see the circuit open within 1 s");
    // And refuses without calling the upstream.
    let refused = b.chat(HELLO).await;
    assert_eq!(refused.status, 503, "{}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "circuit_open");
    assert_eq!(a.primary.received().len(), 3);
    assert!(b.primary.received().is_empty());
    assert!(b.backup.received().is_empty());
}

// One thread: a new store's tasks cannot connect before this test yields,
// so `breaker_shared_up()` right after a reload tells a kept store (up)
// from a new one (not yet).
#[tokio::test(flavor = "current_thread")]
async fn breaker_shared_a_reload_keeps_the_store_unless_its_settings_change() {
    let Some(redis) = RedisServer::start("breaker_shared_reload") else {
        return;
    };
    let shared = format!("[breaker_shared]\nredis = \"{}\"", redis.url());
    let h = start_text(down(), down(), |p, _| one_link(&p.url(), &shared)).await;
    let url = h.primary.url();
    let gw = &h.gateway;
    assert!(poll(Duration::from_secs(5), || async { gw.breaker_shared_up() }).await);
    // Unchanged: the running store (connected) stays.
    let same = GatewayConfig::from_toml(&one_link(&url, &shared)).expect("policy");
    gw.reload(same).expect("reload");
    assert!(gw.breaker_shared_up());
    // A changed URL (another prefix): a new store, connecting afresh.
    let other = format!("{shared}\nprefix = \"other:\"");
    gw.reload(GatewayConfig::from_toml(&one_link(&url, &other)).expect("policy"))
        .expect("reload");
    assert!(!gw.breaker_shared_up(), "a new store starts unconnected");
    assert!(poll(Duration::from_secs(5), || async { gw.breaker_shared_up() }).await);
    assert_eq!(circuit_state(&h).await, "closed");
    // Without the table: local circuits.
    gw.reload(GatewayConfig::from_toml(&one_link(&url, "")).expect("policy"))
        .expect("reload");
    assert!(!gw.breaker_shared_up());
}

/// An upstream over raw TCP: its first connection never answers (and
/// reports when the gateway closes it); the others answer `fast`.
struct HedgeUpstream {
    url: String,
    accepted: Arc<AtomicUsize>,
    slow_closed: Arc<tokio::sync::Notify>,
}

async fn hedge_upstream() -> HedgeUpstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let accepted = Arc::new(AtomicUsize::new(0));
    let slow_closed = Arc::new(tokio::sync::Notify::new());
    let (count, closed) = (accepted.clone(), slow_closed.clone());
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let n = count.fetch_add(1, Ordering::SeqCst);
            let closed = closed.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0_u8; 4096];
                // The request head and its body.
                loop {
                    let Ok(read) = sock.read(&mut buf).await else {
                        return;
                    };
                    if read == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..read]);
                    let text = String::from_utf8_lossy(&seen).to_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if seen.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                if n > 0 {
                    let body = serde_json::json!({
                        "id": "chatcmpl-fast", "object": "chat.completion", "created": 0,
                        "model": "gpt-4o-mini",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fast"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                    })
                    .to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = sock.write_all(head.as_bytes()).await;
                    let _ = sock.write_all(body.as_bytes()).await;
                }
                // Until the gateway closes the connection.
                while let Ok(read) = sock.read(&mut buf).await {
                    if read == 0 {
                        break;
                    }
                }
                if n == 0 {
                    closed.notify_one();
                }
            });
        }
    });
    HedgeUpstream {
        url,
        accepted,
        slow_closed,
    }
}

#[tokio::test(start_paused = true)]
async fn hedge_a_hedge_that_wins_is_flagged_and_the_slow_connection_closed() {
    let upstream = hedge_upstream().await;
    let extra = "";
    let text = one_link(&upstream.url, extra).replace(
        "chain = [",
        "hedge = { delay_ms = 100, min_useful_ms = 500 }\n        chain = [",
    );
    let h = start_text(down(), down(), |_, _| text).await;
    let start = tokio::time::Instant::now();
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"][0]["message"]["content"], "fast");
    assert_eq!(a.header("x-llm-hedged"), "true");
    assert_eq!(a.header("x-llm-provider"), "primary");
    // The hedge went out at the delay, not before.
    assert!(start.elapsed() >= Duration::from_millis(100));
    assert_eq!(upstream.accepted.load(Ordering::SeqCst), 2);
    // The slow attempt's connection is closed, not left to run.
    tokio::time::timeout(Duration::from_secs(1), upstream.slow_closed.notified())
        .await
        .expect("the slow upstream connection was closed");
    let metrics = h.send("GET", "/metrics", "", &[]).await.body;
    let won = metrics
        .lines()
        .find(|l| l.starts_with("ai_router_hedges_total{") && l.contains("outcome=\"won\""))
        .unwrap_or_else(|| panic!("no won hedge in {metrics}"));
    assert!(won.ends_with(" 1"), "{won}");
}

#[tokio::test(start_paused = true)]
async fn hedge_a_fast_answer_is_not_hedged() {
    let text = |p: &tower_llm_providers::mock::MockServer, _: &_| {
        one_link(&p.url(), "").replace(
            "chain = [",
            "hedge = { delay_ms = 100, min_useful_ms = 500 }\n        chain = [",
        )
    };
    let h = start_text(Reply::openai_text("quick"), down(), text).await;
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.json()["choices"][0]["message"]["content"], "quick");
    assert!(a.headers.get("x-llm-hedged").is_none());
    assert_eq!(h.primary.received().len(), 1);
}

const IDEMPOTENT: &str = "[idempotency]\nttl_ms = 60000";
const OTHER: &str =
    r#"{"model": "smart", "messages": [{"role": "user", "content": "Something else"}]}"#;

/// The answer's JSON without its `created` time (the gateway's clock).
fn body_of(a: &Answer) -> serde_json::Value {
    let mut json = a.json();
    json.as_object_mut().expect("an object").remove("created");
    json
}

#[tokio::test(start_paused = true)]
async fn idempotency_the_same_key_twice_calls_once_and_replays() {
    let h = start(Reply::openai_text("once"), down(), IDEMPOTENT).await;
    let key = [("idempotency-key", "order-42")];
    let first = h.send("POST", "/v1/chat/completions", HELLO, &key).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(first.headers.get("idempotent-replayed").is_none());
    let again = h.send("POST", "/v1/chat/completions", HELLO, &key).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(body_of(&again), body_of(&first));
    assert_eq!(again.json()["choices"][0]["message"]["content"], "once");
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn idempotency_the_same_key_with_another_body_is_422() {
    let h = start(Reply::openai_text("once"), down(), IDEMPOTENT).await;
    let key = [("idempotency-key", "order-42")];
    let first = h.send("POST", "/v1/chat/completions", HELLO, &key).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let other = h.send("POST", "/v1/chat/completions", OTHER, &key).await;
    assert_eq!(other.status, 422, "{}", other.body);
    assert!(
        other.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("idempotency_key_reused")),
        "{}",
        other.body
    );
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn idempotency_without_a_key_every_call_goes_upstream() {
    let h = start(Reply::openai_text("each"), down(), IDEMPOTENT).await;
    for _ in 0..2 {
        let a = h.chat(HELLO).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(h.primary.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn idempotency_keys_are_scoped_by_the_tenant_header() {
    let h = start(Reply::openai_text("each"), down(), IDEMPOTENT).await;
    let send = |tenant: &'static str| {
        let h = &h;
        async move {
            h.send(
                "POST",
                "/v1/chat/completions",
                HELLO,
                &[("idempotency-key", "k1"), ("x-tenant-id", tenant)],
            )
            .await
        }
    };
    assert_eq!(send("acme").await.status, 200);
    let other = send("globex").await;
    assert_eq!(other.status, 200, "{}", other.body);
    assert!(other.headers.get("idempotent-replayed").is_none());
    let again = send("acme").await;
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(h.primary.received().len(), 2);
}

/// Sends HELLO with raw header bytes (values a `&str` cannot hold).
async fn send_raw(h: &Harness, body: &'static str, headers: &[(&str, &[u8])]) -> Answer {
    let mut req = http::Request::post(format!("{}/v1/chat/completions", h.url))
        .header("content-type", "application/json");
    for (name, value) in headers {
        req = req.header(
            *name,
            http::HeaderValue::from_bytes(value).expect("a header value"),
        );
    }
    let req = req
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("request");
    let res = h.client.request(req).await.expect("an answer");
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let body = res.into_body().collect().await.expect("body").to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

#[tokio::test(start_paused = true)]
async fn idempotency_a_tenant_id_is_opaque_bytes_and_never_shares_the_unnamed_space() {
    let h = start(Reply::openai_text("each"), down(), IDEMPOTENT).await;
    let key: (&str, &[u8]) = ("idempotency-key", b"k1");
    // UTF-8, Latin-1, ASCII and no tenant at all: four scopes.
    let tenants: [&[(&str, &[u8])]; 4] = [
        &[key, ("x-tenant-id", "café-lyon".as_bytes())],
        &[key, ("x-tenant-id", b"caf\xe9-lyon")],
        &[key, ("x-tenant-id", b"acme")],
        &[key],
    ];
    for headers in tenants {
        let a = send_raw(&h, HELLO, headers).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(
            a.headers.get("idempotent-replayed").is_none(),
            "{headers:?}"
        );
    }
    assert_eq!(h.primary.received().len(), 4);
    // Each tenant gets its own answer back.
    for headers in tenants {
        let a = send_raw(&h, HELLO, headers).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert_eq!(a.header("idempotent-replayed"), "true", "{headers:?}");
    }
    assert_eq!(h.primary.received().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn idempotency_off_the_key_header_is_ignored_whatever_it_holds() {
    let h = start(Reply::openai_text("each"), down(), "").await;
    for _ in 0..2 {
        let a = send_raw(&h, HELLO, &[("idempotency-key", b"caf\xc3\xa9")]).await;
        assert_eq!(a.status, 200, "{}", a.body);
        assert!(a.headers.get("idempotent-replayed").is_none());
    }
    assert_eq!(h.primary.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn idempotency_a_duplicate_in_flight_is_409_with_reject() {
    let h = start(
        Reply::openai_text("slow").after(Duration::from_millis(500)),
        down(),
        "[idempotency]\nconcurrent = \"reject\"",
    )
    .await;
    let key = [("idempotency-key", "order-7")];
    let (first, second) =
        tokio::join!(h.send("POST", "/v1/chat/completions", HELLO, &key), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            h.send("POST", "/v1/chat/completions", HELLO, &key).await
        });
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(second.status, 409, "{}", second.body);
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn idempotency_a_key_that_is_not_text_is_400() {
    let h = start(Reply::openai_text("never"), down(), IDEMPOTENT).await;
    let req = http::Request::post(format!("{}/v1/chat/completions", h.url))
        .header("content-type", "application/json")
        .header(
            "idempotency-key",
            http::HeaderValue::from_bytes(b"caf\xc3\xa9").expect("a header value"),
        )
        .body(Full::new(Bytes::from_static(HELLO.as_bytes())))
        .expect("request");
    let res = h.client.request(req).await.expect("an answer");
    assert_eq!(res.status(), 400);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(json["error"]["code"], "invalid_idempotency_key");
    assert!(h.primary.received().is_empty());
}

/// The text of an OpenAI SSE body: every chunk's content, joined.
fn streamed_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn idempotency_a_stream_is_replayed_as_a_stream() {
    let h = start(Reply::openai_stream(&["Hel", "lo"]), down(), IDEMPOTENT).await;
    let key = [("idempotency-key", "stream-1")];
    let first = h
        .send("POST", "/v1/chat/completions", HELLO_STREAM, &key)
        .await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(streamed_text(&first.body), "Hello");
    assert!(first.headers.get("idempotent-replayed").is_none());
    let again = h
        .send("POST", "/v1/chat/completions", HELLO_STREAM, &key)
        .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.header("content-type"), "text/event-stream");
    assert_eq!(again.header("idempotent-replayed"), "true");
    assert_eq!(streamed_text(&again.body), "Hello");
    assert!(again.body.ends_with("data: [DONE]\n\n"), "{}", again.body);
    assert_eq!(h.primary.received().len(), 1);
    // The replay keeps the records of the call that produced it, as a
    // unary replay does.
    for name in ["x-llm-provider", "x-llm-model-used", "x-llm-attempts"] {
        assert_eq!(again.header(name), first.header(name), "{name}");
    }
    assert_eq!(again.header("x-llm-provider"), "primary");
    assert_eq!(again.header("x-llm-model-used"), "gpt-4o-mini");
    assert_eq!(again.header("x-llm-attempts"), "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_shared_an_answer_through_one_gateway_is_replayed_by_the_other() {
    let Some(redis) = RedisServer::start("idempotency_shared") else {
        return;
    };
    let shared = format!(
        "[idempotency]\n[idempotency_shared]\nredis = \"{}\"",
        redis.url()
    );
    let a = start_text(Reply::openai_text("once"), down(), |p, _| {
        one_link(&p.url(), &shared)
    })
    .await;
    let upstream = a.primary.url();
    // B is in front of A's upstream (its own mocks are never called).
    let b = start_text(down(), down(), |_, _| one_link(&upstream, &shared)).await;
    let key = [("idempotency-key", "order-42")];
    let first = a.send("POST", "/v1/chat/completions", HELLO, &key).await;
    assert_eq!(first.status, 200, "{}", first.body);
    // The answer is stored in Redis in the background: once A replays it
    // (A asks Redis too), B must, without an upstream call.
    let stored = poll(Duration::from_secs(5), || async {
        let again = a.send("POST", "/v1/chat/completions", HELLO, &key).await;
        again.header("idempotent-replayed") == "true"
    })
    .await;
    assert!(stored, "A never replayed its own answer");
    let again = b.send("POST", "/v1/chat/completions", HELLO, &key).await;
    assert_eq!(
        again.header("idempotent-replayed"),
        "true",
        "{}",
        again.body
    );
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(body_of(&again), body_of(&first));
    assert_eq!(a.primary.received().len(), 1, "one upstream call for both");
    // Another request with the key is refused on either replica.
    let other = r#"{"model": "smart", "messages": [{"role": "user", "content": "Other"}]}"#;
    let refused = b.send("POST", "/v1/chat/completions", other, &key).await;
    assert_eq!(refused.status, 422, "{}", refused.body);
}

/// The usual two-link policy with a 20 s deadline and 2 s attempts, and
/// `failover_on_timeout` as given.
fn silent_primary_policy(failover: bool) -> impl FnOnce(&MockServer, &MockServer) -> String {
    move |p, b| {
        policy_text(p, b, "", FULL_CHAIN)
            .replace("total_ms = 2000", "total_ms = 20000")
            .replace(
                "attempt_timeout_ms = 2000",
                &format!("attempt_timeout_ms = 2000\n        failover_on_timeout = {failover}"),
            )
    }
}

#[tokio::test(start_paused = true)]
async fn failover_on_timeout_a_silent_primary_costs_one_attempt_timeout() {
    let silent = Reply::openai_text("never").after(Duration::from_secs(3600));
    let h = start_text(
        silent,
        Reply::anthropic_text("backup"),
        silent_primary_policy(true),
    )
    .await;
    let start = tokio::time::Instant::now();
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(a.header("x-llm-attempts"), "2");
    assert_eq!(h.primary.received().len(), 1);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_millis(2_100),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn without_failover_on_timeout_a_silent_primary_is_tried_three_times_first() {
    let silent = Reply::openai_text("never").after(Duration::from_secs(3600));
    let h = start_text(
        silent,
        Reply::anthropic_text("backup"),
        silent_primary_policy(false),
    )
    .await;
    let start = tokio::time::Instant::now();
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(h.primary.received().len(), 3);
    // Three 2 s attempts and two backoffs (100 and 200 ms).
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(6_300) && took < Duration::from_millis(6_400),
        "{took:?}"
    );
}

/// Answers every call after 300 ms: a stream to a streaming request, a
/// unary answer to the others.
fn slow_either(req: &tower_llm_providers::mock::Recorded) -> Reply {
    let body = String::from_utf8_lossy(&req.body);
    let reply = if body.contains("\"stream\":true") {
        Reply::openai_stream(&["slow"])
    } else {
        Reply::openai_text("slow")
    };
    reply.after(Duration::from_millis(300))
}

#[tokio::test(start_paused = true)]
async fn hedge_one_budget_per_link_for_its_unary_and_streamed_calls() {
    let text = |p: &MockServer, _: &MockServer| {
        one_link(&p.url(), "").replace(
            "chain = [",
            "hedge = { delay_ms = 100, min_useful_ms = 100, budget_ratio = 0.1, budget_min_per_sec = 1 }\n        chain = [",
        )
    };
    let h = start_text(Reply::With(slow_either), down(), text).await;
    // 30 unary and 30 streamed slow calls at once: the link's budget of
    // max(10 % of 60, 1/s over 10 s) = 10 hedges is one, not one per kind.
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..60_usize {
        let (client, url) = (h.client.clone(), format!("{}/v1/chat/completions", h.url));
        let body = if i % 2 == 0 { HELLO } else { HELLO_STREAM };
        calls.spawn(async move {
            let req = http::Request::post(url)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from_static(body.as_bytes())))
                .expect("request");
            let res = client.request(req).await.expect("an answer");
            assert_eq!(res.status(), 200);
            res.into_body().collect().await.expect("body");
        });
    }
    while let Some(done) = calls.join_next().await {
        done.expect("a call");
    }
    assert_eq!(h.primary.received().len(), 60 + 10);
    // A reload with the same hedge keeps the spent budget: ten more slow
    // calls within the window are not hedged.
    let policy = h.gateway.policy();
    h.gateway.reload(policy).expect("reloaded");
    for _ in 0..10 {
        assert_eq!(h.chat(HELLO).await.status, 200);
    }
    assert_eq!(h.primary.received().len(), 70 + 10);
}

#[tokio::test(start_paused = true)]
async fn hedge_a_slow_primary_is_hedged_onto_the_next_link() {
    let slow = Reply::openai_text("slow").after(Duration::from_secs(5));
    let h = start_text(slow, Reply::anthropic_text("from the backup"), |p, b| {
        policy_text(p, b, "", FULL_CHAIN)
            .replace("total_ms = 2000", "total_ms = 10000")
            .replace("attempt_timeout_ms = 2000", "attempt_timeout_ms = 8000")
            .replace(
                "chain = [",
                "hedge = { delay_ms = 100, min_useful_ms = 100 }\n        hedge_to = \"next\"\n        chain = [",
            )
    })
    .await;
    let start = tokio::time::Instant::now();
    let a = h.chat(HELLO).await;
    assert_eq!(a.status, 200, "{}", a.body);
    assert_eq!(
        a.json()["choices"][0]["message"]["content"],
        "from the backup"
    );
    assert_eq!(a.header("x-llm-hedged"), "true");
    assert_eq!(a.header("x-llm-provider"), "backup");
    assert_eq!(a.header("x-llm-model-used"), "claude-x");
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_millis(200),
        "{took:?}"
    );
    assert_eq!(h.primary.received().len(), 1);
    let sent = h.backup.received();
    assert_eq!(sent.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&sent[0].body).expect("json");
    assert_eq!(
        body["model"], "claude-x",
        "the hedge asks for the target's model"
    );
}

#[test]
fn hedge_to_is_checked_with_the_policy() {
    let text = |chain: &str, route: &str| {
        format!(
            r#"
            [[providers]]
            name = "a"
            kind = "openai"
            api_key_env = "A_KEY"
            [[providers]]
            name = "b"
            kind = "openai"
            api_key_env = "B_KEY"
            [[routes]]
            model = "smart"
            {route}
            chain = {chain}
            "#
        )
    };
    let refused = |chain: &str, route: &str| {
        Policy::from_toml(&text(chain, route))
            .expect_err("refused")
            .to_string()
    };
    let e = refused(
        r#"[{ provider = "a", model = "m" }, { provider = "b", model = "m", hedge_to = "next" }]"#,
        "hedge = { delay_ms = 100 }",
    );
    assert!(e.contains("hedge_to = \"next\" on the last link"), "{e}");
    let e = refused(
        r#"[{ provider = "a", model = "m", hedge_to = { provider = "c", model = "m" } }]"#,
        "hedge = { delay_ms = 100 }",
    );
    assert!(e.contains("hedge_to: unknown provider \"c\""), "{e}");
    let e = refused(
        r#"[{ provider = "a", model = "m", hedge_to = "next" }, { provider = "b", model = "m" }]"#,
        "",
    );
    assert!(e.contains("hedge_to needs a hedge"), "{e}");
    let e = refused(
        r#"[{ provider = "a", model = "m" }]"#,
        "hedge = { delay_ms = 100 }\nhedge_to = \"elsewhere\"",
    );
    assert!(e.contains("hedge_to must be"), "{e}");
    // A route's "next": the last link hedges to itself.
    Policy::from_toml(&text(
        r#"[{ provider = "a", model = "m" }, { provider = "b", model = "m" }]"#,
        "hedge = { delay_ms = 100 }\nhedge_to = \"next\"",
    ))
    .expect("valid");
}
