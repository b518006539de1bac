//! Streams that break after their first token, and upstreams that are
//! silent: one loopback fault test per scenario of the failover benchmark
//! (a cut at 40 and at 60 tokens, a 30 s stall, a malformed chunk, no
//! `[DONE]`, a fallback that refuses a prefill, a silent upstream, a 20 s
//! first token), each counting the tokens the client got twice or never
//! (both must be 0) and the time to recovery, under one policy.
//!
//! The answer is 100 numbered tokens (`w0 ` … `w99 `). A mock upstream
//! asked to continue (the request carries the partial answer: as a
//! prefill, or followed by the instruction to continue) sends the rest,
//! from the first token the partial answer lacks, repeating the last two
//! it has, as a model told to continue often does.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;
use tower_llm_providers::mock::{MockServer, Recorded, Reply, Step};

use crate::support::*;

const TOKENS: usize = 100;

fn token(i: usize) -> String {
    format!("w{i} ")
}

/// The whole answer.
fn full() -> String {
    (0..TOKENS).map(token).collect()
}

fn openai_chunk(text: &str) -> Step {
    let chunk = serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
    Step::sse(None, &chunk.to_string())
}

fn openai_end() -> Vec<Step> {
    let chunk = serde_json::json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
        "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    vec![
        Step::sse(None, &chunk.to_string()),
        Step::Send(Bytes::from_static(b"data: [DONE]\n\n")),
    ]
}

/// The partial answer a continuation request carries (the last assistant
/// message), if any.
fn partial(req: &Recorded) -> Option<String> {
    let body: serde_json::Value = serde_json::from_slice(&req.body).ok()?;
    let messages = body["messages"].as_array()?;
    messages
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant")
        .and_then(|m| match &m["content"] {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(blocks) => Some(
                blocks
                    .iter()
                    .filter_map(|b| b["text"].as_str())
                    .collect::<String>(),
            ),
            _ => None,
        })
}

/// Where a continuation starts: two tokens before the first the partial
/// answer lacks.
fn resume_from(req: &Recorded) -> Option<usize> {
    let have = partial(req)?.split_whitespace().count();
    Some(have.saturating_sub(2))
}

/// The rest of the answer from token `from`, in OpenAI's stream format.
fn openai_rest(from: usize) -> Reply {
    let mut steps: Vec<Step> = (from..TOKENS).map(|i| openai_chunk(&token(i))).collect();
    steps.extend(openai_end());
    Reply::sse_steps(steps)
}

/// The first `n` tokens, then `fault`.
fn first_then(n: usize, fault: Vec<Step>) -> Reply {
    let mut steps: Vec<Step> = (0..n).map(|i| openai_chunk(&token(i))).collect();
    steps.extend(fault);
    Reply::sse_steps(steps)
}

fn cut_at_40(req: &Recorded) -> Reply {
    match resume_from(req) {
        Some(from) => openai_rest(from),
        None => first_then(40, vec![Step::Break]),
    }
}

fn cut_at_60(req: &Recorded) -> Reply {
    match resume_from(req) {
        Some(from) => openai_rest(from),
        None => first_then(60, vec![Step::Break]),
    }
}

fn stall_30s(req: &Recorded) -> Reply {
    match resume_from(req) {
        Some(from) => openai_rest(from),
        None => first_then(30, vec![Step::Pause(Duration::from_secs(30)), Step::Stall]),
    }
}

fn malformed_chunk(req: &Recorded) -> Reply {
    match resume_from(req) {
        Some(from) => openai_rest(from),
        None => first_then(
            50,
            vec![
                Step::Send(Bytes::from_static(b"data: {\"choices\": [{\"delta\": \n\n")),
                openai_chunk(&token(50)),
            ],
        ),
    }
}

fn no_done(req: &Recorded) -> Reply {
    match resume_from(req) {
        Some(from) => openai_rest(from),
        // The body ends cleanly, with neither finish reason nor `[DONE]`.
        None => first_then(70, Vec::new()),
    }
}

