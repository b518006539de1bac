//! Provider wire formats: the shared fixtures, error classification, bad
//! input, and real HTTP over loopback.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_llm_core::{ChatRequest, FailureClass, FinishReason, Message, Usage};
use tower_llm_providers::{
    Anthropic, AnthropicConfig, ApiKey, OpenAi, OpenAiConfig, RequestBody, anthropic, openai,
};

mod common;
use common::{fixture, headers};

#[test]
fn openai_fixtures_normalise() {
    let r = openai::decode(&fixture("openai_chat_completion.json"), Duration::ZERO).expect("ok");
    assert_eq!(r.id, "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT");
    assert_eq!(r.model, "gpt-5.4");
    assert_eq!(r.provider.as_ref(), "openai");
    assert_eq!(r.text(), "Hello! How can I assist you today?");
    assert_eq!(r.finish_reason(), Some(FinishReason::Stop));
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 19,
            completion_tokens: 10,
            cached_input_tokens: 0
        }
    );

    let r = openai::decode(
        &fixture("openai_chat_completion_tool_calls.json"),
        Duration::ZERO,
    )
    .expect("ok");
    assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
    assert_eq!(r.text(), "");
    let call = &r.choices[0].tool_calls[0];
    assert_eq!(call.id, "call_CUdUoJpsWWVdxXntucvnol1M");
    assert_eq!(call.name, "get_weather");
    assert_eq!(call.arguments, r#"{"city":"San Francisco","state":"CA"}"#);
}

#[test]
fn anthropic_fixtures_normalise() {
    let r = anthropic::decode(&fixture("anthropic_message.json"), Duration::ZERO).expect("ok");
    assert_eq!(r.model, "claude-haiku-4-5-20251001");
    assert_eq!(r.text(), "Hello!");
    assert_eq!(r.finish_reason(), Some(FinishReason::Stop));
    // 12 uncached + 2048 read from the cache + 0 written to it.
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 2060,
            completion_tokens: 5,
            cached_input_tokens: 2048
        }
    );
    let r =
        anthropic::decode(&fixture("anthropic_message_tool_use.json"), Duration::ZERO).expect("ok");
    assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
    let call = &r.choices[0].tool_calls[0];
    assert!(!call.id.is_empty());
    let args: serde_json::Value = serde_json::from_str(&call.arguments).expect("JSON arguments");
    assert!(args.is_object());
}

#[test]
fn seed_ac15_the_same_answer_normalises_equal_across_shapes() {
    let openai_body = br#"{"id":"a","object":"chat.completion","model":"m","choices":[
        {"index":0,"message":{"role":"assistant","content":"Hi there"},"finish_reason":"length"}],
        "usage":{"prompt_tokens":30,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":20}}}"#;
    let anthropic_body = br#"{"id":"b","type":"message","role":"assistant","model":"m",
        "content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}],
        "stop_reason":"max_tokens","stop_sequence":null,
        "usage":{"input_tokens":10,"cache_read_input_tokens":20,"cache_creation_input_tokens":0,"output_tokens":7}}"#;
    let mut a = openai::decode(openai_body, Duration::from_millis(5)).expect("openai");
    let mut b = anthropic::decode(anthropic_body, Duration::from_millis(9)).expect("anthropic");
    // Modulo id, latency and who served.
    for r in [&mut a, &mut b] {
        r.id.clear();
        r.latency = Duration::ZERO;
        r.provider = "".into();
    }
    assert_eq!(a, b);
}

fn class(f: tower_llm_core::Failure) -> (FailureClass, Option<Duration>, Option<u16>) {
    (
        f.class(),
        f.retry_after(),
        f.http_status().map(|s| s.as_u16()),
    )
}

#[test]
fn openai_errors_are_classified_from_status_headers_and_body() {
    let s = |c| StatusCode::from_u16(c).expect("status");
    let none = HeaderMap::new();
    let limited = openai::decode_error(
        s(429),
        &headers("openai_error_rate_limit.headers"),
        &fixture("openai_error_rate_limit.json"),
    );
    assert_eq!(
        class(limited),
        (
            FailureClass::RateLimited,
            Some(Duration::from_secs(10)),
            Some(429)
        )
    );
    let quota = openai::decode_error(
        s(429),
        &none,
        &fixture("openai_error_insufficient_quota.json"),
    );
    assert!(quota.is_quota_exhausted());
    assert!(
        quota
            .message()
            .is_some_and(|m| m.contains("exceeded your current quota"))
    );
    let context = openai::decode_error(s(400), &none, &fixture("openai_error_context_length.json"));
    assert!(context.is_context_window_exceeded());
    let auth = openai::decode_error(s(401), &none, &fixture("openai_error_invalid_api_key.json"));
    assert!(auth.is_auth());
    assert!(
        openai::decode_error(s(500), &none, &fixture("openai_error_server.json")).is_transient()
    );
    assert!(
        openai::decode_error(s(503), &none, &fixture("openai_error_server_503.json"))
            .is_transient()
    );
}

