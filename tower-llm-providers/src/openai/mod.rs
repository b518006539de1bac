//! OpenAI Chat Completions, and every server that speaks it; OpenAI
//! embeddings; and the server side of the wire format ([`server`]).

mod chat;
mod config;
mod embeddings;
pub mod server;

pub use chat::{OpenAi, decode, decode_error, encode, encode_with};
pub use config::OpenAiConfig;
pub use embeddings::{OpenAiEmbeddings, decode_embeddings};
