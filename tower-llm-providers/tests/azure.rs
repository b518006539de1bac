//! Azure OpenAI as an outbound dialect: the request (deployment path,
//! `api-version`, `api-key`), the answers with Azure's filter annotations,
//! the error table, streams through the commit point, secrets, bad input,
//! and embeddings.

use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use http::{HeaderMap, StatusCode};
use tokio::time::Instant;
use tower::ServiceExt;
use tower_llm_core::{
    ChatChunk, ChatRequest, ChatStream, EmbeddingRequest, Failure, FailureClass, FinishReason,
    Message, Usage,
};
use tower_llm_providers::dialect::Dialect;
use tower_llm_providers::mock::{Reply, ScriptedTransport, Step};
use tower_llm_providers::stream::{SseEvent, StreamItem, openai_event};
use tower_llm_providers::{
    AZURE_API_VERSION, ApiKey, AzureOpenAi, AzureOpenAiConfig, AzureOpenAiEmbeddings,
};

mod common;
use common::{fixture, headers};

const KEY: &str = "azure-PLANTED-key-0123456789abcdef";
const ENDPOINT: &str = "https://my-resource.openai.azure.com";

fn config() -> AzureOpenAiConfig {
    AzureOpenAiConfig::new(ApiKey::new(KEY), ENDPOINT)
}

fn azure(t: &ScriptedTransport) -> AzureOpenAi<ScriptedTransport> {
    AzureOpenAi::new(t.clone(), config())
}

fn req(deployment: &str) -> ChatRequest {
    ChatRequest::new(deployment, vec![Message::user("hi")])
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).expect("a JSON body")
}

/// Reads a stream to its end: the chunks, and the terminal error if any.
async fn drain(mut stream: ChatStream) -> (Vec<ChatChunk>, Option<Failure>) {
    let mut chunks = Vec::new();
    while let Some(item) = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        match item {
            Ok(c) => chunks.push(c),
            Err(f) => return (chunks, Some(f)),
        }
    }
    (chunks, None)
}

fn text(chunks: &[ChatChunk]) -> String {
    chunks.iter().filter_map(|c| c.text.as_deref()).collect()
}

/// A body sent in `size`-byte frames.
fn split(bytes: &[u8], size: usize) -> Vec<Step> {
    bytes
        .chunks(size)
        .map(|c| Step::Send(Bytes::copy_from_slice(c)))
        .collect()
}

/// A fixture with `from` replaced by `to` (exactly once).
fn patched(name: &str, from: &str, to: &str) -> Vec<u8> {
    let text = String::from_utf8(fixture(name)).expect("utf-8");
    assert_eq!(text.matches(from).count(), 1, "{name}: {from}");
    text.replacen(from, to, 1).into_bytes()
}