#[test]
fn anthropic_errors_are_classified_from_status_headers_and_body() {
    let s = |c| StatusCode::from_u16(c).expect("status");
    let none = HeaderMap::new();
    let overloaded = anthropic::decode_error(
        s(529),
        &headers("anthropic_error_overloaded_529.headers"),
        &fixture("anthropic_error_overloaded_529.json"),
    );
    assert!(overloaded.is_transient());
    assert_eq!(overloaded.should_retry(), Some(true));
    assert_eq!(overloaded.message(), Some("Overloaded"));
    let limited = anthropic::decode_error(
        s(429),
        &headers("anthropic_error_rate_limit_429.headers"),
        &fixture("anthropic_error_rate_limit_429.json"),
    );
    assert_eq!(
        class(limited),
        (
            FailureClass::RateLimited,
            Some(Duration::from_secs(12)),
            Some(429)
        )
    );
    let long = anthropic::decode_error(
        s(400),
        &none,
        &fixture("anthropic_error_prompt_too_long_400.json"),
    );
    assert!(long.is_context_window_exceeded());
    let bad = anthropic::decode_error(
        s(400),
        &none,
        &fixture("anthropic_error_invalid_request_400.json"),
    );
    assert!(bad.is_bad_request());
    let auth = anthropic::decode_error(
        s(401),
        &none,
        &fixture("anthropic_error_authentication_401.json"),
    );
    assert!(auth.is_auth());
    let spend = anthropic::decode_error(
        s(400),
        &none,
        br#"{"type":"error","error":{"type":"invalid_request_error","message":"Your credit balance is too low to access the Anthropic API."}}"#,
    );
    assert!(spend.is_quota_exhausted());
}

#[test]
fn bad_input_gets_a_clear_failure_and_no_panic() {
    let s = |c| StatusCode::from_u16(c).expect("status");
    let none = HeaderMap::new();
    for body in [&b"{not json"[..], b"", b"null", b"[]", b"{\"id\":1}"] {
        assert!(
            openai::decode(body, Duration::ZERO)
                .expect_err("bad")
                .is_invalid_response()
        );
        assert!(
            anthropic::decode(body, Duration::ZERO)
                .expect_err("bad")
                .is_invalid_response()
        );
    }
    let missing =
        openai::decode(br#"{"id":"x","model":"m"}"#, Duration::ZERO).expect_err("no choices");
    assert!(missing.to_string().contains("choices"), "{missing}");
    let empty = openai::decode(br#"{"id":"x","model":"m","choices":[]}"#, Duration::ZERO)
        .expect_err("empty choices");
    assert!(empty.to_string().contains("choices"), "{empty}");
    let missing = anthropic::decode(
        br#"{"id":"x","model":"m","usage":{"input_tokens":1,"output_tokens":1}}"#,
        Duration::ZERO,
    )
    .expect_err("no content");
    assert!(missing.to_string().contains("content"), "{missing}");
    // Truncated JSON.
    let full = fixture("openai_chat_completion.json");
    assert!(openai::decode(&full[..full.len() / 2], Duration::ZERO).is_err());
    // Unknown statuses and garbage bodies and headers.
    assert!(openai::decode_error(s(418), &none, b"<html>teapot</html>").is_bad_request());
    assert!(anthropic::decode_error(s(599), &none, b"\xff\xfe").is_transient());
    let mut h = HeaderMap::new();
    h.insert("retry-after", "soon".parse().expect("value"));
    assert_eq!(openai::decode_error(s(429), &h, b"").retry_after(), None);
    h.insert(
        "retry-after",
        "Wed, 21 Oct 2015 07:28:00 GMT".parse().expect("value"),
    );
    assert_eq!(
        openai::decode_error(s(429), &h, b"").retry_after(),
        Some(Duration::ZERO)
    );
    // A long provider message is bounded.
    let long = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(10_000));
    let f = openai::decode_error(s(500), &none, long.as_bytes());
    assert!(
        f.message()
            .is_some_and(|m| m.len() <= tower_llm_providers::MAX_MESSAGE + 3)
    );
}

proptest::proptest! {
    #[test]
    fn any_body_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512), status in 100u16..1000) {
        let _ = openai::decode(&body, Duration::ZERO);
        let _ = anthropic::decode(&body, Duration::ZERO);
        if let Ok(s) = StatusCode::from_u16(status) {
            let _ = openai::decode_error(s, &HeaderMap::new(), &body);
            let _ = anthropic::decode_error(s, &HeaderMap::new(), &body);
        }
    }
}

