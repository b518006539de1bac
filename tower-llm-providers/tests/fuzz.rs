//! Every parser that reads bytes from the network, fuzzed on stable Rust
//! with proptest: arbitrary bytes, and structure-aware inputs (the real
//! wire fixtures truncated, flipped, spliced, with a JSON node replaced by
//! a random value, deeply nested). No input may panic, and no decode may
//! allocate more than a linear bound of its input.
//!
//! 10,000 cases per parser by default; `FUZZ_CASES=1000000 cargo test -p
//! tower-llm-providers --release --test fuzz` for the long run. A failing
//! case is shrunk and its seed kept in `proptest-regressions/fuzz.txt`
//! (commit it: it replays first on every later run).

mod common;

use std::alloc::System;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use common::fixture;
use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;
use serde_json::Value;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::ServiceExt;
use tower_llm_core::{ChatRequest, Message, parse_retry_after, parse_retry_after_ms};
use tower_llm_providers::mock::{Reply, ScriptedTransport, Step};
use tower_llm_providers::stream::{SseParser, anthropic_event, openai_event};
use tower_llm_providers::{AwsCredentials, Bedrock, BedrockConfig, anthropic, bedrock, openai};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// One test at a time, so an allocation count is the measured code's own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner)
}

fn config() -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(10_000);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::Direct("proptest-regressions/fuzz.txt"),
        )),
        ..ProptestConfig::default()
    }
}

/// Runs `test` on `config`'s cases of `strategy`, holding the lock the
/// whole run: the allocation counter is global, so a case must be made
/// (generating one allocates: a reshaped fixture holds a 70 KB string)
/// while no other test measures, as well as tested.
fn run_serially_with<S: Strategy>(
    config: ProptestConfig,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let _one = serial();
    let mut runner = proptest::test_runner::TestRunner::new(config);
    if let Err(e) = runner.run(&strategy, test) {
        panic!("{e}");
    }
}

/// [`run_serially_with`] with [`config`].
fn run_serially<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    run_serially_with(config(), strategy, test);
}

/// Bytes allocated by `f` (in all, not at once) stay within `per_byte`
/// times its `input` bytes, plus 256 KiB.
fn bounded<T>(input: usize, per_byte: usize, f: impl FnOnce() -> T) -> T {
    let region = Region::new(GLOBAL);
    let out = f();
    let allocated = region.change().bytes_allocated;
    let bound = per_byte * input + (256 << 10);
    assert!(
        allocated <= bound,
        "{allocated} bytes allocated for a {input}-byte input (bound {bound})"
    );
    out
}

const JSON_FIXTURES: &[&str] = &[
    "openai_chat_completion.json",
    "openai_chat_completion_tool_calls.json",
    "openai_error_context_length.json",
    "openai_error_insufficient_quota.json",
    "openai_error_rate_limit.json",
    "anthropic_message.json",
    "anthropic_message_tool_use.json",
    "anthropic_error_overloaded_529.json",
    "anthropic_error_prompt_too_long_400.json",
    "bedrock_converse_response.json",
    "bedrock_converse_tool_use.json",
    "bedrock_error_throttling.json",
    "bedrock_error_validation.json",
];

const SSE_FIXTURES: &[&str] = &[
    "openai_stream_basic.sse",
    "openai_stream_error_midway.sse",
    "openai_stream_include_usage.sse",
    "anthropic_stream_basic.sse",
    "anthropic_stream_overloaded_first.sse",
];

const EVENT_STREAM_FIXTURES: &[&str] = &[
    "bedrock_stream_basic.bin",
    "bedrock_stream_exception_throttling.bin",
];

/// A random JSON value, up to a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,40}".prop_map(Value::String),
        Just(Value::String("x".repeat(70_000))),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,12}", inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Replaces the `index`-th node (depth first) of `value` with `new`.
fn replace_node(value: &mut Value, index: &mut usize, new: &Value) -> bool {
    if *index == 0 {
        *value = new.clone();
        return true;
    }
    *index -= 1;
    match value {
        Value::Array(items) => items.iter_mut().any(|v| replace_node(v, index, new)),
        Value::Object(map) => map.values_mut().any(|v| replace_node(v, index, new)),
        _ => false,
    }
}

