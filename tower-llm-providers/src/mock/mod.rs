//! Test doubles for users and for this project's own tests (feature `mock`).
//!
//! - [`ScriptedTransport`]: an in-process HTTP transport playing a script
//!   of replies and recording every request; put a real provider on it
//!   (`OpenAi::new(ScriptedTransport::new(...), ..)`) and the provider's own
//!   encoding, decoding and error classification run. Virtual-time friendly.
//! - [`MockServer`]: a real loopback hyper server speaking the OpenAI and
//!   Anthropic wire formats, with scripted faults (status codes with headers,
//!   delays, hangs, connection resets, malformed JSON, truncated and
//!   oversized bodies, SSE streams) and a record of every request.

mod reply;
mod respond;
mod script;
mod server;
mod transport;

pub use reply::{
    Recorded, Reply, Step, anthropic_stream_steps, bedrock_stream_steps, openai_stream_steps,
};
pub use respond::MockBody;
pub use server::MockServer;
pub use transport::{ScriptedProvider, ScriptedTransport};