/// A loopback server answering every request with `status` and `body`,
/// after checking it with `check`.
async fn server(
    status: u16,
    body: Vec<u8>,
    check: fn(&http::Request<Incoming>) -> bool,
) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: http::Request<Incoming>| {
                    let status = if check(&req) { status } else { 418 };
                    let body = body.clone();
                    async move {
                        Ok::<_, Infallible>(
                            http::Response::builder()
                                .status(status)
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .expect("response"),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, RequestBody> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn chat() -> ChatRequest {
    ChatRequest::new(
        "m",
        vec![Message::system("Be brief."), Message::user("Say hello")],
    )
}

#[tokio::test(start_paused = true)]
async fn openai_over_real_http() {
    let addr = server(200, fixture("openai_chat_completion.json"), |req| {
        req.uri().path() == "/v1/chat/completions"
            && req
                .headers()
                .get("authorization")
                .is_some_and(|v| v == "Bearer sk-test")
    })
    .await;
    let svc = OpenAi::new(
        client(),
        OpenAiConfig::new(ApiKey::new("sk-test")).with_base_url(&format!("http://{addr}/v1")),
    );
    let res = svc.oneshot(chat()).await.expect("ok");
    assert_eq!(res.text(), "Hello! How can I assist you today?");
}

#[tokio::test(start_paused = true)]
async fn anthropic_over_real_http() {
    let addr = server(200, fixture("anthropic_message.json"), |req| {
        req.uri().path() == "/v1/messages"
            && req
                .headers()
                .get("x-api-key")
                .is_some_and(|v| v == "sk-ant-test")
            && req
                .headers()
                .get("anthropic-version")
                .is_some_and(|v| v == "2023-06-01")
    })
    .await;
    let svc = Anthropic::new(
        client(),
        AnthropicConfig::new(ApiKey::new("sk-ant-test")).with_base_url(&format!("http://{addr}")),
    );
    let res = svc.oneshot(chat()).await.expect("ok");
    assert_eq!(res.text(), "Hello!");
}

#[tokio::test(start_paused = true)]
async fn http_errors_bodies_and_connections() {
    // A classified error answer, with the key kept out of the failure.
    let addr = server(429, fixture("openai_error_insufficient_quota.json"), |_| {
        true
    })
    .await;
    let svc = OpenAi::new(
        client(),
        OpenAiConfig::new(ApiKey::new("sk-secret-123")).with_base_url(&format!("http://{addr}/v1")),
    );
    let err = svc.clone().oneshot(chat()).await.expect_err("quota");
    assert!(err.is_quota_exhausted());
    assert_eq!(err.provider(), Some("openai"));
    assert!(!format!("{err:?} {err}").contains("sk-secret-123"));
    assert!(!format!("{svc:?}").contains("sk-secret-123"));

    // A body over the cap.
    let addr = server(200, vec![b' '; 64 * 1024], |_| true).await;
    let svc = OpenAi::new(
        client(),
        OpenAiConfig::new(ApiKey::new("k"))
            .with_base_url(&format!("http://{addr}/v1"))
            .with_max_body(1024),
    );
    assert!(
        svc.oneshot(chat())
            .await
            .expect_err("too big")
            .is_invalid_response()
    );

    // Nobody listening.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind")
        .local_addr()
        .expect("addr");
    let svc = OpenAi::new(
        client(),
        OpenAiConfig::new(ApiKey::new("k")).with_base_url(&format!("http://{addr}/v1")),
    );
    assert!(
        svc.oneshot(chat())
            .await
            .expect_err("refused")
            .is_transient()
    );

    // The connection resets mid-body.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        if let Ok((mut stream, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut stream, &mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n{\"id\":")
                .await;
            // Dropped here: the body breaks off.
        }
    });
    let svc = OpenAi::new(
        client(),
        OpenAiConfig::new(ApiKey::new("k")).with_base_url(&format!("http://{addr}/v1")),
    );
    assert!(svc.oneshot(chat()).await.expect_err("reset").is_transient());
}

