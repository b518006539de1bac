//! The bad-input table over real loopback HTTP with `MockServer`, and the
//! providers behind the retry layer with scripted faults.

use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tower::ServiceExt;
use tower_llm_core::{ChatRequest, FailureClass, Message};
use tower_llm_providers::mock::{MockServer, Reply, ScriptedTransport};
use tower_llm_providers::{Anthropic, AnthropicConfig, ApiKey, OpenAi, OpenAiConfig, RequestBody};

fn chat() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("hi")])
}

fn openai(
    server: &MockServer,
) -> OpenAi<Client<hyper_util::client::legacy::connect::HttpConnector, RequestBody>> {
    let client = Client::builder(TokioExecutor::new()).build_http();
    OpenAi::new(
        client,
        OpenAiConfig::new(ApiKey::new("sk-mock")).with_base_url(&format!("{}/v1", server.url())),
    )
}

#[tokio::test(start_paused = true)]
async fn the_bad_input_table_over_real_http() {
    let server = MockServer::start(Reply::openai_text("fine"))
        .await
        .expect("server");
    let cases: Vec<(Reply, FailureClass)> = vec![
        (Reply::malformed(), FailureClass::InvalidResponse),
        (
            Reply::json(200, r#"{"id":"x","model":"m"}"#),
            FailureClass::InvalidResponse,
        ),
        (
            Reply::Truncated {
                sent: "{\"id\":\"x\",".into(),
            },
            FailureClass::Transient,
        ),
        (
            Reply::Oversized {
                len: 100 * 1024 * 1024,
            },
            FailureClass::InvalidResponse,
        ),
        (Reply::Reset, FailureClass::Transient),
        (Reply::json(418, "I'm a teapot"), FailureClass::BadRequest),
        (Reply::json(599, ""), FailureClass::Transient),
        (
            Reply::json(429, "{}").with_header("retry-after", "soon"),
            FailureClass::RateLimited,
        ),
        (
            Reply::openai_error(429, "insufficient_quota", "quota"),
            FailureClass::QuotaExhausted,
        ),
    ];
    for (reply, class) in cases {
        let label = format!("{reply:?}").chars().take(60).collect::<String>();
        server.push(reply);
        let err = openai(&server).oneshot(chat()).await.expect_err(&label);
        assert_eq!(err.class(), class, "{label}: {err}");
        assert_eq!(err.provider(), Some("openai"), "{label}");
    }
    // Garbage Retry-After is ignored, not an error.
    server.push(Reply::json(429, "{}").with_header("retry-after", "soon"));
    assert_eq!(
        openai(&server)
            .oneshot(chat())
            .await
            .expect_err("429")
            .retry_after(),
        None
    );
    // And the server still serves, recording every request with its headers.
    assert_eq!(
        openai(&server).oneshot(chat()).await.expect("ok").text(),
        "fine"
    );
    let received = server.received();
    assert_eq!(received.len(), 11);
    assert!(received.iter().all(|r| r.path == "/v1/chat/completions"));
    assert_eq!(received[0].headers["authorization"], "Bearer sk-mock");
    let body: serde_json::Value = serde_json::from_slice(&received[0].body).expect("json body");
    assert_eq!(body["messages"][0]["content"], "hi");
}

#[tokio::test(start_paused = true)]
async fn anthropic_against_the_mock_server() {
    let server = MockServer::start(Reply::anthropic_text("bonjour"))
        .await
        .expect("server");
    server.push(
        Reply::json(
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
        )
        .with_header("x-should-retry", "true"),
    );
    let client = Client::builder(TokioExecutor::new()).build_http();
    let svc = Anthropic::new(
        client,
        AnthropicConfig::new(ApiKey::new("sk-ant")).with_base_url(&server.url()),
    );
    let err = svc.clone().oneshot(chat()).await.expect_err("overloaded");
    assert!(err.is_transient());
    assert_eq!(err.should_retry(), Some(true));
    assert_eq!(svc.oneshot(chat()).await.expect("ok").text(), "bonjour");
    assert_eq!(server.received()[1].headers["x-api-key"], "sk-ant");
}

#[tokio::test(start_paused = true)]
async fn scripted_faults_behind_the_retry_layer_on_virtual_time() {
    let transport = ScriptedTransport::new(Reply::openai_text("made it"))
        .then(Reply::Hang)
        .then(Reply::json(503, "{}").after(Duration::from_millis(300)));
    let provider = OpenAi::new(transport.clone(), OpenAiConfig::new(ApiKey::new("k")));
    let retry = tower_llm_retry::RetryLayer::new()
        .with_attempt_timeout(Duration::from_secs(2))
        .with_rng(tower_llm_retry::FixedFraction(0.5))
        .with_max_attempts(3);
    let svc = tower::Layer::layer(&retry, provider);
    let start = Instant::now();
    let res = svc.oneshot(chat()).await.expect("third attempt");
    assert_eq!(res.text(), "made it");
    // 2 s (hung attempt) + 200 ms + 300 ms (slow 503) + 800 ms.
    assert_eq!(start.elapsed(), Duration::from_millis(3300));
    assert_eq!(transport.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn sse_replies_carry_the_event_stream_content_type() {
    let server = MockServer::start(Reply::Sse(vec![
        "data: {\"x\":1}\n\n".into(),
        "data: [DONE]\n\n".into(),
    ]))
    .await
    .expect("server");
    let client: Client<_, RequestBody> = Client::builder(TokioExecutor::new()).build_http();
    let res = client
        .request(
            http::Request::post(format!("{}/v1/chat/completions", server.url()))
                .body(RequestBody::new("{}".into()))
                .expect("request"),
        )
        .await
        .expect("response");
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let body = http_body_util::BodyExt::collect(res.into_body())
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(&body[..], b"data: {\"x\":1}\n\ndata: [DONE]\n\n");
}

#[tokio::test(start_paused = true)]
async fn the_default_transport_speaks_plain_http_to_local_servers() {
    let server = MockServer::start(Reply::openai_text("via the default transport"))
        .await
        .expect("server");
    let svc = OpenAi::new(
        tower_llm_providers::https::shared_client(),
        OpenAiConfig::new(ApiKey::new("k")).with_base_url(&format!("{}/v1", server.url())),
    );
    let res = svc.oneshot(chat()).await.expect("ok");
    assert_eq!(res.text(), "via the default transport");
    // A client with its own connect timeout and pool: a reset is a
    // transient failure.
    server.push(Reply::Reset);
    let svc = OpenAi::new(
        tower_llm_providers::https::client_with_connect_timeout(Duration::from_secs(1)),
        OpenAiConfig::new(ApiKey::new("k")).with_base_url(&format!("{}/v1", server.url())),
    );
    assert!(svc.oneshot(chat()).await.expect_err("reset").is_transient());
    assert_eq!(server.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn bedrock_round_trip_against_the_mock_server() {
    let body = r#"{"output":{"message":{"role":"assistant","content":[{"text":"hola"}]}},"stopReason":"end_turn","usage":{"inputTokens":3,"outputTokens":1,"totalTokens":4}}"#;
    let server = MockServer::start(Reply::json(200, body).with_header("x-amzn-RequestId", "r-1"))
        .await
        .expect("server");
    server.push(
        Reply::json(
            429,
            r#"{"message":"Too many tokens, please wait before trying again."}"#,
        )
        .with_header(
            "x-amzn-ErrorType",
            "ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/",
        ),
    );
    let client: Client<_, RequestBody> = Client::builder(TokioExecutor::new()).build_http();
    let svc = tower_llm_providers::Bedrock::new(
        client,
        tower_llm_providers::BedrockConfig::new(
            tower_llm_providers::AwsCredentials::new("AKIDEXAMPLE", "secret"),
            "us-east-1",
        )
        .with_endpoint(&server.url()),
    );
    let req = || ChatRequest::new("amazon.nova-micro-v1:0", vec![Message::user("hola")]);
    assert!(
        svc.clone()
            .oneshot(req())
            .await
            .expect_err("throttled")
            .is_rate_limited()
    );
    let res = svc.oneshot(req()).await.expect("ok");
    assert_eq!((res.id.as_str(), res.text()), ("r-1", "hola"));
    let received = server.received();
    assert_eq!(received[1].path, "/model/amazon.nova-micro-v1%3A0/converse");
    let auth = received[1].headers["authorization"]
        .to_str()
        .expect("ascii");
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/"),
        "{auth}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_scripted_provider_records_what_it_received() {
    let transport = ScriptedTransport::new(Reply::anthropic_text("ok"));
    let provider = transport.anthropic();
    provider
        .oneshot(ChatRequest::new(
            "claude",
            vec![Message::system("sys"), Message::user("u")],
        ))
        .await
        .expect("ok");
    let sent: serde_json::Value =
        serde_json::from_slice(&transport.received()[0].body).expect("json");
    assert_eq!(sent["system"], "sys");
    assert_eq!(sent["messages"][0]["content"][0]["text"], "u");
    assert_eq!(sent["max_tokens"], 4096);
}
