//! Bedrock Converse: fixtures, error classification, the SigV4 signature
//! checked against an independent computation, and real HTTP on loopback.

use std::convert::Infallible;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tower::ServiceExt;
use tower_llm_core::{ChatRequest, FailureClass, FinishReason, Message, Usage};
use tower_llm_providers::{AwsCredentials, Bedrock, BedrockConfig, RequestBody, bedrock};

mod common;
use common::{fixture, headers};

const MODEL: &str = "anthropic.claude-3-haiku-20240307-v1:0";

#[test]
fn converse_fixtures_normalise() {
    let r = bedrock::decode(
        &fixture("bedrock_converse_response.json"),
        "req-1",
        MODEL,
        Duration::ZERO,
    )
    .expect("ok");
    assert_eq!(r.id, "req-1");
    assert_eq!(r.model, MODEL);
    assert_eq!(r.provider.as_ref(), "bedrock");
    assert_eq!(r.text(), "I am happy to assist you today");
    assert_eq!(r.finish_reason(), Some(FinishReason::Length));
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 8,
            completion_tokens: 10,
            cached_input_tokens: 0
        }
    );

    let r = bedrock::decode(
        &fixture("bedrock_converse_response_prompt_caching.json"),
        "",
        MODEL,
        Duration::ZERO,
    )
    .expect("ok");
    // 4 uncached + 2701 cache reads + 0 cache writes; totalTokens was 2715.
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 2705,
            completion_tokens: 10,
            cached_input_tokens: 2701
        }
    );

    let r = bedrock::decode(
        &fixture("bedrock_converse_tool_use.json"),
        "",
        MODEL,
        Duration::ZERO,
    )
    .expect("ok");
    assert_eq!(r.finish_reason(), Some(FinishReason::ToolCalls));
    assert_eq!(r.choices[0].tool_calls.len(), 2);
    assert!(!r.text().is_empty());
}

#[test]
fn converse_errors_are_classified_by_error_type() {
    let s = |c| StatusCode::from_u16(c).expect("status");
    let cases = [
        ("throttling", 429, FailureClass::RateLimited),
        ("validation", 400, FailureClass::BadRequest),
        ("access_denied", 403, FailureClass::Auth),
        ("model_timeout", 408, FailureClass::Timeout),
        ("service_unavailable", 503, FailureClass::Transient),
    ];
    for (name, status, class) in cases {
        let f = bedrock::decode_error(
            s(status),
            &headers(&format!("bedrock_error_{name}.headers")),
            &fixture(&format!("bedrock_error_{name}.json")),
        );
        assert_eq!(f.class(), class, "{name}");
        assert_eq!(f.provider(), Some("bedrock"));
        assert!(f.message().is_some(), "{name}");
    }
    // The name may also come from the body; context-window validation.
    let f = bedrock::decode_error(
        s(400),
        &HeaderMap::new(),
        br#"{"__type":"com.amazon.coral.validate#ValidationException","message":"Input is too long for requested model."}"#,
    );
    assert!(f.is_context_window_exceeded());
    assert!(bedrock::decode_error(s(500), &HeaderMap::new(), b"\x00garbage").is_transient());
}

#[test]
fn seed_ac15_bedrock_shape_normalises_like_the_others() {
    let converse =
        br#"{"output":{"message":{"role":"assistant","content":[{"text":"Hi "},{"text":"there"}]}},
        "stopReason":"max_tokens","usage":{"inputTokens":10,"outputTokens":7,"totalTokens":37,
        "cacheReadInputTokens":20,"cacheWriteInputTokens":0}}"#;
    let openai_body =
        br#"{"id":"a","model":"m","choices":[{"index":0,"message":{"content":"Hi there"},
        "finish_reason":"length"}],"usage":{"prompt_tokens":30,"completion_tokens":7,
        "prompt_tokens_details":{"cached_tokens":20}}}"#;
    let mut a = bedrock::decode(converse, "x", "m", Duration::ZERO).expect("bedrock");
    let mut b = tower_llm_providers::openai::decode(openai_body, Duration::ZERO).expect("openai");
    for r in [&mut a, &mut b] {
        r.id.clear();
        r.provider = "".into();
    }
    assert_eq!(a, b);
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    mac.update(data.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// SigV4 computed by hand, step by step from the AWS documentation, to
/// check the signer against.
fn expected_authorization(body: &[u8], path: &str, amz_date: &str, secret: &str) -> String {
    let date = &amz_date[..8];
    let host = "bedrock-runtime.us-east-1.amazonaws.com";
    let canonical = format!(
        "POST\n{path}\n\ncontent-type:application/json\nhost:{host}\nx-amz-date:{amz_date}\n\ncontent-type;host;x-amz-date\n{}",
        hex(&Sha256::digest(body))
    );
    let scope = format!("{date}/us-east-1/bedrock/aws4_request");
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        hex(&Sha256::digest(canonical.as_bytes()))
    );
    let k_date = hmac(format!("AWS4{secret}").as_bytes(), date);
    let k_region = hmac(&k_date, "us-east-1");
    let k_service = hmac(&k_region, "bedrock");
    let k_signing = hmac(&k_service, "aws4_request");
    let signature = hex(&hmac(&k_signing, &to_sign));
    format!(
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{scope}, SignedHeaders=content-type;host;x-amz-date, Signature={signature}"
    )
}

