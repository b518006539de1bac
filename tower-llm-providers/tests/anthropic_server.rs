//! The server side of Anthropic's Messages API: requests decoded into a
//! `ChatRequest`, answers and streams written in Anthropic's shapes (and
//! read back by this crate's own Anthropic decoders), failures as
//! Anthropic's error answers.

mod common;

use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::fixture;
use futures_core::Stream;
use serde_json::{Value, json};
use tower_llm_core::layer::FailureExt;
use tower_llm_core::{
    ChatChunk, ChatResponse, ChatStream, Choice, ContentPart, Failure, FailureClass, FinishReason,
    Message, Role, Tool, ToolCall, ToolCallDelta, ToolChoice, Usage,
};
use tower_llm_providers::anthropic;
use tower_llm_providers::anthropic::server::{
    SseFrames, decode_request, encode_error, encode_response, failure_response, failure_status,
    sse_error_event, write_response,
};
use tower_llm_providers::stream::{SseParser, StreamItem, anthropic_event};

// ---------------------------------------------------------------- requests

fn text(t: &str) -> ContentPart {
    ContentPart::Text { text: t.into() }
}

fn image(url: &str) -> ContentPart {
    ContentPart::ImageUrl { url: url.into() }
}

fn message(role: Role, content: Vec<ContentPart>) -> Message {
    Message {
        role,
        content,
        tool_calls: Vec::new(),
        tool_call_id: None,
    }
}

fn tool_message(id: &str, content: Vec<ContentPart>) -> Message {
    Message {
        tool_call_id: Some(id.into()),
        ..message(Role::Tool, content)
    }
}

/// A request of `messages` (JSON) with everything else minimal.
fn request(messages: Value) -> Vec<u8> {
    json!({"model": "m", "max_tokens": 16, "messages": messages})
        .to_string()
        .into_bytes()
}

#[test]
fn a_realistic_tool_use_request_decodes_to_the_same_conversation() {
    let req = decode_request(&fixture("anthropic_request_tool_use.json")).expect("valid");
    assert_eq!(&*req.model, "claude-sonnet-4-5");
    assert_eq!(req.max_tokens, Some(1024));
    assert_eq!(req.temperature, Some(0.5));
    assert_eq!(req.top_p, None);
    assert_eq!(*req.stop, ["\n\nHuman:"]);
    assert!(!req.stream);
    assert_eq!(req.tool_choice, Some(ToolChoice::Auto));
    let id = "toolu_01A09q90qw90lq917835lq9";
    assert_eq!(
        *req.messages,
        vec![
            Message::system("You are a weather assistant.\n\nAnswer in one sentence."),
            message(
                Role::User,
                vec![
                    image("data:image/png;base64,iVBORw0KGgo="),
                    image("https://example.com/sky.jpg"),
                    text("What is the weather like in San Francisco?"),
                ],
            ),
            Message {
                tool_calls: vec![ToolCall {
                    id: id.into(),
                    name: "get_weather".into(),
                    arguments: r#"{"location":"San Francisco, CA","unit":"celsius"}"#.into(),
                }],
                ..message(
                    Role::Assistant,
                    vec![text("I'll check the weather for you.")]
                )
            },
            tool_message(id, vec![text("15 degrees")]),
        ]
    );
    assert_eq!(
        *req.tools,
        vec![Tool {
            name: "get_weather".into(),
            description: Some("Get the current weather in a given location".into()),
            parameters: json!({
                "type": "object",
                "properties": {
                    "location": {"type": "string",
                                 "description": "The city and state, e.g. San Francisco, CA"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                             "description": "The unit of temperature, either \"celsius\" or \"fahrenheit\""}
                },
                "required": ["location"]
            }),
        }]
    );
}

#[test]
fn a_system_string_or_text_blocks_is_one_system_message() {
    let with_system = |system: Value| {
        let body = json!({"model": "m", "max_tokens": 1, "system": system,
                          "messages": [{"role": "user", "content": "Hi"}]});
        decode_request(body.to_string().as_bytes()).expect("valid")
    };
    let req = with_system(json!("Be brief."));
    assert_eq!(
        *req.messages,
        vec![Message::system("Be brief."), Message::user("Hi")]
    );
    let req = with_system(json!([
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
    ]));
    assert_eq!(
        *req.messages,
        vec![
            Message::system("You are Claude Code.\n\nBe brief."),
            Message::user("Hi")
        ]
    );
    // Empty or absent: no system message.
    for empty in [json!(null), json!(""), json!([])] {
        assert_eq!(*with_system(empty).messages, vec![Message::user("Hi")]);
    }
}

