//! Request encoding details the providers reject when wrong, and error
//! classification edge cases (from a review against the public APIs).

use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde_json::json;
use tower::ServiceExt;
use tower_llm_core::{
    ChatRequest, ContentPart, FinishReason, Message, Role, Tool, ToolCall, ToolChoice,
};
use tower_llm_providers::mock::{MockServer, Reply, ScriptedTransport};
use tower_llm_providers::{
    ApiKey, AwsCredentials, BedrockConfig, OpenAi, OpenAiConfig, anthropic, bedrock, openai,
};

/// An assistant turn with two parallel tool calls and their two results.
fn parallel_tools() -> ChatRequest {
    let call = |id: &str| ToolCall {
        id: id.into(),
        name: "get_weather".into(),
        arguments: String::new(),
    };
    let mut assistant = Message::assistant("");
    assistant.tool_calls = vec![call("a"), call("b")];
    let mut req = ChatRequest::new(
        "m",
        vec![
            Message::user("weather in Paris and Rome?"),
            assistant,
            Message::tool_result("a", "sunny"),
            Message::tool_result("b", "rain"),
            Message::user("thanks, and tomorrow?"),
        ],
    );
    req.tools = vec![Tool {
        name: "get_weather".into(),
        description: None,
        parameters: serde_json::Value::Null,
    }]
    .into();
    req
}

#[test]
fn turns_alternate_tool_inputs_are_objects_and_empty_text_is_dropped() {
    let req = parallel_tools();
    let config = BedrockConfig::new(AwsCredentials::new("AKID", "s"), "us-east-1");
    let signed = bedrock::signed_request(&config, &req).expect("signed");
    let body: serde_json::Value =
        serde_json::from_slice(&futures_body(signed.into_body())).expect("json");
    let roles: Vec<_> = body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].clone())
        .collect();
    assert_eq!(roles, [json!("user"), json!("assistant"), json!("user")]);
    let last = &body["messages"][2]["content"];
    assert!(last[0].get("toolResult").is_some() && last[1].get("toolResult").is_some());
    assert_eq!(last[2]["text"], "thanks, and tomorrow?");
    let assistant = &body["messages"][1]["content"];
    assert_eq!(
        assistant.as_array().map(Vec::len),
        Some(2),
        "no empty text block"
    );
    assert_eq!(assistant[0]["toolUse"]["input"], json!({}));
    let spec = &body["toolConfig"]["tools"][0]["toolSpec"];
    assert!(spec.get("description").is_none());
    assert_eq!(spec["inputSchema"]["json"]["type"], "object");

    let body = anthropic::encode(&req);
    let roles: Vec<_> = body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["role"].clone())
        .collect();
    assert_eq!(roles, [json!("user"), json!("assistant"), json!("user")]);
    assert_eq!(body["messages"][1]["content"][0]["input"], json!({}));
    assert_eq!(body["messages"][2]["content"][0]["type"], "tool_result");
    assert!(body["tools"][0].get("description").is_none());
    assert_eq!(body["tools"][0]["input_schema"]["type"], "object");

    let body = openai::encode(&req);
    assert!(body["tools"][0]["function"].get("description").is_none());
    assert_eq!(body["tools"][0]["function"]["parameters"]["type"], "object");
}

fn futures_body(body: tower_llm_providers::RequestBody) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    rt.block_on(async {
        http_body_util::BodyExt::collect(body)
            .await
            .map(|b| b.to_bytes().to_vec())
            .unwrap_or_default()
    })
}

#[test]
fn data_url_images() {
    let mut req = ChatRequest::new("m", vec![Message::user("what is this?")]);
    std::sync::Arc::make_mut(&mut req.messages)[0]
        .content
        .push(ContentPart::ImageUrl {
            url: "data:image/png;base64,iVBORw0KGgo=".into(),
        });
    let body = anthropic::encode(&req);
    assert_eq!(
        body["messages"][0]["content"][1]["source"],
        json!({"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="})
    );
    let body = bedrock::encode(&req).expect("png data URL");
    assert_eq!(
        body["messages"][0]["content"][1]["image"],
        json!({"format": "png", "source": {"bytes": "iVBORw0KGgo="}})
    );
    req.tool_choice = Some(ToolChoice::None);
    req.tools = parallel_tools().tools;
    assert!(
        bedrock::encode(&req)
            .expect("ok")
            .get("toolConfig")
            .is_none()
    );
    assert_eq!(req.messages[0].role, Role::User);
}

