//! The `generateContent` answer, and Gemini's error answers.

use std::borrow::Cow;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::Value;
use tower_llm_core::{
    ChatResponse, Choice, Failure, FailureClass, FinishReason, Outcome, ToolCall, Usage,
    classify_status,
};

use super::PROVIDER;
use crate::dialect::ErrorBody;
use crate::failure::{Scrub, error_failure, invalid, invalid_json};

/// A `GenerateContentResponse`: a whole answer, or one event of a stream.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireResponse<'a> {
    #[serde(default)]
    pub(super) candidates: Vec<WireCandidate>,
    #[serde(default)]
    pub(super) prompt_feedback: Option<WireFeedback>,
    #[serde(default)]
    pub(super) usage_metadata: Option<WireUsage>,
    #[serde(default)]
    model_version: Option<String>,
    #[serde(default)]
    response_id: Option<String>,
    /// An error in a 2xx body (a stream's in-band error event).
    #[serde(borrow, default)]
    pub(super) error: Option<WireError<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireCandidate {
    #[serde(default)]
    pub(super) content: Option<WireContent>,
    #[serde(default)]
    pub(super) finish_reason: Option<String>,
    /// Left out when 0 (proto3 JSON).
    #[serde(default)]
    pub(super) index: u32,
}

#[derive(Deserialize)]
pub(super) struct WireContent {
    #[serde(default)]
    pub(super) parts: Vec<WirePart>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WirePart {
    #[serde(default)]
    pub(super) text: Option<String>,
    /// A thought summary, not the answer.
    #[serde(default)]
    pub(super) thought: bool,
    #[serde(default)]
    pub(super) function_call: Option<WireFunctionCall>,
}

#[derive(Deserialize)]
pub(super) struct WireFunctionCall {
    #[serde(default)]
    pub(super) id: Option<String>,
    pub(super) name: String,
    #[serde(default)]
    pub(super) args: Option<Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireFeedback {
    #[serde(default)]
    pub(super) block_reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct WireUsage {
    #[serde(default)]
    prompt_token_count: Option<u32>,
    #[serde(default)]
    candidates_token_count: Option<u32>,
    #[serde(default)]
    thoughts_token_count: Option<u32>,
    #[serde(default)]
    cached_content_token_count: Option<u32>,
}

impl WireUsage {
    /// Prompt tokens (cached content included), completion tokens (the
    /// candidates' and the thoughts'), cached input tokens.
    pub(super) fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_token_count.unwrap_or(0),
            completion_tokens: self
                .candidates_token_count
                .unwrap_or(0)
                .saturating_add(self.thoughts_token_count.unwrap_or(0)),
            cached_input_tokens: self.cached_content_token_count.unwrap_or(0),
        }
    }
}

impl WireFunctionCall {
    /// The call as a [`ToolCall`]: Gemini's id, or `call_{n}` (`n` counts
    /// the calls of the answer, from 0).
    pub(super) fn into_tool_call(self, n: u32) -> ToolCall {
        ToolCall {
            id: match self.id {
                Some(id) if !id.is_empty() => id,
                _ => format!("call_{n}"),
            },
            name: self.name,
            arguments: match self.args {
                Some(args @ Value::Object(_)) => args.to_string(),
                _ => "{}".to_owned(),
            },
        }
    }
}

/// The finish reason of a candidate that `called` a function, when
/// Gemini gave one.
pub(super) fn finish_reason(reason: &str, called: bool) -> FinishReason {
    match reason {
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => FinishReason::ContentFilter,
        "STOP" if called => FinishReason::ToolCalls,
        "STOP" => FinishReason::Stop,
        "MAX_TOKENS" => FinishReason::Length,
        _ => FinishReason::Other,
    }
}

/// The failure for a prompt Gemini refused before generating
/// (`promptFeedback.blockReason`, no candidate).
pub(super) fn blocked(reason: &str) -> Failure {
    // The reason is an enum name; anything else is not quoted.
    let named = !reason.is_empty()
        && reason.len() <= 64
        && reason.bytes().all(|b| b.is_ascii_uppercase() || b == b'_');
    let message = if named {
        format!("Gemini blocked the prompt ({reason})")
    } else {
        "Gemini blocked the prompt".to_owned()
    };
    Failure::new(FailureClass::ContentFiltered)
        .with_provider(PROVIDER)
        .with_message(message)
}

/// Normalises a `generateContent` answer to a request for `model` (the
/// answer's model is its `modelVersion`, or `model` without one; its id is
/// its `responseId`). Unknown fields are ignored.
///
/// ```
/// use std::time::Duration;
/// use tower_llm_core::FinishReason;
/// use tower_llm_providers::gemini;
///
/// let body = br#"{"candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}]},
///                 "finishReason": "STOP"}], "modelVersion": "gemini-2.5-flash"}"#;
/// let answer = gemini::decode(body, "gemini-2.5-flash", Duration::ZERO).unwrap();
/// assert_eq!(answer.text(), "Hi");
/// assert_eq!(answer.finish_reason(), Some(FinishReason::Stop));
///
/// let blocked = br#"{"promptFeedback": {"blockReason": "SAFETY"}}"#;
/// assert!(gemini::decode(blocked, "m", Duration::ZERO).unwrap_err().is_content_filtered());
/// ```
///
/// # Errors
///
/// A prompt Gemini blocked (`promptFeedback.blockReason` and no
/// candidate): a content-filtered failure. An answer with no candidate, an
/// `error` object, or a body that is not the JSON expected: an
/// invalid-response failure (or the error's class), naming what is
/// missing and quoting nothing.
pub fn decode(body: &[u8], model: &str, latency: Duration) -> Result<ChatResponse, Failure> {
    let wire: WireResponse<'_> =
        serde_json::from_slice(body).map_err(|e| invalid_json(PROVIDER, &e))?;
    if let Some(error) = wire.error {
        return Err(in_band(error, &Scrub::none()));
    }
    if wire.candidates.is_empty() {
        return Err(match wire.prompt_feedback.and_then(|f| f.block_reason) {
            Some(reason) => blocked(&reason),
            None => invalid(PROVIDER, "no candidates"),
        });
    }
    let mut calls = 0u32;
    let choices = wire
        .candidates
        .into_iter()
        .map(|c| {
            let mut text = String::new();
            let mut tool_calls = Vec::new();
            for part in c.content.map(|c| c.parts).unwrap_or_default() {
                if let Some(call) = part.function_call {
                    tool_calls.push(call.into_tool_call(calls));
                    calls = calls.saturating_add(1);
                } else if let (Some(t), false) = (part.text, part.thought) {
                    text.push_str(&t);
                }
            }
            let finish_reason = match c.finish_reason.as_deref() {
                Some(reason) => finish_reason(reason, !tool_calls.is_empty()),
                None if !tool_calls.is_empty() => FinishReason::ToolCalls,
                None => FinishReason::Other,
            };
            Choice {
                index: c.index,
                text,
                tool_calls,
                finish_reason,
            }
        })
        .collect();
    Ok(ChatResponse {
        id: wire.response_id.unwrap_or_default(),
        model: wire.model_version.unwrap_or_else(|| model.to_owned()),
        provider: PROVIDER.into(),
        fallback_position: 0,
        degraded: false,
        idempotent_replayed: false,
        cache: None,
        choices,
        usage: wire
            .usage_metadata
            .as_ref()
            .map_or_else(Usage::default, WireUsage::usage),
        latency,
        attempts: Vec::new(),
    })
}

/// Gemini's error object: `{"code", "message", "status", "details"}`.
#[derive(Deserialize, Default)]
pub(super) struct WireError<'a> {
    /// The HTTP status, as a number.
    #[serde(default)]
    code: Option<Value>,
    #[serde(borrow, default)]
    message: Option<Cow<'a, str>>,
    /// The error's type (`RESOURCE_EXHAUSTED`, ...).
    #[serde(borrow, default)]
    status: Option<Cow<'a, str>>,
    /// `google.rpc` details (`ErrorInfo`, `QuotaFailure`, `RetryInfo`, ...),
    /// read by hand: one odd detail must not lose the rest.
    #[serde(default)]
    details: Vec<Value>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    error: Option<WireError<'a>>,
}