#[test]
fn tool_results_become_tool_messages_in_their_place_in_the_user_turn() {
    let req = decode_request(&request(json!([
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.rs"}},
            {"type": "tool_use", "id": "toolu_2", "name": "list", "input": {}},
            {"type": "tool_use", "id": "toolu_3", "name": "shot", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "fn main() {}"},
                         {"type": "text", "text": "// end"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
             "content": "<tool_use_error>no such dir</tool_use_error>"},
            {"type": "tool_result", "tool_use_id": "toolu_3", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}}]},
            {"type": "text", "text": "Now fix it."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "first"},
            {"type": "tool_result", "tool_use_id": "toolu_4", "is_error": true},
            {"type": "tool_result", "tool_use_id": "toolu_5", "is_error": false, "content": []}]}
    ])))
    .expect("valid");
    let call = |id: &str, name: &str, arguments: &str| ToolCall {
        id: id.into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    assert_eq!(
        *req.messages,
        vec![
            Message {
                tool_calls: vec![
                    call("toolu_1", "read", r#"{"path":"a.rs"}"#),
                    call("toolu_2", "list", "{}"),
                    call("toolu_3", "shot", "{}"),
                ],
                ..message(Role::Assistant, Vec::new())
            },
            tool_message("toolu_1", vec![text("fn main() {}\n\n// end")]),
            tool_message(
                "toolu_2",
                vec![text("Error: <tool_use_error>no such dir</tool_use_error>")]
            ),
            tool_message("toolu_3", vec![image("data:image/jpeg;base64,/9j/")]),
            Message::user("Now fix it."),
            Message::user("first"),
            tool_message("toolu_4", vec![text("Error")]),
            tool_message("toolu_5", Vec::new()),
        ]
    );
}

#[test]
fn images_become_data_urls_or_their_url() {
    let req = decode_request(&request(json!([{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklGRg=="}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}])))
    .expect("valid");
    assert_eq!(
        req.messages[0].content,
        vec![
            image("data:image/webp;base64,UklGRg=="),
            image("https://example.com/a.png")
        ]
    );
}

#[test]
fn tool_choice_kinds_map_to_the_normalised_choice() {
    for (choice, want) in [
        (json!({"type": "auto"}), Some(ToolChoice::Auto)),
        (
            json!({"type": "auto", "disable_parallel_tool_use": true}),
            Some(ToolChoice::Auto),
        ),
        (json!({"type": "any"}), Some(ToolChoice::Required)),
        (
            json!({"type": "tool", "name": "get_weather"}),
            Some(ToolChoice::Tool("get_weather".into())),
        ),
        (json!({"type": "none"}), Some(ToolChoice::None)),
        (json!(null), None),
    ] {
        let body = json!({"model": "m", "max_tokens": 1, "tool_choice": choice,
                          "messages": [{"role": "user", "content": "Hi"}]});
        let req = decode_request(body.to_string().as_bytes()).expect("valid");
        assert_eq!(req.tool_choice, want, "{body}");
    }
}

#[test]
fn sampling_settings_are_carried_and_hints_without_a_field_ignored() {
    let req = decode_request(
        br#"{"model": "smart", "max_tokens": 300, "temperature": 0.2, "top_p": 0.9,
        "top_k": 40, "stop_sequences": ["END", "STOP"], "stream": true,
        "metadata": {"user_id": "u-1"}, "service_tier": "auto",
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": [{"role": "user", "content": "Hi"},
                     {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "Let me think.", "signature": "EqQB"},
                        {"type": "redacted_thinking", "data": "EmwKAhgB"},
                        {"type": "text", "text": "Hello."}]}]}"#,
    )
    .expect("valid");
    assert_eq!(&*req.model, "smart");
    assert_eq!(req.max_tokens, Some(300));
    assert_eq!(req.temperature, Some(0.2));
    assert_eq!(req.top_p, Some(0.9));
    assert_eq!(*req.stop, ["END", "STOP"]);
    assert!(req.stream);
    // Earlier turns' thinking is dropped; their text stays.
    assert_eq!(
        *req.messages,
        vec![Message::user("Hi"), Message::assistant("Hello.")]
    );
    // `null` is absent.
    let req = decode_request(
        br#"{"model": "m", "max_tokens": 1, "stream": null, "tools": null,
        "stop_sequences": null, "temperature": null, "system": null,
        "messages": [{"role": "user", "content": "Hi"}]}"#,
    )
    .expect("valid");
    assert!(!req.stream && req.tools.is_empty() && req.stop.is_empty());
    assert_eq!(req.temperature, None);
}

#[test]
fn requests_that_cannot_be_served_faithfully_are_refused_naming_what_is_wrong() {
    let user = |content: Value| request(json!([{"role": "user", "content": content}]));
    let assistant = |content: Value| request(json!([{"role": "assistant", "content": content}]));
    let with = |extra: Value| {
        let mut body = json!({"model": "m", "max_tokens": 1,
                              "messages": [{"role": "user", "content": "Hi"}]});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        body.to_string().into_bytes()
    };
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (
            b"{".to_vec(),
            "invalid request body: EOF while parsing an object at line 1 column 1",
        ),
        (
            br#"{"model": "m", "messages": [{"role": "user", "content": "Hi"}]}"#.to_vec(),
            "max_tokens: Field required",
        ),
        (
            br#"{"max_tokens": 1, "messages": []}"#.to_vec(),
            "model: Field required",
        ),
        (
            br#"{"model": "m", "max_tokens": 1}"#.to_vec(),
            "messages: Field required",
        ),
        (
            with(
                json!({"tools": [{"type": "web_search_20250305", "name": "web_search",
                                   "max_uses": 5}]}),
            ),
            "tools[0]: server tool type \"web_search_20250305\" is not supported: \
             only client tools (with an input_schema) are served",
        ),
        (
            with(json!({"tools": [{"name": "f"}]})),
            "tools[0].input_schema: Field required",
        ),
        (
            request(json!([{"role": "system", "content": "x"}])),
            "messages[0].role: unknown role \"system\" (expected \"user\" or \"assistant\")",
        ),
        (
            user(json!(7)),
            "messages[0].content: must be a string or an array of content blocks",
        ),
        (
            user(json!([{"type": "document", "source": {"type": "text",
                          "media_type": "text/plain", "data": "x"}}])),
            "messages[0].content[0].type: block type \"document\" is not supported",
        ),
        (
            user(json!([{"text": "no type"}])),
            "messages[0].content[0].type: Field required",
        ),
        (
            user(json!([{"type": "text"}])),
            "messages[0].content[0].text: Field required",
        ),
        (
            user(json!([{"type": "image", "source": {"type": "file", "file_id": "file_1"}}])),
            "messages[0].content[0].source.type: image source \"file\" is not supported \
             (expected \"base64\" or \"url\")",
        ),
        (
            user(json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])),
            "messages[0].content[0]: a tool_use block belongs to an assistant message",
        ),
        (
            assistant(json!([{"type": "tool_result", "tool_use_id": "t"}])),
            "messages[0].content[0]: a tool_result block belongs to a user message",
        ),
        (
            with(json!({"tool_choice": {"type": "sometimes"}})),
            "tool_choice.type: unknown tool choice \"sometimes\" \
             (expected \"auto\", \"any\", \"tool\" or \"none\")",
        ),
        (
            with(json!({"tool_choice": {"type": "tool"}})),
            "tool_choice.name: Field required",
        ),
    ];
    for (body, want) in cases {
        let f = decode_request(&body).expect_err(want);
        assert_eq!(f.class(), FailureClass::BadRequest, "{want}");
        assert_eq!(f.message(), Some(want));
        assert_eq!(f.provider(), None, "the client's fault, not a provider's");
    }
}