#[tokio::test(start_paused = true)]
async fn a_chat_call_posts_to_the_deployment_with_the_api_version_and_the_key_in_api_key() {
    let t = ScriptedTransport::new(Reply::json(200, fixture("azure_chat_completion.json")));
    let mut r = req("gpt-4o-prod");
    r.max_tokens = Some(64);
    azure(&t).oneshot(r).await.expect("an answer");
    let sent = &t.received()[0];
    assert_eq!(sent.method, http::Method::POST);
    assert_eq!(
        sent.path,
        "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(sent.headers["api-key"], KEY);
    assert!(sent.headers["api-key"].is_sensitive());
    assert_eq!(sent.headers.get("authorization"), None);
    assert_eq!(sent.headers["content-type"], "application/json");
    let body = json(&sent.body);
    assert_eq!(body["messages"][0]["role"], "user");
    assert_eq!(body["messages"][0]["content"], "hi");
    assert_eq!(body["stream"], false);
    assert_eq!(body["max_tokens"], 64);
    assert!(body.get("stream_options").is_none());
    assert!(body.get("max_completion_tokens").is_none());

    // A request that asked for a stream is still sent unary by the unary
    // service, and the o-series field when configured.
    let t = ScriptedTransport::new(Reply::json(200, fixture("azure_chat_completion.json")));
    let mut r = req("o3-mini");
    r.stream = true;
    r.max_tokens = Some(64);
    AzureOpenAi::new(t.clone(), config().with_max_completion_tokens(true))
        .oneshot(r)
        .await
        .expect("an answer");
    let body = json(&t.received()[0].body);
    assert_eq!(body["stream"], false);
    assert!(body.get("stream_options").is_none());
    assert_eq!(body["max_completion_tokens"], 64);
    assert!(body.get("max_tokens").is_none());
}

#[test]
fn settings_trim_the_endpoint_and_choose_the_api_version() {
    let c = AzureOpenAiConfig::new(ApiKey::new(KEY), "https://r.openai.azure.com//");
    assert_eq!(c.endpoint(), "https://r.openai.azure.com");
    assert_eq!(c.api_version(), AZURE_API_VERSION);
    assert_eq!(AZURE_API_VERSION, "2024-10-21");
    let c = c.with_api_version("2025-01-01-preview");
    assert_eq!(c.api_version(), "2025-01-01-preview");
    assert_eq!(c.provider(), "azure");
    let http_req = c.encode(&req("d"), false).expect("a request");
    assert_eq!(
        http_req.uri().to_string(),
        "https://r.openai.azure.com/openai/deployments/d/chat/completions?api-version=2025-01-01-preview"
    );
}

#[tokio::test(start_paused = true)]
async fn deployment_names_are_percent_encoded_into_one_path_segment() {
    let cases = [
        ("gpt/4o", "gpt%2F4o"),
        ("a?api-version=evil", "a%3Fapi-version%3Devil"),
        ("my deploy", "my%20deploy"),
        ("déploiement", "d%C3%A9ploiement"),
        ("a#frag", "a%23frag"),
        ("already%2Fencoded", "already%252Fencoded"),
        ("../../admin", "..%2F..%2Fadmin"),
        ("line\nbreak\0", "line%0Abreak%00"),
        ("gpt-4o_v2.1~x", "gpt-4o_v2.1~x"),
    ];
    for (name, segment) in cases {
        let t = ScriptedTransport::new(Reply::openai_text("ok"));
        azure(&t).oneshot(req(name)).await.expect("an answer");
        let path = &t.received()[0].path;
        assert_eq!(
            path,
            &format!("/openai/deployments/{segment}/chat/completions?api-version=2024-10-21"),
            "{name:?}"
        );
    }
    // Names that are no segment at all are refused, never sent.
    for name in ["", ".", ".."] {
        let t = ScriptedTransport::new(Reply::openai_text("ok"));
        let err = azure(&t).oneshot(req(name)).await.unwrap_err();
        assert_eq!(err.class(), FailureClass::BadRequest, "{name:?}");
        assert_eq!(err.provider(), Some("azure"));
        assert!(t.received().is_empty(), "{name:?} was sent");
    }
    // An endpoint that is no URI: a bad request, never sent.
    let t = ScriptedTransport::new(Reply::openai_text("ok"));
    let err = AzureOpenAi::new(
        t.clone(),
        AzureOpenAiConfig::new(ApiKey::new(KEY), "not a uri"),
    )
    .oneshot(req("d"))
    .await
    .unwrap_err();
    assert_eq!(err.class(), FailureClass::BadRequest);
    assert!(t.received().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_answer_with_filter_annotations_normalises_like_openai() {
    let t = ScriptedTransport::new(Reply::json(200, fixture("azure_chat_completion.json")));
    let r = azure(&t).oneshot(req("gpt-4o-prod")).await.expect("ok");
    assert_eq!(r.id, "chatcmpl-7R1nGnsXO8n4oi9UPz2f3UHdgAYMn");
    assert_eq!(r.model, "gpt-4o-2024-08-06");
    assert_eq!(r.provider.as_ref(), "azure");
    assert_eq!(
        r.text(),
        "Ahoy matey! Give yer parrot a sturdy cage, fresh water and good grub."
    );
    assert_eq!(r.finish_reason(), Some(FinishReason::Stop));
    assert_eq!(
        r.usage,
        Usage {
            prompt_tokens: 33,
            completion_tokens: 17,
            cached_input_tokens: 0
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_completion_stopped_by_the_filter_is_an_answer_with_its_finish_reason() {
    let body = patched(
        "azure_chat_completion.json",
        "\"finish_reason\": \"stop\"",
        "\"finish_reason\": \"content_filter\"",
    );
    let t = ScriptedTransport::new(Reply::json(200, body));
    let r = azure(&t).oneshot(req("d")).await.expect("an answer");
    assert_eq!(r.finish_reason(), Some(FinishReason::ContentFilter));
    assert_eq!(
        r.text(),
        "Ahoy matey! Give yer parrot a sturdy cage, fresh water and good grub."
    );
}

fn status(code: u16) -> StatusCode {
    StatusCode::from_u16(code).expect("status")
}

/// (class, retry-after, status, provider) of a failure.
fn outcome(f: &Failure) -> (FailureClass, Option<Duration>, Option<u16>, Option<&str>) {
    (
        f.class(),
        f.retry_after(),
        f.http_status().map(|s| s.as_u16()),
        f.provider(),
    )
}

/// One row of the error table: status, headers, body, class, wait.
type Row<'a> = (u16, &'a HeaderMap, &'a [u8], FailureClass, Option<Duration>);

#[test]
fn error_answers_map_to_classes_and_hints() {
    use FailureClass::*;
    let c = config();
    let none = HeaderMap::new();
    let limited_headers = headers("azure_error_rate_limit_429.headers");
    let mut garbage_headers = HeaderMap::new();
    garbage_headers.insert("retry-after", "soon".parse().expect("value"));
    let rate_limit = fixture("azure_error_rate_limit_429.json");
    let filtered = fixture("azure_error_content_filter_400.json");
    let inner_only = br#"{"error": {"message": "filtered", "innererror": {"code": "ResponsibleAIPolicyViolation"}}}"#;
    let spec_spelling = br#"{"error": {"code": "400", "message": "filtered", "inner_error": {"code": "ResponsibleAIPolicyViolation"}}}"#;
    let context = br#"{"error": {"message": "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}"#;
    let quota = br#"{"error": {"message": "You exceeded your current quota.", "type": "insufficient_quota", "code": "insufficient_quota"}}"#;
    let auth = br#"{"error": {"code": "401", "message": "Access denied due to invalid subscription key or wrong API endpoint."}}"#;
    let not_found = br#"{"error": {"code": "DeploymentNotFound", "message": "The API deployment for this resource does not exist."}}"#;
    let secs = Duration::from_secs;
    let table: Vec<Row<'_>> = vec![
        (400, &none, &filtered, ContentFiltered, None),
        (400, &none, inner_only, ContentFiltered, None),
        (400, &none, spec_spelling, ContentFiltered, None),
        // `retry-after-ms` wins over `retry-after`.
        (
            429,
            &limited_headers,
            &rate_limit,
            RateLimited,
            Some(Duration::from_millis(5500)),
        ),
        // Without a usable header, the message's "retry after 6 seconds".
        (429, &none, &rate_limit, RateLimited, Some(secs(6))),
        (
            429,
            &garbage_headers,
            &rate_limit,
            RateLimited,
            Some(secs(6)),
        ),
        (429, &none, quota, QuotaExhausted, None),
        (400, &none, context, ContextWindowExceeded, None),
        (401, &none, auth, Auth, None),
        (403, &none, auth, Auth, None),
        (404, &none, not_found, NotFound, None),
        (
            400,
            &none,
            b"{\"error\": {\"code\": \"BadRequest\"}}",
            BadRequest,
            None,
        ),
        (
            500,
            &none,
            b"{\"error\": {\"code\": \"InternalServerError\"}}",
            Transient,
            None,
        ),
        (503, &none, b"", Transient, None),
    ];
    for (code, h, body, class, wait) in table {
        let f = c.decode_error(status(code), h, body);
        assert_eq!(
            outcome(&f),
            (class, wait, Some(code), Some("azure")),
            "{code} {}",
            String::from_utf8_lossy(body)
        );
    }
    // The filter's message is kept; a content-filter failure is never
    // retried and only fails over where allowed.
    let f = c.decode_error(status(400), &none, &filtered);
    assert!(f.is_content_filtered());
    assert!(
        f.message()
            .is_some_and(|m| m.starts_with("The response was filtered due to the prompt"))
    );
    // A gateway's own answer (no envelope) keeps its top-level message.
    let f = c.decode_error(
        status(401),
        &none,
        br#"{"statusCode": 401, "message": "Access denied due to invalid subscription key."}"#,
    );
    assert_eq!(f.class(), Auth);
    assert_eq!(
        f.message(),
        Some("Access denied due to invalid subscription key.")
    );
}

#[test]
fn bad_input_gets_a_clear_failure_and_no_panic() {
    let c = config();
    let none = HeaderMap::new();
    let answer = |body: &[u8]| {
        let res = http::Response::new(Bytes::copy_from_slice(body));
        c.decode(&req("d"), &res, Duration::ZERO)
    };
    // Truncated, empty and wrong-shaped answers.
    let full = fixture("azure_chat_completion.json");
    for body in [&full[..full.len() / 2], b"", b"null", b"[]", b"{\"id\":1}"] {
        let f = answer(body).expect_err("bad");
        assert_eq!(f.class(), FailureClass::InvalidResponse);
        assert_eq!(f.provider(), Some("azure"));
        assert!(
            f.message()
                .is_some_and(|m| m.starts_with("malformed azure response: ")),
            "{f}"
        );
    }
    let truncated = answer(&full[..full.len() / 2]).expect_err("truncated");
    assert!(
        truncated
            .message()
            .is_some_and(|m| m.contains("truncated JSON")),
        "{truncated}"
    );
    // Unknown statuses, non-JSON bodies, garbage hints.
    let f = c.decode_error(status(599), &none, b"\xff\xfe not json");
    assert_eq!(
        outcome(&f),
        (FailureClass::Transient, None, Some(599), Some("azure"))
    );
    assert_eq!(f.message(), None);
    let f = c.decode_error(status(502), &none, b"<html><body>Bad Gateway</body></html>");
    assert_eq!(f.class(), FailureClass::Transient);
    assert_eq!(
        c.decode_error(status(418), &none, b"<html>teapot</html>")
            .class(),
        FailureClass::BadRequest
    );
    let mut h = HeaderMap::new();
    h.insert("retry-after", "soon".parse().expect("value"));
    h.insert("retry-after-ms", "-5".parse().expect("value"));
    assert_eq!(c.decode_error(status(429), &h, b"").retry_after(), None);
    // A message naming a wait too long to parse gives none.
    let huge =
        br#"{"error": {"code": "429", "message": "Please retry after 99999999999 seconds."}}"#;
    assert_eq!(c.decode_error(status(429), &none, huge).retry_after(), None);
    // A long message is bounded.
    let long = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(10_000));
    let f = c.decode_error(status(500), &none, long.as_bytes());
    assert!(
        f.message()
            .is_some_and(|m| m.len() <= tower_llm_providers::MAX_MESSAGE + 3)
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_over_the_cap_is_an_invalid_response() {
    let t = ScriptedTransport::new(Reply::json(200, vec![b' '; 64 * 1024]));
    let err = AzureOpenAi::new(t, config().with_max_body(1024))
        .oneshot(req("d"))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::InvalidResponse);
    assert_eq!(err.provider(), Some("azure"));
}

#[test]
fn the_prompt_annotation_chunk_with_no_choices_is_not_content() {
    let first = String::from_utf8(fixture("azure_stream_basic.sse")).expect("utf-8");
    let data = first
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("data: "))
        .expect("a data line");
    let item = openai_event(&SseEvent {
        event: None,
        data: data.to_owned(),
    })
    .expect("decodes");
    assert_eq!(item, StreamItem::Skip);
    assert!(!item.is_content());
}

#[tokio::test(start_paused = true)]
async fn a_stream_commits_at_its_first_content_not_at_the_prompt_annotations() {
    let bytes = fixture("azure_stream_basic.sse");
    for size in [1, 7, 64, bytes.len()] {
        let t = ScriptedTransport::new(Reply::sse_steps(split(&bytes, size)));
        let stream = azure(&t)
            .streaming()
            .oneshot(req("gpt-4o-prod"))
            .await
            .expect("commits");
        assert_eq!(stream.provider(), "azure");
        let (chunks, end) = drain(stream).await;
        assert!(end.is_none(), "{end:?}");
        assert_eq!(text(&chunks), "Hello!", "{size}-byte frames");
        assert_eq!(
            chunks
                .iter()
                .filter_map(|c| c.finish_reason)
                .collect::<Vec<_>>(),
            [FinishReason::Stop]
        );
        assert_eq!(
            chunks.iter().filter_map(|c| c.usage).next_back(),
            Some(Usage {
                prompt_tokens: 9,
                completion_tokens: 2,
                cached_input_tokens: 0
            })
        );
        let sent = &t.received()[0];
        assert_eq!(
            sent.path,
            "/openai/deployments/gpt-4o-prod/chat/completions?api-version=2024-10-21"
        );
        let body = json(&sent.body);
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
    }

    // The annotations come at once, the content 3 s later: the stream
    // commits at the content (its time to first chunk is 3 s), and a
    // 2-second first-token timeout is not met by the annotations.
    let lines: Vec<String> = String::from_utf8(bytes)
        .expect("utf-8")
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| format!("{e}\n\n"))
        .collect();
    let delayed = || {
        let mut steps = vec![
            Step::Send(Bytes::from(lines[0].clone())),
            Step::Pause(Duration::from_secs(3)),
        ];
        steps.extend(
            lines[1..]
                .iter()
                .map(|l| Step::Send(Bytes::from(l.clone()))),
        );
        steps
    };
    let t = ScriptedTransport::new(Reply::sse_steps(delayed()));
    let stream = azure(&t)
        .streaming()
        .oneshot(req("d"))
        .await
        .expect("commits");
    assert_eq!(stream.time_to_first_chunk(), Duration::from_secs(3));
    let t = ScriptedTransport::new(Reply::sse_steps(delayed()));
    let start = Instant::now();
    let err = azure(&t)
        .streaming()
        .with_first_token_timeout(Duration::from_secs(2))
        .oneshot(req("d"))
        .await
        .unwrap_err();
    assert_eq!(err.class(), FailureClass::Timeout);
    assert_eq!(start.elapsed(), Duration::from_secs(2));

    // A body of annotations only ends before any content: a transient
    // failure of the call, not an empty answer.
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::Send(Bytes::from(
        lines[0].clone(),
    ))]));
    let err = azure(&t).streaming().oneshot(req("d")).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient);
    assert_eq!(err.provider(), Some("azure"));
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_filter_stops_ends_with_its_finish_reason_and_the_text_so_far() {
    let t = ScriptedTransport::new(Reply::sse_steps(split(
        &fixture("azure_stream_content_filter.sse"),
        13,
    )));
    let stream = azure(&t)
        .streaming()
        .oneshot(req("d"))
        .await
        .expect("commits");
    let answer = stream.collect_response().await.expect("complete");
    assert_eq!(answer.text(), "Hey Jude, don't");
    assert_eq!(answer.finish_reason(), Some(FinishReason::ContentFilter));
}

