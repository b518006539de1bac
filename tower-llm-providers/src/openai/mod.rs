//! OpenAI Chat Completions, and every server that speaks it; OpenAI
//! embeddings, and the embeddings service of every dialect that has one
//! ([`Embeddings`], [`EmbeddingDialect`]); and the server side of the wire
//! format ([`server`]).

mod chat;
mod config;
mod embeddings;
pub mod server;

pub use chat::{OpenAi, decode, decode_error, encode, encode_with};
pub use config::OpenAiConfig;
pub use embeddings::{
    EmbeddingDialect, Embeddings, EmbeddingsFuture, OpenAiEmbeddings, decode_embeddings,
};
pub(crate) use embeddings::{decode_embeddings_of, encode_embeddings};