// ----------------------------------------------------------------- answers

fn answer(text: &str, calls: Vec<ToolCall>, reason: FinishReason, usage: Usage) -> ChatResponse {
    ChatResponse {
        id: "msg_01XFDUDYJgAACzvnptvVoYEL".into(),
        model: "gpt-4o-mini".into(),
        provider: "openai".into(),
        choices: vec![Choice {
            index: 0,
            text: text.into(),
            tool_calls: calls,
            finish_reason: reason,
        }],
        usage,
        ..ChatResponse::default()
    }
}

fn usage(prompt: u32, completion: u32, cached: u32) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_input_tokens: cached,
    }
}

fn weather_call(id: &str, arguments: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "get_weather".into(),
        arguments: arguments.into(),
    }
}

/// `encode_response`'s value, checked against `write_response`'s bytes.
fn encoded(res: &ChatResponse, model: &str) -> Value {
    let value = encode_response(res, model);
    let bytes: Value = serde_json::from_slice(&write_response(res, model)).expect("JSON");
    assert_eq!(bytes, value);
    value
}

#[test]
fn a_text_answer_is_an_anthropic_message_with_cache_reads_apart() {
    let res = answer(
        "Hello!",
        Vec::new(),
        FinishReason::Stop,
        usage(2095, 503, 2000),
    );
    assert_eq!(
        encoded(&res, "claude-sonnet"),
        json!({
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "model": "claude-sonnet",
            "content": [{"type": "text", "text": "Hello!"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 95, "cache_read_input_tokens": 2000, "output_tokens": 503}
        })
    );
    // The bytes keep Anthropic's field order.
    let bytes = String::from_utf8(write_response(&res, "claude-sonnet")).expect("UTF-8");
    assert_eq!(
        bytes,
        r#"{"id":"msg_01XFDUDYJgAACzvnptvVoYEL","type":"message","role":"assistant","model":"claude-sonnet","content":[{"type":"text","text":"Hello!"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":95,"cache_read_input_tokens":2000,"output_tokens":503}}"#
    );
}

#[test]
fn tool_calls_are_tool_use_blocks_after_the_text() {
    let calls = vec![
        weather_call("call_1", r#"{"location": "Paris"}"#),
        weather_call("toolu_2", r#"{"location": "Oslo", "unit": "celsius"}"#),
    ];
    let res = answer("", calls.clone(), FinishReason::ToolCalls, usage(10, 5, 0));
    assert_eq!(
        encoded(&res, "m"),
        json!({
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL", "type": "message", "role": "assistant",
            "model": "m",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "get_weather",
                 "input": {"location": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather",
                 "input": {"location": "Oslo", "unit": "celsius"}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 5}
        })
    );
    // With text, the text comes first.
    let res = answer("Checking.", calls, FinishReason::ToolCalls, usage(10, 5, 0));
    let body = encoded(&res, "m");
    assert_eq!(
        body["content"][0],
        json!({"type": "text", "text": "Checking."})
    );
    assert_eq!(body["content"][1]["id"], "call_1");
    assert_eq!(body["content"].as_array().map(Vec::len), Some(3));
}

#[test]
fn stop_reasons_follow_the_finish_reason_and_tool_calls_always_stop_as_tool_use() {
    let call = || vec![weather_call("c", "{}")];
    for (calls, reason, want) in [
        (Vec::new(), FinishReason::Stop, "end_turn"),
        (Vec::new(), FinishReason::Other, "end_turn"),
        (Vec::new(), FinishReason::Length, "max_tokens"),
        (Vec::new(), FinishReason::ContentFilter, "refusal"),
        (Vec::new(), FinishReason::ToolCalls, "tool_use"),
        // Some upstreams stop with "stop" after calling tools.
        (call(), FinishReason::Stop, "tool_use"),
        (call(), FinishReason::Other, "tool_use"),
        (call(), FinishReason::Length, "max_tokens"),
    ] {
        let res = answer("x", calls, reason, Usage::default());
        assert_eq!(encoded(&res, "m")["stop_reason"], want, "{reason:?}");
    }
    // No choice at all: an empty text and a natural end.
    let empty = encode_response(&ChatResponse::default(), "m");
    assert_eq!(empty["content"], json!([{"type": "text", "text": ""}]));
    assert_eq!(empty["stop_reason"], "end_turn");
}

#[test]
fn broken_tool_arguments_are_an_empty_input_and_missing_ids_are_made_up() {
    let calls = vec![
        weather_call("", r#"{"location": "Par"#),
        weather_call("call_b", "[1, 2]"),
    ];
    let res = answer("Hi", calls, FinishReason::ToolCalls, Usage::default());
    let body = encoded(&res, "m");
    assert_eq!(
        body["content"][1],
        json!({"type": "tool_use", "id": "toolu_01XFDUDYJgAACzvnptvVoYEL_1",
               "name": "get_weather", "input": {}})
    );
    assert_eq!(body["content"][2]["input"], json!({}));
}

#[test]
fn message_ids_keep_anthropics_prefix_or_get_one() {
    let with_id = |id: &str| ChatResponse {
        id: id.into(),
        ..ChatResponse::default()
    };
    assert_eq!(encoded(&with_id("msg_abc"), "m")["id"], "msg_abc");
    assert_eq!(encoded(&with_id("chatcmpl-9"), "m")["id"], "msg_chatcmpl-9");
    // No id: a fresh one each time (the time and a counter, in hex).
    let fresh = |_| {
        let id = encode_response(&ChatResponse::default(), "m")["id"]
            .as_str()
            .expect("a string")
            .to_owned();
        assert_eq!(id.len(), "msg_".len() + 24, "{id}");
        assert!(id.starts_with("msg_"), "{id}");
        assert!(id[4..].bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        id
    };
    let ids: std::collections::HashSet<String> = (0..100).map(fresh).collect();
    assert_eq!(ids.len(), 100);
}

#[test]
fn written_answers_decode_back_through_our_own_anthropic_decoder() {
    for res in [
        answer(
            "It is 15 degrees.",
            Vec::new(),
            FinishReason::Stop,
            usage(2095, 503, 2000),
        ),
        answer(
            "Checking.",
            vec![
                weather_call("toolu_1", r#"{"location":"Paris"}"#),
                weather_call("toolu_2", r#"{"location":"Oslo","unit":"celsius"}"#),
            ],
            FinishReason::ToolCalls,
            usage(40, 12, 0),
        ),
        answer("Cut", Vec::new(), FinishReason::Length, usage(3, 16, 0)),
        answer("", Vec::new(), FinishReason::ContentFilter, usage(3, 0, 0)),
    ] {
        let back =
            anthropic::decode(&write_response(&res, "claude-x"), Duration::ZERO).expect("decodes");
        assert_eq!(back.id, res.id);
        assert_eq!(back.model, "claude-x");
        assert_eq!(back.choices, res.choices);
        assert_eq!(back.usage, res.usage);
    }
}

// ----------------------------------------------------------------- streams

fn chunk_text(t: &str) -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        text: Some(t.into()),
        ..ChatChunk::default()
    })
}

fn chunk_call(index: u32, id: Option<&str>, name: Option<&str>, args: &str) -> ChatChunk {
    ChatChunk {
        tool_call: Some(ToolCallDelta {
            index,
            id: id.map(Into::into),
            name: name.map(Into::into),
            arguments: args.into(),
        }),
        ..ChatChunk::default()
    }
}

fn chunk_end(reason: Option<FinishReason>, u: Option<Usage>) -> Result<ChatChunk, Failure> {
    Ok(ChatChunk {
        finish_reason: reason,
        usage: u,
        ..ChatChunk::default()
    })
}

fn chunk_usage(u: Usage) -> Result<ChatChunk, Failure> {
    chunk_end(None, Some(u))
}

/// Every frame of `SseFrames` over `items` (all ready at once).
fn frames(items: Vec<Result<ChatChunk, Failure>>) -> Vec<String> {
    let stream = ChatStream::from_chunks("openai", "claude-x", items);
    let mut frames = SseFrames::new(stream, "msg_1".into());
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = Vec::new();
    loop {
        match Pin::new(&mut frames).poll_next(&mut cx) {
            Poll::Ready(Some(frame)) => {
                out.push(String::from_utf8(frame.to_vec()).expect("UTF-8"));
            }
            Poll::Ready(None) => break,
            Poll::Pending => panic!("a stream of ready chunks is never pending"),
        }
    }
    // Ended for good.
    assert!(matches!(
        Pin::new(&mut frames).poll_next(&mut cx),
        Poll::Ready(None)
    ));
    out
}

/// One event as Anthropic frames it.
fn ev(name: &str, data: &str) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

fn start(input_tokens: u32) -> String {
    ev(
        "message_start",
        &format!(
            r#"{{"type":"message_start","message":{{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{{"input_tokens":{input_tokens},"output_tokens":0}}}}}}"#
        ),
    ) + &ev("ping", r#"{"type":"ping"}"#)
}

fn text_start(index: u32) -> String {
    ev(
        "content_block_start",
        &format!(
            r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"text","text":""}}}}"#
        ),
    )
}

fn text_delta(index: u32, text: &str) -> String {
    ev(
        "content_block_delta",
        &format!(
            r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"text_delta","text":"{text}"}}}}"#
        ),
    )
}