/// A way to damage a fixture.
#[derive(Debug, Clone)]
enum Damage {
    Truncate(prop::sample::Index),
    Flip(prop::sample::Index, u8),
    Insert(prop::sample::Index, Vec<u8>),
    Splice(prop::sample::Index, prop::sample::Index, Vec<u8>),
    Duplicate(prop::sample::Index, prop::sample::Index),
}

fn damage() -> impl Strategy<Value = Damage> {
    let idx = any::<prop::sample::Index>;
    let junk = || prop::collection::vec(any::<u8>(), 0..48);
    prop_oneof![
        idx().prop_map(Damage::Truncate),
        (idx(), 1u8..=255).prop_map(|(i, m)| Damage::Flip(i, m)),
        (idx(), junk()).prop_map(|(i, b)| Damage::Insert(i, b)),
        (idx(), idx(), junk()).prop_map(|(a, b, j)| Damage::Splice(a, b, j)),
        (idx(), idx()).prop_map(|(a, b)| Damage::Duplicate(a, b)),
    ]
}

fn apply(mut bytes: Vec<u8>, damages: &[Damage]) -> Vec<u8> {
    for d in damages {
        if bytes.is_empty() {
            break;
        }
        let len = bytes.len();
        match d {
            Damage::Truncate(i) => bytes.truncate(i.index(len)),
            Damage::Flip(i, m) => bytes[i.index(len)] ^= m,
            Damage::Insert(i, junk) => {
                let at = i.index(len + 1);
                bytes.splice(at..at, junk.iter().copied());
            }
            Damage::Splice(a, b, junk) => {
                let (a, b) = (a.index(len), b.index(len));
                let (from, to) = (a.min(b), a.max(b));
                bytes.splice(from..to, junk.iter().copied());
            }
            Damage::Duplicate(a, b) => {
                let (a, b) = (a.index(len), b.index(len));
                let piece = bytes[a.min(b)..a.max(b)].to_vec();
                bytes.splice(a..a, piece);
            }
        }
    }
    bytes
}

/// A fixture damaged a few times.
fn damaged(names: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(names),
        prop::collection::vec(damage(), 1..4),
    )
        .prop_map(|(name, damages)| apply(fixture(name), &damages))
}

/// A JSON fixture with one node replaced by a random value.
fn reshaped() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(JSON_FIXTURES),
        any::<prop::sample::Index>(),
        json_value(),
    )
        .prop_map(|(name, at, new)| {
            let mut value: Value = serde_json::from_slice(&fixture(name)).expect("fixture");
            let mut index = at.index(64);
            replace_node(&mut value, &mut index, &new);
            serde_json::to_vec(&value).expect("json")
        })
}

/// Any of: arbitrary bytes, a damaged fixture, a reshaped one.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048),
        damaged(JSON_FIXTURES),
        reshaped(),
    ]
}

fn decode_all(body: &[u8], status: StatusCode, headers: &HeaderMap) {
    // A JSON body is parsed once, into at most a few times its size.
    bounded(body.len(), 64, || {
        let _ = openai::decode(body, Duration::ZERO);
        let _ = openai::decode_embeddings(body, Duration::ZERO);
        let _ = openai::server::decode_request(body);
    });
    bounded(body.len(), 64, || {
        let _ = anthropic::decode(body, Duration::ZERO);
    });
    bounded(body.len(), 64, || {
        let _ = bedrock::decode(body, "", "m", Duration::ZERO);
    });
    for f in [
        openai::decode_error(status, headers, body),
        anthropic::decode_error(status, headers, body),
        bedrock::decode_error(status, headers, body),
    ] {
        // Messages are bounded whatever the body.
        assert!(
            f.message()
                .is_none_or(|m| m.len() <= tower_llm_providers::MAX_MESSAGE + 3)
        );
    }
}

/// Header values a provider might send, and garbage.
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[0-9]{0,25}".prop_map(String::into_bytes),
        "-?[0-9]{0,6}\\.[0-9]{0,12}".prop_map(String::into_bytes),
        "(Mon|Tue|Wed), [0-9]{1,2} (Jan|Oct|Dec) [0-9]{4} [0-9]{2}:[0-9]{2}:[0-9]{2} GMT"
            .prop_map(String::into_bytes),
        "(true|false|TRUE|1|0| true )".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