#[tokio::test(start_paused = true)]
async fn an_in_band_filter_error_before_content_fails_the_call_as_filtered() {
    let error = r#"{"error": {"code": "content_filter", "message": "The response was filtered (azure-PLANTED-key-0123456789abcdef)", "innererror": {"code": "ResponsibleAIPolicyViolation"}}}"#;
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(None, error)]));
    let err = azure(&t).streaming().oneshot(req("d")).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::ContentFiltered);
    assert_eq!(err.provider(), Some("azure"));
    assert_eq!(
        err.message(),
        Some("The response was filtered ([redacted])")
    );
    // Any other in-band error is the OpenAI decoder's, as Azure's.
    let error = r#"{"error": {"type": "server_error", "message": "boom"}}"#;
    let t = ScriptedTransport::new(Reply::sse_steps(vec![Step::sse(None, error)]));
    let err = azure(&t).streaming().oneshot(req("d")).await.unwrap_err();
    assert_eq!(err.class(), FailureClass::Transient);
    assert_eq!(err.provider(), Some("azure"));
}

#[tokio::test(start_paused = true)]
async fn the_key_never_shows_in_failures_or_debug_output() {
    let c = config();
    for shown in [
        format!("{c:?}"),
        format!("{:?}", azure(&ScriptedTransport::new(Reply::Hang))),
    ] {
        assert!(!shown.contains(KEY), "{shown}");
        assert!(shown.contains("[redacted]"), "{shown}");
    }
    // An upstream that echoes the key in its error message.
    let echo = format!(
        r#"{{"error": {{"code": "401", "message": "Access denied for key {KEY}: invalid subscription key."}}}}"#
    );
    for code in [400u16, 401, 429, 500] {
        let f = c.decode_error(status(code), &HeaderMap::new(), echo.as_bytes());
        assert_eq!(
            f.message(),
            Some("Access denied for key [redacted]: invalid subscription key."),
            "{code}"
        );
        let rendered = format!("{f} {f:?}");
        assert!(!rendered.contains(KEY), "{rendered}");
    }
    // Through the service, unary and streaming.
    let t = ScriptedTransport::new(Reply::json(401, echo.clone()));
    let f = azure(&t).oneshot(req("d")).await.unwrap_err();
    assert!(!format!("{f} {f:?}").contains(KEY));
    let t = ScriptedTransport::new(Reply::json(401, echo));
    let f = azure(&t).streaming().oneshot(req("d")).await.unwrap_err();
    assert!(f.is_auth());
    assert!(!format!("{f} {f:?}").contains(KEY));
    // The request's header is sensitive, so its `Debug` hides it.
    let http_req = c.encode(&req("d"), false).expect("a request");
    assert!(!format!("{http_req:?}").contains(KEY));
}