/// Cut at 40, then down (503) for the continuation: only the fallback
/// can finish the answer.
fn cut_then_down(req: &Recorded) -> Reply {
    match resume_from(req) {
        Some(_) => Reply::openai_error(503, "server_error", "down"),
        None => first_then(40, vec![Step::Break]),
    }
}

/// An Anthropic backup whose model refuses a prefill (a conversation that
/// ends with an assistant message), as newer Claude models do.
fn refuses_prefill(req: &Recorded) -> Reply {
    let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap_or_default();
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .map(|m| m["role"].clone());
    if last == Some(serde_json::json!("assistant")) {
        return Reply::json(
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"This model does not support assistant message prefill. The conversation must end with a user message."}}"#,
        );
    }
    let from = resume_from(req).unwrap_or(0);
    let pieces: Vec<String> = (from..TOKENS).map(token).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    Reply::anthropic_stream(&pieces)
}

fn silent(_req: &Recorded) -> Reply {
    Reply::Hang
}

fn whole_after_20s(_req: &Recorded) -> Reply {
    Reply::Delayed(Duration::from_secs(20), Box::new(openai_rest(0)))
}

fn whole(_req: &Recorded) -> Reply {
    openai_rest(0)
}

/// One policy for every scenario: resume up to two continuations, a 5 s
/// idle limit, malformed chunks failing the stream (so it is continued),
/// and on the primary a 2 s head timeout and a learned first-token limit.
fn policy(p: &MockServer, b: &MockServer) -> String {
    format!(
        r#"
        [deadline]
        total_ms = 120000
        [retry]
        max_attempts = 2
        attempt_timeout_ms = 60000
        base_ms = 100
        factor = 2
        max_ms = 400
        jitter = "none"
        [breaker]
        consecutive_failures = 50
        cooldown_ms = 30000
        [stream]
        first_token_timeout_ms = 30000
        idle_timeout_ms = 5000
        [complete]
        max_bytes = 65536
        max_ms = 30000
        [[providers]]
        name = "primary"
        kind = "openai"
        base_url = "{}/v1"
        api_key_env = "UNUSED"
        silence = {{ head_timeout_ms = 2000, learned_first_token = {{ min_samples = 3, floor_ms = 1000 }} }}
        [[providers]]
        name = "backup"
        kind = "anthropic"
        base_url = "{}"
        api_key_env = "UNUSED"
        [[routes]]
        model = "smart"
        resume = {{ max_continuations = 2 }}
        chain = [{{ provider = "primary", model = "gpt-4o-mini" }}, {{ provider = "backup", model = "claude-x" }}]
        "#,
        p.url(),
        b.url()
    )
}

/// What a client made of one streamed answer.
struct Received {
    text: String,
    continued: bool,
    done: bool,
    error: bool,
    took: Duration,
}

impl Received {
    /// Tokens the client got more than once.
    fn duplicated(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        self.text
            .split_whitespace()
            .filter(|t| !seen.insert(*t))
            .count()
    }

    /// Tokens of the answer the client never got.
    fn missing(&self) -> usize {
        let got: std::collections::HashSet<&str> = self.text.split_whitespace().collect();
        (0..TOKENS)
            .filter(|i| !got.contains(format!("w{i}").as_str()))
            .count()
    }
}

async fn stream(h: &Harness, headers: &[(&str, &str)]) -> Received {
    let started = Instant::now();
    let a = h
        .send("POST", "/v1/chat/completions", HELLO_STREAM, headers)
        .await;
    assert_eq!(a.status, 200, "{}", a.body);
    let mut text = String::new();
    let mut error = false;
    for data in a.body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).expect("a JSON event");
        if v.get("error").is_some() {
            error = true;
        }
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    Received {
        text,
        continued: a.body.contains(": continued"),
        done: a.body.contains("data: [DONE]"),
        error,
        took: started.elapsed(),
    }
}