#[tokio::test(start_paused = true)]
async fn the_sigv4_signature_matches_a_hand_computed_vector() {
    let secret = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
    // 2015-08-30T12:36:00Z, the AWS documentation's example instant.
    let time = UNIX_EPOCH + Duration::from_secs(1_440_938_160);
    let config = BedrockConfig::new(AwsCredentials::new("AKIDEXAMPLE", secret), "us-east-1")
        .with_fixed_time(time);
    let req = ChatRequest::new(MODEL, vec![Message::user("Hello")]).with_max_tokens(64);
    let signed = bedrock::signed_request(&config, &req).expect("signed");
    assert_eq!(
        signed.uri().to_string(),
        "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    );
    assert_eq!(signed.headers()["x-amz-date"], "20150830T123600Z");
    let body = signed.into_body().collect().await.expect("body").to_bytes();
    let signed = bedrock::signed_request(&config, &req).expect("signed again");
    // The canonical URI encodes the already-encoded path once more.
    let path = "/model/anthropic.claude-3-haiku-20240307-v1%253A0/converse";
    assert_eq!(
        signed.headers()["authorization"],
        expected_authorization(&body, path, "20150830T123600Z", secret).as_str()
    );
    let json: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(json["inferenceConfig"]["maxTokens"], 64);
    assert_eq!(json["messages"][0]["content"][0]["text"], "Hello");
    // The secret itself is never in a header or the debug output.
    assert!(signed.headers().values().all(|v| {
        !v.as_bytes()
            .windows(secret.len())
            .any(|w| w == secret.as_bytes())
    }));
    assert!(!format!("{config:?}").contains(secret));
}

#[test]
fn session_tokens_are_sent_and_image_urls_refused() {
    let config = BedrockConfig::new(
        AwsCredentials::new("AKIDEXAMPLE", "secret").with_session_token("token-123"),
        "us-east-1",
    );
    let req = ChatRequest::new(MODEL, vec![Message::user("Hello")]);
    let signed = bedrock::signed_request(&config, &req).expect("signed");
    assert_eq!(signed.headers()["x-amz-security-token"], "token-123");
    let mut with_image = req.clone();
    std::sync::Arc::make_mut(&mut with_image.messages)[0]
        .content
        .push(tower_llm_core::ContentPart::ImageUrl {
            url: "https://x/y.png".into(),
        });
    assert!(
        bedrock::signed_request(&config, &with_image)
            .expect_err("url")
            .is_bad_request()
    );
}

#[tokio::test(start_paused = true)]
async fn bedrock_over_real_http() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: http::Request<Incoming>| async move {
                    let signed = req.headers().get("authorization").is_some_and(|v| {
                        v.as_bytes()
                            .starts_with(b"AWS4-HMAC-SHA256 Credential=AKID")
                    });
                    let ok = signed && req.uri().path().ends_with("/converse");
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .status(if ok { 200 } else { 403 })
                            .header("x-amzn-RequestId", "req-42")
                            .body(Full::new(Bytes::from(fixture(
                                "bedrock_converse_response.json",
                            ))))
                            .expect("response"),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    let client: Client<_, RequestBody> = Client::builder(TokioExecutor::new()).build_http();
    let svc = Bedrock::new(
        client,
        BedrockConfig::new(AwsCredentials::new("AKIDEXAMPLE", "secret"), "us-east-1")
            .with_endpoint(&format!("http://{addr}")),
    );
    let res = svc
        .oneshot(ChatRequest::new(MODEL, vec![Message::user("hi")]))
        .await
        .expect("ok");
    assert_eq!(res.id, "req-42");
    assert_eq!(res.text(), "I am happy to assist you today");
}

proptest::proptest! {
    #[test]
    fn any_body_never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = bedrock::decode(&body, "", MODEL, Duration::ZERO);
        let _ = bedrock::decode_error(StatusCode::BAD_REQUEST, &HeaderMap::new(), &body);
    }
}