#[test]
fn provider_json_never_panics_and_stays_linear() {
    let inputs = (
        body(),
        100u16..1000,
        header_value(),
        header_value(),
        header_value(),
    );
    run_serially(
        inputs,
        |(body, status, retry_after, retry_after_ms, should_retry)| {
            let mut headers = HeaderMap::new();
            for (name, value) in [
                ("retry-after", retry_after),
                ("retry-after-ms", retry_after_ms),
                ("x-should-retry", should_retry),
            ] {
                if let Ok(v) = HeaderValue::from_bytes(&value) {
                    headers.insert(name, v);
                }
            }
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            decode_all(&body, status, &headers);
            Ok(())
        },
    );
}

#[test]
fn retry_after_values_never_panic() {
    run_serially(header_value(), |value| {
        let at = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        if let Some(d) = parse_retry_after(&value, || at) {
            prop_assert!(d <= Duration::from_secs(u64::from(u32::MAX)));
        }
        let _ = parse_retry_after_ms(&value);
        Ok(())
    });
}

#[test]
fn sse_bytes_in_any_pieces_never_panic() {
    let inputs = (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..4096),
            damaged(SSE_FIXTURES)
        ],
        prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    );
    run_serially(inputs, |(bytes, cuts)| {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        // Every event, down to a 7-byte `data:\n\n`, may become a failure
        // of its own (about 1 KiB each, for two decoders): linear, with a
        // large constant.
        bounded(bytes.len(), 1024, || {
            let mut parser = SseParser::new();
            for w in cuts.windows(2) {
                let Ok(events) = parser.push(&bytes[w[0]..w[1]]) else {
                    break;
                };
                for e in events {
                    let _ = openai_event(&e);
                    let _ = anthropic_event(&e);
                }
            }
        });
        Ok(())
    });
}

fn bedrock_stream(reply: Reply) -> Bedrock<ScriptedTransport> {
    Bedrock::new(
        ScriptedTransport::new(reply),
        BedrockConfig::new(AwsCredentials::new("AKID", "secret"), "us-east-1"),
    )
}

/// The AWS event stream, through the streaming Bedrock service (its
/// decoder is internal): damaged recordings in pieces of any size end
/// with an answer or a clear failure, never a panic.
#[test]
fn bedrock_event_stream_never_panics() {
    let inputs = (
        prop_oneof![
            damaged(EVENT_STREAM_FIXTURES),
            prop::collection::vec(any::<u8>(), 0..1024)
        ],
        1usize..64,
    );
    let fewer = ProptestConfig {
        cases: config().cases / 10,
        ..config()
    };
    run_serially_with(fewer, inputs, |(bytes, piece)| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(async {
            let steps: Vec<Step> = bytes
                .chunks(piece)
                .map(|c| Step::Send(bytes::Bytes::copy_from_slice(c)))
                .collect();
            let provider =
                bedrock_stream(Reply::stream("application/vnd.amazon.eventstream", steps));
            let req = ChatRequest::new("m", vec![Message::user("hi")]);
            if let Ok(stream) = provider.streaming().oneshot(req).await {
                let _ = stream.collect_response().await;
            }
        });
        Ok(())
    });
}

#[test]
fn deep_nesting_is_refused_without_overflowing_the_stack() {
    let _one = serial();
    for depth in [200, 10_000, 100_000] {
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(openai::decode(body.as_bytes(), Duration::ZERO).is_err());
        assert!(anthropic::decode(body.as_bytes(), Duration::ZERO).is_err());
        assert!(bedrock::decode(body.as_bytes(), "", "m", Duration::ZERO).is_err());
        let object = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        assert!(openai::server::decode_request(object.as_bytes()).is_err());
    }
}

// ---------------------------------------------------------------------
// Anthropic's server side: `anthropic::server::decode_request` reads a
// client's request body, so it gets the same treatment as the decoders
// of provider answers.

const ANTHROPIC_REQUEST_FIXTURES: &[&str] = &["anthropic_request_tool_use.json"];

/// The request fixture with one node (of its first 128) replaced by a
/// random value.
fn reshaped_anthropic_request() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(ANTHROPIC_REQUEST_FIXTURES),
        any::<prop::sample::Index>(),
        json_value(),
    )
        .prop_map(|(name, at, new)| {
            let mut value: Value = serde_json::from_slice(&fixture(name)).expect("fixture");
            let mut index = at.index(128);
            replace_node(&mut value, &mut index, &new);
            serde_json::to_vec(&value).expect("json")
        })
}