#[test]
fn openai_variants() {
    let req = ChatRequest::new("o3", vec![Message::user("hi")]).with_max_tokens(100);
    assert_eq!(
        openai::encode_with(&req, true)["max_completion_tokens"],
        100
    );
    assert!(openai::encode_with(&req, true).get("max_tokens").is_none());
    assert_eq!(openai::encode(&req)["max_tokens"], 100);
    let nulls = br#"{"id":"x","model":"m","choices":[{"index":0,"message":{"content":"ok","tool_calls":null},
        "finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":null,
        "prompt_tokens_details":{"cached_tokens":null}}}"#;
    let r = openai::decode(nulls, Duration::ZERO).expect("nulls are fine");
    assert_eq!(r.usage.prompt_tokens, 3);
    let refusal = br#"{"id":"x","model":"m","choices":[{"index":0,"message":{"content":null,
        "refusal":"I can't help with that."},"finish_reason":"stop"}]}"#;
    let r = openai::decode(refusal, Duration::ZERO).expect("refusal");
    assert_eq!(r.finish_reason(), Some(FinishReason::ContentFilter));
}

#[test]
fn limits_that_no_wait_can_fix() {
    let s = |c| StatusCode::from_u16(c).expect("status");
    let too_large = br#"{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 45000.","type":"tokens","code":"rate_limit_exceeded"}}"#;
    let f = openai::decode_error(s(429), &HeaderMap::new(), too_large);
    assert!(f.is_context_window_exceeded(), "{f}");
    let long = br#"{"type":"error","error":{"type":"rate_limit_error","message":"Extra usage is required for long context requests."}}"#;
    assert!(anthropic::decode_error(s(429), &HeaderMap::new(), long).is_quota_exhausted());
    let name = br#"{"message":"The tool name is too long"}"#;
    let mut h = HeaderMap::new();
    h.insert(
        "x-amzn-errortype",
        "ValidationException:x".parse().expect("value"),
    );
    assert!(bedrock::decode_error(s(400), &h, name).is_bad_request());
}

#[tokio::test(start_paused = true)]
async fn keys_are_sensitive_headers_and_scrubbed_from_echoed_messages() {
    let transport = ScriptedTransport::new(Reply::openai_text("ok"));
    let provider = OpenAi::new(
        transport.clone(),
        OpenAiConfig::new(ApiKey::new("sk-live-secret-42")),
    );
    provider
        .oneshot(ChatRequest::new("m", vec![Message::user("hi")]))
        .await
        .expect("ok");
    let sent = &transport.received()[0].headers;
    assert!(sent["authorization"].is_sensitive());
    assert!(!format!("{sent:?}").contains("sk-live-secret-42"));

    let server = MockServer::start(Reply::openai_error(
        401,
        "invalid_api_key",
        "Incorrect API key provided: sk-live-secret-42.",
    ))
    .await
    .expect("server");
    let client: hyper_util::client::legacy::Client<_, tower_llm_providers::RequestBody> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let provider = OpenAi::new(
        client,
        OpenAiConfig::new(ApiKey::new("sk-live-secret-42"))
            .with_base_url(&format!("{}/v1", server.url())),
    );
    let err = provider
        .oneshot(ChatRequest::new("m", vec![Message::user("hi")]))
        .await
        .expect_err("401");
    assert!(err.is_auth());
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("sk-live-secret-42"), "{shown}");
    assert!(shown.contains("[redacted]"), "{shown}");
}

#[test]
fn escaped_error_messages_are_still_read() {
    let s = |c| StatusCode::from_u16(c).expect("status");
    let quota = br#"{"error":{"message":"You exceeded your current quota \u2014 see \"billing\".","type":"insufficient_quota","code":"insufficient_quota"}}"#;
    let f = openai::decode_error(s(429), &HeaderMap::new(), quota);
    assert!(f.is_quota_exhausted());
    assert_eq!(
        f.message(),
        Some("You exceeded your current quota \u{2014} see \"billing\".")
    );
    let long = br#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 200251 tokens > 200000 maximum \n(\"claude\")"}}"#;
    assert!(anthropic::decode_error(s(400), &HeaderMap::new(), long).is_context_window_exceeded());
    let mut h = HeaderMap::new();
    h.insert(
        "x-amzn-errortype",
        "ValidationException:x".parse().expect("value"),
    );
    let aws = br#"{"message":"Input is too long for requested model. \"Claude\""}"#;
    assert!(bedrock::decode_error(s(400), &h, aws).is_context_window_exceeded());
}