impl<'a> WireError<'a> {
    /// What it says for classification, and the retry delay it asks for.
    fn read(self) -> (ErrorBody<'a>, Option<Duration>) {
        let mut reason = None;
        let mut quota = None;
        let mut retry = None;
        for d in &self.details {
            if let Some(r) = d.get("reason").and_then(Value::as_str) {
                reason.get_or_insert(r);
            }
            if let Some(violations) = d.get("violations").and_then(Value::as_array) {
                for id in violations
                    .iter()
                    .filter_map(|v| v.get("quotaId").and_then(Value::as_str))
                {
                    // A daily quota says more than a per-minute one.
                    if quota.is_none() || id.contains("PerDay") {
                        quota = Some(id);
                    }
                }
            }
            if let Some(delay) = d.get("retryDelay").and_then(Value::as_str) {
                retry = retry.or_else(|| retry_delay(delay));
            }
        }
        let code = reason.or(quota).map(|c| Cow::Owned(c.to_owned()));
        (ErrorBody::new(self.status, code, self.message), retry)
    }
}

/// Reads an error body leniently (garbage gives an empty one): the object
/// `{"error": {...}}`, or the array `[{"error": {...}}]` the streaming
/// endpoint answers with. Its `status` is the error's type, the reason
/// of its `ErrorInfo` detail (or else the `quotaId` of its `QuotaFailure`
/// detail, a daily one first) its code; with the `RetryInfo.retryDelay`
/// detail.
pub(super) fn read_error(body: &[u8]) -> (ErrorBody<'_>, Option<Duration>) {
    let array = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
    let error = if array {
        serde_json::from_slice::<Vec<Envelope<'_>>>(body)
            .ok()
            .and_then(|v| v.into_iter().next())
            .and_then(|e| e.error)
    } else {
        serde_json::from_slice::<Envelope<'_>>(body)
            .ok()
            .and_then(|e| e.error)
    };
    error.map_or_else(|| (ErrorBody::default(), None), WireError::read)
}

