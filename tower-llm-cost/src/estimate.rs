//! [`CostRequest`]: what a request tells the cost layer about its worst
//! case.

use std::sync::Arc;

use tower_llm_core::{ChatRequest, ContentPart, LlmRequest, Message, Tool};

/// Tokens counted for each message's framing (role, separators): more
/// than any provider's chat template adds.
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 8;

/// Tokens counted for each image part: more than an image costs at any
/// provider's largest detail level in 2026 (OpenAI's high detail tops out
/// near 1,500, Anthropic's near 1,600).
pub const IMAGE_TOKENS: u64 = 3_000;

/// Tokens counted for a request's fixed framing.
pub const REQUEST_OVERHEAD_TOKENS: u64 = 16;

/// A request the cost layer can price before sending: an upper bound of
/// its input tokens, and its cap on output tokens.
///
/// For [`ChatRequest`] the bound counts one token per byte of every text,
/// tool call, tool result and tool definition (the byte length of the
/// encoded request's text: a token of a byte-pair tokenizer covers at least
/// one byte, so no prompt has more tokens than bytes), plus
/// [`MESSAGE_OVERHEAD_TOKENS`] per message, [`IMAGE_TOKENS`] per image and
/// [`REQUEST_OVERHEAD_TOKENS`]. It costs one pass over the message list,
/// reading lengths only. It overestimates an English prompt about four
/// times; the hold is settled to the real usage when the attempt ends.
///
/// ```
/// use tower_llm_core::{ChatRequest, Message};
/// use tower_llm_cost::CostRequest;
///
/// let mut req = ChatRequest::new("m", vec![Message::user("hello")]);
/// assert_eq!(req.input_tokens_bound(), 16 + 8 + 5);
/// assert_eq!(req.max_output_tokens(), None);
/// req.cap_output_tokens(256);
/// assert_eq!(req.max_tokens, Some(256));
/// ```
pub trait CostRequest: LlmRequest {
    /// At least as many tokens as the provider will bill as input.
    fn input_tokens_bound(&self) -> u64;

    /// The same bound, to be computed later if at all: an attempt held to
    /// no budget or quota needs it only when its answer brings no usage.
    /// The default computes it now; [`ChatRequest`] keeps its shared
    /// message list (a reference count) instead.
    fn input_bound_later(&self) -> InputBound {
        InputBound::known(self.input_tokens_bound())
    }

    /// The request's own cap on output tokens, if it has one.
    fn max_output_tokens(&self) -> Option<u32>;

    /// Caps output tokens at `cap` (the provider then cannot generate,
    /// nor bill, more).
    fn cap_output_tokens(&mut self, cap: u32);
}

/// An upper bound of a request's input tokens, known now or computed
/// when first asked ([`CostRequest::input_bound_later`]).
#[derive(Debug, Clone)]
pub struct InputBound(Bound);

#[derive(Debug, Clone)]
enum Bound {
    Known(u64),
    /// The messages, and the tools when there are any.
    Chat(Arc<Vec<Message>>, Option<Arc<Vec<Tool>>>),
}

impl InputBound {
    /// A bound of `tokens`.
    pub fn known(tokens: u64) -> Self {
        InputBound(Bound::Known(tokens))
    }

    /// The bound of a chat request, computed when asked.
    pub fn chat(req: &ChatRequest) -> Self {
        let tools = (!req.tools.is_empty()).then(|| req.tools.clone());
        InputBound(Bound::Chat(req.messages.clone(), tools))
    }

    /// The bound, in tokens.
    pub fn get(&self) -> u64 {
        match &self.0 {
            Bound::Known(tokens) => *tokens,
            Bound::Chat(messages, tools) => {
                chat_bound(messages, tools.as_deref().map_or(&[], |t| t))
            }
        }
    }
}

fn len(s: &str) -> u64 {
    s.len() as u64
}

/// [`CostRequest::input_tokens_bound`] of a chat request: one pass over
/// the messages adding lengths (text is by far the common part).
fn chat_bound(messages: &[Message], tools: &[Tool]) -> u64 {
    let mut bytes = 0usize;
    let mut parts = 0u64;
    let mut extra = 0u64;
    for m in messages {
        match m.content.as_slice() {
            [ContentPart::Text { text }] => bytes += text.len(),
            content => {
                for part in content {
                    match part {
                        ContentPart::Text { text } => bytes += text.len(),
                        _ => parts += 1,
                    }
                }
            }
        }
        if !m.tool_calls.is_empty() || m.tool_call_id.is_some() {
            for call in &m.tool_calls {
                extra += MESSAGE_OVERHEAD_TOKENS + len(&call.id) + len(&call.name);
                extra += len(&call.arguments);
            }
            extra += m.tool_call_id.as_deref().map_or(0, len);
        }
    }
    for tool in tools {
        let mut params = Count(0);
        // Writing to a counter cannot fail; a value that cannot be
        // encoded counts what was written before.
        let _ = serde_json::to_writer(&mut params, &tool.parameters);
        extra += MESSAGE_OVERHEAD_TOKENS + len(&tool.name) + params.0;
        extra += tool.description.as_deref().map_or(0, len);
    }
    REQUEST_OVERHEAD_TOKENS
        + MESSAGE_OVERHEAD_TOKENS * messages.len() as u64
        + bytes as u64
        + IMAGE_TOKENS * parts
        + extra
}

/// Counts the bytes serde writes, writing nowhere.
struct Count(u64);

impl std::io::Write for Count {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CostRequest for ChatRequest {
    fn input_tokens_bound(&self) -> u64 {
        chat_bound(&self.messages, &self.tools)
    }

    fn input_bound_later(&self) -> InputBound {
        InputBound::chat(self)
    }

    fn max_output_tokens(&self) -> Option<u32> {
        self.max_tokens
    }

    fn cap_output_tokens(&mut self, cap: u32) {
        self.max_tokens = Some(self.max_tokens.map_or(cap, |m| m.min(cap)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower_llm_core::{Message, Tool, ToolCall};

    #[test]
    fn the_input_bound_counts_every_byte_sent_and_each_image() {
        let mut with_call = Message::assistant("");
        with_call.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        });
        let mut image = Message::user("é");
        image.content.push(ContentPart::ImageUrl {
            url: "data:image/png;base64,AAAA".into(),
        });
        let req = ChatRequest::new(
            "m",
            vec![with_call, image, Message::tool_result("c1", "ok")],
        )
        .with_tools(vec![Tool {
            name: "f".into(),
            description: Some("does".into()),
            parameters: serde_json::json!({"type": "object"}),
        }]);
        let expected =
            16 + (8 + 8 + 2 + 1 + 7) + (8 + 2 + IMAGE_TOKENS) + (8 + 2 + 2) + (8 + 1 + 17 + 4);
        assert_eq!(req.input_tokens_bound(), expected);
    }

    #[test]
    fn a_cap_never_raises_the_request_s_own() {
        let mut req = ChatRequest::new("m", vec![]);
        req.max_tokens = Some(100);
        req.cap_output_tokens(1_000);
        assert_eq!(req.max_tokens, Some(100));
        req.cap_output_tokens(10);
        assert_eq!(req.max_tokens, Some(10));
    }
}