fn tool_start(index: u32, id: &str, name: &str) -> String {
    ev(
        "content_block_start",
        &format!(
            r#"{{"type":"content_block_start","index":{index},"content_block":{{"type":"tool_use","id":"{id}","name":"{name}","input":{{}}}}}}"#
        ),
    )
}

fn json_delta(index: u32, partial: &str) -> String {
    let partial = serde_json::to_string(partial).expect("a string");
    ev(
        "content_block_delta",
        &format!(
            r#"{{"type":"content_block_delta","index":{index},"delta":{{"type":"input_json_delta","partial_json":{partial}}}}}"#
        ),
    )
}

fn stop(index: u32) -> String {
    ev(
        "content_block_stop",
        &format!(r#"{{"type":"content_block_stop","index":{index}}}"#),
    )
}

fn end(reason: &str, usage: &str) -> String {
    ev(
        "message_delta",
        &format!(
            r#"{{"type":"message_delta","delta":{{"stop_reason":"{reason}","stop_sequence":null}},"usage":{usage}}}"#
        ),
    ) + &ev("message_stop", r#"{"type":"message_stop"}"#)
}

#[test]
fn a_text_stream_is_framed_as_anthropic_sends_it() {
    let out = frames(vec![
        chunk_usage(usage(25, 0, 0)),
        chunk_text("Hello"),
        chunk_text("!"),
        chunk_end(Some(FinishReason::Stop), Some(usage(0, 15, 0))),
    ]);
    assert_eq!(
        out,
        vec![
            start(25) + &text_start(0) + &text_delta(0, "Hello"),
            text_delta(0, "!"),
            stop(0) + &end("end_turn", r#"{"input_tokens":25,"output_tokens":15}"#),
        ]
    );
}

#[test]
fn text_and_two_tool_calls_stream_as_three_blocks_in_order() {
    let out = frames(vec![
        chunk_text("Let me check."),
        Ok(chunk_call(0, Some("call_a"), Some("get_weather"), "")),
        Ok(chunk_call(0, None, None, r#"{"location":"#)),
        Ok(chunk_call(0, None, None, r#""Paris"}"#)),
        Ok(chunk_call(
            1,
            Some("call_b"),
            Some("get_time"),
            r#"{"tz":"CET"}"#,
        )),
        chunk_end(Some(FinishReason::ToolCalls), Some(usage(40, 30, 0))),
    ]);
    assert_eq!(
        out.concat(),
        [
            start(0),
            text_start(0),
            text_delta(0, "Let me check."),
            stop(0),
            tool_start(1, "call_a", "get_weather"),
            json_delta(1, r#"{"location":"#),
            json_delta(1, r#""Paris"}"#),
            stop(1),
            tool_start(2, "call_b", "get_time"),
            json_delta(2, r#"{"tz":"CET"}"#),
            stop(2),
            end("tool_use", r#"{"input_tokens":40,"output_tokens":30}"#),
        ]
        .concat()
    );
    // The empty first fragment opened its block and sent no delta.
    assert_eq!(out[1], stop(0) + &tool_start(1, "call_a", "get_weather"));
}

#[test]
fn a_tool_call_after_a_stop_still_stops_as_tool_use_and_gets_an_id_when_it_has_none() {
    let out = frames(vec![
        Ok(chunk_call(3, None, Some("get_weather"), "{}")),
        chunk_end(Some(FinishReason::Stop), None),
    ]);
    assert_eq!(
        out.concat(),
        [
            start(0),
            tool_start(0, "toolu_1_0", "get_weather"),
            json_delta(0, "{}"),
            stop(0),
            end("tool_use", r#"{"output_tokens":0}"#),
        ]
        .concat()
    );
}

#[test]
fn a_failure_after_the_commit_point_ends_with_one_error_event() {
    let overloaded = Failure::new(FailureClass::Transient)
        .with_provider("openai")
        .with_message("upstream went away");
    let out = frames(vec![
        chunk_usage(usage(12, 0, 0)),
        chunk_text("Hel"),
        Err(overloaded),
        chunk_text("never sent"),
    ]);
    assert_eq!(
        out,
        vec![
            start(12) + &text_start(0) + &text_delta(0, "Hel"),
            ev(
                "error",
                r#"{"type":"error","error":{"type":"overloaded_error","message":"upstream went away"}}"#
            ),
        ]
    );
}

#[test]
fn usage_reported_in_parts_keeps_every_count() {
    // Anthropic's way: input (with cache reads) first, output last.
    let out = frames(vec![
        chunk_usage(usage(2095, 1, 2000)),
        chunk_text("Hi"),
        chunk_end(Some(FinishReason::Stop), Some(usage(0, 7, 0))),
    ]);
    assert!(out[0].contains(
        r#""usage":{"input_tokens":95,"cache_read_input_tokens":2000,"output_tokens":1}}}"#
    ));
    assert!(out.concat().ends_with(&end(
        "end_turn",
        r#"{"input_tokens":95,"cache_read_input_tokens":2000,"output_tokens":7}"#
    )));
    // OpenAI's way: everything at the end, after the finish reason.
    let out = frames(vec![
        chunk_text("Hi"),
        chunk_end(Some(FinishReason::Stop), None),
        chunk_usage(usage(19, 2, 0)),
    ]);
    assert_eq!(
        out.concat(),
        [
            start(0),
            text_start(0),
            text_delta(0, "Hi"),
            stop(0),
            end("end_turn", r#"{"input_tokens":19,"output_tokens":2}"#),
        ]
        .concat()
    );
}

#[test]
fn an_interleaved_tool_call_ends_the_stream_with_an_error() {
    let out = frames(vec![
        Ok(chunk_call(0, Some("a"), Some("f"), "{")),
        Ok(chunk_call(1, Some("b"), Some("g"), "{}")),
        Ok(chunk_call(0, None, None, "}")),
        chunk_end(Some(FinishReason::ToolCalls), None),
    ]);
    assert_eq!(out.len(), 3);
    assert_eq!(
        out[2],
        ev(
            "error",
            r#"{"type":"error","error":{"type":"api_error","message":"the upstream interleaved its tool calls: a closed tool_use block cannot reopen"}}"#
        )
    );
}

#[test]
fn a_stream_without_content_still_starts_and_stops_its_message() {
    let out = frames(vec![chunk_end(Some(FinishReason::Length), None)]);
    assert_eq!(
        out,
        vec![start(0) + &end("max_tokens", r#"{"output_tokens":0}"#)]
    );
    // Chunks of another choice only count for usage.
    let out = frames(vec![
        Ok(ChatChunk {
            index: 1,
            text: Some("other".into()),
            usage: Some(usage(5, 0, 0)),
            ..ChatChunk::default()
        }),
        chunk_text("mine"),
    ]);
    assert_eq!(
        out.concat(),
        [
            start(5),
            text_start(0),
            text_delta(0, "mine"),
            stop(0),
            end("end_turn", r#"{"input_tokens":5,"output_tokens":0}"#),
        ]
        .concat()
    );
}

/// `frames` read back by this crate's Anthropic stream decoder: its
/// chunks, and whether it saw the terminator.
fn decoded(frames: &[String]) -> (Vec<Result<ChatChunk, Failure>>, bool) {
    let mut parser = SseParser::new();
    let mut chunks = Vec::new();
    let mut done = false;
    for frame in frames {
        for event in parser.push(frame.as_bytes()).expect("well-formed SSE") {
            assert!(!done, "nothing after message_stop");
            match anthropic_event(&event) {
                Ok(StreamItem::Chunk(c)) => chunks.push(Ok(c)),
                Ok(StreamItem::Chunks(cs)) => chunks.extend(cs.into_iter().map(Ok)),
                Ok(StreamItem::Done) => done = true,
                Ok(StreamItem::Skip) => {}
                Err(f) => chunks.push(Err(f)),
            }
        }
    }
    (chunks, done)
}

#[tokio::test]
async fn streams_decode_back_through_our_own_anthropic_decoder() {
    let original = || {
        vec![
            chunk_usage(usage(300, 0, 200)),
            chunk_text("Checking "),
            chunk_text("both."),
            Ok(chunk_call(0, Some("call_a"), Some("get_weather"), "")),
            Ok(chunk_call(0, None, None, r#"{"location":"Paris"}"#)),
            Ok(chunk_call(1, Some("call_b"), Some("get_time"), r#"{"tz":"#)),
            Ok(chunk_call(1, None, None, r#""CET"}"#)),
            chunk_end(Some(FinishReason::ToolCalls), Some(usage(0, 42, 0))),
        ]
    };
    let (chunks, done) = decoded(&frames(original()));
    assert!(done, "the stream ends with message_stop");
    let want = ChatStream::from_chunks("openai", "claude-x", original())
        .collect_response()
        .await
        .expect("whole");
    let back = ChatStream::from_chunks("anthropic", "claude-x", chunks)
        .collect_response()
        .await
        .expect("whole");
    assert_eq!(back.choices, want.choices);
    assert_eq!(back.choices[0].text, "Checking both.");
    assert_eq!(back.choices[0].tool_calls.len(), 2);
    assert_eq!(back.usage, usage(300, 42, 200));

    // A failure comes back as the stream's failure, its class kept.
    let (chunks, done) = decoded(&frames(vec![
        chunk_text("Hel"),
        Err(Failure::new(FailureClass::Transient).with_message("reset")),
    ]));
    assert!(!done, "no message_stop after an error");
    let f = chunks
        .into_iter()
        .find_map(Result::err)
        .expect("the error event");
    assert_eq!(f.class(), FailureClass::Transient);
    assert_eq!(f.message(), Some("reset"));
}

// ---------------------------------------------------------------- failures

#[test]
fn failures_map_to_anthropic_statuses_and_error_types() {
    let want = |class: FailureClass| -> (u16, &str) {
        match class {
            FailureClass::Transient
            | FailureClass::RateLimited
            | FailureClass::QuotaExhausted
            | FailureClass::Timeout
            | FailureClass::CircuitOpen => (503, "overloaded_error"),
            FailureClass::BadRequest
            | FailureClass::ContextWindowExceeded
            | FailureClass::ContentFiltered => (400, "invalid_request_error"),
            FailureClass::Auth
            | FailureClass::NotFound
            | FailureClass::InvalidResponse
            | FailureClass::Cancelled => (502, "api_error"),
            FailureClass::Conflict => (409, "invalid_request_error"),
            FailureClass::DeadlineExceeded => (504, "timeout_error"),
            FailureClass::CostBudgetExhausted => (402, "billing_error"),
            FailureClass::TenantQuotaExhausted => (429, "rate_limit_error"),
            other => panic!("a class without a row: {other:?}"),
        }
    };
    for class in FailureClass::ALL {
        let (status, kind) = failure_status(&Failure::new(class));
        assert_eq!((status.as_u16(), kind), want(class), "{class:?}");
        // When every link failed: 503, unless the call ran out of time,
        // budget or quota.
        let mut all = Failure::new(class);
        all.mark_all_links_failed(None);
        let (status, kind) = failure_status(&all);
        let expected = match want(class).0 {
            402 | 429 | 504 => want(class),
            _ => (503, "overloaded_error"),
        };
        assert_eq!(
            (status.as_u16(), kind),
            expected,
            "all links failed: {class:?}"
        );
    }
    // The gateway's own 422 (no provider) stays a 422; an upstream's is a 400.
    let ours =
        Failure::new(FailureClass::BadRequest).with_status(http::StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        failure_status(&ours),
        (
            http::StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_request_error"
        )
    );
    let upstream = ours.with_provider("anthropic");
    assert_eq!(
        failure_status(&upstream),
        (http::StatusCode::BAD_REQUEST, "invalid_request_error")
    );
}

fn body_of(res: http::Response<http_body_util::Full<bytes::Bytes>>) -> String {
    use http_body_util::BodyExt;
    let collected = match ready(res.into_body().collect()) {
        Ok(collected) => collected,
        Err(never) => match never {},
    };
    String::from_utf8(collected.to_bytes().to_vec()).expect("UTF-8")
}

/// The body of a ready future (`Full` is always ready).
fn ready<F: std::future::Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("a full body is never pending"),
    }
}

#[test]
fn failure_answers_are_anthropic_error_bodies_with_retry_after_when_retrying_helps() {
    let res = failure_response(
        &Failure::new(FailureClass::RateLimited)
            .with_retry_after(Duration::from_millis(2500))
            .with_message("slow down"),
    );
    assert_eq!(res.status(), 503);
    assert_eq!(res.headers()["retry-after"], "3");
    assert_eq!(res.headers()["content-type"], "application/json");
    assert_eq!(
        body_of(res),
        r#"{"type":"error","error":{"type":"overloaded_error","message":"slow down"}}"#
    );
    let res = failure_response(
        &Failure::new(FailureClass::TenantQuotaExhausted)
            .with_retry_after(Duration::from_millis(1)),
    );
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["retry-after"], "1");
    assert_eq!(
        body_of(res),
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"the call failed"}}"#
    );
    // A client error has nothing to wait for.
    let res = failure_response(
        &Failure::new(FailureClass::BadRequest)
            .with_retry_after(Duration::from_secs(5))
            .with_message("max_tokens: Field required"),
    );
    assert_eq!(res.status(), 400);
    assert!(res.headers().get("retry-after").is_none());
    assert!(res.headers().get("x-should-retry").is_none());
    // Our credentials refused upstream: the SDK is told not to retry.
    let auth = failure_response(
        &Failure::new(FailureClass::Auth)
            .with_provider("openai")
            .with_message("bad key"),
    );
    assert_eq!(auth.status(), 502);
    assert_eq!(auth.headers()["x-should-retry"], "false");
    assert!(
        failure_response(&Failure::new(FailureClass::RateLimited))
            .headers()
            .get("x-should-retry")
            .is_none()
    );
    assert_eq!(
        body_of(res),
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"max_tokens: Field required"}}"#
    );
    // The body is the one `encode_error` builds.
    assert_eq!(
        encode_error("not_found_error", "no such model"),
        json!({"type": "error", "error": {"type": "not_found_error", "message": "no such model"}})
    );
}

#[test]
fn a_stream_error_event_reads_back_as_the_same_kind_of_failure() {
    for (failure, kind, class) in [
        (
            Failure::new(FailureClass::Transient),
            "overloaded_error",
            FailureClass::Transient,
        ),
        (
            Failure::new(FailureClass::InvalidResponse),
            "api_error",
            FailureClass::Transient,
        ),
        (
            Failure::new(FailureClass::BadRequest),
            "invalid_request_error",
            FailureClass::BadRequest,
        ),
    ] {
        let event = sse_error_event(&failure);
        assert_eq!(
            std::str::from_utf8(&event).expect("UTF-8"),
            ev(
                "error",
                &format!(
                    r#"{{"type":"error","error":{{"type":"{kind}","message":"the stream failed"}}}}"#
                )
            )
        );
        let events = SseParser::new().push(&event).expect("one event");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].event.as_deref(), Some("error"));
        let back = anthropic_event(&events[0]).expect_err("an error event");
        assert_eq!(back.class(), class, "{kind}");
    }
}