/// The scenario's answer is whole: every token once, ended as a clean
/// stream that says it was continued.
fn assert_rescued(r: &Received, scenario: &str) {
    assert_eq!(r.duplicated(), 0, "{scenario}: duplicated tokens");
    assert_eq!(r.missing(), 0, "{scenario}: missing tokens");
    assert_eq!(r.text, full(), "{scenario}");
    assert!(r.done && !r.error, "{scenario}: not a clean end");
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_at_40_or_60_tokens_is_continued_without_a_duplicated_or_missing_token() {
    for (scenario, upstream) in [
        ("cut at 40", cut_at_40 as fn(&Recorded) -> Reply),
        ("cut at 60", cut_at_60),
    ] {
        let h = start_text(Reply::With(upstream), Reply::With(whole), policy).await;
        let r = stream(&h, &[]).await;
        assert_rescued(&r, scenario);
        assert!(r.continued, "{scenario}: the stream says it was continued");
        // The primary, asked again: the continuation (no prefill on an
        // OpenAI link: the partial answer, then the instruction).
        let sent = h.primary.received();
        assert_eq!(sent.len(), 2, "{scenario}");
        let body: serde_json::Value = serde_json::from_slice(&sent[1].body).expect("json");
        let messages = body["messages"].as_array().expect("messages");
        assert_eq!(messages[messages.len() - 2]["role"], "assistant");
        assert_eq!(messages[messages.len() - 1]["role"], "user");
        assert!(h.backup.received().is_empty(), "{scenario}");
        assert!(r.took < Duration::from_secs(1), "{scenario}: {:?}", r.took);
    }
}

#[tokio::test(start_paused = true)]
async fn a_stream_stalled_for_30s_is_continued_at_the_idle_limit() {
    let h = start_text(Reply::With(stall_30s), Reply::With(whole), policy).await;
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "30 s stall");
    assert!(r.continued);
    // The 5 s idle limit, then the continuation: recovered in 5 s, not 30.
    assert!(
        r.took >= Duration::from_secs(5) && r.took < Duration::from_secs(6),
        "{:?}",
        r.took
    );
}

#[tokio::test(start_paused = true)]
async fn a_malformed_chunk_ends_the_piece_and_the_stream_is_continued() {
    let h = start_text(Reply::With(malformed_chunk), Reply::With(whole), policy).await;
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "malformed chunk");
    assert!(r.continued);
    assert_eq!(h.primary.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stream_without_its_finish_or_done_is_continued_not_shown_as_complete() {
    let h = start_text(Reply::With(no_done), Reply::With(whole), policy).await;
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "no [DONE]");
    assert!(r.continued);
}

