//! Provider-neutral chat types.

use std::sync::Arc;
use std::time::Duration;

use http::Extensions;
use serde::{Deserialize, Serialize};

use crate::{AttemptRecord, Link, RecordsAttempts};

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The end user.
    User,
    /// The model.
    Assistant,
    /// The result of a tool call.
    Tool,
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by URL (`https:` or a `data:` URL).
    ImageUrl {
        /// The image URL.
        url: String,
    },
}

/// A tool the model invoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for this call; a tool result refers to it.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments, as a JSON text (as the model produced it; it may not
    /// be valid JSON).
    pub arguments: String,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its content parts, in order.
    #[serde(default)]
    pub content: Vec<ContentPart>,
    /// Tools the assistant invoked in this message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a [`Role::Tool`] message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message of `role` with one text part.
    pub fn text(role: Role, text: impl Into<String>) -> Self {
        Message {
            role,
            content: vec![ContentPart::Text { text: text.into() }],
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Message::text(Role::System, text)
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Self {
        Message::text(Role::User, text)
    }

    /// An assistant message.
    pub fn assistant(text: impl Into<String>) -> Self {
        Message::text(Role::Assistant, text)
    }

    /// A tool result answering call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(tool_call_id.into()),
            ..Message::text(Role::Tool, text)
        }
    }

    /// The text parts joined together.
    pub fn joined_text(&self) -> String {
        let mut out = String::new();
        for part in &self.content {
            if let ContentPart::Text { text } = part {
                out.push_str(text);
            }
        }
        out
    }
}

/// `true` for an empty shared list (serde's `skip_serializing_if`).
fn is_empty<T>(list: &Arc<Vec<T>>) -> bool {
    list.is_empty()
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// The tool's name.
    pub name: String,
    /// What the tool does, for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema of the arguments.
    #[serde(default)]
    pub parameters: serde_json::Value,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool calls.
    None,
    /// At least one tool call.
    Required,
    /// This tool.
    Tool(String),
}

/// A provider-neutral chat request.
///
/// `call` carries what the layers share about the call (deadline, attempt
/// log, the link being called: see [`Call`](crate::Call)); `extensions`
/// carry values of your own. Neither is serialised. `messages`, `tools` and
/// `stop` are shared, so a copy of the request costs reference counts.
///
/// ```
/// use tower_llm_core::{ChatRequest, Message};
///
/// let req = ChatRequest::new("gpt-4o-mini", vec![Message::user("Say hi")])
///     .with_max_tokens(64)
///     .with_temperature(0.2);
/// let json = serde_json::to_value(&req).unwrap();
/// assert_eq!(json["model"], "gpt-4o-mini");
/// assert_eq!(json["messages"][0]["content"][0]["text"], "Say hi");
/// ```
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model id (or route alias) to call, shared like `messages`.
    pub model: Arc<str>,
    /// The conversation so far, shared: a copy of the request (the retry
    /// layer's for a later attempt, the fallback layer's for the next link)
    /// costs a reference count, whatever the prompt's size. Change it with
    /// [`Arc::make_mut`] (which copies only if it is shared) or replace it.
    pub messages: Arc<Vec<Message>>,
    /// Tools the model may call, shared like `messages`.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub tools: Arc<Vec<Tool>>,
    /// Tool choice; `None` leaves it to the provider's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// The most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stop sequences, shared like `messages`.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub stop: Arc<Vec<String>>,
    /// Ask for a streamed answer.
    #[serde(default)]
    pub stream: bool,
    /// What the call carries between the layers (deadline, link, attempt
    /// log; see [`Call`](crate::Call)); set by the layers, not serialised.
    #[serde(skip)]
    pub call: Option<crate::Call>,
    /// Values of your own that travel with the request (for example
    /// [`NotReplayable`](crate::NotReplayable)); not serialised.
    #[serde(skip)]
    pub extensions: Extensions,
}

