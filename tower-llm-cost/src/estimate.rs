//! [`CostRequest`]: what a request tells the cost layer about its worst
//! case.

use std::sync::Arc;

use tower_llm_core::{ChatRequest, LlmRequest, Message, Tool, input_tokens_bound};

/// A request the cost layer can price before sending: an upper bound of
/// its input tokens, and its cap on output tokens.
///
/// For [`ChatRequest`] the bound counts one token per byte of every text,
/// tool call, tool result and tool definition (the byte length of the
/// encoded request's text: a token of a byte-pair tokenizer covers at least
/// one byte, so no prompt has more tokens than bytes), plus
/// `MESSAGE_OVERHEAD_TOKENS` per message, `IMAGE_TOKENS` per image and
/// `REQUEST_OVERHEAD_TOKENS` ([`input_tokens_bound`]). It costs one pass over the message list,
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
                input_tokens_bound(messages, tools.as_ref().map_or(&[], |t| t.as_slice()))
            }
        }
    }
}

impl CostRequest for ChatRequest {
    fn input_tokens_bound(&self) -> u64 {
        input_tokens_bound(&self.messages, &self.tools)
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