/// A `google.protobuf.Duration` in JSON (`"7s"`, `"20.04466179s"`); none
/// for anything else. At most `u32::MAX` seconds.
fn retry_delay(text: &str) -> Option<Duration> {
    let number = text.strip_suffix('s')?;
    let (secs, fraction) = number.split_once('.').unwrap_or((number, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if secs.is_empty() || secs.len() > 12 || !digits(secs) || !digits(fraction) {
        return None;
    }
    let secs: u64 = secs.parse().ok()?;
    let mut nanos = 0u32;
    for (i, b) in fraction.bytes().take(9).enumerate() {
        let place = 10u32.pow(8 - i as u32);
        nanos += u32::from(b - b'0') * place;
    }
    Some(Duration::new(secs.min(u64::from(u32::MAX)), nanos))
}

/// Sharpens the status's class from a Gemini error body (see the
/// [module docs](super#errors)).
pub(super) fn classify(class: FailureClass, e: &ErrorBody<'_>) -> FailureClass {
    let message = e.message();
    let code = e.code().unwrap_or_default();
    match e.kind() {
        _ if code.starts_with("API_KEY_") => FailureClass::Auth,
        Some("UNAUTHENTICATED" | "PERMISSION_DENIED") => FailureClass::Auth,
        Some("RESOURCE_EXHAUSTED") if code.contains("PerDay") || zero_limit(message) => {
            FailureClass::QuotaExhausted
        }
        Some("RESOURCE_EXHAUSTED") => FailureClass::RateLimited,
        Some("INVALID_ARGUMENT")
            if message.contains("input token count")
                && message.contains("exceeds the maximum number of tokens") =>
        {
            FailureClass::ContextWindowExceeded
        }
        Some("UNAVAILABLE" | "INTERNAL" | "DEADLINE_EXCEEDED") => FailureClass::Transient,
        _ => class,
    }
}

/// `true` when the message names a quota of `limit: 0` (a model the
/// account's tier does not include: no wait helps).
fn zero_limit(message: &str) -> bool {
    message.match_indices("limit: 0").any(|(at, m)| {
        !message[at + m.len()..]
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_digit())
    })
}

/// The failure for a Gemini error answer: the status's class sharpened by
/// the body, the message scrubbed of `scrub`'s secrets, and the
/// `RetryInfo.retryDelay` detail as `retry_after` when no header gave one
/// (for a rate-limited or transient failure only).
pub(super) fn error_answer(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    scrub: &Scrub,
) -> Failure {
    let (error, retry) = read_error(body);
    let failure = error_failure(PROVIDER, status, headers, &error, scrub, classify);
    with_retry_delay(failure, retry)
}

fn with_retry_delay(failure: Failure, retry: Option<Duration>) -> Failure {
    match retry {
        Some(d)
            if failure.retry_after().is_none()
                && matches!(
                    failure.class(),
                    FailureClass::RateLimited | FailureClass::Transient
                ) =>
        {
            failure.with_retry_after(d)
        }
        _ => failure,
    }
}

/// Classifies a Gemini error answer (a non-2xx status with its headers and
/// body); see the [module docs](super#errors). The body is read leniently:
/// garbage leaves the status's class.
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use tower_llm_providers::gemini;
///
/// let body = br#"{"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED",
///   "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}]}}"#;
/// let f = gemini::decode_error(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), body);
/// assert!(f.is_rate_limited());
/// assert_eq!(f.retry_after(), Some(Duration::from_secs(7)));
/// ```
pub fn decode_error(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Failure {
    error_answer(status, headers, body, &Scrub::none())
}

/// The failure for an error object inside a 2xx answer (a stream's error
/// event): the class its `code` (an HTTP status) says, sharpened by its
/// `status`, transient when it names no status; its message scrubbed.
pub(super) fn in_band(error: WireError<'_>, scrub: &Scrub) -> Failure {
    let status = error
        .code
        .as_ref()
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|s| s.is_client_error() || s.is_server_error());
    let (body, retry) = error.read();
    let class = match status.map(|s| classify_status(s, &HeaderMap::new())) {
        Some(Outcome::Failure(c)) => c.class,
        // An error that names no failing status: something went wrong upstream.
        _ => FailureClass::Transient,
    };
    let mut failure = Failure::new(classify(class, &body)).with_provider(PROVIDER);
    if let Some(message) = body.message.as_deref() {
        failure = failure.with_message(scrub.message(message));
    }
    with_retry_delay(failure, retry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_are_protobuf_durations() {
        assert_eq!(retry_delay("7s"), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_delay("20.04466179s"),
            Some(Duration::new(20, 44_661_790))
        );
        assert_eq!(retry_delay("0.5s"), Some(Duration::from_millis(500)));
        assert_eq!(
            retry_delay("99999999999s"),
            Some(Duration::from_secs(u64::from(u32::MAX)))
        );
        for bad in ["", "s", "7", "-7s", "7ms", "1.2.3s", "+7s", " 7s", "7.s5"] {
            assert_eq!(retry_delay(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_zero_limit_is_not_a_limit_of_ten() {
        assert!(zero_limit("Quota exceeded, limit: 0, model: x"));
        assert!(zero_limit("limit: 0"));
        assert!(!zero_limit("Quota exceeded, limit: 10, model: x"));
        assert!(!zero_limit("no limit here"));
    }
}