impl ChatRequest {
    /// A request for `model` with `messages`.
    pub fn new(model: impl Into<Arc<str>>, messages: Vec<Message>) -> Self {
        ChatRequest {
            model: model.into(),
            messages: Arc::new(messages),
            ..ChatRequest::default()
        }
    }

    /// Sets `max_tokens`.
    #[must_use]
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// Sets `temperature`.
    #[must_use]
    pub fn with_temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Sets the tools.
    #[must_use]
    pub fn with_tools(mut self, tools: Vec<Tool>) -> Self {
        self.tools = Arc::new(tools);
        self
    }

    /// Sets `stream`.
    #[must_use]
    pub fn with_stream(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }
}

crate::call::call_field!(ChatRequest);

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FinishReason {
    /// A natural end or a stop sequence.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The model called tools.
    ToolCalls,
    /// The provider's safety filter cut the answer.
    ContentFilter,
    /// Anything else.
    Other,
}

/// Token counts of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens, including cached ones.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Input tokens served from the provider's prompt cache (0 if none).
    #[serde(default)]
    pub cached_input_tokens: u32,
}

impl Usage {
    /// `prompt_tokens + completion_tokens`, saturating.
    pub fn total_tokens(&self) -> u32 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }
}

impl crate::Price {
    /// What `usage` costs at this price, rounded up to the next
    /// nano-dollar. Cached input tokens (at most the input tokens) are
    /// charged the cached price.
    pub fn cost(&self, usage: &Usage) -> crate::Cost {
        let cached = usage.cached_input_tokens.min(usage.prompt_tokens);
        self.tokens(
            u64::from(usage.prompt_tokens - cached),
            u64::from(cached),
            u64::from(usage.completion_tokens),
        )
    }
}

/// One answer of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice {
    /// Index among the choices.
    pub index: u32,
    /// The text (empty on a tool-call-only answer).
    pub text: String,
    /// Tools the model called.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub finish_reason: FinishReason,
}

/// A provider-neutral chat answer.
///
/// Build one with [`ChatResponse::builder`] (test doubles, degraded
/// answers), or field by field from `Default`, an empty answer:
/// `ChatResponse { id, ..Default::default() }`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The provider's id of the answer.
    pub id: String,
    /// The model that actually served (after any fallback).
    pub model: String,
    /// The provider that served (for example `"anthropic"`).
    pub provider: Arc<str>,
    /// Position in the fallback chain of the link that served (0 = primary).
    #[serde(default)]
    pub fallback_position: u8,
    /// `true` when no provider served and the fallback layer's degraded
    /// step built this answer.
    #[serde(default)]
    pub degraded: bool,
    /// `true` when an idempotency layer replayed this answer, stored from
    /// an earlier call with the same key: no provider was called, and
    /// `attempts` are the original call's.
    #[serde(default)]
    pub idempotent_replayed: bool,
    /// What a response cache did for this answer (`None`: no cache on the
    /// route). A hit or stale answer made no provider call, and its
    /// `attempts` are empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::CacheOutcome>,
    /// The answers.
    pub choices: Vec<Choice>,
    /// Token counts.
    pub usage: Usage,
    /// Time from sending the request to having the whole answer.
    #[serde(with = "crate::layer::serde_millis")]
    pub latency: Duration,
    /// Every attempt the call made (attached by the outermost layer).
    #[serde(default)]
    pub attempts: Vec<AttemptRecord>,
}