#[tokio::test(start_paused = true)]
async fn embeddings_post_to_the_deployment_and_normalise_in_input_order() {
    let t = ScriptedTransport::new(Reply::json(200, fixture("azure_embeddings.json")));
    let embed = AzureOpenAiEmbeddings::new(t.clone(), config());
    let mut r = EmbeddingRequest::new("embed large", vec!["a".into(), "b".into()]);
    r.dimensions = Some(6);
    let res = embed.clone().oneshot(r).await.expect("ok");
    assert_eq!(res.provider.as_ref(), "azure");
    assert_eq!(res.model, "text-embedding-3-small");
    assert_eq!(res.prompt_tokens, 9);
    assert_eq!(res.embeddings.len(), 2);
    assert_eq!(
        res.embeddings[1],
        vec![
            0.010674067,
            0.02412286,
            -0.013647936,
            0.013189907,
            0.0021125758,
            0.012406612
        ]
    );
    let sent = &t.received()[0];
    assert_eq!(
        sent.path,
        "/openai/deployments/embed%20large/embeddings?api-version=2024-10-21"
    );
    assert_eq!(sent.headers["api-key"], KEY);
    assert_eq!(sent.headers.get("authorization"), None);
    let body = json(&sent.body);
    assert_eq!(body["input"], serde_json::json!(["a", "b"]));
    assert_eq!(body["dimensions"], 6);

    // An answer that names no model (as in Azure's API spec example)
    // takes the deployment's name.
    let t = ScriptedTransport::new(Reply::json(
        200,
        r#"{"data": [{"index": 0, "embedding": [0.5]}], "usage": {"prompt_tokens": 4, "total_tokens": 4}}"#,
    ));
    let res = AzureOpenAiEmbeddings::new(t, config())
        .oneshot(EmbeddingRequest::new("emb", vec!["x".into()]))
        .await
        .expect("ok");
    assert_eq!(res.model, "emb");
    assert_eq!(res.embeddings, vec![vec![0.5]]);

    // Errors are the chat dialect's.
    let t = ScriptedTransport::new(Reply::json(429, fixture("azure_error_rate_limit_429.json")));
    let err = AzureOpenAiEmbeddings::new(t, config())
        .oneshot(EmbeddingRequest::new("emb", vec!["x".into()]))
        .await
        .unwrap_err();
    assert_eq!(
        outcome(&err),
        (
            FailureClass::RateLimited,
            Some(Duration::from_secs(6)),
            Some(429),
            Some("azure")
        )
    );
    // A duplicate index is an invalid response.
    let t = ScriptedTransport::new(Reply::json(
        200,
        r#"{"model": "m", "data": [{"index": 0, "embedding": [1]}, {"index": 0, "embedding": [2]}]}"#,
    ));
    let err = AzureOpenAiEmbeddings::new(t, config())
        .oneshot(EmbeddingRequest::new("emb", vec!["x".into(), "y".into()]))
        .await
        .unwrap_err();
    assert_eq!(outcome(&err).0, FailureClass::InvalidResponse);
    assert_eq!(err.http_status(), Some(StatusCode::OK));
}