#[test]
fn embeddings_normalise_in_input_order() {
    let body = br#"{"object":"list","model":"text-embedding-3-small","data":[
        {"object":"embedding","index":1,"embedding":[0.5,-1.0]},
        {"object":"embedding","index":0,"embedding":[0.25,0.75]}],
        "usage":{"prompt_tokens":4,"total_tokens":4}}"#;
    let r = openai::decode_embeddings(body, Duration::ZERO).expect("ok");
    assert_eq!(r.embeddings, vec![vec![0.25, 0.75], vec![0.5, -1.0]]);
    assert_eq!(r.prompt_tokens, 4);
    let dup = br#"{"model":"m","data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}]}"#;
    assert!(
        openai::decode_embeddings(dup, Duration::ZERO)
            .expect_err("dup")
            .is_invalid_response()
    );
    let gap = br#"{"model":"m","data":[{"index":5,"embedding":[1]}]}"#;
    assert!(openai::decode_embeddings(gap, Duration::ZERO).is_err());
}

#[tokio::test(start_paused = true)]
async fn embeddings_over_real_http_behind_the_retry_layer() {
    let addr = server(
        200,
        br#"{"model":"text-embedding-3-small","data":[{"index":0,"embedding":[0.1,0.2,0.3]}],"usage":{"prompt_tokens":2}}"#.to_vec(),
        |req| req.uri().path() == "/v1/embeddings",
    )
    .await;
    let svc = tower::ServiceBuilder::new()
        .layer(tower_llm_retry_layer())
        .service(tower_llm_providers::OpenAiEmbeddings::new(
            client(),
            OpenAiConfig::new(ApiKey::new("k")).with_base_url(&format!("http://{addr}/v1")),
        ));
    let res = svc
        .oneshot(tower_llm_core::EmbeddingRequest::new(
            "text-embedding-3-small",
            vec!["hi".into()],
        ))
        .await
        .expect("ok");
    assert_eq!(res.embeddings, vec![vec![0.1, 0.2, 0.3]]);
    assert_eq!(res.attempts.len(), 1);
}

fn tower_llm_retry_layer() -> tower_llm_retry::RetryLayer {
    tower_llm_retry::RetryLayer::new()
}

/// A fixture with `from` replaced by `to` (exactly once).
fn patched(name: &str, from: &str, to: &str) -> Vec<u8> {
    let text = String::from_utf8(fixture(name)).expect("utf-8");
    assert_eq!(text.matches(from).count(), 1, "{name}: {from}");
    text.replacen(from, to, 1).into_bytes()
}

/// Row 7, the content-filter table: a refusal *before* generation is an
/// error answer and a failure (`content_filtered`, opt-in failover); a
/// filter that *stops* a generation is a 200 with a finish reason (the
/// answer, possibly partial, is the caller's to judge).
#[test]
fn content_filter_openai_error_is_a_failure_finish_reason_is_a_finish_reason() {
    // OpenAI (and Azure OpenAI): a 400 whose code is `content_filter`
    // (or `content_policy_violation`) is a failure.
    for code in ["content_filter", "content_policy_violation"] {
        let body = patched(
            "openai_error_context_length.json",
            "\"context_length_exceeded\"",
            &format!("\"{code}\""),
        );
        // The fixture's message speaks of the context length; only the
        // code may decide here.
        let body = String::from_utf8(body)
            .expect("utf-8")
            .replace("maximum context length", "content management policy");
        let f = openai::decode_error(StatusCode::BAD_REQUEST, &HeaderMap::new(), body.as_bytes());
        assert_eq!(f.class(), FailureClass::ContentFiltered, "{code}");
        assert!(f.is_content_filtered());
    }
    // `finish_reason: content_filter` on a 200: the answer, finished by
    // the filter.
    let body = patched(
        "openai_chat_completion.json",
        "\"finish_reason\": \"stop\"",
        "\"finish_reason\": \"content_filter\"",
    );
    let r = openai::decode(&body, Duration::ZERO).expect("an answer");
    assert_eq!(r.finish_reason(), Some(FinishReason::ContentFilter));
    assert_eq!(r.text(), "Hello! How can I assist you today?");
}

#[test]
fn content_filter_anthropic_refusal_is_a_finish_reason() {
    let body = patched(
        "anthropic_message.json",
        "\"stop_reason\": \"end_turn\"",
        "\"stop_reason\": \"refusal\"",
    );
    let r = anthropic::decode(&body, Duration::ZERO).expect("an answer");
    assert_eq!(r.finish_reason(), Some(FinishReason::ContentFilter));
}

#[test]
fn content_filter_bedrock_stop_reasons_are_finish_reasons() {
    for reason in ["guardrail_intervened", "content_filtered"] {
        let body = patched(
            "bedrock_converse_response.json",
            "\"stopReason\":\"max_tokens\"",
            &format!("\"stopReason\":\"{reason}\""),
        );
        let r = tower_llm_providers::bedrock::decode(&body, "req-1", "m", Duration::ZERO)
            .expect("an answer");
        assert_eq!(
            r.finish_reason(),
            Some(FinishReason::ContentFilter),
            "{reason}"
        );
    }
}
