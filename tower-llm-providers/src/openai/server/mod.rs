//! The server side of the OpenAI wire format, for gateways that speak it to
//! their own clients: requests in ([`decode_request`], [`wants_usage`]),
//! answers and stream chunks out ([`write_response`], [`encode_response`],
//! [`encode_chunk`], [`SseFrames`]), embeddings in and out
//! ([`decode_embedding_request`], [`write_embeddings`]), and failed calls
//! as OpenAI error answers ([`failure_response`], [`failure_status`],
//! [`sse_error_event`]).

mod embeddings;
mod error;
mod request;
mod response;
mod sse;

pub use embeddings::{
    EncodingFormat, MAX_EMBEDDING_INPUTS, decode_embedding_request, write_embeddings,
};
pub use error::{encode_error, failure_response, failure_status, sse_error_event};
pub use request::{decode_request, wants_usage};
pub use response::{
    encode_chunk, encode_first_chunk, encode_response, finish_reason, write_response,
};
pub use sse::SseFrames;