/// Anthropic's request decoder (a client's body) on arbitrary bytes,
/// damaged fixtures and reshaped ones: no panic, allocation linear in the
/// input, refusals bad requests with bounded messages.
#[test]
fn anthropic_requests_never_panic_and_stay_linear() {
    let requests = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048),
        damaged(ANTHROPIC_REQUEST_FIXTURES),
        reshaped_anthropic_request(),
    ];
    run_serially(requests, |body| {
        let refused = bounded(body.len(), 64, || {
            anthropic::server::decode_request(&body).err()
        });
        if let Some(f) = refused {
            // Refusals are the client's bad request, their message bounded.
            prop_assert!(f.is_bad_request());
            prop_assert!(
                f.message()
                    .is_some_and(|m| m.len() <= tower_llm_providers::MAX_MESSAGE + 3)
            );
        }
        Ok(())
    });
}

#[test]
fn deep_anthropic_requests_are_refused_without_overflowing_the_stack() {
    let _one = serial();
    for depth in [200, 10_000, 100_000] {
        // Nested in a tool's input, in a tool result's content, and bare.
        let input = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        let tool_use = format!(
            r#"{{"model": "m", "max_tokens": 1, "messages": [{{"role": "assistant",
            "content": [{{"type": "tool_use", "id": "t", "name": "f", "input": {input}}}]}}]}}"#
        );
        let content = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let tool_result = format!(
            r#"{{"model": "m", "max_tokens": 1, "messages": [{{"role": "user",
            "content": [{{"type": "tool_result", "tool_use_id": "t", "content": {content}}}]}}]}}"#
        );
        for body in [tool_use, tool_result, content] {
            let f = anthropic::server::decode_request(body.as_bytes()).expect_err("too deep");
            assert!(f.is_bad_request());
        }
    }
}

// ------------------------------------------------------------------ Gemini

const GEMINI_JSON_FIXTURES: &[&str] = &[
    "gemini_generate_content.json",
    "gemini_generate_content_function_call.json",
    "gemini_prompt_blocked.json",
    "gemini_error_resource_exhausted_429.json",
    "gemini_error_resource_exhausted_daily_429.json",
    "gemini_error_api_key_invalid_400.json",
    "gemini_error_token_count_400.json",
];

const GEMINI_SSE_FIXTURES: &[&str] = &["gemini_stream_basic.sse", "gemini_stream_error_midway.sse"];

/// A Gemini JSON fixture with one node replaced by a random value.
fn gemini_reshaped() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(GEMINI_JSON_FIXTURES),
        any::<prop::sample::Index>(),
        json_value(),
    )
        .prop_map(|(name, at, new)| {
            let mut value: Value = serde_json::from_slice(&fixture(name)).expect("fixture");
            let mut index = at.index(64);
            replace_node(&mut value, &mut index, &new);
            serde_json::to_vec(&value).expect("json")
        })
}

/// Gemini's unary and error decoders on arbitrary bytes, damaged fixtures
/// and reshaped ones: no panic, allocation linear in the input, messages
/// bounded.
#[test]
fn gemini_json_never_panics_and_stays_linear() {
    let strategy = (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            damaged(GEMINI_JSON_FIXTURES),
            gemini_reshaped(),
        ],
        100u16..1000,
        header_value(),
    );
    run_serially(strategy, |(body, status, retry_after)| {
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_bytes(&retry_after) {
            headers.insert("retry-after", v);
        }
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        bounded(body.len(), 64, || {
            let _ = tower_llm_providers::gemini::decode(&body, "m", Duration::ZERO);
        });
        let f = bounded(body.len(), 64, || {
            tower_llm_providers::gemini::decode_error(status, &headers, &body)
        });
        prop_assert!(
            f.message()
                .is_none_or(|m| m.len() <= tower_llm_providers::MAX_MESSAGE + 3)
        );
        prop_assert!(
            f.retry_after()
                .is_none_or(|d| d <= Duration::from_secs(u64::from(u32::MAX)))
        );
        Ok(())
    });
}

