//! The server side of Anthropic's Messages API, for gateways that serve
//! `POST /v1/messages` to Anthropic's SDKs and to coding agents (Claude
//! Code with `ANTHROPIC_BASE_URL`), whatever dialect answers behind
//! them: requests in ([`decode_request`]), answers and streams out
//! ([`write_response`], [`encode_response`], [`SseFrames`]), and failed
//! calls as Anthropic error answers ([`failure_response`],
//! [`failure_status`], [`encode_error`], [`sse_error_event`]).
//!
//! # What is carried
//!
//! A request's system prompt, its turns (text, images by `base64` or
//! `url`, tool calls and tool results), its client tools and tool
//! choice, `max_tokens`, `temperature`, `top_p`, `stop_sequences` and
//! `stream`; an answer's first choice (its text, tool calls, finish
//! reason) and its usage, with cache reads apart from the other input
//! tokens as Anthropic counts them. [`decode_request`] lists what it
//! leaves out (earlier turns' thinking blocks, `cache_control`, `top_k`,
//! `metadata`, the `thinking` switch, ...) and what it refuses (a
//! missing `max_tokens`, server tools, documents, other block types).
//!
//! # What is not
//!
//! Answers never hold `thinking`, `redacted_thinking` or server-tool
//! blocks, and never say `stop_sequence`, `pause_turn` or which stop
//! sequence matched (a stop sequence reads as `end_turn`); cache writes
//! are counted in `input_tokens`, not in `cache_creation_input_tokens`.
//! The token-counting endpoint (`/v1/messages/count_tokens`) and the
//! Message Batches API are not served here.

mod error;
mod request;
mod response;
mod sse;

pub use error::{encode_error, failure_response, failure_status, sse_error_event};
pub use request::decode_request;
pub use response::{encode_response, write_response};
pub use sse::SseFrames;