#[tokio::test(start_paused = true)]
async fn a_fallback_that_refuses_a_prefill_is_asked_again_without_one() {
    let h = start_text(
        Reply::With(cut_then_down),
        Reply::With(refuses_prefill),
        policy,
    )
    .await;
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "fallback refusing prefill");
    assert!(r.continued);
    // The backup (Anthropic: prefill by default) refused the prefilled
    // continuation, learned it, and took the instruction instead.
    let sent = h.backup.received();
    assert_eq!(sent.len(), 2);
    let last_role = |i: usize| {
        let body: serde_json::Value = serde_json::from_slice(&sent[i].body).expect("json");
        body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .map(|m| m["role"].clone())
    };
    assert_eq!(last_role(0), Some(serde_json::json!("assistant")));
    assert_eq!(last_role(1), Some(serde_json::json!("user")));

    // Learned: the next continuation goes there without a prefill at once.
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "fallback refusing prefill, learned");
    assert_eq!(h.backup.received().len(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_silent_upstream_fails_over_at_the_head_timeout() {
    let h = start_text(Reply::With(silent), Reply::With(refuses_prefill), policy).await;
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "silent upstream");
    assert!(!r.continued, "nothing was sent before the failover");
    // Two attempts of 2 s each on the primary, then the backup.
    assert_eq!(h.primary.received().len(), 2);
    assert!(
        r.took >= Duration::from_secs(4) && r.took < Duration::from_secs(5),
        "{:?}",
        r.took
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_token_slower_than_the_links_own_history_fails_over_in_seconds() {
    let h = start_text(Reply::With(whole), Reply::With(refuses_prefill), policy).await;
    // Three quick answers teach the primary's first-token limit (its
    // floor: 1 s).
    for _ in 0..3 {
        assert_rescued(&stream(&h, &[]).await, "warm-up");
    }
    h.primary.push(Reply::With(whole_after_20s));
    h.primary.push(Reply::With(whole_after_20s));
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "20 s first token");
    // Each attempt cut at the learned 1 s (a timeout doubles it: 2 s for
    // the second), then the backup: about 3 s instead of 20.
    assert_eq!(h.primary.received().len(), 5);
    assert!(
        r.took >= Duration::from_secs(3) && r.took < Duration::from_secs(4),
        "{:?}",
        r.took
    );
}

#[tokio::test(start_paused = true)]
async fn a_stream_held_until_complete_is_retried_whole_instead_of_continued() {
    let h = start_text(Reply::With(whole), Reply::With(whole), policy).await;
    h.primary.push(first_then(40, vec![Step::Break]));
    let r = stream(&h, &[("x-llm-complete", "true")]).await;
    assert_rescued(&r, "complete-or-fail");
    assert!(
        !r.continued,
        "held: the cut was retried before anything was sent"
    );
    assert_eq!(h.primary.received().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_resume_a_cut_stream_ends_with_its_error_never_as_a_success() {
    let h = start_text(Reply::With(cut_at_40), Reply::With(whole), |p, b| {
        policy(p, b).replace("resume = { max_continuations = 2 }", "")
    })
    .await;
    let r = stream(&h, &[]).await;
    // What arrived before the cut (the mock's last writes may be lost
    // with the connection), and not one token more.
    assert!(
        !r.text.is_empty() && full().starts_with(&r.text),
        "{}",
        r.text
    );
    assert!(r.text.split_whitespace().count() <= 40);
    assert!(r.error, "the cut is one error event");
    assert!(!r.done, "and no [DONE]");
    assert!(!r.continued);
    assert_eq!(h.primary.received().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn each_piece_of_a_continued_stream_counts_on_the_status_page() {
    let h = start_text(Reply::With(cut_at_40), Reply::With(whole), policy).await;
    assert_rescued(&stream(&h, &[]).await, "cut at 40");
    // The continuation's records arrive once the stream is over.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let page = h.send("GET", "/status", "", &[]).await.body;
    // The primary served both pieces: two attempts, no failure.
    assert!(
        page.contains("<td class=\"num\">2 / 2 / 2</td><td class=\"num\">0 / 0 / 0</td>"),
        "{page}"
    );
}

#[tokio::test(start_paused = true)]
async fn what_a_first_token_limit_learned_survives_a_reload() {
    let h = start_text(Reply::With(whole), Reply::With(refuses_prefill), policy).await;
    for _ in 0..3 {
        assert_rescued(&stream(&h, &[]).await, "warm-up");
    }
    // The same policy again (a reload keeps the limit while its settings
    // are unchanged): the slow first token is still cut at 1 s, then 2 s.
    let text = policy(&h.primary, &h.backup);
    h.gateway
        .reload(tower_llm_gateway::GatewayConfig::from_toml(&text).expect("policy"))
        .expect("reloaded");
    h.primary.push(Reply::With(whole_after_20s));
    h.primary.push(Reply::With(whole_after_20s));
    let r = stream(&h, &[]).await;
    assert_rescued(&r, "20 s first token after a reload");
    assert!(
        r.took >= Duration::from_secs(3) && r.took < Duration::from_secs(4),
        "{:?}",
        r.took
    );
}