/// Gemini's stream decoder (a `Wire` over server-sent events), fed
/// damaged recordings and garbage in pieces of any size.
#[test]
fn gemini_sse_in_any_pieces_never_panics() {
    use tower_llm_providers::dialect::{Dialect, Wire};
    let inputs = (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..4096),
            damaged(GEMINI_SSE_FIXTURES)
        ],
        prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    );
    run_serially(inputs, |(bytes, cuts)| {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        let config = tower_llm_providers::GeminiConfig::new(tower_llm_providers::ApiKey::new(
            "AIza-fuzz-key",
        ));
        bounded(bytes.len(), 1024, || {
            let mut wire = config.wire();
            let mut out = std::collections::VecDeque::new();
            for w in cuts.windows(2) {
                wire.feed(&bytes[w[0]..w[1]], &mut out);
            }
            let _ = wire.ended_cleanly();
            out.len()
        });
        Ok(())
    });
}

/// Every prefix of the recorded streams through the streaming service:
/// complete only when the last event (which holds the finish reason) is
/// whole; an error event never completes; no prefix panics.
#[test]
fn gemini_streams_cut_anywhere_complete_only_whole() {
    let _one = serial();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime");
    for name in GEMINI_SSE_FIXTURES {
        let bytes = fixture(name);
        for cut in 0..=bytes.len() {
            let complete = rt.block_on(async {
                let steps = vec![Step::Send(bytes::Bytes::copy_from_slice(&bytes[..cut]))];
                let provider = tower_llm_providers::Gemini::new(
                    ScriptedTransport::new(Reply::sse_steps(steps)),
                    tower_llm_providers::GeminiConfig::new(tower_llm_providers::ApiKey::new("k")),
                );
                let req = ChatRequest::new("m", vec![Message::user("hi")]);
                match provider.streaming().oneshot(req).await {
                    Ok(stream) => stream.collect_response().await.is_ok(),
                    Err(_) => false,
                }
            });
            // The body ends `}\r\n\r\n`: its last `\r` alone ends the blank line.
            let whole = *name == "gemini_stream_basic.sse" && cut + 1 >= bytes.len();
            assert_eq!(complete, whole, "{name} cut at {cut} of {}", bytes.len());
        }
    }
}

#[test]
fn gemini_deep_nesting_is_refused_without_overflowing_the_stack() {
    let _one = serial();
    for depth in [200, 10_000, 100_000] {
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert!(tower_llm_providers::gemini::decode(body.as_bytes(), "m", Duration::ZERO).is_err());
        let object = format!("{}1{}", "{\"error\":".repeat(depth), "}".repeat(depth));
        let f = tower_llm_providers::gemini::decode_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &HeaderMap::new(),
            object.as_bytes(),
        );
        assert!(f.is_transient());
    }
}

// Azure OpenAI: its decoders (chat answers, error answers, embeddings and
// stream events, reached through the dialect's public methods) under the
// same properties as the others: no panic, allocations linear in the
// input, messages bounded.

const AZURE_JSON_FIXTURES: &[&str] = &[
    "azure_chat_completion.json",
    "azure_error_content_filter_400.json",
    "azure_error_rate_limit_429.json",
    "azure_embeddings.json",
];

const AZURE_SSE_FIXTURES: &[&str] = &["azure_stream_basic.sse", "azure_stream_content_filter.sse"];

fn azure() -> tower_llm_providers::AzureOpenAiConfig {
    tower_llm_providers::AzureOpenAiConfig::new(
        tower_llm_providers::ApiKey::new("azure-fuzz-key"),
        "https://fuzz.openai.azure.com",
    )
}

/// An Azure JSON fixture with one node replaced by a random value.
fn azure_reshaped() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::sample::select(AZURE_JSON_FIXTURES),
        any::<prop::sample::Index>(),
        json_value(),
    )
        .prop_map(|(name, at, new)| {
            let mut value: Value = serde_json::from_slice(&fixture(name)).expect("fixture");
            let mut index = at.index(64);
            replace_node(&mut value, &mut index, &new);
            serde_json::to_vec(&value).expect("json")
        })
}