impl ChatResponse {
    /// A builder for an answer from `model` (test doubles, degraded
    /// answers, a provider of your own). Text, tool calls and the finish
    /// reason go to the first choice; a first choice without a finish
    /// reason ends with [`ToolCalls`](FinishReason::ToolCalls) when it
    /// called tools, [`Stop`](FinishReason::Stop) otherwise.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_llm_core::{ChatResponse, FinishReason, Usage};
    ///
    /// let answer = ChatResponse::builder("gpt-4o-mini")
    ///     .provider("openai")
    ///     .text("Hello!")
    ///     .usage(Usage { prompt_tokens: 9, completion_tokens: 3, ..Usage::default() })
    ///     .finish_reason(FinishReason::Length)
    ///     .latency(Duration::from_millis(120))
    ///     .build();
    /// assert_eq!(answer.text(), "Hello!");
    /// assert_eq!(answer.finish_reason(), Some(FinishReason::Length));
    /// assert_eq!((answer.model.as_str(), &*answer.provider), ("gpt-4o-mini", "openai"));
    /// assert_eq!(answer.usage.total_tokens(), 12);
    /// ```
    pub fn builder(model: impl Into<String>) -> ChatResponseBuilder {
        ChatResponseBuilder {
            response: ChatResponse {
                model: model.into(),
                ..ChatResponse::default()
            },
            first: None,
        }
    }

    /// The first choice's text, or `""`.
    pub fn text(&self) -> &str {
        self.choices.first().map_or("", |c| c.text.as_str())
    }

    /// The first choice's finish reason.
    pub fn finish_reason(&self) -> Option<FinishReason> {
        self.choices.first().map(|c| c.finish_reason)
    }
}

impl RecordsAttempts for ChatResponse {
    /// A replayed answer keeps the records of the call that produced it
    /// when the replaying call made no attempt.
    fn record_attempts(&mut self, attempts: Vec<AttemptRecord>) {
        if self.idempotent_replayed && attempts.is_empty() {
            return;
        }
        self.attempts = attempts;
    }

    fn record_served_by(&mut self, link: &Link) {
        self.fallback_position = link.position();
    }

    fn mark_degraded(&mut self) {
        self.degraded = true;
    }
}

/// Builds a [`ChatResponse`]; made by [`ChatResponse::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ChatResponseBuilder {
    response: ChatResponse,
    /// The first choice, while it is being built: its text, tool calls and
    /// finish reason (if given).
    first: Option<(String, Vec<ToolCall>, Option<FinishReason>)>,
}

impl ChatResponseBuilder {
    /// The provider's id of the answer.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.response.id = id.into();
        self
    }

    /// The provider that served (for example `"openai"`).
    pub fn provider(mut self, provider: impl Into<Arc<str>>) -> Self {
        self.response.provider = provider.into();
        self
    }

    /// The first choice's text (replacing text set before).
    pub fn text(mut self, text: impl Into<String>) -> Self {
        self.first_choice().0 = text.into();
        self
    }

    /// Adds a tool call to the first choice.
    pub fn tool_call(mut self, call: ToolCall) -> Self {
        self.first_choice().1.push(call);
        self
    }

    /// Why the first choice stopped.
    pub fn finish_reason(mut self, reason: FinishReason) -> Self {
        self.first_choice().2 = Some(reason);
        self
    }

    /// Adds a whole choice after the first (its `index` is kept as given).
    pub fn choice(mut self, choice: Choice) -> Self {
        self.first_choice();
        self.response.choices.push(choice);
        self
    }

    /// The token counts.
    pub fn usage(mut self, usage: Usage) -> Self {
        self.response.usage = usage;
        self
    }

    /// The time from sending the request to having the whole answer.
    pub fn latency(mut self, latency: Duration) -> Self {
        self.response.latency = latency;
        self
    }

    /// The answer.
    #[must_use]
    pub fn build(self) -> ChatResponse {
        let mut response = self.response;
        if let Some((text, tool_calls, reason)) = self.first {
            let finish_reason = reason.unwrap_or(if tool_calls.is_empty() {
                FinishReason::Stop
            } else {
                FinishReason::ToolCalls
            });
            response.choices.insert(
                0,
                Choice {
                    index: 0,
                    text,
                    tool_calls,
                    finish_reason,
                },
            );
        }
        response
    }

    fn first_choice(&mut self) -> &mut (String, Vec<ToolCall>, Option<FinishReason>) {
        self.first.get_or_insert_with(Default::default)
    }
}