#[test]
fn azure_json_never_panics_and_stays_linear() {
    use tower_llm_providers::{Dialect, EmbeddingDialect};
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..2048),
        damaged(AZURE_JSON_FIXTURES),
        azure_reshaped(),
    ];
    let inputs = (body, 100u16..1000, header_value(), header_value());
    run_serially(inputs, |(body, status, retry_after, retry_after_ms)| {
        let dialect = azure();
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("retry-after", retry_after),
            ("retry-after-ms", retry_after_ms),
        ] {
            if let Ok(v) = HeaderValue::from_bytes(&value) {
                headers.insert(name, v);
            }
        }
        let answer = http::Response::new(bytes::Bytes::copy_from_slice(&body));
        let chat = ChatRequest::new("d", vec![Message::user("hi")]);
        let embed = tower_llm_core::EmbeddingRequest::new("d", vec!["hi".into()]);
        bounded(body.len(), 64, || {
            let _ = dialect.decode(&chat, &answer, Duration::ZERO);
            let _ = dialect.decode_embeddings(&embed, &answer, Duration::ZERO);
        });
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        let f = bounded(body.len(), 64, || {
            dialect.decode_error(status, &headers, &body)
        });
        prop_assert!(
            f.message()
                .is_none_or(|m| m.len() <= tower_llm_providers::MAX_MESSAGE + 3)
        );
        Ok(())
    });
}

#[test]
fn azure_sse_bytes_in_any_pieces_never_panic() {
    use tower_llm_providers::Dialect;
    use tower_llm_providers::dialect::Wire;
    let inputs = (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..4096),
            damaged(AZURE_SSE_FIXTURES)
        ],
        prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    );
    run_serially(inputs, |(bytes, cuts)| {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        // As the other SSE test: every event may become a failure of its
        // own, so linear with a large constant.
        bounded(bytes.len(), 1024, || {
            let mut wire = azure().wire();
            let mut out = std::collections::VecDeque::new();
            for w in cuts.windows(2) {
                wire.feed(&bytes[w[0]..w[1]], &mut out);
                out.clear();
            }
            let _ = wire.ended_cleanly();
        });
        Ok(())
    });
}

#[test]
fn azure_deep_nesting_is_refused_without_overflowing_the_stack() {
    use tower_llm_providers::Dialect;
    let _one = serial();
    let dialect = azure();
    let chat = ChatRequest::new("d", vec![Message::user("hi")]);
    for depth in [200, 10_000, 100_000] {
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let answer = http::Response::new(bytes::Bytes::from(body));
        assert!(dialect.decode(&chat, &answer, Duration::ZERO).is_err());
        let object = format!("{}1{}", "{\"error\":".repeat(depth), "}".repeat(depth));
        let f = dialect.decode_error(
            StatusCode::BAD_REQUEST,
            &HeaderMap::new(),
            object.as_bytes(),
        );
        assert!(f.is_bad_request());
    }
}

// Skipping malformed events after the commit point
// (`streaming::MalformedChunks::Skip`): the wire reads on past every event
// it cannot decode, so whatever follows is decoded too.

#[test]
fn sse_wires_skipping_malformed_events_never_panic_and_stay_linear() {
    use tower_llm_providers::dialect::{SseWire, Wire};
    let inputs = (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..4096),
            damaged(SSE_FIXTURES)
        ],
        prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    );
    run_serially(inputs, |(bytes, cuts)| {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        /// A first content event, and a wire of the decoder it is for.
        type First = (&'static [u8], fn() -> SseWire);
        let firsts: [First; 2] = [
            (
                b"data: {\"choices\": [{\"delta\": {\"content\": \"x\"}}]}\n\n",
                || SseWire::new(openai_event),
            ),
            (
                b"data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"x\"}}\n\n",
                || SseWire::new(anthropic_event),
            ),
        ];
        for (first, wire) in firsts {
            // As the other SSE tests: linear, with a large constant.
            let skipped = bounded(bytes.len(), 1024, || {
                let mut wire = wire();
                assert!(wire.skip_malformed());
                let mut out = std::collections::VecDeque::new();
                // The first content chunk: from here, malformed events are
                // skipped.
                wire.feed(first, &mut out);
                for w in cuts.windows(2) {
                    wire.feed(&bytes[w[0]..w[1]], &mut out);
                    out.clear();
                }
                let _ = wire.ended_cleanly();
                wire.skipped()
            });
            // An event takes at least 6 bytes (`data\n\n`).
            prop_assert!(skipped <= bytes.len() as u64 / 6, "{skipped} skipped");
        }
        Ok(())
    });
}