/// A fragment of a tool call in a stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallDelta {
    /// Identifies the tool call within its choice: fragments with the same
    /// index belong to the same call. (OpenAI sends the tool call's
    /// position; Anthropic and Bedrock the content block's, so the first
    /// call after a text block has index 1.)
    pub index: u32,
    /// The call id (on the first fragment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The tool name (on the first fragment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the JSON arguments.
    #[serde(default)]
    pub arguments: String,
}

/// One item of a streamed answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ChatChunk {
    /// Which choice the chunk belongs to.
    pub index: u32,
    /// Text to append.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A tool-call fragment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call: Option<ToolCallDelta>,
    /// Set on the chunk that ends the choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Token counts, when the provider sends them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trips_without_extensions() {
        let mut req = ChatRequest::new(
            "m",
            vec![
                Message::system("be brief"),
                Message::tool_result("call_1", "42"),
            ],
        )
        .with_tools(vec![Tool {
            name: "add".into(),
            description: None,
            parameters: serde_json::json!({"type": "object"}),
        }])
        .with_stream(true);
        req.extensions.insert(7u8);
        let json = serde_json::to_string(&req).expect("json");
        let back: ChatRequest = serde_json::from_str(&json).expect("back");
        assert_eq!(back.messages, req.messages);
        assert_eq!(back.tools, req.tools);
        assert!(back.stream);
        assert!(back.extensions.get::<u8>().is_none());
    }

    #[test]
    fn response_helpers() {
        let res = ChatResponse {
            id: "x".into(),
            model: "m".into(),
            provider: "openai".into(),
            fallback_position: 0,
            degraded: false,
            idempotent_replayed: false,
            cache: None,
            choices: vec![Choice {
                index: 0,
                text: "hi".into(),
                tool_calls: vec![],
                finish_reason: FinishReason::Stop,
            }],
            usage: Usage {
                prompt_tokens: u32::MAX,
                completion_tokens: 3,
                cached_input_tokens: 0,
            },
            latency: Duration::from_millis(850),
            attempts: vec![],
        };
        assert_eq!(res.text(), "hi");
        assert_eq!(res.finish_reason(), Some(FinishReason::Stop));
        assert_eq!(res.usage.total_tokens(), u32::MAX);
        let json = serde_json::to_value(&res).expect("json");
        assert_eq!(json["latency"], 850);
    }

    #[test]
    fn the_builder_fills_the_first_choice() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "add".into(),
            arguments: "{}".into(),
        };
        let res = ChatResponse::builder("m").tool_call(call.clone()).build();
        assert_eq!(res.finish_reason(), Some(FinishReason::ToolCalls));
        assert_eq!(res.choices[0].tool_calls, vec![call]);
        assert_eq!(res.text(), "");
        let res = ChatResponse::builder("m")
            .choice(Choice {
                index: 1,
                text: "second".into(),
                tool_calls: vec![],
                finish_reason: FinishReason::Length,
            })
            .text("first")
            .build();
        assert_eq!(res.choices.len(), 2);
        assert_eq!(
            (res.text(), res.finish_reason()),
            ("first", Some(FinishReason::Stop))
        );
        assert_eq!(res.choices[1].text, "second");
        let empty = ChatResponse::builder("m").id("x").build();
        assert!(empty.choices.is_empty());
        assert_eq!((empty.id.as_str(), empty.model.as_str()), ("x", "m"));
    }

    #[test]
    fn joined_text_skips_images() {
        let m = Message {
            role: Role::User,
            content: vec![
                ContentPart::Text { text: "a".into() },
                ContentPart::ImageUrl {
                    url: "data:".into(),
                },
                ContentPart::Text { text: "b".into() },
            ],
            tool_calls: vec![],
            tool_call_id: None,
        };
        assert_eq!(m.joined_text(), "ab");
    }
}
